//! One NodeConfig per node, written only when its content changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use aether_crds::{NodeConfig, NodeConfigSpec};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

use super::{FIELD_MANAGER, WRITES_IN_FLIGHT, WriteError, Writer};
use crate::cache::Stores;
use crate::index::{Index, Key};
use crate::node_config::{self, Shared};
use crate::status;
use crate::targets::Target;

/// A NodeConfig write: the node and the generation it wrote.
type ConfigWrite<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(String, Option<i64>), WriteError>> + Send + 'a>,
>;
/// Replaces a NodeConfig's spec (a JSON patch), leaving its status to the proxy; the object
/// as written.
async fn replace_spec(
    api: &Api<NodeConfig>,
    node: &str,
    spec: &NodeConfigSpec,
) -> Result<NodeConfig, kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(
        serde_json::json!([{"op": "replace", "path": "/spec", "value": spec}]),
    )
    .map_err(kube::Error::SerdeError)?;
    api.patch(node, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
}

impl Writer {
    /// One NodeConfig per node; a node's object is written only when its content changes.
    /// Returns, per node, the generation that holds the computed config.
    pub(super) async fn node_configs(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        shared: &Shared,
    ) -> (status::Required, Vec<WriteError>) {
        let api: Api<NodeConfig> = Api::all(self.client.clone());
        let existing: BTreeMap<String, Arc<NodeConfig>> = stores
            .node_configs
            .state()
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();
        let mut required = status::Required::new();
        let mut writes: Vec<ConfigWrite<'_>> = Vec::new();
        for node in &index.nodes {
            let spec: NodeConfigSpec = node_config::node_config(node, targets, shared);
            let exists = existing.contains_key(node);
            if let Some(stored) = existing.get(node).filter(|c| c.spec == spec) {
                if let Some(generation) = stored.metadata.generation {
                    required.insert(node.clone(), generation);
                }
                continue;
            }
            let api = api.clone();
            writes.push(Box::pin(async move {
                let failed = |e| WriteError::new(format!("NodeConfig {node}"), e);
                if !self.leading() {
                    return Ok((node.clone(), None));
                }
                // The spec is the operator's alone: replaced whole, which costs the API
                // server far less than a server-side apply of a large object.
                let written = if exists {
                    replace_spec(&api, node, &spec).await.map_err(failed)?
                } else {
                    let object = NodeConfig::new(node, spec.clone());
                    let params = PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    match api.create(&params, &object).await {
                        Ok(created) => created,
                        // Written by an earlier pass whose write the cache has not seen yet.
                        Err(kube::Error::Api(e)) if e.code == 409 => {
                            replace_spec(&api, node, &spec).await.map_err(failed)?
                        }
                        Err(e) => return Err(failed(e)),
                    }
                };
                self.metrics.writes.inc();
                tracing::info!(node, "updated NodeConfig");
                Ok((node.clone(), written.metadata.generation))
            }));
        }
        let results: Vec<Result<(String, Option<i64>), WriteError>> = futures::stream::iter(writes)
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let mut failed = Vec::new();
        for result in results {
            match result {
                Ok((node, Some(generation))) => {
                    required.insert(node, generation);
                }
                Ok((_, None)) => {}
                Err(e) => failed.push(e),
            }
        }
        for name in existing.keys().filter(|n| !index.nodes.contains(*n)) {
            if !self.leading() {
                break;
            }
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => failed.push(WriteError::new(format!("NodeConfig {name}"), e)),
            }
        }
        (required, failed)
    }
}
