//! What the proxy writes about its node: the cold path's demand on the NodeConfig, and the
//! removal of the readiness taint.

use std::sync::Arc;
use std::time::Duration;

use aether_core::names::AGENT_NOT_READY_TAINT;
use aether_crds::NodeConfig;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use tracing::{info, warn};

use crate::dataplane::Demand;

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
pub(super) async fn remove_taint(client: kube::Client, node: String) {
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
