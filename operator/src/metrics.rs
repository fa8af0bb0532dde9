//! Prometheus metrics and the health endpoints, served on one plain HTTP port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

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
        let queue_depth = Gauge::default();
        let duration = Family::<Pass, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        registry.register("reconciles", "Reconcile passes", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconcile passes that failed and were retried",
            errors.clone(),
        );
        registry.register(
            "writes",
            "Objects written to the API server (status, RouteTargets, NodeConfigs)",
            writes.clone(),
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
            queue_depth,
            duration,
        }
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

    fn text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn respond(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// Serves `/healthz` (the process runs), `/readyz` (the watch caches are filled) and
/// `/metrics` until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    loop {
        let (stream, _) = listener.accept().await?;
        let (metrics, ready) = (metrics.clone(), ready.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = match req.uri().path() {
                    "/healthz" => respond(StatusCode::OK, "ok\n".into()),
                    "/readyz" if *ready.borrow() => respond(StatusCode::OK, "ok\n".into()),
                    "/readyz" => respond(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "watch caches not ready\n".into(),
                    ),
                    "/metrics" => respond(StatusCode::OK, metrics.text()),
                    _ => respond(StatusCode::NOT_FOUND, "not found\n".into()),
                };
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
