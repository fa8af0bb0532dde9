//! Strict mode: pods that refuse plaintext from other hosts (their namespace says so, or their
//! AuthorizationPolicies refuse callers without an identity), and the node's table that gives
//! the node's probes of them a probe source address.

use std::collections::BTreeSet;
use std::net::IpAddr;

use aether_cni::nft::{self, Strict, TableSpec};
use aether_cni::protocol::PodRef;
use tracing::{debug, error, info, warn};

use super::Agent;
use crate::control::pod_view;
use crate::inpod::probes::Probes;
use crate::state::registry::RegisteredPod;

impl Agent {
    /// Brings every registered pod's table to its mTLS mode: a namespace labelled (or no longer
    /// labelled) `aether.io/mtls=strict`, or a pod an AuthorizationPolicy now (or no longer)
    /// closes to callers without an identity, gets its table reinstalled with (or without)
    /// strict mode's chain.
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

    /// The inbound port, when the pod's namespace is in strict mode or its AuthorizationPolicies
    /// refuse callers without an identity, and the proxy has a mesh (without one there is no
    /// mTLS to require). An unknown namespace is not strict yet.
    pub(super) fn strict_port(&self, pod: &PodRef) -> Option<u16> {
        self.inbound_port.filter(|_| {
            pod_view::strict(&*self.view, pod).unwrap_or(false) || self.plane.refuses_plaintext(pod)
        })
    }

    /// The table a registered pod has, by its record.
    pub(super) fn table_spec(&self, pod: &RegisteredPod) -> TableSpec {
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
    pub(super) fn probes(&self, pod: &PodRef) -> Probes {
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
}
