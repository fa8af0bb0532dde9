//! AuthorizationPolicies, as pure functions of the index: each policy checked field by field
//! and compiled into the data plane's form ([`aether_core::authz::Policy`]), the nodes that
//! enforce it (those running meshed pods it selects), and its status.

use std::collections::{BTreeMap, BTreeSet};

use aether_core::authz::{
    Action, HttpMatch, Mode, NodeAuthorization, Policy, Rule, ServiceAccountName, Source,
};
use aether_core::identity::ServiceAccount;
use aether_crds::authorization_policy::{
    AuthorizationPolicySpec, AuthorizationPolicyStatus, AuthorizationRule, AuthorizationSource,
};
use aether_crds::conditions::{self, reason};
use aether_routing::RouteRules;
use aether_routing::RuleError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::index::{Index, Key, key};
use crate::status::condition;

/// A policy object as the index holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyObject {
    pub generation: Option<i64>,
    pub spec: AuthorizationPolicySpec,
}

/// One policy as the proxies enforce it, with a reason per invalid field.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledPolicy {
    pub key: Key,
    pub generation: Option<i64>,
    pub compiled: Compiled,
    /// The targets as one line, for `kubectl get`.
    pub targets: String,
}

/// What [`compile`] makes of a policy. An invalid policy fails closed on the targets it can
/// resolve, so that an edit with a typo never opens a workload its valid version closed: an
/// ALLOW keeps only its valid rules, and a DENY with a rule it cannot read, or a policy whose
/// action is unknown, admits nothing. A policy with no resolvable target enforces nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub enforced: Option<Policy>,
    /// Every invalid field; empty for a valid policy.
    pub reasons: Vec<String>,
}

/// Compiles every policy of the index.
pub fn compile_all(index: &Index) -> BTreeMap<Key, CompiledPolicy> {
    index
        .policies
        .iter()
        .map(|(k, object)| {
            let compiled = CompiledPolicy {
                key: k.clone(),
                generation: object.generation,
                compiled: compile(index, &k.0, &k.1, &object.spec),
                targets: target_summary(&object.spec),
            };
            (k.clone(), compiled)
        })
        .collect()
}

fn target_summary(spec: &AuthorizationPolicySpec) -> String {
    let mut parts: Vec<String> = spec
        .target_refs
        .iter()
        .map(|t| format!("{}/{}", t.kind, t.name))
        .collect();
    if let Some(selector) = &spec.selector {
        let labels: Vec<String> = selector
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.push(format!("pods {}", labels.join(",")));
    }
    if parts.is_empty() {
        "namespace".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The policy in the data plane's form, and every reason it is invalid.
pub fn compile(
    index: &Index,
    namespace: &str,
    name: &str,
    spec: &AuthorizationPolicySpec,
) -> Compiled {
    let mut reasons = Vec::new();
    let action = match spec.action.as_str() {
        "ALLOW" => Some(Action::Allow),
        "DENY" => Some(Action::Deny),
        other => {
            reasons.push(format!("spec.action: {other:?} is not ALLOW or DENY"));
            None
        }
    };
    let mode = match spec.mode.as_deref() {
        None | Some("Enforce") => Mode::Enforce,
        Some("Audit") => Mode::Audit,
        Some(other) => {
            reasons.push(format!("spec.mode: {other:?} is not Enforce or Audit"));
            Mode::Enforce
        }
    };
    let mut selectors = Vec::new();
    for (i, target) in spec.target_refs.iter().enumerate() {
        let field = format!("spec.targetRefs[{i}]");
        if !matches!(target.group.as_str(), "" | "core") || target.kind != "Service" {
            reasons.push(format!(
                "{field}: only a Service (group \"\", kind Service) can be a target, not {:?} {:?}",
                target.group, target.kind
            ));
            continue;
        }
        match index.services.get(&key(namespace, &target.name)) {
            None => reasons.push(format!(
                "{field}: Service {namespace}/{} not found",
                target.name
            )),
            Some(service) => match service.selector.as_ref().filter(|s| !s.is_empty()) {
                Some(selector) => selectors.push(selector.clone()),
                None => reasons.push(format!(
                    "{field}: Service {namespace}/{} has no selector, so no pods of its own; select them with spec.selector",
                    target.name
                )),
            },
        }
    }
    if let Some(selector) = &spec.selector {
        selectors.push(selector.match_labels.clone());
    }
    if spec.target_refs.is_empty() && spec.selector.is_none() {
        selectors.push(BTreeMap::new());
    }
    let (mut rules, mut unreadable_rule) = (Vec::new(), false);
    for (i, rule) in spec.rules.iter().enumerate() {
        match compile_rule(index, namespace, &format!("spec.rules[{i}]"), rule) {
            Ok(rule) => rules.push(rule),
            Err(mut why) => {
                reasons.append(&mut why);
                unreadable_rule = true;
            }
        }
    }
    let (action, rules) = match action {
        Some(Action::Allow) => (Action::Allow, rules),
        Some(Action::Deny) if !unreadable_rule => (Action::Deny, rules),
        _ => (Action::Allow, Vec::new()),
    };
    let enforced = (!selectors.is_empty()).then(|| Policy {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        action,
        mode,
        selectors,
        rules,
    });
    Compiled { enforced, reasons }
}

fn compile_rule(
    index: &Index,
    namespace: &str,
    field: &str,
    rule: &AuthorizationRule,
) -> Result<Rule, Vec<String>> {
    let mut reasons = Vec::new();
    if rule.sources.is_empty() {
        reasons.push(format!("{field}.sources: a rule needs at least one source"));
    }
    let sources: Vec<Source> = rule
        .sources
        .iter()
        .enumerate()
        .filter_map(|(j, s)| {
            source(s)
                .map_err(|why| reasons.push(format!("{field}.sources[{j}]: {why}")))
                .ok()
        })
        .collect();
    let mut ports = Vec::new();
    for (j, port) in rule.ports.iter().enumerate() {
        match u16::try_from(*port).ok().filter(|p| *p != 0) {
            Some(port) => ports.push(port),
            None => reasons.push(format!(
                "{field}.ports[{j}]: {port} is not a port (1 to 65535)"
            )),
        }
    }
    let http = match (&rule.route_rule, rule.http.is_empty()) {
        (Some(_), false) => {
            reasons.push(format!("{field}: set http or routeRule, not both"));
            Vec::new()
        }
        (Some(reference), true) => {
            match route_rule_matches(index, namespace, &reference.route, &reference.rule) {
                Ok(matches) => matches,
                Err(why) => {
                    reasons.push(format!("{field}.routeRule: {why}"));
                    Vec::new()
                }
            }
        }
        (None, _) => match http_matches(&rule.http) {
            Ok(matches) => matches,
            Err(why) => {
                reasons.push(format!("{field}.http: {why}"));
                Vec::new()
            }
        },
    };
    let unauthenticated = sources.iter().any(|s| matches!(s, Source::Unauthenticated));
    if unauthenticated && (!ports.is_empty() || !http.is_empty()) {
        reasons.push(format!(
            "{field}: a rule with an unauthenticated source can have no ports, http or routeRule: plaintext callers do not pass through aether's proxy"
        ));
    }
    if reasons.is_empty() {
        Ok(Rule {
            sources,
            ports,
            http,
        })
    } else {
        Err(reasons)
    }
}

fn source(s: &AuthorizationSource) -> Result<Source, String> {
    let set = [
        s.service_account.is_some(),
        s.namespace.is_some(),
        s.spiffe_id.is_some(),
        s.unauthenticated.is_some(),
    ];
    if set.iter().filter(|x| **x).count() != 1 {
        return Err(
            "set exactly one of serviceAccount, namespace, spiffeId and unauthenticated".into(),
        );
    }
    if let Some(text) = &s.service_account {
        let sa: ServiceAccount = text.parse().map_err(|e| format!("serviceAccount: {e}"))?;
        return Ok(Source::ServiceAccount(ServiceAccountName {
            namespace: sa.namespace,
            name: sa.name,
        }));
    }
    if let Some(namespace) = &s.namespace {
        if !aether_core::k8s_names::is_dns1123_label(namespace) {
            return Err(format!("namespace: {namespace:?} is not a namespace name"));
        }
        return Ok(Source::Namespace(namespace.clone()));
    }
    if let Some(id) = &s.spiffe_id {
        let valid = id
            .strip_prefix("spiffe://")
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(domain, path)| {
                aether_core::k8s_names::is_trust_domain(domain)
                    && !path.is_empty()
                    && path.split('/').all(|segment| !segment.is_empty())
            });
        if !valid {
            return Err(format!(
                "spiffeId: {id:?} is not a SPIFFE ID (spiffe://<trust-domain>/<path>)"
            ));
        }
        return Ok(Source::SpiffeId(id.clone()));
    }
    match s.unauthenticated {
        Some(true) => Ok(Source::Unauthenticated),
        _ => Err("unauthenticated: only true is meaningful; leave the source out instead".into()),
    }
}

fn http_matches(matches: &[aether_crds::http::HttpRouteMatch]) -> Result<Vec<HttpMatch>, String> {
    if matches.is_empty() {
        return Ok(Vec::new());
    }
    let entries = aether_routing::request_matches(matches).map_err(|e| match e {
        RuleError::InvalidRegex {
            pattern, message, ..
        } => {
            // The regex crate's message draws the pattern over several lines; its last says why.
            let why = message.lines().last().unwrap_or_default().trim();
            format!("invalid regular expression {pattern:?}: {why}")
        }
        RuleError::InvalidHeader { what, value, .. } => format!("invalid header {what} {value:?}"),
        RuleError::InvalidValue { message, .. } => message,
        other => other.to_string(),
    })?;
    Ok(entries
        .into_iter()
        .map(|entry| HttpMatch {
            path: Some(entry.path),
            method: entry.method,
            headers: entry.headers,
            query: entry.query,
        })
        .collect())
}

/// The matches of the rule named `rule` of the HTTPRoute `route` (no match is every request).
fn route_rule_matches(
    index: &Index,
    namespace: &str,
    route: &str,
    rule: &str,
) -> Result<Vec<HttpMatch>, String> {
    let source = index
        .routes
        .get(&("HTTPRoute", namespace.to_owned(), route.to_owned()))
        .ok_or_else(|| format!("HTTPRoute {namespace}/{route} not found"))?;
    let RouteRules::Http(rules) = &source.rules else {
        return Err(format!(
            "HTTPRoute {namespace}/{route} is not accepted, so its rules cannot be named"
        ));
    };
    let named = rules
        .iter()
        .find(|r| r.name.as_deref() == Some(rule))
        .ok_or_else(|| format!("HTTPRoute {namespace}/{route} has no rule named {rule:?}"))?;
    let matches = named.matches.clone().unwrap_or_default();
    if matches.is_empty() {
        return http_matches(&[aether_crds::http::HttpRouteMatch::default()]);
    }
    http_matches(&matches)
}

/// The pods a policy selects: meshed, running, of its namespace, carrying one selector's labels.
fn selected<'a>(
    index: &'a Index,
    policy: &'a Policy,
) -> impl Iterator<Item = &'a crate::index::PodData> + 'a {
    index
        .pods
        .range((policy.namespace.clone(), String::new())..)
        .take_while(|((namespace, _), _)| *namespace == policy.namespace)
        .map(|(_, pod)| pod)
        .filter(|pod| pod.meshed && !pod.terminating)
        .filter(|pod| {
            policy
                .selectors
                .iter()
                .any(|s| s.iter().all(|(k, v)| pod.labels.get(k) == Some(v)))
        })
}

/// The nodes running pods the policy selects: where it is enforced.
pub fn nodes_of(index: &Index, policy: &Policy) -> BTreeSet<String> {
    selected(index, policy)
        .filter_map(|pod| pod.node.clone())
        .collect()
}

/// What one node's proxy enforces: the accepted policies and the denying namespaces among the
/// namespaces of its meshed pods.
pub fn node_authorization(
    policies: &BTreeMap<Key, CompiledPolicy>,
    deny_by_default: &BTreeSet<String>,
    client_namespaces: &BTreeSet<String>,
) -> NodeAuthorization {
    NodeAuthorization {
        policies: policies
            .values()
            .filter(|p| client_namespaces.contains(&p.key.0))
            .filter_map(|p| p.compiled.enforced.clone())
            .collect(),
        deny_by_default: deny_by_default
            .intersection(client_namespaces)
            .cloned()
            .collect(),
    }
}

/// The status of one policy: `Accepted` with every reason, `Programmed` naming the nodes that
/// enforce it and whether each has applied it.
pub fn policy_status(
    index: &Index,
    compiled: &CompiledPolicy,
    required: &crate::status::Required,
    previous: Option<&AuthorizationPolicyStatus>,
    now: &Time,
) -> AuthorizationPolicyStatus {
    let previous: &[Condition] = previous.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let generation = compiled.generation;
    let cond = |kind: &str, ok: bool, reason: &str, message: &str| {
        condition(kind, ok, reason, message, generation, previous, now)
    };
    let reasons = &compiled.compiled.reasons;
    let accepted = if reasons.is_empty() {
        cond(
            conditions::ACCEPTED,
            true,
            reason::ACCEPTED,
            "the policy is valid",
        )
    } else {
        cond(
            conditions::ACCEPTED,
            false,
            reason::INVALID,
            &reasons.join("; "),
        )
    };
    let Some(policy) = &compiled.compiled.enforced else {
        let programmed = cond(
            conditions::PROGRAMMED,
            false,
            reason::INVALID,
            "not enforced: none of its targets is valid",
        );
        return AuthorizationPolicyStatus {
            observed_generation: generation,
            target_summary: Some(compiled.targets.clone()),
            nodes: Vec::new(),
            conditions: vec![accepted, programmed],
        };
    };
    let nodes: Vec<String> = nodes_of(index, policy).into_iter().collect();
    let lagging: Vec<&str> = nodes
        .iter()
        .filter(|node| {
            let applied = index.node_configs.get(*node).and_then(|(have, _)| *have);
            match (applied, required.get(*node)) {
                (Some(have), Some(need)) => have < *need,
                _ => true,
            }
        })
        .map(String::as_str)
        .collect();
    let (ok, why, mut message) = if nodes.is_empty() {
        (
            true,
            reason::PROGRAMMED,
            "no meshed pod selected yet; a node enforces it once it runs one".to_owned(),
        )
    } else if lagging.is_empty() {
        (
            true,
            reason::PROGRAMMED,
            format!("enforced on {}", nodes.join(", ")),
        )
    } else {
        (
            false,
            reason::PENDING,
            format!(
                "enforced on {} of {} nodes; not yet applied by {}",
                nodes.len() - lagging.len(),
                nodes.len(),
                lagging.join(", ")
            ),
        )
    };
    if !reasons.is_empty() {
        message.push_str(
            "; while invalid it fails closed: its invalid rules admit nothing (a DENY with one, or an unknown action, admits no caller at all)",
        );
    }
    let programmed = cond(conditions::PROGRAMMED, ok, why, &message);
    AuthorizationPolicyStatus {
        observed_generation: generation,
        target_summary: Some(compiled.targets.clone()),
        nodes,
        conditions: vec![accepted, programmed],
    }
}

#[cfg(test)]
mod tests {
    use aether_crds::authorization_policy::{PolicyTargetRef, RouteRuleRef, WorkloadSelector};
    use aether_crds::http::{HttpPathMatch, HttpRouteMatch, HttpRouteRule, PathMatchType};
    use aether_routing::RouteSource;

    use super::*;
    use crate::index::{PodData, ServiceData};

    fn index() -> Index {
        let mut index = Index::default();
        index.services.insert(
            key("shop", "checkout"),
            ServiceData {
                selector: Some(BTreeMap::from([("app".into(), "checkout".into())])),
                ..ServiceData::default()
            },
        );
        index
            .services
            .insert(key("shop", "manual"), ServiceData::default());
        let rule = HttpRouteRule {
            name: Some("reads".into()),
            matches: Some(vec![HttpRouteMatch {
                path: Some(HttpPathMatch {
                    r#type: Some(PathMatchType::Exact),
                    value: Some("/items".into()),
                }),
                ..HttpRouteMatch::default()
            }]),
            ..HttpRouteRule::default()
        };
        index.routes.insert(
            ("HTTPRoute", "shop".into(), "checkout".into()),
            RouteSource {
                route: aether_routing::table::RouteRef {
                    kind: aether_routing::table::RouteKind::HTTPRoute,
                    namespace: "shop".into(),
                    name: "checkout".into(),
                },
                created: None,
                parents: Vec::new(),
                rules: RouteRules::Http(vec![rule]),
            },
        );
        for (name, app, node) in [
            ("c1", "checkout", "n1"),
            ("c2", "checkout", "n2"),
            ("w", "web", "n3"),
        ] {
            index.pods.insert(
                key("shop", name),
                PodData {
                    node: Some(node.into()),
                    service_account: ServiceAccount::new("shop", app),
                    labels: BTreeMap::from([("app".into(), app.into())]),
                    meshed: true,
                    depends_on: Vec::new(),
                    terminating: false,
                    ips: Vec::new(),
                },
            );
        }
        index
    }

    fn source_sa(sa: &str) -> AuthorizationSource {
        AuthorizationSource {
            service_account: Some(sa.into()),
            ..AuthorizationSource::default()
        }
    }

    fn spec(rules: Vec<AuthorizationRule>) -> AuthorizationPolicySpec {
        AuthorizationPolicySpec {
            target_refs: vec![PolicyTargetRef {
                group: String::new(),
                kind: "Service".into(),
                name: "checkout".into(),
            }],
            selector: None,
            action: "ALLOW".into(),
            mode: None,
            rules,
        }
    }

    #[test]
    fn a_valid_policy_compiles_with_its_service_selector_and_a_route_rule() {
        let policy = compile(
            &index(),
            "shop",
            "p",
            &spec(vec![AuthorizationRule {
                sources: vec![source_sa("shop/web")],
                ports: vec![8080],
                http: Vec::new(),
                route_rule: Some(RouteRuleRef {
                    route: "checkout".into(),
                    rule: "reads".into(),
                }),
            }]),
        );
        assert!(policy.reasons.is_empty(), "{:?}", policy.reasons);
        let policy = policy.enforced.unwrap();
        assert_eq!(policy.action, Action::Allow);
        assert_eq!(
            policy.selectors,
            [BTreeMap::from([("app".into(), "checkout".into())])]
        );
        let rule = &policy.rules[0];
        assert_eq!(rule.ports, [8080]);
        assert_eq!(
            rule.http[0].path,
            Some(aether_core::route_table::PathMatch::Exact("/items".into()))
        );
        assert_eq!(
            nodes_of(&index(), &policy).into_iter().collect::<Vec<_>>(),
            ["n1", "n2"]
        );
    }

    #[test]
    fn every_invalid_field_has_its_reason() {
        let mut bad = spec(vec![
            AuthorizationRule {
                sources: vec![
                    source_sa("web"),
                    AuthorizationSource::default(),
                    AuthorizationSource {
                        spiffe_id: Some("http://x".into()),
                        ..AuthorizationSource::default()
                    },
                    AuthorizationSource {
                        unauthenticated: Some(true),
                        ..AuthorizationSource::default()
                    },
                ],
                ports: vec![0, 70000, 8080],
                http: vec![HttpRouteMatch {
                    path: Some(HttpPathMatch {
                        r#type: Some(PathMatchType::RegularExpression),
                        value: Some("(".into()),
                    }),
                    ..HttpRouteMatch::default()
                }],
                route_rule: None,
            },
            AuthorizationRule {
                sources: Vec::new(),
                ports: Vec::new(),
                http: Vec::new(),
                route_rule: Some(RouteRuleRef {
                    route: "checkout".into(),
                    rule: "writes".into(),
                }),
            },
        ]);
        bad.action = "PERMIT".into();
        bad.mode = Some("DryRun".into());
        bad.target_refs.push(PolicyTargetRef {
            group: String::new(),
            kind: "Service".into(),
            name: "missing".into(),
        });
        bad.target_refs.push(PolicyTargetRef {
            group: "apps".into(),
            kind: "Deployment".into(),
            name: "x".into(),
        });
        bad.target_refs.push(PolicyTargetRef {
            group: String::new(),
            kind: "Service".into(),
            name: "manual".into(),
        });
        let Compiled { enforced, reasons } = compile(&index(), "shop", "p", &bad);
        // Its one valid target stays closed: an unknown action admits nothing.
        let enforced = enforced.unwrap();
        assert_eq!((enforced.action, enforced.rules.len()), (Action::Allow, 0));
        let expected = [
            "spec.action: \"PERMIT\" is not ALLOW or DENY",
            "spec.mode: \"DryRun\" is not Enforce or Audit",
            "spec.targetRefs[1]: Service shop/missing not found",
            "spec.targetRefs[2]: only a Service",
            "spec.targetRefs[3]: Service shop/manual has no selector",
            "spec.rules[0].sources[0]: serviceAccount:",
            "spec.rules[0].sources[1]: set exactly one of",
            "spec.rules[0].sources[2]: spiffeId:",
            "spec.rules[0].ports[0]: 0 is not a port",
            "spec.rules[0].ports[1]: 70000 is not a port",
            "spec.rules[0].http: invalid regular expression",
            "spec.rules[0]: a rule with an unauthenticated source",
            "spec.rules[1].sources: a rule needs at least one source",
            "spec.rules[1].routeRule: HTTPRoute shop/checkout has no rule named \"writes\"",
        ];
        assert_eq!(reasons.len(), expected.len(), "{reasons:#?}");
        for (reason, start) in reasons.iter().zip(expected) {
            assert!(
                reason.starts_with(start),
                "{reason:?} should start with {start:?}"
            );
        }
    }

    #[test]
    fn an_invalid_policy_fails_closed_on_the_targets_it_resolves() {
        let good = AuthorizationRule {
            sources: vec![source_sa("shop/web")],
            ..AuthorizationRule::default()
        };
        let typo = AuthorizationRule {
            sources: vec![source_sa("web")],
            ..AuthorizationRule::default()
        };
        let allow = compile(
            &index(),
            "shop",
            "p",
            &spec(vec![good.clone(), typo.clone()]),
        );
        assert_eq!(allow.reasons.len(), 1);
        let allow = allow.enforced.unwrap();
        assert_eq!((allow.action, allow.rules.len()), (Action::Allow, 1));

        let mut deny = spec(vec![good.clone(), typo]);
        deny.action = "DENY".into();
        let deny = compile(&index(), "shop", "p", &deny).enforced.unwrap();
        assert_eq!((deny.action, deny.rules.len()), (Action::Allow, 0));

        let mut nowhere = spec(vec![good]);
        nowhere.target_refs[0].name = "missing".into();
        let nowhere = compile(&index(), "shop", "p", &nowhere);
        assert_eq!((nowhere.enforced, nowhere.reasons.len()), (None, 1));
    }

    #[test]
    fn no_target_is_the_whole_namespace_and_a_selector_adds_pods() {
        let mut s = spec(Vec::new());
        s.target_refs.clear();
        let all = compile(&index(), "shop", "p", &s).enforced.unwrap();
        assert_eq!(all.selectors, [BTreeMap::new()]);
        assert_eq!(nodes_of(&index(), &all).len(), 3);
        s.selector = Some(WorkloadSelector {
            match_labels: BTreeMap::from([("app".into(), "web".into())]),
        });
        let web = compile(&index(), "shop", "p", &s).enforced.unwrap();
        assert_eq!(
            nodes_of(&index(), &web).into_iter().collect::<Vec<_>>(),
            ["n3"]
        );
    }

    #[test]
    fn a_node_gets_the_accepted_policies_of_its_namespaces_only() {
        let index = index();
        let mut policies = BTreeMap::new();
        let good = compile(&index, "shop", "good", &spec(Vec::new()));
        let bad = Compiled {
            enforced: None,
            reasons: vec!["x".to_owned()],
        };
        for (name, compiled) in [("good", good), ("bad", bad)] {
            policies.insert(
                key("shop", name),
                CompiledPolicy {
                    key: key("shop", name),
                    generation: Some(1),
                    compiled,
                    targets: String::new(),
                },
            );
        }
        let deny: BTreeSet<String> = ["shop".into(), "other".into()].into();
        let shop: BTreeSet<String> = ["shop".into()].into();
        let node = node_authorization(&policies, &deny, &shop);
        assert_eq!(node.policies.len(), 1);
        assert_eq!(node.policies[0].name, "good");
        assert_eq!(node.deny_by_default, ["shop"]);
        assert!(node_authorization(&policies, &deny, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn programmed_names_the_enforcing_nodes_and_those_behind() {
        let mut index = index();
        let compiled = CompiledPolicy {
            key: key("shop", "p"),
            generation: Some(2),
            compiled: compile(&index, "shop", "p", &spec(Vec::new())),
            targets: "Service/checkout".into(),
        };
        index.node_configs.insert("n1".into(), (Some(5), Some(5)));
        index.node_configs.insert("n2".into(), (Some(3), Some(5)));
        let required = crate::status::Required::from([("n1".into(), 5), ("n2".into(), 5)]);
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let status = policy_status(&index, &compiled, &required, None, &now);
        assert_eq!(status.nodes, ["n1", "n2"]);
        let programmed = &status.conditions[1];
        assert_eq!(programmed.status, "False");
        assert!(
            programmed.message.contains("not yet applied by n2"),
            "{}",
            programmed.message
        );
        index.node_configs.insert("n2".into(), (Some(5), Some(5)));
        let status = policy_status(&index, &compiled, &required, None, &now);
        assert_eq!(status.conditions[1].message, "enforced on n1, n2");
        assert_eq!(status.target_summary.as_deref(), Some("Service/checkout"));
    }
}
