//! The loop that turns what the watches see into the data plane's snapshot, the pods' capture
//! sets, the wanted SVIDs and the NodeConfig's status.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aether_crds::NodeConfig;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::enroller::Enroller;
use super::node::remove_taint;
use super::view::ClusterView;
use crate::dataplane::SnapshotCell;
use crate::identity::ServiceAccount;
use crate::identity::tls::Certs;
use crate::inpod::agent::Agent;
use crate::metrics::Metrics;

/// Changes arriving together are applied together.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// The removal of the node's readiness taint, once the first config is applied. Its task
/// retries until the taint is gone; one that panicked is started again.
enum Untaint {
    NotYet,
    Running(JoinHandle<()>),
    Done,
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
    let mut untaint = Untaint::NotYet;
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
        untaint = match untaint {
            Untaint::Running(task) if task.is_finished() => match task.await {
                Ok(()) => Untaint::Done,
                Err(e) => {
                    warn!(error = %e, "removing the node's taint failed; trying again");
                    Untaint::NotYet
                }
            },
            other => other,
        };
        if matches!(untaint, Untaint::NotYet) && generation.is_some() && applied {
            untaint = Untaint::Running(tokio::spawn(remove_taint(
                client.clone(),
                view.node.clone(),
            )));
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
