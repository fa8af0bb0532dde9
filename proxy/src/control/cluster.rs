//! The proxy's watches of the cluster, and the loops that turn what they see into the data
//! plane's snapshot, the pods' capture sets, the wanted SVIDs, the NodeConfig's status, the
//! node's readiness taint and drift repairs.
//!
//! Everything read here is cached: if the API server goes away, the proxy keeps serving the
//! last snapshot it built, and a proxy restarted meanwhile serves the caches the last run saved
//! ([`crate::state::watch_cache`]).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aether_cni::protocol::PodRef;
use aether_core::names::AGENT_NOT_READY_TAINT;
use aether_crds::NodeConfig;
use aether_crds::node_config::NodeConfigStatus;
use aether_crds::pods;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::control::enrol::{self, NodePod, Step};
use crate::control::node_pods::NodePods;
use crate::control::pod_view::{Labels, PodView, ViewError};
use crate::dataplane::snapshot::{Inputs, Snapshot};
use crate::dataplane::{Demand, SnapshotCell, Workloads};
use crate::identity::ServiceAccount;
use crate::identity::tls::Certs;
use crate::inpod::agent::{Agent, Enrolment, LEAVE_LINGER};
use crate::inpod::probes::Probes;
use crate::metrics::Metrics;
use crate::state::last_config::LastConfig;
use crate::state::watch_cache::{self, SavedCache};

/// Changes arriving together are applied together.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// The key of the trust bundle in its ConfigMap.
const BUNDLE_KEY: &str = "ca.crt";
/// The field manager of the proxy's writes.
const MANAGER: &str = "aether-proxy";

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
    namespaces: Store<Namespace>,
    pods: Arc<NodePods>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    node_configs: Store<NodeConfig>,
    bundles: Store<ConfigMap>,
    markers: Store<ConfigMap>,
    daemonsets: Store<DaemonSet>,
    install: Install,
    node: String,
    last_config: LastConfig,
    synced: AtomicBool,
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

    fn is_synced(&self) -> bool {
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
    fn reported(&self) -> Option<NodeConfigStatus> {
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

    fn pod(&self, pod: &PodRef) -> Option<Arc<Pod>> {
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

/// Where the container runtime mounts the pods' network namespaces (the plugin is given paths
/// under it), as the proxy's container sees it.
const NETNS_DIR: &str = "/var/run/netns";
/// A pod that could not be meshed is tried again after this long.
const ENROL_RETRY: Duration = Duration::from_secs(5);
/// How often a running pod waiting for its SVID to join is looked at again.
const SVID_POLL: Duration = Duration::from_millis(200);

/// Brings this node's running pods in and out of the mesh as their namespace's label and their
/// annotations say (`enrol::plan`), with an Event on each pod and a metric; a pod that cannot
/// be meshed says why once per cause and is tried again after [`ENROL_RETRY`]. A running pod
/// joins only once its ServiceAccount's SVID is on the node: captured before, its connections
/// would fail until the SVID came (after an install the CA may still be starting).
pub struct Enroller {
    recorder: Recorder,
    node: String,
    /// Pods (by uid) that could not be meshed: when to try again, and why they failed.
    failed: std::collections::HashMap<String, (tokio::time::Instant, String)>,
}

impl Enroller {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Enroller {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: MANAGER.into(),
                    instance: Some(node.to_owned()),
                },
            ),
            node: node.to_owned(),
            failed: std::collections::HashMap::new(),
        }
    }

    /// One pass; returns when a failed pod is due again, if one is.
    pub async fn pass(
        &mut self,
        view: &ClusterView,
        agent: &Arc<Agent>,
        certs: &Certs,
        metrics: &Metrics,
    ) -> Option<tokio::time::Instant> {
        let pods = view.node_pods()?;
        let now = tokio::time::Instant::now();
        let mut awaiting_svid = None;
        self.failed
            .retain(|uid, _| pods.iter().any(|p| p.pod.uid.as_deref() == Some(uid)));
        let (mut joining, mut leaving, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for step in enrol::plan(&pods, &agent.registered()) {
            match step {
                Step::Enrol { pod, ips } => {
                    let due = pod
                        .uid
                        .as_ref()
                        .and_then(|uid| self.failed.get(uid))
                        .is_none_or(|(at, _)| *at <= now);
                    let has_svid = view.service_account(&pod).is_some_and(|sa| certs.has(&sa));
                    if !has_svid {
                        awaiting_svid = Some(now + SVID_POLL);
                    } else if due {
                        joining.push((pod, ips));
                    }
                }
                Step::Leave {
                    container_id,
                    pod,
                    reason,
                } => leaving.push((container_id, pod, reason)),
                Step::Forget { container_id } => gone.push(container_id),
            }
        }
        if !joining.is_empty() {
            self.join(view, agent, metrics, joining).await;
        }
        if !leaving.is_empty() {
            let ids: Vec<String> = leaving.iter().map(|(id, _, _)| id.clone()).collect();
            let agent_ = agent.clone();
            if let Ok(results) =
                tokio::task::spawn_blocking(move || agent_.leave(&ids, LEAVE_LINGER)).await
            {
                for (pod, result) in results {
                    let reason = leaving
                        .iter()
                        .find(|(_, p, _)| *p == pod)
                        .map(|(_, _, r)| r.clone())
                        .unwrap_or_default();
                    let note = match &result {
                        Ok(()) => format!(
                            "aether-proxy on {} took the running pod out of the mesh ({reason}): new connections go direct",
                            self.node
                        ),
                        Err(e) => format!(
                            "aether-proxy on {} cannot take the pod out of the mesh: {e}",
                            self.node
                        ),
                    };
                    metrics.enrolment("leave", result.is_ok());
                    self.event(view, &pod, result.is_ok(), "Unmeshed", "UnmeshFailed", note)
                        .await;
                }
            }
        }
        if !gone.is_empty() {
            let agent_ = agent.clone();
            let _ = tokio::task::spawn_blocking(move || agent_.forget(&gone)).await;
        }
        self.failed
            .values()
            .map(|(at, _)| *at)
            .chain(awaiting_svid)
            .min()
    }

    async fn join(
        &mut self,
        view: &ClusterView,
        agent: &Arc<Agent>,
        metrics: &Metrics,
        joining: Vec<(PodRef, Vec<IpAddr>)>,
    ) {
        let wanted: Vec<IpAddr> = joining.iter().flat_map(|(_, ips)| ips.clone()).collect();
        let found = tokio::task::spawn_blocking(move || {
            crate::inpod::netns::holding(std::path::Path::new(NETNS_DIR), &wanted)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| format!("cannot read {NETNS_DIR}: {e}")));
        let mut enrolments = Vec::new();
        let mut results = Vec::new();
        for (pod, ips) in joining {
            let netns =
                match &found {
                    Ok(found) => ips.iter().find_map(|ip| found.get(ip)).cloned().ok_or_else(
                        || {
                            format!(
                                "no network namespace under {NETNS_DIR} holds the pod's address {}",
                                ips.iter()
                                    .map(ToString::to_string)
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        },
                    ),
                    Err(e) => Err(e.clone()),
                };
            match netns {
                Ok(netns) => enrolments.push(Enrolment { pod, netns, ips }),
                Err(e) => results.push((pod, Err(e))),
            }
        }
        if !enrolments.is_empty() {
            let agent_ = agent.clone();
            match tokio::task::spawn_blocking(move || agent_.enrol(enrolments)).await {
                Ok(done) => results.extend(done),
                Err(e) => warn!(error = %e, "enrolling running pods failed"),
            }
        }
        let retry = tokio::time::Instant::now() + ENROL_RETRY;
        for (pod, result) in results {
            metrics.enrolment("enrol", result.is_ok());
            let uid = pod.uid.clone().unwrap_or_default();
            match result {
                Ok(()) => {
                    self.failed.remove(&uid);
                    let note = format!(
                        "aether-proxy on {} meshed the running pod: capture table installed, listeners open; new connections are captured, open ones are left as they are",
                        self.node
                    );
                    self.event(view, &pod, true, "Meshed", "", note).await;
                }
                Err(e) => {
                    let repeated = self.failed.get(&uid).is_some_and(|(_, last)| *last == e);
                    self.failed.insert(uid, (retry, e.clone()));
                    if !repeated {
                        warn!(pod = %pod, error = %e, "cannot mesh a running pod; retrying");
                        let note = format!(
                            "aether-proxy on {} cannot mesh the running pod: {e}",
                            self.node
                        );
                        self.event(view, &pod, false, "", "MeshFailed", note).await;
                    }
                }
            }
        }
    }

    async fn event(
        &self,
        view: &ClusterView,
        pod: &PodRef,
        ok: bool,
        done: &str,
        failed: &str,
        note: String,
    ) {
        let Some(object) = view.pod(pod) else {
            return;
        };
        let event = Event {
            type_: if ok {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: if ok { done } else { failed }.into(),
            note: Some(note),
            action: "Enrol".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &object.object_ref(&())).await {
            warn!(error = %e, "cannot publish an enrolment Event");
        }
    }
}

/// Rebuilds the snapshot after every change, brings the pods' tables to its capture set,
/// meshes and unmeshes running pods (`Enroller`), reports the applied generation and the
/// captured pods on the NodeConfig, keeps the trust bundle and the wanted SVIDs current. Runs
/// until `stop` turns true (an uninstall must not see pods meshed again behind it), ending
/// between passes.
#[allow(clippy::too_many_arguments)]
pub async fn apply_changes(
    client: kube::Client,
    view: Arc<ClusterView>,
    agent: Arc<Agent>,
    cell: Arc<SnapshotCell>,
    certs: Arc<Certs>,
    wanted: watch::Sender<BTreeSet<ServiceAccount>>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut enroller = Enroller::new(client.clone(), &view.node);
    let configs: Api<NodeConfig> = Api::all(client.clone());
    // The node takes new pods only once they get a real capture set: after the first config.
    let mut untainted = false;
    let mut told = false;
    loop {
        let previous = cell.load();
        let snapshot = Arc::new(view.snapshot(&previous));
        cell.store(snapshot.clone());
        agent.data_plane().prune(&snapshot);
        if let Some(pem) = view.trust_bundle() {
            match certs.trust().set_bundle(&pem) {
                Ok(true) => info!("loaded a new trust bundle"),
                Ok(false) => {}
                Err(e) => warn!(error = %e, "ignoring the published trust bundle"),
            }
        }
        let capture = snapshot.capture.clone();
        let generation = snapshot.generation;
        let agent_ = agent.clone();
        let applied = tokio::task::spawn_blocking(move || {
            let update = agent_.update_capture_set(capture);
            // A namespace's mTLS mode may have changed with the view.
            agent_.sync_modes();
            agent_.sync_node_probes();
            (update, agent_.finish_leaving())
        })
        .await;
        let (applied, leaving) = match applied {
            Ok((update, leaving)) => (update.failed.is_empty(), leaving),
            Err(e) => {
                warn!(error = %e, "updating the pods' capture sets failed");
                (false, None)
            }
        };
        // After the leaving pods moved on: the SVID of one whose listeners closed goes now.
        wanted.send_if_modified(|current| {
            let next = view.wanted_service_accounts(&agent.serving());
            // The first is said even when empty: SVIDs restored from a run before are
            // dropped only once it is heard.
            let changed = !told || *current != next;
            told = true;
            *current = next;
            changed
        });
        let retry = enroller.pass(&view, &agent, &certs, &metrics).await;
        let captured = agent.registered();
        metrics.captured_pods.set(captured.len() as i64);
        let mut names: Vec<String> = captured.iter().map(|p| p.pod.to_string()).collect();
        names.sort();
        names.dedup();
        // Reported against what the status says now, not what this loop last wrote: a
        // NodeConfig written anew starts with an empty status. None while there is none.
        let status = view.reported();
        if let Some(status) = &status
            && status.captured_pods != names
        {
            let patch = serde_json::json!({"status": {"capturedPods": names, "capturedPodCount": names.len()}});
            if let Err(e) = configs
                .patch_status(&view.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                warn!(error = %e, "cannot report the node's captured pods");
            }
        }
        if generation.is_some() && applied && !untainted {
            tokio::spawn(remove_taint(client.clone(), view.node.clone()));
            untainted = true;
        }
        if let Some(generation) = generation
            && applied
            && let Some(status) = &status
            && status.applied_generation != Some(generation)
        {
            metrics.config_generation.set(generation);
            let patch = serde_json::json!({"status": {"appliedGeneration": generation}});
            match configs
                .patch_status(&view.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => info!(generation, "applied the node's config"),
                Err(e) => {
                    warn!(generation, error = %e, "cannot report the applied config generation")
                }
            }
        }
        // A pod that left in this pass is moved on from its linger's end.
        let leaving = leaving.or_else(|| agent.leaving_due());
        let due = [retry, leaving.map(tokio::time::Instant::from_std)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = view.changed.notified() => {}
            _ = agent.registrations.notified() => {}
            _ = tokio::time::sleep_until(due) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// Reports the targets of the cold path on the NodeConfig's status whenever one is added.
pub async fn report_demand(client: kube::Client, node: String, demand: Arc<Demand>) {
    let configs: Api<NodeConfig> = Api::all(client);
    loop {
        demand.changed.notified().await;
        let status = serde_json::json!({"status": {"demand": demand.targets()}});
        if let Err(e) = configs
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            warn!(error = %e, "cannot report the route targets this node needs; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            demand.changed.notify_one();
        }
    }
}

/// Removes the node's `aether.io/agent-not-ready` taint (pods may schedule here now: the
/// proxy can capture them). Retries until it is gone.
async fn remove_taint(client: kube::Client, node: String) {
    let nodes: Api<Node> = Api::all(client);
    let mut delay = Duration::from_millis(500);
    loop {
        match remove_taint_once(&nodes, &node).await {
            Ok(true) => {
                return info!(
                    node,
                    taint = AGENT_NOT_READY_TAINT,
                    "removed the node taint"
                );
            }
            Ok(false) => return,
            Err(e) => warn!(node, error = %e, "cannot remove the node taint; retrying"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

async fn remove_taint_once(nodes: &Api<Node>, name: &str) -> kube::Result<bool> {
    let node = nodes.get(name).await?;
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let kept: Vec<_> = taints
        .iter()
        .filter(|t| t.key != AGENT_NOT_READY_TAINT)
        .cloned()
        .collect();
    if kept.len() == taints.len() {
        return Ok(false);
    }
    // The resourceVersion makes this a compare-and-swap: a concurrent taint change fails it.
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": kept},
    });
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(true)
}

/// aether-cni's entry in the node's CNI config, as the installer wrote it. Another network
/// plugin rewriting its config would drop it, and new pods would then start uncaptured.
#[derive(Clone, Debug)]
pub struct CniEntry {
    pub conf_dir: std::path::PathBuf,
    pub entry: serde_json::Value,
}

impl CniEntry {
    /// The entry the node's config holds now, to keep it there.
    pub fn current(conf_dir: &std::path::Path) -> Option<CniEntry> {
        let entry = aether_cni::install::chained_entry(conf_dir).ok()??;
        Some(CniEntry {
            conf_dir: conf_dir.to_owned(),
            entry,
        })
    }

    /// Puts the entry back if it is gone or changed; returns whether it did.
    fn repair(&self) -> bool {
        match aether_cni::install::chained_entry(&self.conf_dir) {
            Ok(Some(entry)) if entry == self.entry => false,
            Ok(_) => match aether_cni::install::chain(&self.conf_dir, &self.entry) {
                Ok((path, changed)) => {
                    if changed {
                        warn!(config = %path.display(), "put aether-cni back into the node's CNI config");
                    }
                    changed
                }
                Err(e) => {
                    warn!(error = %e, "cannot put aether-cni back into the node's CNI config");
                    false
                }
            },
            Err(e) => {
                warn!(error = %e, "cannot read the node's CNI config");
                false
            }
        }
    }
}

/// Checks every captured pod every `period`, repairs drift, counts it and reports it as an
/// Event on the pod.
pub async fn repair_drift(
    client: kube::Client,
    view: Arc<ClusterView>,
    agent: Arc<Agent>,
    metrics: Arc<Metrics>,
    period: Duration,
    cni: Option<CniEntry>,
    mut stop: watch::Receiver<bool>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: MANAGER.into(),
            instance: Some(view.node.clone()),
        },
    );
    loop {
        // Stopping ends the loop between checks, never in the middle of a repair: an uninstall
        // that follows must not see a table or the CNI entry put back behind it.
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        if let Some(cni) = cni.clone()
            && let Ok(true) = tokio::task::spawn_blocking(move || cni.repair()).await
        {
            metrics.drift_repaired("cni_config");
        }
        let node = agent.clone();
        if let Ok(true) = tokio::task::spawn_blocking(move || node.repair_node_probes()).await {
            metrics.drift_repaired("node_table");
        }
        let agent = agent.clone();
        let Ok(repairs) = tokio::task::spawn_blocking(move || agent.repair_drift()).await else {
            continue;
        };
        for repair in repairs {
            metrics.drift_repaired(repair.what.as_str());
            let Some(pod) = view.pod(&repair.pod) else {
                continue;
            };
            let event = Event {
                type_: EventType::Warning,
                reason: "CaptureRepaired".into(),
                note: Some(format!(
                    "aether-proxy on {} repaired the pod's capture {}: {}",
                    view.node,
                    repair.what.as_str(),
                    repair.detail
                )),
                action: "Repair".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &pod.object_ref(&())).await {
                warn!(error = %e, "cannot publish a drift Event");
            }
        }
    }
}

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
