//! The leader's writes to the API server, one object each: derived RouteTargets and their
//! status and Events (`targets`), Gateway API route status (`routes`), AuthorizationPolicy
//! status (`policies`), and NodeConfigs (`node_configs`). A write that fails fails for its
//! object alone: every other write of the pass still runs, and the failure comes back typed,
//! naming its object, with a label for the metric.
mod node_configs;
mod policies;
mod routes;
mod targets;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::Recorder;
use tokio::sync::watch;

use crate::cache::Stores;
use crate::controller::Config;
use crate::index::{Index, Key};
use crate::metrics::Metrics;
use crate::node_config::Shared;
use crate::status;
use crate::targets::Target;

#[derive(Debug, thiserror::Error)]
#[error("{object}: {source}")]
pub struct WriteError {
    /// `Kind namespace/name` (or `Kind name` for a cluster-scoped object).
    pub object: String,
    #[source]
    pub source: kube::Error,
}

impl WriteError {
    pub fn new(object: impl Into<String>, source: kube::Error) -> Self {
        WriteError {
            object: object.into(),
            source,
        }
    }

    /// The reason, for `aether_operator_write_errors_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match &self.source {
            kube::Error::Api(e) => match e.code {
                404 => "not_found",
                403 => "forbidden",
                409 => "conflict",
                422 => "invalid",
                code if code >= 500 => "server_error",
                _ => "refused",
            },
            kube::Error::SerdeError(_) => "unreadable",
            _ => "unreachable",
        }
    }

    /// Whether the object's namespace is being deleted: the write cannot succeed until it is
    /// gone, and no retry will change that.
    pub fn namespace_terminating(&self) -> bool {
        matches!(&self.source, kube::Error::Api(e) if e.code == 403 && e.message.contains("is being terminated"))
    }
}

/// One object's write.
pub type Write<'a> = Pin<Box<dyn Future<Output = Result<(), WriteError>> + Send + 'a>>;

/// Runs every write, `in_flight` at a time, each to its end; returns the failures.
pub async fn all(writes: Vec<Write<'_>>, in_flight: usize) -> Vec<WriteError> {
    futures::stream::iter(writes)
        .buffer_unordered(in_flight)
        .filter_map(|result| async move { result.err() })
        .collect()
        .await
}

pub(crate) const FIELD_MANAGER: &str = "aether-operator";
/// API writes of one config pass in flight at once: a first sync writes thousands of objects.
const WRITES_IN_FLIGHT: usize = 32;
/// Status writes in flight at once: fewer, so that a first sync's thousands of status writes
/// leave the API server room for the config loop's.
const STATUS_WRITES_IN_FLIGHT: usize = 8;

/// What one config pass computed, handed to the status loop.
pub(crate) struct Model {
    pub index: Arc<Index>,
    pub targets: BTreeMap<Key, Target>,
    pub shared: Shared,
    /// The NodeConfig generations holding this model's per-node config.
    pub required: status::Required,
}

/// The leader's writer: its client, Event recorder and metrics, and the lease it writes under.
pub(crate) struct Writer {
    pub client: kube::Client,
    pub config: Config,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub leader: watch::Receiver<bool>,
}

impl Writer {
    /// Logs and counts a pass's failed writes, each with its object.
    pub fn report(&self, pass: &'static str, failed: &[WriteError]) {
        for error in failed {
            let reason = error.metric_label();
            self.metrics.write_failed(reason);
            if error.namespace_terminating() {
                tracing::info!(pass, object = %error.object, "not written: its namespace is being deleted");
            } else {
                tracing::warn!(pass, object = %error.object, reason, error = %error.source, "write failed; the others went ahead, this one is retried");
            }
        }
    }

    /// What the data plane reads: derived RouteTargets, then every node's config.
    pub async fn configs(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        shared: &Shared,
    ) -> (status::Required, Vec<WriteError>) {
        let mut failed = self.derived_targets(stores, index, targets).await;
        let (required, nodes) = self.node_configs(stores, index, targets, shared).await;
        failed.extend(nodes);
        (required, failed)
    }

    pub async fn status(&self, stores: &Stores, model: &Model) -> Vec<WriteError> {
        let now = Time(Timestamp::now());
        let mut failed = self.target_status(stores, model, &now).await;
        failed.extend(
            self.route_status(stores, &model.index, &model.targets, &now)
                .await,
        );
        failed.extend(self.policy_status(stores, model, &now).await);
        failed
    }

    /// Whether this replica still leads: checked right before each write, so a replica that
    /// lost its lease stops writing at once.
    pub fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    /// A write that runs only while this replica leads.
    fn guarded<'a>(&'a self, write: Write<'a>) -> Write<'a> {
        Box::pin(async move { if self.leading() { write.await } else { Ok(()) } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[tokio::test]
    async fn one_failing_write_leaves_the_others_to_run() {
        let ran = std::sync::atomic::AtomicUsize::new(0);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for i in 0..5 {
            let ran = &ran;
            writes.push(Box::pin(async move {
                ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i == 1 {
                    return Err(WriteError::new(
                        "RouteTarget ghost/web",
                        api_error(404, "namespaces \"ghost\" not found"),
                    ));
                }
                Ok(())
            }));
        }
        let failed = all(writes, 2).await;
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 5);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].metric_label(), "not_found");
        assert!(failed[0].to_string().starts_with("RouteTarget ghost/web: "));
    }

    #[test]
    fn a_terminating_namespace_is_told_apart() {
        let terminating = WriteError::new(
            "RouteTarget gone/web",
            api_error(
                403,
                "unable to create new content in namespace gone because it is being terminated",
            ),
        );
        assert!(terminating.namespace_terminating());
        assert_eq!(terminating.metric_label(), "forbidden");
        let forbidden = WriteError::new("RouteTarget x/web", api_error(403, "forbidden"));
        assert!(!forbidden.namespace_terminating());
    }
}
