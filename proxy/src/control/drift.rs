//! Drift repair: pods' capture tables and the node's CNI config put back when something
//! else changed them.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::watch;
use tracing::warn;

use super::view::{ClusterView, MANAGER};
use crate::inpod::agent::Agent;
use crate::metrics::Metrics;

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
