//! Pods the CNI plugin sets up and tears down: what a new pod's table captures, registering
//! its listeners, and the runtime's CHECK and GC. Failures are typed; `inpod::protocol` turns
//! them into the plugin's replies.

use std::net::IpAddr;
use std::path::PathBuf;

use aether_cni::decision::Meshing;
use aether_cni::nft;
use aether_cni::protocol::{CapturePlan, CheckStatus, Decision, PodRef, StrictPlan};
use tracing::{info, warn};

use super::{Agent, State};
use crate::control::pod_view::{self, ViewError};
use crate::inpod::listeners::Listeners;
use crate::inpod::netns::{self, Netns};
use crate::state::registry::RegisteredPod;

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The proxy's view cannot answer yet: the plugin decides from the API server itself, and
    /// a meshed pod's setup is retried.
    #[error(transparent)]
    NotReady(#[from] ViewError),
    /// The registration does not describe the pod it names.
    #[error("refusing to register pod {pod}: {why}")]
    Refused { pod: PodRef, why: String },
    /// The proxy could not do its part (listeners, tables, its state file).
    #[error("{0}")]
    Failed(String),
}

/// A pod the plugin set up, to register.
#[derive(Clone, Debug)]
pub struct Registration {
    pub pod: PodRef,
    pub container_id: String,
    pub ifname: String,
    pub netns: PathBuf,
    pub ips: Vec<IpAddr>,
    /// The capture set generation the plugin installed.
    pub generation: u64,
}

impl Agent {
    /// What a new pod's table is to capture, or why the pod is not meshed.
    pub fn plan(&self, pod: &PodRef, ips: &[IpAddr]) -> Result<Decision, RegisterError> {
        Ok(match pod_view::meshing(&*self.view, pod)? {
            Meshing::Unmeshed { reason } => Decision::Unmeshed { reason },
            Meshing::Meshed => {
                let capture = self.lock().capture.clone();
                Decision::Meshed(CapturePlan {
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
                })
            }
        })
    }

    /// Registers a pod whose table the plugin installed: opens its listeners and records it.
    pub fn register(&self, registration: Registration) -> Result<(), RegisterError> {
        let pod = RegisteredPod {
            strict_inbound_port: self.strict_port(&registration.pod),
            pod: registration.pod,
            container_id: registration.container_id,
            ifname: registration.ifname,
            netns: registration.netns,
            ips: registration.ips,
            capture_port: self.capture_port,
            generation: registration.generation,
        };
        let result = self.register_pod(pod);
        // Before the kubelet's first probe of a new strict pod, when it can.
        self.sync_node_probes();
        self.registrations.notify_one();
        result
    }

    fn register_pod(&self, mut pod: RegisteredPod) -> Result<(), RegisterError> {
        let netns = self.verify_netns(&pod).map_err(|why| {
            warn!(pod = %pod.pod, netns = %pod.netns.display(), reason = %why, "refused a registration");
            RegisterError::Refused {
                pod: pod.pod.clone(),
                why,
            }
        })?;
        let mut state = self.lock();
        let State {
            registry,
            capture,
            listeners,
        } = &mut *state;
        let id = pod.container_id.clone();
        let opened = self.open_listeners(listeners, &pod, netns).map_err(|e| {
            RegisterError::Failed(format!(
                "cannot open the capture listeners of pod {}: {e}",
                pod.pod
            ))
        })?;
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
                return Err(RegisterError::Failed(format!(
                    "cannot bring the capture set of pod {} to generation {}: {e}",
                    pod.pod, capture.generation
                )));
            }
            pod.generation = capture.generation;
        }
        let mut next = registry.clone();
        next.insert(pod.clone());
        if let Err(e) = next.save(&self.registry_path) {
            undo(listeners);
            return Err(RegisterError::Failed(e.to_string()));
        }
        *registry = next;
        info!(pod = %pod.pod, container_id = %id, netns = %pod.netns.display(),
            generation = pod.generation, "registered a pod");
        Ok(())
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

    /// Forgets a pod the runtime tore down and closes its listeners. Whether it was known.
    pub fn unregister(&self, container_id: &str, ifname: &str) -> Result<bool, RegisterError> {
        let result = self.unregister_pod(container_id, ifname);
        self.sync_node_probes();
        self.registrations.notify_one();
        result
    }

    fn unregister_pod(&self, container_id: &str, ifname: &str) -> Result<bool, RegisterError> {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        let Some(pod) = next.remove(container_id, ifname) else {
            return Ok(false);
        };
        next.save(&self.registry_path)
            .map_err(|e| RegisterError::Failed(e.to_string()))?;
        state.registry = next;
        state.listeners.close(container_id);
        info!(pod = %pod.pod, container_id, "unregistered a pod");
        Ok(true)
    }

    /// The runtime's CHECK: whether a meshed pod is registered with open listeners.
    pub fn check(&self, pod: &PodRef, container_id: &str) -> Result<CheckStatus, RegisterError> {
        Ok(match pod_view::meshing(&*self.view, pod)? {
            Meshing::Unmeshed { reason } => CheckStatus::Unmeshed { reason },
            Meshing::Meshed => {
                let state = self.lock();
                let registered = state.registry.get(container_id);
                CheckStatus::Meshed {
                    registered: registered.is_some() && state.listeners.is_open(container_id),
                    capture_port: registered.map_or(self.capture_port, |p| p.capture_port),
                    strict_inbound_port: registered
                        .map_or_else(|| self.strict_port(pod), |p| p.strict_inbound_port),
                }
            }
        })
    }

    /// The runtime's GC: forgets every pod not among `valid_container_ids`. The ids removed.
    pub fn gc(&self, valid_container_ids: &[String]) -> Result<Vec<String>, RegisterError> {
        let mut state = self.lock();
        let mut next = state.registry.clone();
        let removed = next.retain_valid(valid_container_ids);
        if removed.is_empty() {
            return Ok(Vec::new());
        }
        next.save(&self.registry_path)
            .map_err(|e| RegisterError::Failed(e.to_string()))?;
        state.registry = next;
        for pod in &removed {
            state.listeners.close(&pod.container_id);
            info!(pod = %pod.pod, container_id = %pod.container_id, "garbage-collected a pod");
        }
        Ok(removed.into_iter().map(|p| p.container_id).collect())
    }
}
