//! The node proxy's pod state: the registry, the capture set and the pods' listeners, changed
//! by the CNI plugin's requests (`registration`, answered on the wire by `inpod::protocol`), by
//! the proxy's own enrolment of running pods (`enrolment`), by strict mode (`strict`) and by
//! drift repair (`drift`).
//!
//! Synchronous on purpose: a request may run nftables (libnftables or `nft`) and open sockets
//! through short-lived threads, so callers run it off the async workers, on tokio's blocking
//! pool. One lock serialises every change, so a registration and a capture set update can never
//! interleave and leave a pod's table behind.

mod drift;
mod enrolment;
mod registration;
mod strict;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aether_cni::nft::{self, Nft};
use tokio::runtime::Handle;
use tracing::{debug, error, info, warn};

use crate::control::pod_view::PodView;
use crate::dataplane::{DataPlane, ForwardCounts};
use crate::inpod::capture_set::CaptureSet;
use crate::inpod::listeners::{
    ConnectionLimits, Listeners, PodInfo, PodSocket, Role, capture_addrs, inbound_addr,
};
use crate::inpod::netns::{Netns, NetnsError};
use crate::state::registry::{RegisteredPod, Registry, RegistryError};

pub use drift::{DriftKind, Repair};
pub use enrolment::Enrolment;
pub use registration::{RegisterError, Registration};

/// The registry's file in the state directory.
pub const REGISTRY_FILE: &str = "registry.json";
/// How long a pod leaving the mesh keeps its listeners: longer than the news takes to reach
/// every node's proxy.
pub const LEAVE_LINGER: Duration = Duration::from_secs(10);

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
