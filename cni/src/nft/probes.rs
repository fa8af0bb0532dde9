//! The node's side of strict mode's probe path: a table in the node's own network namespace
//! that gives the node's own TCP connections to strict pods the probe source address. The
//! kubelet's probes come from an address of the node, as does anything else the node sends, and
//! traffic it forwards after masquerading (NodePort) looks the same to the pod. Translated here,
//! the probes arrive from [`PROBE_SOURCE_V4`] (or [`PROBE_SOURCE_V6`]), which a strict pod
//! admits on the ports its probes name only, as the probes use them (see [`super::ruleset`]'s
//! probe sets): any host process gets the same source, so it may do no more than a probe.
//! Forwarded traffic is not the node's own (`fib saddr type local` fails before any
//! masquerade), keeps its address and is refused.
//!
//! ```text
//! table inet aether-node {
//!     set strict4 { type ipv4_addr; }                      # this node's strict pods
//!     set strict6 { type ipv6_addr; }
//!     chain postrouting {
//!         type nat hook postrouting priority 90; policy accept;   # before kube-proxy's (100)
//!         fib saddr type local ip daddr @strict4 meta l4proto tcp snat ip to 169.254.7.127
//!         fib saddr type local ip6 daddr @strict6 meta l4proto tcp snat ip6 to fd16:9254:7127::1
//!     }
//! }
//! ```
//!
//! A pod's reply goes to its default gateway, the node, whose conntrack translates it back.
//! Pure: building batches touches no system.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;

use nftables::batch::Batch;
use nftables::expr::{Expression, Fib, FibFlag, FibResult, NamedExpression};
use nftables::schema::{
    Chain, Element, NfListObject, NfObject, Nftables, Rule, Set, SetTypeValue, Table,
};
use nftables::stmt::{Match, NAT, NATFamily, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::ruleset::{Family, l4proto, payload};

pub const NODE_TABLE: &str = "aether-node";
const CHAIN: &str = "postrouting";
/// Just before NF_IP_PRI_NAT_SRC (100), where kube-proxy masquerades: the first source
/// translation of a connection is the one it keeps.
const PRIORITY: i32 = 90;
/// The table has both families' sets and rules, whatever the node's pods have.
const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

fn set_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "strict4",
        Family::V6 => "strict6",
    }
}

fn nat_family(family: Family) -> NATFamily {
    match family {
        Family::V4 => NATFamily::IP,
        Family::V6 => NATFamily::IP6,
    }
}

fn table() -> Table<'static> {
    Table {
        family: NfFamily::INet,
        name: NODE_TABLE.into(),
        handle: None,
    }
}

/// The table with `pods` (the addresses of this node's strict pods) in its sets, replacing
/// whatever table was there, in one transaction.
pub fn node_batch(pods: &[IpAddr]) -> Nftables<'static> {
    let mut batch = Batch::new();
    batch.add(NfListObject::Table(table()));
    batch.delete(NfListObject::Table(table()));
    batch.add(NfListObject::Table(table()));
    for family in FAMILIES {
        batch.add(NfListObject::Set(Box::new(Set {
            family: NfFamily::INet,
            table: NODE_TABLE.into(),
            name: set_name(family).into(),
            handle: None,
            set_type: SetTypeValue::Single(family.addr_type()),
            policy: None,
            flags: None,
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        })));
    }
    batch.add(NfListObject::Chain(Chain {
        family: NfFamily::INet,
        table: NODE_TABLE.into(),
        name: CHAIN.into(),
        _type: Some(NfChainType::NAT),
        hook: Some(NfHook::Postrouting),
        prio: Some(PRIORITY),
        policy: Some(NfChainPolicy::Accept),
        newname: None,
        handle: None,
        dev: None,
    }));
    for family in FAMILIES {
        batch.add(NfListObject::Rule(Rule {
            family: NfFamily::INet,
            table: NODE_TABLE.into(),
            chain: CHAIN.into(),
            expr: Cow::Owned(probe_translation(family)),
            handle: None,
            index: None,
            comment: None,
        }));
        let unique = addresses(pods, family);
        if !unique.is_empty() {
            batch.add(NfListObject::Element(Element {
                family: NfFamily::INet,
                table: NODE_TABLE.into(),
                name: set_name(family).into(),
                elem: Cow::Owned(
                    unique
                        .into_iter()
                        .map(|ip| Expression::String(ip.into()))
                        .collect(),
                ),
            }));
        }
    }
    batch.to_nftables()
}

/// How `listed` (the table's objects, as `nft` lists them) differs from what [`node_batch`]
/// makes for `pods`, in words; `None` when it does not.
pub fn node_drift(listed: &Nftables, pods: &[IpAddr]) -> Option<String> {
    let objects: Vec<&NfListObject> = listed
        .objects
        .iter()
        .filter_map(|o| match o {
            NfObject::ListObject(o) => Some(o),
            NfObject::CmdObject(_) => None,
        })
        .collect();
    if !objects
        .iter()
        .any(|o| matches!(o, NfListObject::Table(t) if t.name == NODE_TABLE))
    {
        return Some(format!("table inet {NODE_TABLE} is missing"));
    }
    let chain_is_ours = objects.iter().any(|o| {
        matches!(o, NfListObject::Chain(c) if c.name == CHAIN
            && (c._type, c.hook, c.prio) == (Some(NfChainType::NAT), Some(NfHook::Postrouting), Some(PRIORITY)))
    });
    if !chain_is_ours {
        return Some(format!("chain {CHAIN} is missing or changed"));
    }
    let rules: Vec<&[Statement]> = objects
        .iter()
        .filter_map(|o| match o {
            NfListObject::Rule(r) if r.chain == CHAIN => Some(r.expr.as_ref()),
            _ => None,
        })
        .collect();
    let expected: Vec<Vec<Statement>> = FAMILIES.into_iter().map(probe_translation).collect();
    if !rules.iter().copied().eq(expected.iter().map(Vec::as_slice)) {
        return Some(format!("the rules of chain {CHAIN} changed"));
    }
    for family in FAMILIES {
        let listed: BTreeSet<String> = objects
            .iter()
            .filter_map(|o| match o {
                NfListObject::Set(s) if s.name == set_name(family) => Some(s),
                _ => None,
            })
            .flat_map(|s| s.elem.iter().flat_map(|e| e.iter()))
            .filter_map(|e| match e {
                Expression::String(ip) => Some(ip.to_string()),
                _ => None,
            })
            .collect();
        if listed != addresses(pods, family) {
            return Some(format!("set {} holds {listed:?}", set_name(family)));
        }
    }
    None
}

/// The addresses of `family` among `pods`, as `nft` lists them.
fn addresses(pods: &[IpAddr], family: Family) -> BTreeSet<String> {
    pods.iter()
        .filter(|ip| Family::of(**ip) == family)
        .map(ToString::to_string)
        .collect()
}

/// Removes the table; idempotent.
pub fn node_delete_batch() -> Nftables<'static> {
    let mut batch = Batch::new();
    batch.add(NfListObject::Table(table()));
    batch.delete(NfListObject::Table(table()));
    batch.to_nftables()
}

/// `fib saddr type local ip daddr @strict4 meta l4proto tcp snat ip to 169.254.7.127`.
fn probe_translation(family: Family) -> Vec<Statement<'static>> {
    vec![
        Statement::Match(Match {
            left: Expression::Named(NamedExpression::Fib(Fib {
                result: FibResult::Type,
                flags: HashSet::from([FibFlag::Saddr]),
            })),
            right: Expression::String("local".into()),
            op: Operator::EQ,
        }),
        Statement::Match(Match {
            left: payload(family.protocol(), "daddr"),
            right: Expression::String(format!("@{}", set_name(family)).into()),
            op: Operator::EQ,
        }),
        Statement::Match(l4proto("tcp")),
        Statement::SNAT(Some(NAT {
            addr: Some(Expression::String(family.probe_source().to_string().into())),
            family: Some(nat_family(family)),
            port: None,
            flags: None,
        })),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn the_node_table_translates_the_nodes_own_tcp_to_strict_pods() {
        let pods: Vec<IpAddr> = ["10.244.1.5", "10.244.1.5", "fd00:244::5"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        let batch: Value = serde_json::to_value(node_batch(&pods)).unwrap();
        let cmds = batch["nftables"].as_array().unwrap();
        let rules: Vec<&Value> = cmds.iter().filter_map(|c| c["add"].get("rule")).collect();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[0]["expr"],
            json!([
                {"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["saddr"]}}, "right": "local"}},
                {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@strict4"}},
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
                {"snat": {"addr": "169.254.7.127", "family": "ip"}}
            ])
        );
        let elements: Vec<&Value> = cmds
            .iter()
            .filter_map(|c| c["add"].get("element"))
            .collect();
        assert_eq!(elements[0]["elem"], json!(["10.244.1.5"]), "deduplicated");
        assert_eq!(elements[1]["elem"], json!(["fd00:244::5"]));
        // No strict pod: the sets stay empty (an empty element list is a syntax error).
        let empty: Value = serde_json::to_value(node_batch(&[])).unwrap();
        assert!(
            empty["nftables"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["add"].get("element").is_none())
        );
    }

    /// What `nft -j list ruleset` shows after `node_batch(pods)`: its last `add` of each
    /// object, with the elements inside their sets.
    fn listed(pods: &[IpAddr]) -> Nftables<'static> {
        let batch = node_batch(pods);
        let mut objects: Vec<NfObject<'static>> = Vec::new();
        for object in batch.objects.iter().skip(2) {
            let NfObject::CmdObject(nftables::schema::NfCmd::Add(object)) = object else {
                continue;
            };
            match object {
                NfListObject::Element(e) => {
                    for listed in &mut objects {
                        if let NfObject::ListObject(NfListObject::Set(set)) = listed
                            && set.name == e.name
                        {
                            set.elem = Some(e.elem.clone());
                        }
                    }
                }
                other => objects.push(NfObject::ListObject(other.clone())),
            }
        }
        Nftables {
            objects: objects.into(),
        }
    }

    #[test]
    fn the_node_table_as_applied_has_no_drift_and_anything_else_has() {
        let pods: Vec<IpAddr> = vec!["10.244.1.5".parse().unwrap()];
        assert_eq!(node_drift(&listed(&pods), &pods), None);
        assert_eq!(node_drift(&listed(&[]), &[]), None);
        assert_eq!(
            node_drift(&listed(&[]), &pods).as_deref(),
            Some("set strict4 holds {}")
        );
        let empty = Nftables {
            objects: Vec::new().into(),
        };
        assert_eq!(
            node_drift(&empty, &pods).as_deref(),
            Some("table inet aether-node is missing")
        );
        let mut no_rules = listed(&pods);
        no_rules.objects = no_rules
            .objects
            .iter()
            .filter(|o| !matches!(o, NfObject::ListObject(NfListObject::Rule(_))))
            .cloned()
            .collect::<Vec<_>>()
            .into();
        assert_eq!(
            node_drift(&no_rules, &pods).as_deref(),
            Some("the rules of chain postrouting changed")
        );
    }
}
