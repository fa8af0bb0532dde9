//! `kubectl aether check`: what a healthy installation has, judged from [`Facts`] alone.

use serde::Serialize;

use crate::facts::{Facts, Rollout};

/// The oldest Kubernetes minor release aether supports; older ones are untested.
pub const MIN_KUBERNETES: (u32, u32) = (1, 29);

/// The CRDs aether reads: the Gateway API's (standard channel) and its own.
pub const REQUIRED_CRDS: [&str; 6] = [
    "httproutes.gateway.networking.k8s.io",
    "grpcroutes.gateway.networking.k8s.io",
    "referencegrants.gateway.networking.k8s.io",
    "routetargets.aether.io",
    "nodeconfigs.aether.io",
    "authorizationpolicies.aether.io",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: String,
    pub ok: bool,
    /// What was found; for a failure, what is wrong and where.
    pub detail: String,
}

fn finding(check: impl Into<String>, ok: bool, detail: impl Into<String>) -> Finding {
    Finding {
        check: check.into(),
        ok,
        detail: detail.into(),
    }
}

/// Every check, in the order a user fixes them: the cluster, the CRDs, the control plane, then
/// each node.
pub fn check(facts: &Facts) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.push(match facts.kubernetes {
        Some(version) if version >= MIN_KUBERNETES => finding(
            "kubernetes version",
            true,
            format!("{}.{}", version.0, version.1),
        ),
        Some(version) => finding(
            "kubernetes version",
            false,
            format!(
                "{}.{} is older than {}.{}, the oldest release aether supports",
                version.0, version.1, MIN_KUBERNETES.0, MIN_KUBERNETES.1
            ),
        ),
        None => finding(
            "kubernetes version",
            false,
            "the API server did not say its version",
        ),
    });
    for crd in REQUIRED_CRDS {
        findings.push(if facts.crds.contains(crd) {
            finding(format!("crd {crd}"), true, "installed")
        } else {
            finding(
                format!("crd {crd}"),
                false,
                "missing: install the Gateway API standard channel and the chart's crds/",
            )
        });
    }
    let namespace = &facts.namespace;
    findings.push(rollout(
        "operator",
        facts.operator,
        &format!("deployment {namespace}/aether-operator"),
    ));
    findings.push(rollout(
        "node proxies",
        facts.proxies,
        &format!("daemonset {namespace}/aether-proxy"),
    ));
    for node in &facts.nodes {
        let check = format!("node {}", node.name);
        if !node.ready {
            findings.push(finding(check, true, "not Ready: skipped"));
            continue;
        }
        let problem = match (&node.proxy_pod, node.proxy_ready) {
            (None, _) => {
                Some("no aether proxy pod on the node: meshed pods cannot start here".to_owned())
            }
            (Some(pod), false) => Some(format!("proxy pod {pod} is not Ready")),
            (Some(_), true) => None,
        };
        let problem = problem.or_else(|| match (node.config_generation, node.applied_generation) {
            (None, _) => {
                Some("no NodeConfig: the operator has not written this node's config".to_owned())
            }
            (Some(want), have) if have.is_none_or(|have| have < want) => Some(format!(
                "the proxy applied NodeConfig generation {} of {want}",
                have.map_or("none".to_owned(), |h| h.to_string())
            )),
            _ => None,
        });
        let problem = problem.or_else(|| {
            node.scrape_error
                .as_ref()
                .map(|e| format!("cannot read the proxy's metrics: {e}"))
        });
        findings.push(match problem {
            Some(problem) => finding(check, false, problem),
            None => {
                let figures = node.figures.clone().unwrap_or_default();
                finding(
                    check,
                    true,
                    format!(
                        "proxy {} applied generation {}, {} pods captured, {} drift repairs",
                        figures.version.as_deref().unwrap_or("unknown"),
                        node.applied_generation.unwrap_or_default(),
                        figures.captured_pods.unwrap_or_default(),
                        figures.drift_repairs
                    ),
                )
            }
        });
    }
    findings
}

fn rollout(check: &str, rollout: Option<Rollout>, object: &str) -> Finding {
    match rollout {
        None => finding(
            check,
            false,
            format!("{object} not found: is aether installed?"),
        ),
        Some(r) if r.desired > 0 && r.ready >= r.desired => finding(
            check,
            true,
            format!("{object}: {}/{} ready", r.ready, r.desired),
        ),
        Some(r) => finding(
            check,
            false,
            format!("{object}: {}/{} ready", r.ready, r.desired),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::NodeFacts;
    use crate::metrics::ProxyFigures;

    fn healthy() -> Facts {
        Facts {
            kubernetes: Some((1, 36)),
            crds: REQUIRED_CRDS.iter().map(|c| c.to_string()).collect(),
            namespace: "aether-system".into(),
            operator: Some(Rollout {
                desired: 2,
                ready: 2,
            }),
            proxies: Some(Rollout {
                desired: 1,
                ready: 1,
            }),
            nodes: vec![NodeFacts {
                name: "n1".into(),
                ready: true,
                proxy_pod: Some("aether-proxy-x".into()),
                proxy_ready: true,
                config_generation: Some(4),
                applied_generation: Some(4),
                figures: Some(ProxyFigures::default()),
                scrape_error: None,
            }],
        }
    }

    fn failed(facts: &Facts) -> Vec<String> {
        check(facts)
            .into_iter()
            .filter(|f| !f.ok)
            .map(|f| format!("{}: {}", f.check, f.detail))
            .collect()
    }

    #[test]
    fn a_healthy_cluster_passes_every_check() {
        assert_eq!(failed(&healthy()), Vec::<String>::new());
    }

    #[test]
    fn each_problem_is_one_line_naming_what_and_where() {
        let mut facts = healthy();
        facts.kubernetes = Some((1, 27));
        facts.crds.remove("authorizationpolicies.aether.io");
        facts.operator = None;
        facts.proxies = Some(Rollout {
            desired: 2,
            ready: 1,
        });
        let mut lagging = facts.nodes[0].clone();
        lagging.name = "n2".into();
        lagging.applied_generation = Some(3);
        let mut bare = facts.nodes[0].clone();
        bare.name = "n3".into();
        bare.proxy_pod = None;
        let mut down = facts.nodes[0].clone();
        down.name = "n4".into();
        down.ready = false;
        down.proxy_pod = None;
        facts.nodes.extend([lagging, bare, down]);
        assert_eq!(
            failed(&facts),
            [
                "kubernetes version: 1.27 is older than 1.29, the oldest release aether supports",
                "crd authorizationpolicies.aether.io: missing: install the Gateway API standard channel and the chart's crds/",
                "operator: deployment aether-system/aether-operator not found: is aether installed?",
                "node proxies: daemonset aether-system/aether-proxy: 1/2 ready",
                "node n2: the proxy applied NodeConfig generation 3 of 4",
                "node n3: no aether proxy pod on the node: meshed pods cannot start here",
            ]
        );
    }
}
