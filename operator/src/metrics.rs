//! The operator's Prometheus metrics (served by `aether_admin` with the health endpoints).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A failed write's reason: `not_found`, `forbidden`, `conflict`, `invalid`, `server_error`,
/// `refused` or `unreachable` (see `write::WriteError::metric_label`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteErrorLabels {
    pub reason: &'static str,
}

/// The two reconcile loops: `config` (derived RouteTargets, NodeConfigs: what the data
/// plane reads) and `status` (RouteTarget and route status: what users read).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Pass {
    pub pass: &'static str,
}

pub struct Metrics {
    registry: Registry,
    reconciles: Family<Pass, Counter>,
    errors: Family<Pass, Counter>,
    pub writes: Counter,
    write_errors: Family<WriteErrorLabels, Counter>,
    /// Changed parts of the index (a kind in a namespace) waiting for the next pass.
    pub queue_depth: Gauge,
    duration: Family<Pass, Histogram>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("aether_operator");
        let reconciles = Family::<Pass, Counter>::default();
        let errors = Family::<Pass, Counter>::default();
        let writes = Counter::default();
        let write_errors = Family::<WriteErrorLabels, Counter>::default();
        let queue_depth = Gauge::default();
        let duration = Family::<Pass, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        registry.register("reconciles", "Reconcile passes", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconcile passes with a failed write (retried)",
            errors.clone(),
        );
        registry.register(
            "writes",
            "Objects written to the API server (status, RouteTargets, NodeConfigs)",
            writes.clone(),
        );
        registry.register(
            "write_errors",
            "Writes of one object that failed (the pass's other writes went ahead), by reason",
            write_errors.clone(),
        );
        registry.register(
            "queue_depth",
            "Changed parts of the index (a kind in a namespace) taken by the last config pass",
            queue_depth.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile pass",
            duration.clone(),
        );
        Metrics {
            registry,
            reconciles,
            errors,
            writes,
            write_errors,
            queue_depth,
            duration,
        }
    }

    pub fn write_failed(&self, reason: &'static str) {
        self.write_errors
            .get_or_create(&WriteErrorLabels { reason })
            .inc();
    }

    pub fn observe(&self, pass: &'static str, took: Duration, ok: bool) {
        let pass = Pass { pass };
        self.reconciles.get_or_create(&pass).inc();
        if !ok {
            self.errors.get_or_create(&pass).inc();
        }
        self.duration
            .get_or_create(&pass)
            .observe(took.as_secs_f64());
    }

    pub fn text(&self) -> String {
        aether_admin::encode(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
