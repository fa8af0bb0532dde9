//! Whether a pod is meshed, decided from the namespace label and the pod's opt-out annotation.
//!
//! The node proxy decides with these same rules from its watch caches; the CNI plugin applies
//! them itself, from the API server, only when the proxy cannot answer. That is what lets
//! unmeshed pods start while the proxy is down.

mod apiserver;

pub use apiserver::{LookupError, lookup};

use std::collections::BTreeMap;

use crate::protocol::PodRef;

/// Namespace label that opts every pod of the namespace in.
pub const MANAGED_LABEL: &str = "aether.io/managed";
/// Pod annotation that opts one pod out, with the value [`CAPTURE_DISABLED`].
pub const CAPTURE_ANNOTATION: &str = "aether.io/capture";
pub const CAPTURE_DISABLED: &str = "disabled";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meshing {
    Meshed,
    Unmeshed { reason: String },
}

pub fn decide(
    pod: &PodRef,
    namespace_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
) -> Meshing {
    if namespace_labels.get(MANAGED_LABEL).map(String::as_str) != Some("true") {
        return Meshing::Unmeshed {
            reason: format!(
                "namespace {} is not labelled {MANAGED_LABEL}=true",
                pod.namespace
            ),
        };
    }
    if pod_annotations.get(CAPTURE_ANNOTATION).map(String::as_str) == Some(CAPTURE_DISABLED) {
        return Meshing::Unmeshed {
            reason: format!("pod {pod} is annotated {CAPTURE_ANNOTATION}={CAPTURE_DISABLED}"),
        };
    }
    Meshing::Meshed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: None,
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn managed_namespace_meshes_its_pods() {
        assert_eq!(
            decide(&pod(), &map(&[(MANAGED_LABEL, "true")]), &map(&[])),
            Meshing::Meshed
        );
    }

    #[test]
    fn other_namespaces_are_left_alone() {
        for labels in [
            map(&[]),
            map(&[(MANAGED_LABEL, "false")]),
            map(&[(MANAGED_LABEL, "True")]),
        ] {
            let Meshing::Unmeshed { reason } = decide(&pod(), &labels, &map(&[])) else {
                panic!("meshed with {labels:?}");
            };
            assert_eq!(
                reason,
                "namespace shop is not labelled aether.io/managed=true"
            );
        }
    }

    #[test]
    fn the_annotation_opts_a_pod_out() {
        let managed = map(&[(MANAGED_LABEL, "true")]);
        assert_eq!(
            decide(&pod(), &managed, &map(&[(CAPTURE_ANNOTATION, "disabled")])),
            Meshing::Unmeshed {
                reason: "pod shop/web-0 is annotated aether.io/capture=disabled".into()
            }
        );
        assert_eq!(
            decide(&pod(), &managed, &map(&[(CAPTURE_ANNOTATION, "enabled")])),
            Meshing::Meshed
        );
    }
}
