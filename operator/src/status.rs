//! Status, computed as pure functions of the index and the compiled targets: the
//! RouteTarget status, and the `status.parents` entries aether owns in Gateway API routes.

use std::collections::BTreeMap;

use aether_core::names::CONTROLLER_NAME;
use aether_crds::conditions::{self, reason};
use aether_crds::route_status::{ParentReference, RouteParentStatus};
use aether_crds::route_target::{AttachedRoute, ResolvedBackend, RouteTargetStatus, TargetPort};
use aether_routing::Verdict;
use aether_routing::table::{BackendTarget, RouteKind};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::index::{Index, Key};
use crate::targets::Target;

/// A condition that keeps its previous transition time while its status stays the same.
pub fn condition(
    kind: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// For each node, the generation of its NodeConfig that holds what the current model computed
/// for it (the config pass's own write, or the generation already stored when nothing changed).
pub type Required = BTreeMap<String, i64>;

/// The nodes that have applied what the model computed for them, and those that lag (with
/// the generation they applied, if any). Every node needs every route target: each node's
/// config carries the capture set of all of them.
fn programmed(index: &Index, required: &Required) -> (Vec<String>, Vec<(String, Option<i64>)>) {
    let (mut applied, mut lagging) = (Vec::new(), Vec::new());
    for node in &index.nodes {
        let (have, stored) = index
            .node_configs
            .get(node)
            .cloned()
            .unwrap_or((None, None));
        let need = required.get(node).copied().or(stored);
        match (have, need) {
            (Some(have), Some(need)) if have >= need => applied.push(node.clone()),
            _ => lagging.push((node.clone(), have)),
        }
    }
    (applied, lagging)
}

fn programmed_condition(
    index: &Index,
    required: &Required,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let (applied, lagging) = programmed(index, required);
    let total = applied.len() + lagging.len();
    if total > 0 && lagging.is_empty() {
        return condition(
            conditions::PROGRAMMED,
            true,
            reason::PROGRAMMED,
            &format!("applied by all {total} nodes"),
            generation,
            previous,
            now,
        );
    }
    let behind: Vec<String> = lagging
        .iter()
        .map(|(node, have)| match have {
            Some(have) => format!("{node} (applied generation {have})"),
            None => format!("{node} (applied nothing yet)"),
        })
        .collect();
    let message = if total == 0 {
        "no node to apply it".to_owned()
    } else {
        format!(
            "applied by {} of {total} nodes; not yet by {}",
            applied.len(),
            behind.join(", ")
        )
    };
    condition(
        conditions::PROGRAMMED,
        false,
        reason::PENDING,
        &message,
        generation,
        previous,
        now,
    )
}

/// `identities`: the SPIFFE IDs behind each Service (`node_config::identity_map`).
pub fn route_target_status(
    index: &Index,
    target: &Target,
    identities: &BTreeMap<Key, Vec<String>>,
    required: &Required,
    generation: Option<i64>,
    previous: Option<&RouteTargetStatus>,
    now: &Time,
) -> RouteTargetStatus {
    let previous_conditions = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let service = index.services.get(&target.key);
    let service_verdict =
        aether_routing::service_verdict(&target.key.0, &target.key.1, service.map(|s| &s.info));
    // A hand-written RouteTarget's own rules are judged as an HTTPRoute's are.
    let refused_rules = target.in_force.as_ref().and_then(|name| {
        target
            .compiled
            .routes
            .iter()
            .filter(|o| o.route.kind == RouteKind::RouteTarget && &o.route.name == name)
            .flat_map(|o| &o.parents)
            .find(|p| !p.accepted.ok)
            .map(|p| p.accepted.clone())
    });
    let accepted = match refused_rules {
        Some(refused) if service_verdict.ok => refused,
        _ => service_verdict,
    };

    let mut routes = Vec::new();
    let mut unresolved: Option<Verdict> = None;
    for outcome in &target.compiled.routes {
        for parent in &outcome.parents {
            let (group, kind) = match outcome.route.kind {
                RouteKind::RouteTarget => ("aether.io", "RouteTarget"),
                other => ("gateway.networking.k8s.io", other.as_str()),
            };
            routes.push(AttachedRoute {
                group: group.into(),
                kind: kind.into(),
                namespace: outcome.route.namespace.clone(),
                name: outcome.route.name.clone(),
                accepted: parent.accepted.ok,
                consumer: parent.consumer,
            });
            if parent.accepted.ok && !parent.resolved_refs.ok && unresolved.is_none() {
                unresolved = Some(parent.resolved_refs.clone());
            }
        }
    }
    routes.sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    routes.dedup();

    let mut weights: BTreeMap<(String, String, u16), i64> = BTreeMap::new();
    for port in &target.compiled.table.ports {
        for set in port.producer.iter().chain(port.consumers.values()) {
            for rule in &set.rules {
                for backend in &rule.backends {
                    if let BackendTarget::Service(s) = &backend.target {
                        *weights
                            .entry((s.namespace.clone(), s.name.clone(), s.port))
                            .or_default() += i64::from(backend.weight);
                    }
                }
            }
        }
    }
    let backends: Vec<ResolvedBackend> = weights
        .into_iter()
        .map(|((namespace, service, port), weight)| {
            let backend: Key = (namespace.clone(), service.clone());
            ResolvedBackend {
                ready_endpoints: index.ready_endpoints.get(&backend).copied().unwrap_or(0) as i32,
                identities: identities.get(&backend).cloned().unwrap_or_default(),
                namespace,
                service,
                port: i32::from(port),
                weight,
            }
        })
        .collect();

    let not_ready: Vec<String> = backends
        .iter()
        .filter(|b| b.ready_endpoints == 0)
        .map(|b| format!("{}/{}:{}", b.namespace, b.service, b.port))
        .collect();
    let (resolved_ok, resolved_reason, resolved_message) = match &unresolved {
        Some(v) => (false, v.reason.clone(), v.message.clone()),
        None if !not_ready.is_empty() => (
            false,
            reason::NO_READY_ENDPOINTS.to_owned(),
            format!(
                "no ready endpoint behind {}: requests sent there fail with 503",
                not_ready.join(", ")
            ),
        ),
        None => (
            true,
            reason::RESOLVED_REFS.to_owned(),
            "all references resolved".to_owned(),
        ),
    };
    let resolved = condition(
        conditions::RESOLVED_REFS,
        resolved_ok,
        &resolved_reason,
        &resolved_message,
        generation,
        previous_conditions,
        now,
    );
    let programmed = programmed_condition(index, required, generation, previous_conditions, now);
    let ports: Vec<TargetPort> = service
        .map(|s| {
            s.info
                .ports
                .iter()
                .map(|p| TargetPort {
                    name: p.name.clone(),
                    port: i32::from(p.port),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    RouteTargetStatus {
        observed_generation: generation,
        cluster_ip: service.and_then(|s| s.cluster_ips.first().cloned()),
        cluster_ips: service.map(|s| s.cluster_ips.clone()).unwrap_or_default(),
        port_summary: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|p| p.port.to_string())
                .collect::<Vec<_>>()
                .join(",")
        }),
        ports,
        route_count: routes.iter().filter(|r| r.accepted).count() as i32,
        routes,
        backend_count: backends.len() as i32,
        backends,
        conditions: vec![
            condition(
                conditions::ACCEPTED,
                accepted.ok,
                &accepted.reason,
                &accepted.message,
                generation,
                previous_conditions,
                now,
            ),
            resolved,
            programmed,
        ],
    }
}

/// The status of a hand-written RouteTarget that is not in force: another one for the same
/// Service (`winner`, the oldest) is, so none of this one's rules are used.
pub fn conflicted_status(
    index: &Index,
    service: &Key,
    winner: &str,
    generation: Option<i64>,
    previous: Option<&RouteTargetStatus>,
    now: &Time,
) -> RouteTargetStatus {
    let previous = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let message = format!(
        "RouteTarget {}/{winner} is in force for Service {}/{} (the oldest of them): this one's rules are not used; delete one of them",
        service.0, service.0, service.1
    );
    let not_in_force = |kind| {
        condition(
            kind,
            false,
            reason::CONFLICTED,
            &message,
            generation,
            previous,
            now,
        )
    };
    let data = index.services.get(service);
    RouteTargetStatus {
        observed_generation: generation,
        cluster_ip: data.and_then(|s| s.cluster_ips.first().cloned()),
        cluster_ips: data.map(|s| s.cluster_ips.clone()).unwrap_or_default(),
        conditions: vec![
            not_in_force(conditions::ACCEPTED),
            not_in_force(conditions::RESOLVED_REFS),
            not_in_force(conditions::PROGRAMMED),
        ],
        ..RouteTargetStatus::default()
    }
}

/// aether's `status.parents` entries for every route, keyed like `Index::routes`.
pub fn route_parents(
    targets: &BTreeMap<Key, Target>,
    index: &Index,
    now: &Time,
) -> BTreeMap<(&'static str, String, String), Vec<RouteParentStatus>> {
    let mut out: BTreeMap<(&'static str, String, String), Vec<RouteParentStatus>> = index
        .routes
        .keys()
        .map(|k| (k.clone(), Vec::new()))
        .collect();
    for outcome in targets.values().flat_map(|t| &t.compiled.routes) {
        let route_key = (
            outcome.route.kind.as_str(),
            outcome.route.namespace.clone(),
            outcome.route.name.clone(),
        );
        let (Some(route), Some(entries)) = (index.routes.get(&route_key), out.get_mut(&route_key))
        else {
            continue;
        };
        let generation = index.route_generations.get(&route_key).copied();
        for parent in &outcome.parents {
            let p = &route.parents[parent.parent_index];
            let verdict = |kind: &str, v: &Verdict| {
                condition(kind, v.ok, &v.reason, &v.message, generation, &[], now)
            };
            entries.push(RouteParentStatus {
                parent_ref: ParentReference {
                    group: Some(String::new()),
                    kind: Some("Service".into()),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    port: p.port,
                    section_name: p.section_name.clone(),
                },
                controller_name: CONTROLLER_NAME.into(),
                conditions: vec![
                    verdict(conditions::ACCEPTED, &parent.accepted),
                    verdict(conditions::RESOLVED_REFS, &parent.resolved_refs),
                ],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let first = condition("Accepted", true, "Accepted", "ok", Some(1), &[], &at(10));
        let same = condition(
            "Accepted",
            true,
            "Accepted",
            "still ok",
            Some(2),
            std::slice::from_ref(&first),
            &at(20),
        );
        assert_eq!(same.last_transition_time, at(10));
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(
            "Accepted",
            false,
            "Refused",
            "no",
            Some(3),
            &[same],
            &at(30),
        );
        assert_eq!(flipped.last_transition_time, at(30));
        assert_eq!(flipped.status, "False");
    }

    #[test]
    fn programmed_names_the_nodes_behind() {
        let mut index = Index::default();
        for node in ["n1", "n2", "n3"] {
            index.add_node(node);
        }
        index.node_configs.insert("n1".into(), (Some(4), Some(4)));
        index.node_configs.insert("n2".into(), (Some(3), Some(4)));
        let required = Required::from([("n1".into(), 4), ("n2".into(), 4)]);
        let programmed = programmed_condition(&index, &required, Some(1), &[], &at(0));
        assert_eq!(programmed.status, "False");
        assert_eq!(
            programmed.message,
            "applied by 1 of 3 nodes; not yet by n2 (applied generation 3), n3 (applied nothing yet)"
        );
        index.node_configs.insert("n2".into(), (Some(4), Some(4)));
        index.node_configs.insert("n3".into(), (Some(5), Some(5)));
        let programmed = programmed_condition(&index, &required, Some(1), &[], &at(0));
        assert_eq!(
            (programmed.status.as_str(), programmed.message.as_str()),
            ("True", "applied by all 3 nodes")
        );
        let none = programmed_condition(&Index::default(), &required, Some(1), &[], &at(0));
        assert_eq!(none.message, "no node to apply it");
    }
}
