//! Drift repair: a registered pod's table or listeners put back when something removed them.

use aether_cni::nft;
use aether_cni::protocol::PodRef;
use tracing::{debug, error, warn};

use super::{Agent, State};
use crate::inpod::netns::Netns;

impl Agent {
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
