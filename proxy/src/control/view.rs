//! The proxy's watches of the cluster: what this node's proxy needs to know, cached. If the
//! API server goes away, the proxy keeps serving from these caches, and a proxy restarted
//! meanwhile serves the caches the last run saved ([`crate::state::watch_cache`]).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aether_cni::protocol::PodRef;
use aether_crds::NodeConfig;
use aether_crds::node_config::NodeConfigStatus;
use aether_crds::pods;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::Notify;

use crate::control::enrol::NodePod;
use crate::control::node_pods::NodePods;
use crate::control::pod_view::{Labels, PodView, ViewError};
use crate::dataplane::Workloads;
use crate::dataplane::snapshot::{Inputs, Snapshot};
use crate::identity::ServiceAccount;
use crate::inpod::probes::Probes;
use crate::state::last_config::LastConfig;
use crate::state::watch_cache::{self, SavedCache};

/// The key of the trust bundle in its ConfigMap.
const BUNDLE_KEY: &str = "ca.crt";
/// The field manager of the proxy's writes, and the reporter of its Events.
pub(crate) const MANAGER: &str = "aether-proxy";

/// Where aether is installed, as the proxy finds it.
pub struct Install {
    /// The install namespace, holding everything below.
    pub namespace: String,
    /// The trust bundle ConfigMap.
    pub bundle: String,
    /// The proxy's own DaemonSet.
    pub daemonset: String,
    /// The ConfigMap `helm uninstall` creates before it deletes anything.
    pub uninstall_marker: String,
    /// This proxy's pod, when it runs in one.
    pub pod: Option<String>,
}

/// Caches of what this node's proxy needs to know.
pub struct ClusterView {
    pub(super) namespaces: Store<Namespace>,
    pub(super) pods: Arc<NodePods>,
    pub(super) services: Store<Service>,
    pub(super) slices: Store<EndpointSlice>,
    pub(super) node_configs: Store<NodeConfig>,
    pub(super) bundles: Store<ConfigMap>,
    pub(super) markers: Store<ConfigMap>,
    pub(super) daemonsets: Store<DaemonSet>,
    pub(super) install: Install,
    pub(super) node: String,
    pub(super) last_config: LastConfig,
    pub(super) synced: AtomicBool,
    pub changed: Arc<Notify>,
}

impl ClusterView {
    /// Starts the watches, each saved in `state_dir`; `pods` is fed by
    /// [`crate::control::node_pods::feed`].
    pub fn start(
        client: &kube::Client,
        node: &str,
        install: Install,
        state_dir: &Path,
        pods: Arc<NodePods>,
        tasks: &mut watch_cache::Tasks,
    ) -> Arc<Self> {
        let changed = Arc::new(Notify::new());
        let saved = |name| SavedCache::new(state_dir, name);
        let all = watcher::Config::default;
        let by_name =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        Arc::new(ClusterView {
            namespaces: watch_cache::watch(
                Api::all(client.clone()),
                all(),
                changed.clone(),
                saved("namespaces"),
                tasks,
            ),
            pods,
            services: watch_cache::watch(
                Api::all(client.clone()),
                all(),
                changed.clone(),
                saved("services"),
                tasks,
            ),
            slices: watch_cache::watch(
                Api::all(client.clone()),
                all(),
                changed.clone(),
                saved("endpointslices"),
                tasks,
            ),
            node_configs: watch_cache::watch(
                Api::all(client.clone()),
                by_name(node),
                changed.clone(),
                saved("nodeconfig"),
                tasks,
            ),
            bundles: watch_cache::watch(
                Api::namespaced(client.clone(), &install.namespace),
                by_name(&install.bundle),
                changed.clone(),
                saved("trust-bundle"),
                tasks,
            ),
            // Watches keep delivering after an uninstall deleted the proxy's RBAC and
            // ServiceAccount, so the marker and the DaemonSet's deletion are seen even when a
            // fresh GET would be refused.
            markers: watch_cache::watch(
                Api::namespaced(client.clone(), &install.namespace),
                by_name(&install.uninstall_marker),
                changed.clone(),
                saved("uninstall-marker"),
                tasks,
            ),
            daemonsets: watch_cache::watch(
                Api::namespaced(client.clone(), &install.namespace),
                by_name(&install.daemonset),
                changed.clone(),
                saved("daemonset"),
                tasks,
            ),
            install,
            node: node.to_owned(),
            last_config: LastConfig::load(state_dir),
            synced: AtomicBool::new(false),
            changed,
        })
    }

    /// Waits until every cache holds a first full list, or the one the last run saved when the
    /// API server does not answer (the node's pods: the feed's, or the list saved last).
    pub async fn wait_synced(&self) -> Result<(), String> {
        let results = [
            self.namespaces.wait_until_ready().await.is_ok(),
            self.pods.store().wait_until_ready().await.is_ok(),
            self.services.wait_until_ready().await.is_ok(),
            self.slices.wait_until_ready().await.is_ok(),
            self.node_configs.wait_until_ready().await.is_ok(),
            self.bundles.wait_until_ready().await.is_ok(),
            self.markers.wait_until_ready().await.is_ok(),
            self.daemonsets.wait_until_ready().await.is_ok(),
        ];
        if results.iter().all(|ok| *ok) {
            self.synced.store(true, Ordering::Release);
            Ok(())
        } else {
            Err("a watch cache was dropped before it was filled".into())
        }
    }

    pub(super) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Builds a snapshot of the current caches.
    pub fn snapshot(&self, previous: &Snapshot) -> Snapshot {
        let config = self.node_configs.get(&ObjectRef::new(&self.node));
        // Without its NodeConfig the node serves from the last one it saw, across restarts.
        let last = match &config {
            Some(c) => {
                self.last_config
                    .remember(c.metadata.generation.unwrap_or_default(), &c.spec);
                None
            }
            None => self.last_config.get(),
        };
        let services = self.services.state();
        let slices = self.slices.state();
        Snapshot::build(
            &Inputs {
                node_config: config
                    .as_ref()
                    .map(|c| (c.metadata.generation.unwrap_or_default(), &c.spec))
                    .or_else(|| last.as_ref().map(|(g, spec)| (*g, spec.as_ref()))),
                services: &services,
                slices: &slices,
            },
            previous,
        )
    }

    /// What the node's NodeConfig status says now; `None` while there is no NodeConfig.
    pub(super) fn reported(&self) -> Option<NodeConfigStatus> {
        let config = self.node_configs.get(&ObjectRef::new(&self.node))?;
        Some(config.status.clone().unwrap_or_default())
    }

    pub fn trust_bundle(&self) -> Option<String> {
        let object = ObjectRef::new(&self.install.bundle).within(&self.install.namespace);
        self.bundles
            .get(&object)?
            .data
            .as_ref()?
            .get(BUNDLE_KEY)
            .cloned()
    }

    /// ServiceAccounts that need an SVID: those of this node's meshed pods, and of the pods
    /// whose listeners still accept mTLS (`serving`: a pod that just left still gets
    /// connections from peers that have not heard yet).
    pub fn wanted_service_accounts(&self, serving: &[PodRef]) -> BTreeSet<ServiceAccount> {
        let meshed = self
            .pods
            .store()
            .state()
            .into_iter()
            .filter(|pod| !is_host_network(pod) && !pods::is_finished(pod))
            .filter(|pod| {
                let pod_ref = PodRef {
                    namespace: pod.namespace().unwrap_or_default(),
                    name: pod.name_any(),
                    uid: None,
                };
                matches!(
                    crate::control::pod_view::meshing(self, &pod_ref),
                    Ok(aether_cni::decision::Meshing::Meshed)
                )
            });
        let serving = serving.iter().filter_map(|pod| self.pod(pod));
        meshed
            .chain(serving)
            .map(|pod| pods::service_account(&pod))
            .collect()
    }

    /// The ClusterIP of `host` when it names a Service (`name.namespace.svc[.domain]`).
    pub fn service_ip(&self, host: &str) -> Option<IpAddr> {
        let mut parts = host.split('.');
        let (name, namespace) = (parts.next()?, parts.next()?);
        if parts.next() != Some("svc") {
            return None;
        }
        let service = self.services.get(&ObjectRef::new(name).within(namespace))?;
        service.spec.as_ref()?.cluster_ip.as_ref()?.parse().ok()
    }

    pub(super) fn pod(&self, pod: &PodRef) -> Option<Arc<Pod>> {
        self.pods
            .store()
            .get(&ObjectRef::new(&pod.name).within(&pod.namespace))
    }
}

/// `status.podIPs`.
fn ips_of(pod: &Pod) -> Vec<IpAddr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect()
}

fn is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

impl PodView for ClusterView {
    fn namespace_labels(&self, namespace: &str) -> Result<Labels, ViewError> {
        if !self.is_synced() {
            return Err(ViewError::NotReady("the watch caches are filling".into()));
        }
        let ns = self
            .namespaces
            .get(&ObjectRef::new(namespace))
            .ok_or_else(|| ViewError::UnknownNamespace(namespace.to_owned()))?;
        Ok(ns.labels().clone())
    }

    fn pod_annotations(&self, pod: &PodRef) -> Result<Labels, ViewError> {
        if !self.is_synced() {
            return Err(ViewError::NotReady("the watch caches are filling".into()));
        }
        let found = self
            .pod(pod)
            .ok_or_else(|| ViewError::UnknownPod(pod.clone()))?;
        Ok(found.annotations().clone())
    }

    fn pod_ips(&self, pod: &PodRef) -> Result<Vec<IpAddr>, ViewError> {
        if !self.is_synced() {
            return Err(ViewError::NotReady("the watch caches are filling".into()));
        }
        let found = self
            .pod(pod)
            .ok_or_else(|| ViewError::UnknownPod(pod.clone()))?;
        Ok(ips_of(&found))
    }

    fn probes(&self, pod: &PodRef) -> Result<Probes, ViewError> {
        if !self.is_synced() {
            return Err(ViewError::NotReady("the watch caches are filling".into()));
        }
        let found = self
            .pod(pod)
            .ok_or_else(|| ViewError::UnknownPod(pod.clone()))?;
        Ok(found.spec.as_ref().map(Probes::of).unwrap_or_default())
    }
}

impl Workloads for ClusterView {
    fn service_account(&self, pod: &PodRef) -> Option<ServiceAccount> {
        self.pod(pod).map(|p| pods::service_account(&p))
    }

    fn probes(&self, pod: &PodRef) -> Probes {
        PodView::probes(self, pod).unwrap_or_default()
    }

    fn labels(&self, pod: &PodRef) -> Labels {
        self.pod(pod)
            .map(|p| p.labels().clone())
            .unwrap_or_default()
    }

    fn declared_ports(&self, pod: &PodRef) -> Vec<u16> {
        let Some(pod) = self.pod(pod) else {
            return Vec::new();
        };
        let Some(spec) = pod.spec.as_ref() else {
            return Vec::new();
        };
        let init = spec.init_containers.iter().flatten();
        spec.containers
            .iter()
            .chain(init)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| u16::try_from(p.container_port).ok())
            .collect()
    }
}

impl ClusterView {
    /// This node's pods as enrolment sees them; `None` until the caches are filled and the
    /// pod feed answered (an empty list would say every pod is gone, a saved one that gone pods
    /// still run).
    pub fn node_pods(&self) -> Option<Vec<NodePod>> {
        if !self.is_synced() || !self.pods.is_live() {
            return None;
        }
        Some(
            self.pods
                .store()
                .state()
                .iter()
                .map(|pod| {
                    let pod_ref = PodRef {
                        namespace: pod.namespace().unwrap_or_default(),
                        name: pod.name_any(),
                        uid: pod.metadata.uid.clone(),
                    };
                    let ips = ips_of(pod);
                    let running = !is_host_network(pod)
                        && !pods::is_finished(pod)
                        && pod.metadata.deletion_timestamp.is_none()
                        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && !ips.is_empty();
                    NodePod {
                        meshing: crate::control::pod_view::meshing(self, &pod_ref).ok(),
                        pod: pod_ref,
                        ips,
                        running,
                    }
                })
                .collect(),
        )
    }
}
