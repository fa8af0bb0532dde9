//! The proxy's view of namespace labels and pod annotations, which decides whether a pod is
//! meshed. A trait, so the CNI server works the same over watch caches, a test's fixed answers,
//! or no view at all.

use std::collections::BTreeMap;
use std::net::IpAddr;

use aether_cni::decision::{self, Meshing};
use aether_cni::protocol::PodRef;
use aether_core::meshing::namespace_is_strict;

use crate::inpod::probes::Probes;

pub type Labels = BTreeMap<String, String>;

pub trait PodView: Send + Sync {
    fn namespace_labels(&self, namespace: &str) -> Result<Labels, ViewError>;
    fn pod_annotations(&self, pod: &PodRef) -> Result<Labels, ViewError>;
    /// The pod's addresses as the API server has them (`status.podIPs`; none before its
    /// sandbox is set up).
    fn pod_ips(&self, pod: &PodRef) -> Result<Vec<IpAddr>, ViewError>;
    /// The pod's probes. A view without pod specs (no cluster, hence no strict mode) knows
    /// none.
    fn probes(&self, _pod: &PodRef) -> Result<Probes, ViewError> {
        Ok(Probes::default())
    }
}

/// The view cannot answer (yet). The CNI plugin is told "not ready" and decides from the API
/// server itself, failing closed for a meshed pod, so the runtime retries.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("the proxy's view of the cluster is not ready: {0}")]
    NotReady(String),
    #[error("namespace {0} is not in the proxy's view (yet)")]
    UnknownNamespace(String),
    #[error("pod {0} is not in the proxy's view (yet)")]
    UnknownPod(PodRef),
}

/// aether's meshing rules ([`aether_cni::decision::decide`], the same the plugin applies) over
/// `view`. A pod of an unmanaged namespace is decided without looking the pod up.
pub fn meshing(view: &dyn PodView, pod: &PodRef) -> Result<Meshing, ViewError> {
    let labels = view.namespace_labels(&pod.namespace)?;
    if let unmeshed @ Meshing::Unmeshed { .. } = decision::decide(pod, &labels, &Labels::new()) {
        return Ok(unmeshed);
    }
    let annotations = view.pod_annotations(pod)?;
    Ok(decision::decide(pod, &labels, &annotations))
}

/// Whether the pod's namespace asks for strict mTLS (`aether.io/mtls=strict`).
pub fn strict(view: &dyn PodView, pod: &PodRef) -> Result<bool, ViewError> {
    Ok(namespace_is_strict(&view.namespace_labels(&pod.namespace)?))
}

#[cfg(test)]
mod tests {
    use aether_core::names::{CAPTURE_ANNOTATION, CAPTURE_DISABLED, MANAGED_LABEL};

    use super::*;

    /// Namespace "shop" is managed, "other" is not; pod "opted-out" has the opt-out annotation;
    /// pods named "unknown" are not in the view.
    struct Fixed;

    impl PodView for Fixed {
        fn namespace_labels(&self, namespace: &str) -> Result<Labels, ViewError> {
            match namespace {
                "shop" => Ok(Labels::from([(MANAGED_LABEL.into(), "true".into())])),
                "other" => Ok(Labels::new()),
                _ => Err(ViewError::UnknownNamespace(namespace.into())),
            }
        }

        fn pod_annotations(&self, pod: &PodRef) -> Result<Labels, ViewError> {
            match pod.name.as_str() {
                "opted-out" => Ok(Labels::from([(
                    CAPTURE_ANNOTATION.into(),
                    CAPTURE_DISABLED.into(),
                )])),
                "unknown" => Err(ViewError::UnknownPod(pod.clone())),
                _ => Ok(Labels::new()),
            }
        }

        fn pod_ips(&self, pod: &PodRef) -> Result<Vec<IpAddr>, ViewError> {
            Err(ViewError::UnknownPod(pod.clone()))
        }
    }

    fn pod(namespace: &str, name: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: None,
        }
    }

    #[test]
    fn pods_of_a_managed_namespace_are_meshed() {
        assert_eq!(meshing(&Fixed, &pod("shop", "web")), Ok(Meshing::Meshed));
    }

    #[test]
    fn the_annotation_opts_a_pod_out() {
        assert_eq!(
            meshing(&Fixed, &pod("shop", "opted-out")),
            Ok(Meshing::Unmeshed {
                reason: "pod shop/opted-out is annotated aether.io/capture=disabled".into()
            })
        );
    }

    #[test]
    fn an_unmanaged_namespace_needs_no_pod_lookup() {
        assert_eq!(
            meshing(&Fixed, &pod("other", "unknown")),
            Ok(Meshing::Unmeshed {
                reason: "namespace other is not labelled aether.io/managed=true".into()
            })
        );
    }

    #[test]
    fn what_the_view_does_not_know_is_an_error() {
        assert_eq!(
            meshing(&Fixed, &pod("shop", "unknown")),
            Err(ViewError::UnknownPod(pod("shop", "unknown")))
        );
        assert_eq!(
            meshing(&Fixed, &pod("nowhere", "web")),
            Err(ViewError::UnknownNamespace("nowhere".into()))
        );
    }
}
