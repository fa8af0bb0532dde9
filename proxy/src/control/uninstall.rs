//! Whether the proxy is stopping because aether is being uninstalled.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use super::view::ClusterView;

impl ClusterView {
    /// Whether the proxy is stopping because aether is being uninstalled: `helm uninstall`
    /// created the marker (after this proxy's pod was created, so not a past uninstall's) and
    /// the DaemonSet is gone or being deleted. Anything less (an orphaning delete of the
    /// DaemonSet, a restart, a rollout) keeps every pod's capture. Waits a little for the
    /// deletion's watch event, which may trail the signal.
    pub async fn is_uninstalling(&self) -> bool {
        let daemonset = ObjectRef::new(&self.install.daemonset).within(&self.install.namespace);
        let marker = ObjectRef::new(&self.install.uninstall_marker).within(&self.install.namespace);
        // This proxy's pod, from the node's pods.
        let own = self.install.pod.as_ref().and_then(|name| {
            let pod = self
                .pods
                .store()
                .get(&ObjectRef::new(name).within(&self.install.namespace))?;
            pod.metadata.creation_timestamp.clone()
        });
        let mut deleted = false;
        for _ in 0..20 {
            deleted = deleted
                || match self.daemonsets.get(&daemonset) {
                    None => self.is_synced(),
                    Some(ds) => ds.metadata.deletion_timestamp.is_some(),
                };
            if deleted && let Some(marker) = self.markers.get(&marker) {
                let current = uninstall_marker_is_current(
                    marker.metadata.creation_timestamp.as_ref(),
                    own.as_ref(),
                );
                if !current {
                    info!("the uninstall marker predates this proxy's pod: not an uninstall");
                }
                return current;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if deleted {
            info!(
                "the DaemonSet is gone but helm uninstall did not say so: keeping every pod's capture"
            );
        }
        false
    }
}

/// A marker signals this uninstall unless it is older than the proxy's pod (one left by an
/// earlier `helm uninstall` of a release since reinstalled). Both times are the API server's.
fn uninstall_marker_is_current(marker: Option<&Time>, pod: Option<&Time>) -> bool {
    match (marker, pod) {
        (Some(marker), Some(pod)) => marker.0 >= pod.0,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn only_a_marker_made_since_the_pod_started_is_an_uninstall() {
        assert!(uninstall_marker_is_current(Some(&at(200)), Some(&at(100))));
        assert!(uninstall_marker_is_current(Some(&at(100)), Some(&at(100))));
        // Left by an earlier uninstall of a release installed again since.
        assert!(!uninstall_marker_is_current(Some(&at(50)), Some(&at(100))));
        // A proxy run outside a pod has nothing to compare with.
        assert!(uninstall_marker_is_current(Some(&at(50)), None));
    }
}
