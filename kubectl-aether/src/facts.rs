//! What the plugin learns of a cluster, as plain data: [`crate::gather`] fills it from the API
//! server, [`crate::checks`] and [`crate::status`] judge and show it.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::metrics::ProxyFigures;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Facts {
    /// The API server's `major.minor`, when it said.
    pub kubernetes: Option<(u32, u32)>,
    /// Names of the CustomResourceDefinitions installed.
    pub crds: BTreeSet<String>,
    /// The namespace aether was looked for in.
    pub namespace: String,
    pub operator: Option<Rollout>,
    pub proxies: Option<Rollout>,
    pub nodes: Vec<NodeFacts>,
}

/// Ready replicas against desired ones, of a Deployment or a DaemonSet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rollout {
    pub desired: i32,
    pub ready: i32,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeFacts {
    pub name: String,
    pub ready: bool,
    /// The aether proxy pod on the node, and whether it is Ready.
    pub proxy_pod: Option<String>,
    pub proxy_ready: bool,
    /// The node's NodeConfig: its generation and the one the proxy reported applied.
    pub config_generation: Option<i64>,
    pub applied_generation: Option<i64>,
    /// The proxy's own figures (from its `/metrics`), or why they could not be read.
    pub figures: Option<ProxyFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scrape_error: Option<String>,
}
