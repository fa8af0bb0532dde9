//! Whether a pod is meshed: the one rule the CNI plugin, the operator (its index and its
//! certificate authority) and the proxy all apply.

use std::collections::BTreeMap;

use crate::names::{CAPTURE_ANNOTATION, CAPTURE_DISABLED, MANAGED_LABEL, MTLS_LABEL, MTLS_STRICT};

/// What the rule reads of a pod.
#[derive(Clone, Copy, Debug)]
pub struct PodFacts<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub annotations: &'a BTreeMap<String, String>,
    /// A hostNetwork pod shares the node's network namespace, which is never captured.
    pub host_network: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meshing {
    Meshed,
    /// Not meshed, and why, in words for a pod's Events and the plugin's log.
    Unmeshed {
        reason: String,
    },
}

impl Meshing {
    pub fn is_meshed(&self) -> bool {
        matches!(self, Meshing::Meshed)
    }
}

/// Whether a namespace's labels opt it into the mesh: only the value `"true"` does.
pub fn namespace_is_managed(labels: &BTreeMap<String, String>) -> bool {
    labels.get(MANAGED_LABEL).is_some_and(|v| v == "true")
}

/// Whether a namespace's labels ask for strict mTLS (`aether.io/mtls=strict`).
pub fn namespace_is_strict(labels: &BTreeMap<String, String>) -> bool {
    labels.get(MTLS_LABEL).is_some_and(|v| v == MTLS_STRICT)
}

/// A pod is meshed when its namespace is managed, it is not opted out, and it has a network
/// namespace of its own.
pub fn meshing(namespace_managed: bool, pod: &PodFacts<'_>) -> Meshing {
    let unmeshed = |reason: String| Meshing::Unmeshed { reason };
    if !namespace_managed {
        return unmeshed(format!(
            "namespace {} is not labelled {MANAGED_LABEL}=true",
            pod.namespace
        ));
    }
    if pod.annotations.get(CAPTURE_ANNOTATION).map(String::as_str) == Some(CAPTURE_DISABLED) {
        return unmeshed(format!(
            "pod {}/{} is annotated {CAPTURE_ANNOTATION}={CAPTURE_DISABLED}",
            pod.namespace, pod.name
        ));
    }
    if pod.host_network {
        return unmeshed(format!(
            "pod {}/{} uses the host network",
            pod.namespace, pod.name
        ));
    }
    Meshing::Meshed
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

    fn pod(annotations: &BTreeMap<String, String>, host_network: bool) -> PodFacts<'_> {
        PodFacts {
            namespace: "shop",
            name: "web-0",
            annotations,
            host_network,
        }
    }

    #[test]
    fn only_the_label_value_true_manages_a_namespace() {
        assert!(namespace_is_managed(&map(&[(MANAGED_LABEL, "true")])));
        for labels in [
            map(&[]),
            map(&[(MANAGED_LABEL, "True")]),
            map(&[(MANAGED_LABEL, "")]),
            map(&[(MANAGED_LABEL, "false")]),
        ] {
            assert!(!namespace_is_managed(&labels), "{labels:?}");
        }
    }

    #[test]
    fn only_the_value_strict_makes_a_namespace_strict() {
        assert!(namespace_is_strict(&map(&[(MTLS_LABEL, "strict")])));
        assert!(!namespace_is_strict(&map(&[(MTLS_LABEL, "Strict")])));
        assert!(!namespace_is_strict(&map(&[])));
    }

    #[test]
    fn a_pod_is_meshed_in_a_managed_namespace_unless_opted_out_or_on_the_host_network() {
        let none = map(&[]);
        assert_eq!(meshing(true, &pod(&none, false)), Meshing::Meshed);
        assert_eq!(
            meshing(false, &pod(&none, false)),
            Meshing::Unmeshed {
                reason: "namespace shop is not labelled aether.io/managed=true".into()
            }
        );
        assert_eq!(
            meshing(true, &pod(&none, true)),
            Meshing::Unmeshed {
                reason: "pod shop/web-0 uses the host network".into()
            }
        );
        let opted_out = map(&[(CAPTURE_ANNOTATION, CAPTURE_DISABLED)]);
        assert_eq!(
            meshing(true, &pod(&opted_out, false)),
            Meshing::Unmeshed {
                reason: "pod shop/web-0 is annotated aether.io/capture=disabled".into()
            }
        );
        let other_value = map(&[(CAPTURE_ANNOTATION, "enabled")]);
        assert!(meshing(true, &pod(&other_value, false)).is_meshed());
    }
}
