//! `kubectl aether analyze`: configuration that does not do what its author likely meant,
//! judged from an [`Inventory`] of the cluster's objects alone.

use serde::Serialize;

/// What `analyze` reads, as plain data ([`crate::gather::inventory`] fills it).
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub route_targets: Vec<TargetFacts>,
    pub routes: Vec<RouteFacts>,
    /// Pods aether's meshing rule meshes that no node's proxy captures (`namespace/name`).
    pub uncaptured_pods: Vec<String>,
}

/// A condition of an object: type, status, reason, message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConditionFacts {
    pub kind: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone, Default)]
pub struct TargetFacts {
    /// `namespace/name`.
    pub name: String,
    /// Derived from Gateway API routes: its conditions are the routes' own, reported there.
    pub derived: bool,
    pub conditions: Vec<ConditionFacts>,
    pub backends: Vec<BackendFacts>,
}

#[derive(Debug, Clone, Default)]
pub struct BackendFacts {
    /// `namespace/service:port`.
    pub name: String,
    pub ready_endpoints: i32,
    /// Ready endpoints whose pod a node's proxy captures.
    pub meshed_endpoints: usize,
}

#[derive(Debug, Clone, Default)]
pub struct RouteFacts {
    /// `HTTPRoute namespace/name`.
    pub name: String,
    /// The Services (`namespace/name`) among its parentRefs.
    pub service_parents: Vec<String>,
    /// aether's entries in its `status.parents`: the parent and its Accepted condition.
    pub aether_parents: Vec<(String, Option<ConditionFacts>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The object at fault, `Kind namespace/name`.
    pub object: String,
    pub problem: String,
}

fn problem(object: impl Into<String>, problem: impl Into<String>) -> Problem {
    Problem {
        object: object.into(),
        problem: problem.into(),
    }
}

pub fn analyze(inventory: &Inventory) -> Vec<Problem> {
    let mut problems = Vec::new();
    for route in &inventory.routes {
        if route.service_parents.is_empty() {
            continue;
        }
        if route.aether_parents.is_empty() {
            problems.push(problem(
                &route.name,
                format!(
                    "names Service {} but aether has not written its status: is the operator running?",
                    route.service_parents.join(", ")
                ),
            ));
        }
        for (parent, accepted) in &route.aether_parents {
            match accepted {
                Some(c) if c.status == "True" => {}
                Some(c) => problems.push(problem(
                    &route.name,
                    format!("attaches nowhere on {parent}: {} ({})", c.reason, c.message),
                )),
                None => problems.push(problem(
                    &route.name,
                    format!("attaches nowhere on {parent}: no Accepted condition"),
                )),
            }
        }
    }
    for target in &inventory.route_targets {
        let object = format!("RouteTarget {}", target.name);
        let refused = target
            .conditions
            .iter()
            .any(|c| c.kind == "Accepted" && c.status != "True");
        // A refused target's other conditions only repeat why.
        let conditions = target
            .conditions
            .iter()
            .filter(|c| !target.derived && (!refused || c.kind == "Accepted"));
        for c in conditions {
            match (c.kind.as_str(), c.status.as_str()) {
                (_, "True") | ("Programmed", _) => {}
                ("Accepted", _) if c.reason == "Conflicted" => problems.push(problem(
                    &object,
                    format!("conflicts with another RouteTarget: {}", c.message),
                )),
                ("Accepted", _) => problems.push(problem(
                    &object,
                    format!("not accepted: {} ({})", c.reason, c.message),
                )),
                ("ResolvedRefs", _) => problems.push(problem(
                    &object,
                    format!("backends unresolved: {} ({})", c.reason, c.message),
                )),
                _ => {}
            }
        }
        for backend in &target.backends {
            if backend.ready_endpoints > 0 && backend.meshed_endpoints == 0 {
                problems.push(problem(
                    &object,
                    format!(
                        "backend {} has {} ready endpoints and none is meshed: its traffic is not encrypted",
                        backend.name, backend.ready_endpoints
                    ),
                ));
            }
        }
    }
    for pod in &inventory.uncaptured_pods {
        problems.push(problem(
            format!("Pod {pod}"),
            "is in a meshed namespace but no node's proxy captures it: its traffic bypasses the mesh (restart it, or look at `kubectl describe pod`)",
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(status: &str, reason: &str) -> ConditionFacts {
        ConditionFacts {
            kind: "Accepted".into(),
            status: status.into(),
            reason: reason.into(),
            message: "why".into(),
        }
    }

    #[test]
    fn a_clean_inventory_has_no_problem() {
        let inventory = Inventory {
            route_targets: vec![TargetFacts {
                name: "shop/web".into(),
                derived: true,
                conditions: vec![accepted("True", "Accepted")],
                backends: vec![BackendFacts {
                    name: "shop/web:80".into(),
                    ready_endpoints: 2,
                    meshed_endpoints: 1,
                }],
            }],
            routes: vec![
                RouteFacts {
                    name: "HTTPRoute shop/web".into(),
                    service_parents: vec!["shop/web".into()],
                    aether_parents: vec![(
                        "Service shop/web".into(),
                        Some(accepted("True", "Accepted")),
                    )],
                },
                // A Gateway's route is not the mesh's business.
                RouteFacts {
                    name: "HTTPRoute shop/edge".into(),
                    ..RouteFacts::default()
                },
            ],
            uncaptured_pods: Vec::new(),
        };
        assert_eq!(analyze(&inventory), []);
    }

    #[test]
    fn each_planted_problem_is_found() {
        let inventory = Inventory {
            route_targets: vec![
                TargetFacts {
                    name: "shop/a".into(),
                    derived: false,
                    conditions: vec![
                        accepted("False", "Conflicted"),
                        ConditionFacts {
                            kind: "ResolvedRefs".into(),
                            status: "False".into(),
                            reason: "Conflicted".into(),
                            message: "repeated".into(),
                        },
                    ],
                    backends: vec![BackendFacts {
                        name: "legacy/db:5432".into(),
                        ready_endpoints: 1,
                        meshed_endpoints: 0,
                    }],
                },
                TargetFacts {
                    name: "shop/b".into(),
                    derived: false,
                    conditions: vec![ConditionFacts {
                        kind: "ResolvedRefs".into(),
                        status: "False".into(),
                        reason: "BackendNotFound".into(),
                        message: "shop/gone".into(),
                    }],
                    backends: Vec::new(),
                },
                // The route reports what its derived target would.
                TargetFacts {
                    name: "shop/missing".into(),
                    derived: true,
                    conditions: vec![accepted("False", "ServiceNotFound")],
                    backends: Vec::new(),
                },
            ],
            routes: vec![
                RouteFacts {
                    name: "HTTPRoute shop/lost".into(),
                    service_parents: vec!["shop/missing".into()],
                    aether_parents: vec![(
                        "Service shop/missing".into(),
                        Some(accepted("False", "NoMatchingParent")),
                    )],
                },
                RouteFacts {
                    name: "HTTPRoute shop/unseen".into(),
                    service_parents: vec!["shop/web".into()],
                    aether_parents: Vec::new(),
                },
            ],
            uncaptured_pods: vec!["shop/old".into()],
        };
        let found: Vec<String> = analyze(&inventory)
            .into_iter()
            .map(|p| format!("{}: {}", p.object, p.problem))
            .collect();
        let expected = [
            "HTTPRoute shop/lost: attaches nowhere on Service shop/missing: NoMatchingParent (why)",
            "HTTPRoute shop/unseen: names Service shop/web but aether has not written its status",
            "RouteTarget shop/a: conflicts with another RouteTarget: why",
            "RouteTarget shop/a: backend legacy/db:5432 has 1 ready endpoints and none is meshed",
            "RouteTarget shop/b: backends unresolved: BackendNotFound (shop/gone)",
            "Pod shop/old: is in a meshed namespace but no node's proxy captures it",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (line, start) in found.iter().zip(expected) {
            assert!(
                line.starts_with(start),
                "{line:?} should start with {start:?}"
            );
        }
    }
}
