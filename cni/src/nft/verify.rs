//! CHECK's comparison of a listed ruleset with the table ADD installs. Pure.

use std::fmt;

use nftables::schema::{Chain, NfListObject, NfObject, Nftables, Set, SetTypeValue};
use nftables::types::NfFamily;
use serde_json::Value;

use super::ruleset::{
    CHAIN, Family, PROBE_CHAIN, PROBES_SET, PROXIED_PROBES_SET, RuleKind, STRICT_CHAIN, TABLE,
    TableSpec, chain, probe_chain, probes_set, set, strict_chain,
};

/// One way the table differs from what ADD installs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    TableMissing,
    SetMissing(&'static str),
    SetChanged { name: &'static str, found: String },
    UnexpectedSet(String),
    ChainMissing(&'static str),
    ChainChanged { name: &'static str, found: String },
    UnexpectedChain(String),
    RuleMissing(String),
    UnexpectedRule(String),
    RulesReordered(&'static str),
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::TableMissing => write!(f, "table inet {TABLE} is missing"),
            Drift::SetMissing(name) => write!(f, "set inet {TABLE} {name} is missing"),
            Drift::SetChanged { name, found } => {
                write!(f, "set inet {TABLE} {name} has type {found}")
            }
            Drift::UnexpectedSet(name) => write!(f, "set inet {TABLE} {name} should not exist"),
            Drift::ChainMissing(name) => write!(f, "chain inet {TABLE} {name} is missing"),
            Drift::ChainChanged { name, found } => {
                write!(f, "chain inet {TABLE} {name} is {found}")
            }
            Drift::UnexpectedChain(name) => {
                write!(f, "chain inet {TABLE} {name} should not exist")
            }
            Drift::RuleMissing(rule) => write!(f, "rule `{rule}` is missing"),
            Drift::UnexpectedRule(expr) => write!(f, "unexpected rule {expr}"),
            Drift::RulesReordered(chain) => {
                write!(f, "the rules of chain {chain} are out of order")
            }
        }
    }
}

/// The objects of our table in the output of `nft -j list ruleset`. Objects of other tables
/// are dropped unread, so whatever else lives in the pod's netns cannot break CHECK.
pub fn our_objects(listing: &Value) -> Result<Nftables<'static>, serde_json::Error> {
    table_objects(listing, TABLE)
}

/// The objects of table `inet NAME` in the output of `nft -j list ruleset`, others unread.
pub fn table_objects(listing: &Value, name: &str) -> Result<Nftables<'static>, serde_json::Error> {
    let objects = listing
        .get("nftables")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|object| is_of(object, name))
        .map(|object| {
            let mut object = object.clone();
            protocols_by_name(&mut object);
            serde_json::from_value(object)
        })
        .collect::<Result<Vec<NfObject>, _>>()?;
    Ok(Nftables {
        objects: objects.into(),
    })
}

/// The layer 4 protocols our rules match, as nft names them.
const PROTOCOL_NAMES: [(u64, &str); 4] = [(1, "icmp"), (6, "tcp"), (17, "udp"), (58, "ipv6-icmp")];

/// Names the protocol of every `meta l4proto` match: nft lists a number where
/// `/etc/protocols` is missing (the proxy's image), and the rules we install name it.
fn protocols_by_name(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(Value::Object(matched)) = object.get_mut("match") {
                let l4proto = matched
                    .get("left")
                    .and_then(|left| left.pointer("/meta/key"))
                    .and_then(Value::as_str)
                    == Some("l4proto");
                if l4proto
                    && let Some(number) = matched.get("right").and_then(Value::as_u64)
                    && let Some((_, name)) = PROTOCOL_NAMES.iter().find(|(n, _)| *n == number)
                {
                    matched.insert("right".into(), Value::from(*name));
                }
            }
            object.values_mut().for_each(protocols_by_name);
        }
        Value::Array(items) => items.iter_mut().for_each(protocols_by_name),
        _ => {}
    }
}

fn is_of(object: &Value, name: &str) -> bool {
    let Some((kind, body)) = object.as_object().and_then(|o| o.iter().next()) else {
        return false;
    };
    let table = if kind == "table" { "name" } else { "table" };
    body.get("family").and_then(Value::as_str) == Some("inet")
        && body.get(table).and_then(Value::as_str) == Some(name)
}

/// Compares the output of `nft -j list ruleset` with `spec`. Set elements are not compared:
/// they change at run time and the proxy owns them.
pub fn diff(spec: &TableSpec, listed: &Nftables) -> Vec<Drift> {
    let ours: Vec<&NfListObject> = listed
        .objects
        .iter()
        .filter_map(|object| match object {
            NfObject::ListObject(object) if in_our_table(object) => Some(object),
            _ => None,
        })
        .collect();
    if !ours.iter().any(
        |o| matches!(o, NfListObject::Table(t) if t.family == NfFamily::INet && t.name == TABLE),
    ) {
        return vec![Drift::TableMissing];
    }
    let mut drift = Vec::new();
    diff_sets(spec, &ours, &mut drift);
    diff_chains(spec, &ours, &mut drift);
    diff_rules(spec, &ours, &mut drift);
    drift
}

fn in_our_table(object: &NfListObject) -> bool {
    let (family, table) = match object {
        NfListObject::Table(t) => (t.family, &t.name),
        NfListObject::Chain(c) => (c.family, &c.table),
        NfListObject::Rule(r) => (r.family, &r.table),
        NfListObject::Set(s) => (s.family, &s.table),
        NfListObject::Map(m) => (m.family, &m.table),
        _ => return false,
    };
    family == NfFamily::INet && table == TABLE
}

/// The sets `spec` has, with their types.
fn expected_sets(spec: &TableSpec) -> Vec<Set<'static>> {
    spec.families
        .iter()
        .map(set)
        .chain(
            spec.strict
                .iter()
                .flat_map(|_| [probes_set(PROBES_SET), probes_set(PROXIED_PROBES_SET)]),
        )
        .collect()
}

fn diff_sets(spec: &TableSpec, ours: &[&NfListObject], drift: &mut Vec<Drift>) {
    let listed: Vec<_> = ours
        .iter()
        .filter_map(|o| match o {
            NfListObject::Set(s) => Some(s),
            _ => None,
        })
        .collect();
    let expected = expected_sets(spec);
    for want in &expected {
        let name = set_name(want);
        match listed.iter().find(|s| s.name == name) {
            None => drift.push(Drift::SetMissing(name)),
            Some(found) if found.set_type != want.set_type => drift.push(Drift::SetChanged {
                name,
                found: type_name(&found.set_type),
            }),
            Some(_) => {}
        }
    }
    for found in listed {
        if !expected.iter().any(|want| want.name == found.name) {
            drift.push(Drift::UnexpectedSet(found.name.to_string()));
        }
    }
}

/// A set's name as the `'static` str it was built from.
fn set_name(set: &Set<'static>) -> &'static str {
    [Family::V4, Family::V6]
        .into_iter()
        .map(Family::set_name)
        .chain([PROBES_SET, PROXIED_PROBES_SET])
        .find(|name| *name == set.name)
        .unwrap_or("?")
}

fn type_name(value: &SetTypeValue) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("<{e}>"))
}

/// The chains `spec` has: the output chain, and strict mode's two.
fn expected_chains(spec: &TableSpec) -> Vec<(&'static str, Chain<'static>)> {
    std::iter::once((CHAIN, chain()))
        .chain(
            spec.strict
                .iter()
                .flat_map(|_| [(PROBE_CHAIN, probe_chain()), (STRICT_CHAIN, strict_chain())]),
        )
        .collect()
}

fn diff_chains(spec: &TableSpec, ours: &[&NfListObject], drift: &mut Vec<Drift>) {
    let expected = expected_chains(spec);
    let listed: Vec<_> = ours
        .iter()
        .filter_map(|o| match o {
            NfListObject::Chain(c) => Some(c),
            _ => None,
        })
        .collect();
    for (name, want) in &expected {
        match listed.iter().find(|c| c.name == *name) {
            None => drift.push(Drift::ChainMissing(name)),
            Some(found)
                if (found._type, found.hook, found.prio, found.policy)
                    != (want._type, want.hook, want.prio, want.policy) =>
            {
                drift.push(Drift::ChainChanged {
                    name,
                    found: format!(
                        "type {:?} hook {:?} priority {:?} policy {:?}",
                        found._type, found.hook, found.prio, found.policy
                    ),
                })
            }
            Some(_) => {}
        }
    }
    for found in listed {
        if !expected.iter().any(|(name, _)| *name == found.name) {
            drift.push(Drift::UnexpectedChain(found.name.to_string()));
        }
    }
}

fn diff_rules(spec: &TableSpec, ours: &[&NfListObject], drift: &mut Vec<Drift>) {
    for (chain, kinds) in [
        (CHAIN, RuleKind::all(spec)),
        (PROBE_CHAIN, RuleKind::probe_redirects(spec)),
        (STRICT_CHAIN, RuleKind::strict(spec)),
    ] {
        let found: Vec<_> = ours
            .iter()
            .filter_map(|o| match o {
                NfListObject::Rule(r) if r.chain == chain => Some(&r.expr),
                _ => None,
            })
            .collect();
        let expected: Vec<(RuleKind, _)> = kinds
            .into_iter()
            .map(|kind| (kind, kind.statements(spec)))
            .collect();
        let mut complete = true;
        for (kind, statements) in &expected {
            if !found.iter().any(|f| f.as_ref() == statements.as_slice()) {
                complete = false;
                drift.push(Drift::RuleMissing(kind.describe(spec)));
            }
        }
        for f in &found {
            if !expected.iter().any(|(_, s)| f.as_ref() == s.as_slice()) {
                complete = false;
                drift.push(Drift::UnexpectedRule(
                    serde_json::to_string(f.as_ref()).unwrap_or_else(|e| format!("<{e}>")),
                ));
            }
        }
        let in_order = found
            .iter()
            .map(|f| f.as_ref())
            .eq(expected.iter().map(|(_, s)| s.as_slice()));
        if complete && !in_order {
            drift.push(Drift::RulesReordered(chain));
        }
    }
}

#[cfg(test)]
mod tests {
    use nftables::schema::NfCmd;

    use super::super::ruleset::{Families, install_batch};
    use super::*;

    const SPEC: TableSpec = TableSpec {
        capture_port: 15001,
        families: Families {
            ipv4: true,
            ipv6: true,
        },
        strict: None,
    };

    /// What `nft -j list ruleset` shows after the install batch: its `add` objects, listed.
    fn listed(spec: &TableSpec) -> Vec<NfObject<'static>> {
        let batch = install_batch(spec, &[]);
        batch.objects[2..]
            .iter()
            .filter_map(|o| match o {
                NfObject::CmdObject(NfCmd::Add(obj)) => Some(NfObject::ListObject(obj.clone())),
                _ => None,
            })
            .collect()
    }

    fn nft(objects: Vec<NfObject<'static>>) -> Nftables<'static> {
        Nftables {
            objects: objects.into(),
        }
    }

    #[test]
    fn the_installed_table_has_no_drift() {
        assert_eq!(diff(&SPEC, &nft(listed(&SPEC))), []);
    }

    #[test]
    fn nft_json_listing_parses_and_matches() {
        // Real `nft -j list ruleset` output (nft 1.0.6) for the table, with another table
        // beside it that must be ignored.
        let text = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
          {"table": {"family": "ip", "name": "other", "handle": 1}},
          {"table": {"family": "inet", "name": "aether", "handle": 2}},
          {"set": {"family": "inet", "name": "capture4", "table": "aether", "type": ["ipv4_addr", "inet_service"], "handle": 2, "elem": [{"concat": ["10.96.0.10", 80]}]}},
          {"set": {"family": "inet", "name": "capture6", "table": "aether", "type": ["ipv6_addr", "inet_service"], "handle": 3}},
          {"chain": {"family": "inet", "table": "aether", "name": "output", "handle": 1, "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}},
          {"rule": {"family": "inet", "table": "aether", "chain": "output", "handle": 4, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 182910976}}, {"return": null}]}},
          {"rule": {"family": "inet", "table": "aether", "chain": "output", "handle": 5, "expr": [{"match": {"op": "==", "left": {"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"payload": {"protocol": "tcp", "field": "dport"}}]}, "right": "@capture4"}}, {"redirect": {"port": 15001}}]}},
          {"rule": {"family": "inet", "table": "aether", "chain": "output", "handle": 6, "expr": [{"match": {"op": "==", "left": {"concat": [{"payload": {"protocol": "ip6", "field": "daddr"}}, {"payload": {"protocol": "tcp", "field": "dport"}}]}, "right": "@capture6"}}, {"redirect": {"port": 15001}}]}}]}"#;
        let listed: Nftables = serde_json::from_str(text).unwrap();
        // The table of an earlier aether, whose first rule exempted marked sockets: drift, so
        // an upgraded proxy rewrites it.
        let [Drift::UnexpectedRule(exempt)] = &diff(&SPEC, &listed)[..] else {
            panic!("the old exemption is not drift: {:?}", diff(&SPEC, &listed));
        };
        assert!(exempt.contains("mark"), "{exempt}");
        let mut listed = listed;
        listed
            .objects
            .to_mut()
            .retain(|o| !format!("{o:?}").contains("Mark"));
        assert_eq!(diff(&SPEC, &listed), []);
        let other_port = TableSpec {
            capture_port: 15002,
            ..SPEC
        };
        let drift = diff(&other_port, &listed);
        assert!(drift.contains(&Drift::RuleMissing(
            "ip daddr . tcp dport @capture4 redirect to :15002".into()
        )));
        assert_eq!(
            drift
                .iter()
                .filter(|d| matches!(d, Drift::UnexpectedRule(_)))
                .count(),
            2
        );
    }

    #[test]
    fn other_tables_are_not_even_parsed() {
        let listing = serde_json::json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "ip", "name": "app", "handle": 1}},
            {"rule": {"family": "ip", "table": "app", "chain": "x", "expr": [{"some future expression": {}}]}},
            {"table": {"family": "inet", "name": "aether", "handle": 2}}
        ]});
        let ours = our_objects(&listing).unwrap();
        assert_eq!(ours.objects.len(), 1);
        assert!(diff(&SPEC, &ours).contains(&Drift::ChainMissing(CHAIN)));
        assert_eq!(
            our_objects(&serde_json::json!("nonsense"))
                .unwrap()
                .objects
                .len(),
            0
        );
    }

    #[test]
    fn a_missing_table_is_reported_alone() {
        assert_eq!(diff(&SPEC, &nft(vec![])), [Drift::TableMissing]);
        assert_eq!(
            Drift::TableMissing.to_string(),
            "table inet aether is missing"
        );
    }

    #[test]
    fn missing_pieces_are_named() {
        let objects: Vec<_> = listed(&SPEC)
            .into_iter()
            .filter(|o| {
                !matches!(o, NfObject::ListObject(NfListObject::Set(s)) if s.name == "capture6")
                    && !matches!(o, NfObject::ListObject(NfListObject::Chain(_)))
            })
            .collect();
        let drift = diff(&SPEC, &nft(objects));
        assert!(drift.contains(&Drift::SetMissing("capture6")), "{drift:?}");
        assert!(drift.contains(&Drift::ChainMissing(CHAIN)), "{drift:?}");
    }

    #[test]
    fn a_deleted_rule_is_named_in_nft_syntax() {
        let objects: Vec<_> = listed(&SPEC)
            .into_iter()
            .filter(|o| !matches!(o, NfObject::ListObject(NfListObject::Rule(r)) if serde_json::to_string(&r.expr).unwrap().contains("capture4")))
            .collect();
        let drift = diff(&SPEC, &nft(objects));
        assert_eq!(
            drift,
            [Drift::RuleMissing(
                "ip daddr . tcp dport @capture4 redirect to :15001".into()
            )]
        );
        assert_eq!(
            drift[0].to_string(),
            "rule `ip daddr . tcp dport @capture4 redirect to :15001` is missing"
        );
    }

    #[test]
    fn reordered_rules_are_reported() {
        let mut objects = listed(&SPEC);
        let first_rule = objects
            .iter()
            .position(|o| matches!(o, NfObject::ListObject(NfListObject::Rule(_))))
            .unwrap();
        objects.swap(first_rule, first_rule + 1);
        assert_eq!(diff(&SPEC, &nft(objects)), [Drift::RulesReordered(CHAIN)]);
    }

    #[test]
    fn a_changed_chain_and_extra_sets_are_reported() {
        let v4_only = TableSpec {
            families: Families {
                ipv4: true,
                ipv6: false,
            },
            ..SPEC
        };
        let mut objects = listed(&v4_only);
        objects.extend(listed(&SPEC).into_iter().filter(
            |o| matches!(o, NfObject::ListObject(NfListObject::Set(s)) if s.name == "capture6"),
        ));
        for object in &mut objects {
            if let NfObject::ListObject(NfListObject::Chain(c)) = object {
                c.prio = Some(0);
            }
        }
        let drift = diff(&v4_only, &nft(objects));
        assert!(
            drift.contains(&Drift::UnexpectedSet("capture6".into())),
            "{drift:?}"
        );
        assert!(
            drift.iter().any(
                |d| matches!(d, Drift::ChainChanged { found, .. } if found.contains("Some(0)"))
            ),
            "{drift:?}"
        );
    }

    #[test]
    fn a_protocol_listed_by_number_is_the_protocol_named() {
        let listing = serde_json::json!({"nftables": [
            {"rule": {"family": "inet", "table": TABLE, "chain": STRICT_CHAIN, "handle": 4, "expr": [
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": 6}},
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": 58}},
                {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 6}},
            ]}},
        ]});
        let listed = serde_json::to_value(our_objects(&listing).unwrap()).unwrap();
        let expr = &listed["nftables"][0]["rule"]["expr"];
        assert_eq!(expr[0]["match"]["right"], "tcp");
        assert_eq!(expr[1]["match"]["right"], "ipv6-icmp");
        assert_eq!(expr[2]["match"]["right"], 6, "a port stays a number");
    }
}
