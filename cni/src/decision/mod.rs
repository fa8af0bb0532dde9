//! Whether a pod is meshed: `aether_core::meshing`'s rule over what the plugin is given.
//!
//! The node proxy decides with these same rules from its watch caches; the CNI plugin applies
//! them itself, from the API server, only when the proxy cannot answer. That is what lets
//! unmeshed pods start while the proxy is down.

mod apiserver;

pub use apiserver::{LookupError, lookup};

use std::collections::BTreeMap;

pub use aether_core::meshing::Meshing;
use aether_core::meshing::{PodFacts, meshing, namespace_is_managed};

use crate::protocol::PodRef;

/// aether's meshing rule for a pod the runtime sets up. The runtime calls a CNI plugin only for
/// pods with a network namespace of their own, so none is on the host network.
pub fn decide(
    pod: &PodRef,
    namespace_labels: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
) -> Meshing {
    let facts = PodFacts {
        namespace: &pod.namespace,
        name: &pod.name,
        annotations: pod_annotations,
        host_network: false,
    };
    meshing(namespace_is_managed(namespace_labels), &facts)
}

#[cfg(test)]
mod tests {
    use aether_core::names::{CAPTURE_ANNOTATION, MANAGED_LABEL};

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
