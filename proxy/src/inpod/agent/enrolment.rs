//! Running pods the proxy meshes and takes out of the mesh itself, with no restart.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use aether_cni::nft::{self};
use aether_cni::protocol::PodRef;
use tracing::{debug, error, info, warn};

use super::{Agent, State};
use crate::inpod::netns::Netns;
use crate::state::registry::{RegisteredPod, Registry, enrolled_id};

/// What a leaving pod's open connections then get to finish.
const LEAVE_DRAIN: Duration = Duration::from_secs(5);

/// A running pod to mesh, found by the proxy itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enrolment {
    pub pod: PodRef,
    pub netns: PathBuf,
    pub ips: Vec<IpAddr>,
}

impl Agent {
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
}
