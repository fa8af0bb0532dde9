//! What aether reads of a Pod, through `aether_core`'s rules: whether it is meshed, and its
//! identity.

use aether_core::identity::ServiceAccount;
use aether_core::meshing::{self, Meshing, PodFacts};
use k8s_openapi::api::core::v1::Pod;

/// aether's meshing rule for `pod`, whose namespace is managed or not.
pub fn meshing(namespace_managed: bool, pod: &Pod) -> Meshing {
    let no_annotations = Default::default();
    let facts = PodFacts {
        namespace: pod.metadata.namespace.as_deref().unwrap_or_default(),
        name: pod.metadata.name.as_deref().unwrap_or_default(),
        annotations: pod.metadata.annotations.as_ref().unwrap_or(&no_annotations),
        host_network: (pod.spec.as_ref()).is_some_and(|s| s.host_network == Some(true)),
    };
    meshing::meshing(namespace_managed, &facts)
}

/// The ServiceAccount the pod runs as.
pub fn service_account(pod: &Pod) -> ServiceAccount {
    ServiceAccount::of_pod(
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref()),
    )
}

/// Whether the pod's containers are done for good (`Succeeded` or `Failed`): it needs no
/// identity and takes no traffic.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn reads_the_meshing_facts_and_the_identity_of_a_pod() {
        let web = pod(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web-0"},
            "spec": {"containers": [], "serviceAccountName": "web"}
        }));
        assert!(meshing(true, &web).is_meshed());
        assert!(!meshing(false, &web).is_meshed());
        assert_eq!(service_account(&web), ServiceAccount::new("shop", "web"));

        let host = pod(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "agent",
                         "annotations": {"unrelated": "x"}},
            "spec": {"containers": [], "hostNetwork": true},
            "status": {"phase": "Succeeded"}
        }));
        assert!(!meshing(true, &host).is_meshed());
        assert_eq!(
            service_account(&host),
            ServiceAccount::new("shop", "default")
        );
        assert!(is_finished(&host));
        assert!(!is_finished(&web));
    }
}
