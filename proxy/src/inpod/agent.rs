//! The node proxy's pod state: the registry, the capture set and the pods' listeners, and the
//! answers to the CNI plugin's requests.
//!
//! Synchronous on purpose: a request may run nftables (libnftables or `nft`) and open sockets
//! through short-lived threads, so callers run it off the async workers, on tokio's blocking
//! pool. One lock serialises every change, so a registration and a capture set update can never
//! interleave and leave a pod's table behind.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aether_cni::decision::Meshing;
use aether_cni::nft::{self, Nft, Strict, TableSpec};
use aether_cni::protocol::{
    CapturePlan, CheckStatus, Decision, ErrorKind, ErrorReply, PodRef, Request, Response,
    StrictPlan,
};
use tokio::runtime::Handle;
use tracing::{debug, error, info, warn};

use crate::control::pod_view::{self, PodView};
use crate::dataplane::{DataPlane, ForwardCounts};
use crate::inpod::capture_set::CaptureSet;
use crate::inpod::listeners::{
    ConnectionLimits, Listeners, PodInfo, PodSocket, Role, capture_addrs, inbound_addr,
};
use crate::inpod::netns::{self, Netns, NetnsError};
use crate::inpod::probes::Probes;
use crate::state::registry::{RegisteredPod, Registry, RegistryError, enrolled_id};

/// The registry's file in the state directory.
pub const REGISTRY_FILE: &str = "registry.json";
/// How long a pod leaving the mesh keeps its listeners: longer than the news takes to reach
/// every node's proxy.
pub const LEAVE_LINGER: Duration = Duration::from_secs(10);
/// What a leaving pod's open connections then get to finish.
const LEAVE_DRAIN: Duration = Duration::from_secs(5);

/// A running pod to mesh, found by the proxy itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enrolment {
    pub pod: PodRef,
    pub netns: PathBuf,
    pub ips: Vec<IpAddr>,
}

pub struct AgentConfig {
    /// Holds the pod registry; kept across restarts.
    pub state_dir: PathBuf,
    /// The capture port given to newly registered pods' tables.
    pub capture_port: u16,
    /// The inbound mTLS port opened in every registered pod; `None` without a mesh.
    pub inbound_port: Option<u16>,
    /// The node's network namespace, where the node's table of strict pods goes (the node's
    /// probes of them get the probe source address); `None` without a mesh (no strict mode).
    pub node_netns: Option<PathBuf>,
    pub nft: Nft,
    pub limits: ConnectionLimits,
    /// Listening sockets a predecessor process handed over, reused for the pods it had.
    pub inherited: Vec<PodSocket>,
}

pub struct Agent {
    capture_port: u16,
    inbound_port: Option<u16>,
    node_netns: Option<PathBuf>,
    /// The strict pods' addresses the node's table last got, to skip rewriting it unchanged.
    node_probes: Mutex<Option<BTreeSet<IpAddr>>>,
    nft: Nft,
    registry_path: PathBuf,
    state_dir: PathBuf,
    view: Arc<dyn PodView>,
    plane: Arc<DataPlane>,
    state: Mutex<State>,
    /// Woken when the plugin registers or unregisters a pod: callers on other nodes learn
    /// from the node's report whether a pod takes mTLS, so it goes out before the pod serves.
    pub registrations: tokio::sync::Notify,
}

struct State {
    registry: Registry,
    capture: CaptureSet,
    listeners: Listeners,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("capture port 0 is not a port")]
    CapturePortZero,
    #[error("cannot create state directory {}: {source}", path.display())]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// What a capture set update did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CaptureUpdate {
    pub generation: u64,
    /// Container ids whose tables now hold `generation`.
    pub updated: Vec<String>,
    /// Container ids whose tables could not be updated, with the reason; they keep the
    /// generation they had, so the next update tries them again.
    pub failed: Vec<(String, String)>,
}

impl Agent {
    /// Loads the registry from the state directory and reopens the listeners of every pod in it
    /// (forgetting pods whose network namespace is gone), then brings their tables to `capture`.
    /// Listener tasks run on `runtime`; `plane` serves their connections.
    pub fn start(
        config: AgentConfig,
        view: Arc<dyn PodView>,
        capture: CaptureSet,
        runtime: Handle,
        plane: Arc<DataPlane>,
    ) -> Result<Agent, AgentError> {
        if config.capture_port == 0 {
            return Err(AgentError::CapturePortZero);
        }
        crate::state::file::create_private_dir(&config.state_dir).map_err(|source| {
            AgentError::StateDir {
                path: config.state_dir.clone(),
                source,
            }
        })?;
        let registry_path = config.state_dir.join(REGISTRY_FILE);
        let registry = Registry::load(&registry_path)?;
        let mut listeners = Listeners::new(runtime, plane.clone(), config.limits);
        listeners.inherit(config.inherited);
        let agent = Agent {
            capture_port: config.capture_port,
            inbound_port: config.inbound_port,
            node_netns: config.node_netns,
            node_probes: Mutex::default(),
            nft: config.nft,
            registry_path,
            state_dir: config.state_dir,
            view,
            plane,
            registrations: tokio::sync::Notify::new(),
            state: Mutex::new(State {
                registry,
                capture: capture.clone(),
                listeners,
            }),
        };
        agent.restore(capture);
        agent.sync_node_probes();
        Ok(agent)
    }

    fn restore(&self, capture: CaptureSet) {
        let mut state = self.lock();
        let State {
            registry,
            listeners,
            ..
        } = &mut *state;
        let mut kept = registry.clone();
        for pod in registry.pods() {
            let id = pod.container_id.as_str();
            if !pod.netns.exists() {
                info!(pod = %pod.pod, container_id = id, netns = %pod.netns.display(),
                    "forgetting a registered pod: its network namespace is gone");
                kept.remove(id, &pod.ifname);
                continue;
            }
            match Netns::open(&pod.netns).and_then(|ns| self.open_listeners(listeners, pod, ns)) {
                Ok(_) => info!(pod = %pod.pod, container_id = id, "reopened capture listeners"),
                Err(e) => error!(pod = %pod.pod, container_id = id, error = %e,
                    "cannot reopen capture listeners; captured connections of this pod are refused"),
            }
        }
        *registry = kept;
        let unclaimed = listeners.drop_inherited();
        if unclaimed > 0 {
            info!(
                sockets = unclaimed,
                "closed handed-over listeners of pods no longer registered"
            );
        }
        let update = self.sync_elements(&mut state, capture);
        self.save_capture(&state.capture);
        info!(
            pods = state.registry.len(),
            generation = update.generation,
            updated = update.updated.len(),
            failed = update.failed.len(),
            "restored the pod registry"
        );
    }

    /// The data plane serving the pods' listeners.
    pub fn data_plane(&self) -> &DataPlane {
        &self.plane
    }

    /// Replaces the set elements in every registered pod's table whose generation differs
    /// (rules untouched), and records the generation per pod and as the proxy's current one.
    pub fn update_capture_set(&self, capture: CaptureSet) -> CaptureUpdate {
        let mut state = self.lock();
        self.sync_elements(&mut state, capture)
    }

    fn sync_elements(&self, state: &mut State, capture: CaptureSet) -> CaptureUpdate {
        let mut update = CaptureUpdate {
            generation: capture.generation,
            ..CaptureUpdate::default()
        };
        let mut next = state.registry.clone();
        for pod in state.registry.pods() {
            if pod.generation == capture.generation {
                continue;
            }
            let id = pod.container_id.clone();
            match nft::replace_elements(
                &self.nft,
                &pod.netns,
                pod.families(),
                &pod.elements(&capture),
            ) {
                Ok(()) => {
                    next.set_generation(&id, capture.generation);
                    update.updated.push(id);
                }
                // The pod is going: its table went with its netns, and its DEL (or the
                // runtime's GC) takes it out of the registry. Nothing to retry.
                Err(nft::NftError::NetnsGone(_)) => {
                    debug!(pod = %pod.pod, container_id = %id, "a pod's netns is gone; its capture set is not updated");
                }
                Err(e) => {
                    warn!(pod = %pod.pod, container_id = %id, error = %e,
                        "cannot update the capture set of a pod's table");
                    update.failed.push((id, e.to_string()));
                }
            }
        }
        // The tables are what they are now, so memory follows them even if the file cannot be
        // written: a stale generation on disk only makes a restarted proxy rewrite the sets.
        if next != state.registry
            && let Err(e) = next.save(&self.registry_path)
        {
            error!(error = %e, "cannot save the pod registry after a capture set update");
        }
        state.registry = next;
        if capture != state.capture {
            self.save_capture(&capture);
        }
        state.capture = capture;
        update
    }

    /// Keeps the set the tables now hold for a restart without a NodeConfig to read.
    fn save_capture(&self, capture: &CaptureSet) {
        if let Err(e) = capture.save(&self.state_dir) {
            error!(error = %e, "cannot save the capture set");
        }
    }

    /// Answers one request of the CNI plugin.
    pub fn handle(&self, request: Request) -> Response {
        debug!(?request, "CNI request");
        match request {
            Request::Ping => Response::Pong,
            Request::Add { pod, ips, .. } => self.add(&pod, &ips),
            Request::Register {
                pod,
                container_id,
                ifname,
                netns,
                ips,
                generation,
            } => {
                let response = self.register(RegisteredPod {
                    strict_inbound_port: self.strict_port(&pod),
                    pod,
                    container_id,
                    ifname,
                    netns,
                    ips,
                    capture_port: self.capture_port,
                    generation,
                });
                // Before the kubelet's first probe of a new strict pod, when it can.
                self.sync_node_probes();
                self.registrations.notify_one();
                response
            }
            Request::Unregister {
                container_id,
                ifname,
            } => {
                let response = self.unregister(&container_id, &ifname);
                self.sync_node_probes();
                self.registrations.notify_one();
                response
            }
            Request::Check { pod, container_id } => self.check(&pod, &container_id),
            Request::Gc {
                valid_container_ids,
            } => self.gc(&valid_container_ids),
        }
    }

    fn add(&self, pod: &PodRef, ips: &[IpAddr]) -> Response {
        match pod_view::meshing(&*self.view, pod) {
            Ok(Meshing::Unmeshed { reason }) => Response::Decision(Decision::Unmeshed { reason }),
            Ok(Meshing::Meshed) => {
                let capture = self.lock().capture.clone();
                Response::Decision(Decision::Meshed(CapturePlan {
                    capture_port: self.capture_port,
                    targets: capture.for_pod(&pod.namespace, ips),
                    generation: capture.generation,
                    strict: self.strict_port(pod).map(|inbound_port| {
                        let probes = self.probes(pod);
                        StrictPlan {
                            inbound_port,
                            probe_ports: probes.connect_only(),
                            proxied_probe_ports: probes.proxied(),
                        }
                    }),
                }))
            }
            Err(e) => error_reply(ErrorKind::NotReady, e.to_string()),
        }
    }

    fn register(&self, mut pod: RegisteredPod) -> Response {
        let netns = match self.verify_netns(&pod) {
            Ok(netns) => netns,
            Err(why) => {
                warn!(pod = %pod.pod, netns = %pod.netns.display(), reason = %why, "refused a registration");
                return error_reply(
                    ErrorKind::BadRequest,
                    format!("refusing to register pod {}: {why}", pod.pod),
                );
            }
        };
        let mut state = self.lock();
        let State {
            registry,
            capture,
            listeners,
        } = &mut *state;
        let id = pod.container_id.clone();
        let opened = match self.open_listeners(listeners, &pod, netns) {
            Ok(opened) => opened,
            Err(e) => {
                return error_reply(
                    ErrorKind::Internal,
                    format!("cannot open the capture listeners of pod {}: {e}", pod.pod),
                );
            }
        };
        let undo = |listeners: &mut Listeners| {
            if opened {
                listeners.close(&id);
            }
        };
        // The capture set may have changed between the plugin's `add` and this `register`.
        if pod.generation != capture.generation {
            if let Err(e) = nft::replace_elements(
                &self.nft,
                &pod.netns,
                pod.families(),
                &pod.elements(capture),
            ) {
                undo(listeners);
                return error_reply(
                    ErrorKind::Internal,
                    format!(
                        "cannot bring the capture set of pod {} to generation {}: {e}",
                        pod.pod, capture.generation
                    ),
                );
            }
            pod.generation = capture.generation;
        }
        let mut next = registry.clone();
        next.insert(pod.clone());
        if let Err(e) = next.save(&self.registry_path) {
            undo(listeners);
            return error_reply(ErrorKind::Internal, e.to_string());
        }
        *registry = next;
        info!(pod = %pod.pod, container_id = %id, netns = %pod.netns.display(),
            generation = pod.generation, "registered a pod");
        Response::Registered
    }

    /// A registration's network namespace is the pod's: it holds every address registered for
    /// the pod, and, once the API server has the pod's addresses, one of them. Otherwise the
    /// proxy would serve another namespace's connections with the pod's identity. The namespace
    /// checked is the one returned, held open, so it is the one served.
    fn verify_netns(&self, pod: &RegisteredPod) -> Result<Netns, String> {
        let netns = Netns::open(&pod.netns).map_err(|e| e.to_string())?;
        let held = netns::addresses_in(&netns).map_err(|e| e.to_string())?;
        let missing: Vec<&IpAddr> = pod.ips.iter().filter(|ip| !held.contains(ip)).collect();
        if !missing.is_empty() {
            return Err(format!(
                "network namespace {} does not hold {missing:?} (it holds {held:?})",
                pod.netns.display()
            ));
        }
        if let Ok(known) = self.view.pod_ips(&pod.pod)
            && !known.is_empty()
            && !known.iter().any(|ip| pod.ips.contains(ip))
        {
            return Err(format!(
                "the API server gives the pod the addresses {known:?}, not {:?}",
                pod.ips
            ));
        }
        Ok(netns)
    }

    fn unregister(&self, container_id: &str, ifname: &str) -> Response {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        let Some(pod) = next.remove(container_id, ifname) else {
            return Response::Unregistered { known: false };
        };
        if let Err(e) = next.save(&self.registry_path) {
            return error_reply(ErrorKind::Internal, e.to_string());
        }
        state.registry = next;
        state.listeners.close(container_id);
        info!(pod = %pod.pod, container_id, "unregistered a pod");
        Response::Unregistered { known: true }
    }

    fn check(&self, pod: &PodRef, container_id: &str) -> Response {
        match pod_view::meshing(&*self.view, pod) {
            Ok(Meshing::Unmeshed { reason }) => Response::Checked(CheckStatus::Unmeshed { reason }),
            Ok(Meshing::Meshed) => {
                let state = self.lock();
                let registered = state.registry.get(container_id);
                Response::Checked(CheckStatus::Meshed {
                    registered: registered.is_some() && state.listeners.is_open(container_id),
                    capture_port: registered.map_or(self.capture_port, |p| p.capture_port),
                    strict_inbound_port: registered
                        .map_or_else(|| self.strict_port(pod), |p| p.strict_inbound_port),
                })
            }
            Err(e) => error_reply(ErrorKind::NotReady, e.to_string()),
        }
    }

    fn gc(&self, valid_container_ids: &[String]) -> Response {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        let removed = next.retain_valid(valid_container_ids);
        if removed.is_empty() {
            return Response::Collected { removed: vec![] };
        }
        if let Err(e) = next.save(&self.registry_path) {
            return error_reply(ErrorKind::Internal, e.to_string());
        }
        state.registry = next;
        for pod in &removed {
            state.listeners.close(&pod.container_id);
            info!(pod = %pod.pod, container_id = %pod.container_id, "garbage-collected a pod");
        }
        Response::Collected {
            removed: removed.into_iter().map(|p| p.container_id).collect(),
        }
    }

    /// Checks every registered pod's table and listeners and repairs what drifted: a missing
    /// or altered table is installed again with the current capture set, closed listeners are
    /// reopened. Returns what was repaired, for metrics and Events.
    pub fn repair_drift(&self) -> Vec<Repair> {
        let mut state = self.lock();
        let State {
            registry,
            capture,
            listeners,
        } = &mut *state;
        let mut repairs = Vec::new();
        for pod in registry.pods() {
            if !pod.netns.exists() {
                continue;
            }
            let spec = self.table_spec(pod);
            match nft::verify(&self.nft, &pod.netns, &spec) {
                Ok(drift) if drift.is_empty() => {}
                Ok(drift) => {
                    let what = format!("{drift:?}");
                    match nft::install(&self.nft, &pod.netns, &spec, &pod.elements(capture)) {
                        Ok(()) => {
                            warn!(pod = %pod.pod, drift = %what, "repaired a pod's capture table");
                            repairs.push(Repair {
                                pod: pod.pod.clone(),
                                what: DriftKind::Table,
                                detail: what,
                            });
                        }
                        Err(e) => {
                            error!(pod = %pod.pod, error = %e, "cannot repair a pod's capture table")
                        }
                    }
                }
                Err(e) => debug!(pod = %pod.pod, error = %e, "cannot check a pod's capture table"),
            }
            if !listeners.is_open(&pod.container_id) {
                match Netns::open(&pod.netns).and_then(|ns| self.open_listeners(listeners, pod, ns))
                {
                    Ok(_) => repairs.push(Repair {
                        pod: pod.pod.clone(),
                        what: DriftKind::Listeners,
                        detail: "listeners were closed".into(),
                    }),
                    Err(e) => error!(pod = %pod.pod, error = %e, "cannot reopen a pod's listeners"),
                }
            }
        }
        repairs
    }

    /// Meshes running pods the CNI plugin never registered (they started before their namespace
    /// was opted in, or before this proxy was installed): the same table the plugin installs,
    /// the same listeners, a registration under [`enrolled_id`]. New connections are captured
    /// from then on; the pods' open connections are not touched. A pod already registered is
    /// left as it is. One result per pod.
    pub fn enrol(&self, pods: Vec<Enrolment>) -> Vec<(PodRef, Result<(), String>)> {
        let mut state = self.lock();
        let State {
            registry,
            capture,
            listeners,
        } = &mut *state;
        let mut next = registry.clone();
        let mut results = Vec::new();
        let mut enrolled = Vec::new();
        for Enrolment { pod, netns, ips } in pods {
            if registry.pods().any(|r| r.is_of(&pod)) {
                results.push((pod, Ok(())));
                continue;
            }
            let Some(uid) = pod.uid.clone() else {
                results.push((pod, Err("the pod has no uid".into())));
                continue;
            };
            let registered = RegisteredPod {
                strict_inbound_port: self.strict_port(&pod),
                container_id: enrolled_id(&uid),
                ifname: "eth0".into(),
                netns,
                ips,
                capture_port: self.capture_port,
                generation: capture.generation,
                pod,
            };
            let installed = nft::install(
                &self.nft,
                &registered.netns,
                &self.table_spec(&registered),
                &registered.elements(capture),
            )
            .map_err(|e| format!("cannot install the capture table: {e}"))
            .and_then(|()| {
                Netns::open(&registered.netns)
                    .and_then(|ns| self.open_listeners(listeners, &registered, ns))
                    .map(drop)
                    .map_err(|e| {
                        let _ = nft::delete(&self.nft, &registered.netns);
                        format!("cannot open the capture listeners: {e}")
                    })
            });
            match installed {
                Ok(()) => {
                    enrolled.push(registered.container_id.clone());
                    next.insert(registered.clone());
                    results.push((registered.pod, Ok(())));
                }
                Err(e) => results.push((registered.pod, Err(e))),
            }
        }
        if enrolled.is_empty() {
            return results;
        }
        if let Err(e) = next.save(&self.registry_path) {
            // Not recorded, so not meshed: the pods go back to how they were.
            for id in &enrolled {
                if let Some(pod) = next.get(id) {
                    listeners.close(id);
                    let _ = nft::delete(&self.nft, &pod.netns);
                }
            }
            let why = e.to_string();
            return results
                .into_iter()
                .map(|(pod, result)| (pod, result.and(Err(why.clone()))))
                .collect();
        }
        *registry = next;
        for (pod, result) in &results {
            if result.is_ok() {
                info!(pod = %pod, "enrolled a running pod");
            }
        }
        results
    }

    /// Takes registered pods out of the mesh without restarting them: their tables capture
    /// nothing new at once (new connections go direct, open ones go on), their listeners close
    /// after `linger` (peers that still see them meshed keep reaching them meanwhile; usually
    /// [`LEAVE_LINGER`]) and their tables go after that, in [`Agent::finish_leaving`]. One result
    /// per container id.
    pub fn leave(
        &self,
        container_ids: &[String],
        linger: Duration,
    ) -> Vec<(PodRef, Result<(), String>)> {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        let mut results = Vec::new();
        for id in container_ids {
            let Some(pod) = state.registry.get(id).cloned() else {
                continue;
            };
            match nft::release(&self.nft, &pod.netns, &self.table_spec(&pod)) {
                Ok(()) => {
                    next.remove(id, &pod.ifname);
                    results.push((pod.pod, Ok(())));
                }
                Err(e) => results.push((
                    pod.pod,
                    Err(format!("cannot remove the capture table: {e}")),
                )),
            }
        }
        if next == state.registry {
            return results;
        }
        if let Err(e) = next.save(&self.registry_path) {
            let why = e.to_string();
            return results
                .into_iter()
                .map(|(pod, result)| (pod, result.and(Err(why.clone()))))
                .collect();
        }
        for id in container_ids {
            if next.get(id).is_none() {
                state.listeners.retire(id, linger, LEAVE_DRAIN);
            }
        }
        state.registry = next;
        for (pod, result) in &results {
            if result.is_ok() {
                info!(pod = %pod, "took a running pod out of the mesh");
            }
        }
        results
    }

    /// Moves the pods leaving the mesh on: closes the listeners whose linger is over, and
    /// deletes the tables of the pods whose listeners and connections have all ended (unless
    /// the pod joined again meanwhile). Returns when to call it again, `None` when no pod is
    /// leaving.
    pub fn finish_leaving(&self) -> Option<std::time::Instant> {
        let mut state = self.lock();
        let (ended, next) = state.listeners.sweep(std::time::Instant::now());
        for pod in ended {
            if state.registry.pods().any(|r| r.netns == pod.netns.path()) {
                continue;
            }
            match nft::delete(&self.nft, pod.netns.path()) {
                Ok(_) => debug!(pod = %pod.pod, "deleted the table of a pod that left the mesh"),
                // Harmless: a released table captures and refuses nothing.
                Err(e) => {
                    warn!(pod = %pod.pod, error = %e, "cannot delete the table of a pod that left the mesh")
                }
            }
        }
        next
    }

    /// When [`Agent::finish_leaving`] has something to do next; `None` when no pod is leaving.
    pub fn leaving_due(&self) -> Option<std::time::Instant> {
        self.lock().listeners.next_due()
    }

    /// The pods whose listeners accept connections, registered or leaving: those whose
    /// ServiceAccounts need an SVID.
    pub fn serving(&self) -> Vec<PodRef> {
        self.lock()
            .listeners
            .serving()
            .map(|info| info.pod.clone())
            .collect()
    }

    /// Forgets pods the proxy enrolled whose pod is gone (the runtime tells the plugin about
    /// the others): their listeners close, their tables went with their namespaces.
    pub fn forget(&self, container_ids: &[String]) {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        for id in container_ids {
            if let Some(pod) = state.registry.get(id) {
                next.remove(id, &pod.ifname);
            }
        }
        if next == state.registry {
            return;
        }
        if let Err(e) = next.save(&self.registry_path) {
            return error!(error = %e, "cannot save the pod registry; retrying");
        }
        for id in container_ids {
            state.listeners.close(id);
        }
        state.registry = next;
    }

    /// aether is being uninstalled: removes every registered pod's table, closes its listeners
    /// and forgets it, so pods keep working unmeshed.
    pub fn remove_all(&self) -> Vec<(String, String)> {
        let mut state = self.lock();
        let mut failed = Vec::new();
        for pod in state.registry.clone().pods() {
            state.listeners.close(&pod.container_id);
            match nft::delete(&self.nft, &pod.netns) {
                Ok(_) => info!(pod = %pod.pod, "removed the capture table: aether is uninstalled"),
                Err(e) => failed.push((pod.container_id.clone(), e.to_string())),
            }
        }
        for pod in state.listeners.close_leaving() {
            if let Err(e) = nft::delete(&self.nft, pod.netns.path()) {
                failed.push((pod.key.clone(), e.to_string()));
            }
        }
        state.registry = Registry::default();
        if let Err(e) = state.registry.save(&self.registry_path) {
            failed.push((String::new(), e.to_string()));
        }
        failed
    }

    /// Closes every listener; open connections get up to `drain` to finish. The registry stays
    /// on disk for the next start.
    pub async fn shutdown(&self, drain: Duration) {
        let tasks = self.lock().listeners.stop_all(drain);
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Has `keeper` keep every registered pod's listening sockets from now on.
    pub fn keep_sockets_in(&self, keeper: Arc<crate::handover::holder::Keeper>) {
        self.lock().listeners.keep_in(keeper);
    }

    /// A copy of every registered pod's listening sockets, for a successor process.
    pub fn pod_sockets(&self) -> std::io::Result<Vec<PodSocket>> {
        self.lock().listeners.sockets()
    }

    pub fn registered(&self) -> Vec<RegisteredPod> {
        self.lock().registry.pods().cloned().collect()
    }

    pub fn forward_counts(&self) -> ForwardCounts {
        self.plane.counts()
    }

    /// Brings every registered pod's table to its namespace's mTLS mode: a namespace labelled
    /// (or no longer labelled) `aether.io/mtls=strict` gets its pods' tables reinstalled with
    /// (or without) strict mode's chain.
    pub fn sync_modes(&self) {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        for pod in state.registry.pods() {
            let want = self.strict_port(&pod.pod);
            if want == pod.strict_inbound_port || !pod.netns.exists() {
                continue;
            }
            let mut updated = pod.clone();
            updated.strict_inbound_port = want;
            match nft::install(
                &self.nft,
                &pod.netns,
                &self.table_spec(&updated),
                &updated.elements(&state.capture),
            ) {
                Ok(()) => {
                    info!(pod = %pod.pod, strict = want.is_some(), "changed the pod's mTLS mode");
                    next.insert(updated);
                }
                Err(e) => {
                    warn!(pod = %pod.pod, error = %e, "cannot change the pod's mTLS mode; retrying")
                }
            }
        }
        if next != state.registry
            && let Err(e) = next.save(&self.registry_path)
        {
            error!(error = %e, "cannot save the pod registry after an mTLS mode change");
        }
        state.registry = next;
    }

    /// The inbound port, when the pod's namespace is in strict mode and the proxy has a mesh
    /// (without one there is no mTLS to require). An unknown namespace is not strict yet.
    fn strict_port(&self, pod: &PodRef) -> Option<u16> {
        self.inbound_port
            .filter(|_| pod_view::strict(&*self.view, pod).unwrap_or(false))
    }

    /// The table a registered pod has, by its record.
    fn table_spec(&self, pod: &RegisteredPod) -> TableSpec {
        TableSpec {
            capture_port: pod.capture_port,
            families: pod.families(),
            strict: pod.strict_inbound_port.map(|inbound_port| {
                let probes = self.probes(&pod.pod);
                Strict {
                    inbound_port,
                    probe_ports: probes.connect_only(),
                    proxied_probe_ports: probes.proxied(),
                }
            }),
        }
    }

    /// The pod's probes; none while the view does not know the pod (its probes are then
    /// refused until the next reinstall, never other ports let in).
    fn probes(&self, pod: &PodRef) -> Probes {
        self.view.probes(pod).unwrap_or_else(|e| {
            warn!(pod = %pod, error = %e, "the pod's probes are not known; they are refused for now");
            Probes::default()
        })
    }

    /// Brings the node's table of strict pods to the registered strict pods' addresses, so the
    /// node's probes of them come from the probe source address. Cheap when nothing changed.
    pub fn sync_node_probes(&self) {
        let Some(netns) = &self.node_netns else {
            return;
        };
        let pods: BTreeSet<IpAddr> = self
            .lock()
            .registry
            .pods()
            .filter(|p| p.strict_inbound_port.is_some())
            .flat_map(|p| p.ips.iter().copied())
            .collect();
        let mut applied = self.node_probes.lock().unwrap_or_else(|e| e.into_inner());
        if applied.as_ref() == Some(&pods) {
            return;
        }
        let list: Vec<IpAddr> = pods.iter().copied().collect();
        match nft::apply_node_probes(&self.nft, netns, &list) {
            Ok(()) => {
                info!(
                    strict_pods = list.len(),
                    "updated the node's table of strict pods"
                );
                *applied = Some(pods);
            }
            Err(e) => warn!(error = %e, "cannot update the node's table of strict pods; retrying"),
        }
    }

    /// Puts the node's table of strict pods back when it is not the one last applied (deleted
    /// or changed by hand: the node's probes of strict pods would be refused). Returns whether
    /// it did.
    pub fn repair_node_probes(&self) -> bool {
        let Some(netns) = &self.node_netns else {
            return false;
        };
        let applied = self.node_probes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pods) = applied.as_ref() else {
            return false;
        };
        let list: Vec<IpAddr> = pods.iter().copied().collect();
        let drift = match nft::verify_node_probes(&self.nft, netns, &list) {
            Ok(None) => return false,
            Ok(Some(drift)) => drift,
            Err(e) => {
                debug!(error = %e, "cannot check the node's table of strict pods");
                return false;
            }
        };
        match nft::apply_node_probes(&self.nft, netns, &list) {
            Ok(()) => {
                warn!(%drift, "repaired the node's table of strict pods");
                true
            }
            Err(e) => {
                error!(%drift, error = %e, "cannot repair the node's table of strict pods");
                false
            }
        }
    }

    /// aether is being uninstalled: the node's table of strict pods goes too.
    pub fn remove_node_probes(&self) {
        if let Some(netns) = &self.node_netns
            && let Err(e) = nft::delete_node_probes(&self.nft, netns)
        {
            warn!(error = %e, "cannot remove the node's table of strict pods");
        }
    }

    /// Opens `pod`'s listeners in `netns`, which they and their connections hold from then on.
    fn open_listeners(
        &self,
        listeners: &mut Listeners,
        pod: &RegisteredPod,
        netns: Netns,
    ) -> Result<bool, NetnsError> {
        let info = PodInfo {
            key: pod.container_id.clone(),
            pod: pod.pod.clone(),
            netns,
            families: pod.families(),
            ips: pod.ips.clone(),
        };
        listeners.open(info, &self.listener_addrs(pod))
    }

    /// The capture listeners, and the inbound one when the proxy is part of a mesh.
    fn listener_addrs(&self, pod: &RegisteredPod) -> Vec<(std::net::SocketAddr, Role)> {
        let mut addrs: Vec<_> = capture_addrs(pod.families(), pod.capture_port)
            .into_iter()
            .map(|addr| (addr, Role::Capture))
            .collect();
        if let Some(port) = self.inbound_port {
            addrs.push((inbound_addr(pod.families(), port), Role::Inbound));
        }
        addrs
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing in the state is left half-changed by a panic (every change is built on a copy
        // and swapped in), so a poisoned lock is still good.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One repair of [`Agent::repair_drift`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub pod: PodRef,
    pub what: DriftKind,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftKind {
    Table,
    Listeners,
}

impl DriftKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Table => "table",
            DriftKind::Listeners => "listeners",
        }
    }
}

fn error_reply(kind: ErrorKind, message: String) -> Response {
    Response::Error(ErrorReply { kind, message })
}
