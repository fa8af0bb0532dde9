//! A shell on every node, for looking at what only a node shows (its network namespaces,
//! the nft tables in them, its CNI config) through the Kubernetes API: a DaemonSet of
//! privileged host-network pods with the node's root filesystem at `/host`, as `kubectl debug
//! node/...` gives an administrator. Its image is the node shell tests/cluster/images.sh
//! builds (a static busybox).

use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::Cluster;

pub const NAMESPACE: &str = "aether-e2e-nodes";
/// The node shell image (tests/cluster/images/node-shell.Containerfile).
pub const NODE_SHELL_IMAGE: &str = "localhost/aether-test/node-shell:1";

fn manifest() -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n---\n\
         apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: node-shell, namespace: {NAMESPACE}}}\n\
         spec:\n  selector: {{matchLabels: {{app: node-shell}}}}\n  template:\n\
         \x20   metadata: {{labels: {{app: node-shell}}}}\n    spec:\n\
         \x20     hostNetwork: true\n      terminationGracePeriodSeconds: 0\n\
         \x20     tolerations: [{{operator: Exists}}]\n      containers:\n      - name: shell\n\
         \x20       image: {NODE_SHELL_IMAGE}\n\
         \x20       command: [sh, -c, \"trap 'exit 0' TERM; while :; do sleep 3600 & wait; done\"]\n\
         \x20       securityContext: {{privileged: true}}\n\
         \x20       volumeMounts: [{{name: host, mountPath: /host, mountPropagation: Bidirectional}}]\n\
         \x20     volumes: [{{name: host, hostPath: {{path: /}}}}]\n"
    )
}

static DEPLOYED: OnceLock<Result<(), String>> = OnceLock::new();

/// The shell pod on `node`, the DaemonSet applied and rolled out once per process.
pub fn shell(cluster: &Cluster, node: &str) -> Result<Pod> {
    DEPLOYED
        .get_or_init(|| {
            cluster
                .apply_text(&manifest())
                .and_then(|()| cluster.rollout_status(NAMESPACE, "daemonset/node-shell"))
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)?;
    let field = format!("spec.nodeName={node},status.phase=Running");
    let text = cluster.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app=node-shell",
        "--field-selector",
        &field,
        "-o",
        "json",
    ])?;
    let list: Value = serde_json::from_str(&text)?;
    let Some(item) = list["items"].as_array().and_then(|items| items.first()) else {
        bail!("no running node shell on {node}");
    };
    serde_json::from_value(item.clone()).context("reading the node shell pod")
}
