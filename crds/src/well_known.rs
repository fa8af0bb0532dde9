//! Labels, annotations and names that more than one aether component reads or writes, and
//! the rules read from them.

use std::collections::BTreeMap;

/// The API group of every aether resource.
pub const GROUP: &str = "aether.io";

/// Namespace label that opts every pod of the namespace into the mesh (value `"true"`).
pub const MANAGED_LABEL: &str = "aether.io/managed";

/// Namespace label whose value [`MTLS_STRICT`] puts the namespace's meshed pods in strict mTLS
/// mode: plaintext TCP from other hosts into them is refused (the node itself, for kubelet
/// probes, is let through).
pub const MTLS_LABEL: &str = "aether.io/mtls";
pub const MTLS_STRICT: &str = "strict";

/// Pod annotation that keeps a single pod of a managed namespace out of the mesh (value
/// [`CAPTURE_DISABLED`]).
pub const CAPTURE_ANNOTATION: &str = "aether.io/capture";
pub const CAPTURE_DISABLED: &str = "disabled";

/// Pod annotation listing extra route targets (`namespace/service`, comma separated) the pod
/// dials, so that their tables are on its node before the first request.
pub const DEPENDS_ON_ANNOTATION: &str = "aether.io/depends-on";

/// Label the operator puts on the RouteTargets it derives from Gateway API routes
/// (value `"true"`); hand-written RouteTargets do not carry it.
pub const DERIVED_LABEL: &str = "aether.io/derived";

/// `controllerName` the operator writes into Gateway API route status.
pub const CONTROLLER_NAME: &str = "aether.io/mesh";

/// Node taint that keeps pods off a node until its aether agent is ready.
pub const AGENT_NOT_READY_TAINT: &str = "aether.io/agent-not-ready";

/// The SPIFFE identity of a ServiceAccount: `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// Whether a namespace's labels opt it into the mesh.
pub fn namespace_is_managed(labels: &BTreeMap<String, String>) -> bool {
    labels.get(MANAGED_LABEL).is_some_and(|v| v == "true")
}

/// Whether a pod is meshed: its namespace is managed, it is not opted out, and it has a
/// network namespace of its own (a hostNetwork pod shares the node's, which is never captured).
pub fn pod_is_meshed(
    namespace_managed: bool,
    annotations: &BTreeMap<String, String>,
    host_network: bool,
) -> bool {
    namespace_managed
        && annotations.get(CAPTURE_ANNOTATION).map(String::as_str) != Some(CAPTURE_DISABLED)
        && !host_network
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_the_label_value_true_manages_a_namespace() {
        assert!(namespace_is_managed(&map(&[(MANAGED_LABEL, "true")])));
        for labels in [
            map(&[]),
            map(&[(MANAGED_LABEL, "True")]),
            map(&[(MANAGED_LABEL, "")]),
        ] {
            assert!(!namespace_is_managed(&labels), "{labels:?}");
        }
    }

    #[test]
    fn a_pod_is_meshed_in_a_managed_namespace_unless_opted_out_or_on_the_host_network() {
        let none = map(&[]);
        assert!(pod_is_meshed(true, &none, false));
        assert!(!pod_is_meshed(false, &none, false));
        assert!(!pod_is_meshed(true, &none, true));
        assert!(!pod_is_meshed(
            true,
            &map(&[(CAPTURE_ANNOTATION, CAPTURE_DISABLED)]),
            false
        ));
        assert!(pod_is_meshed(
            true,
            &map(&[(CAPTURE_ANNOTATION, "enabled")]),
            false
        ));
    }
}
