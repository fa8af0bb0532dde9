//! The admin endpoint the operator and the proxy serve on one plain HTTP port: `/healthz`
//! (the process runs), `/readyz` (ready, or why not) and `/metrics` (Prometheus text format).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Readiness: `Ok`, or the reason `/readyz` reports while not ready.
pub type Readiness = Result<(), String>;

/// A registry's metrics in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// What one client of the endpoint may hold. Any pod can reach a node's address, so the
/// proxy's admin port is open to every tenant: without these, a pod opening connections and
/// sending nothing would hold the process's file descriptors, which its data plane shares.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections at once, in all.
    pub connections: usize,
    /// Connections at once from one address.
    pub per_source: usize,
    /// How long a client may take to send a request head.
    pub head: Duration,
    /// How long a connection may live: enough for a scrape, a probe or a keep-alive client
    /// between scrapes, which then reconnects.
    pub lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            per_source: 16,
            head: Duration::from_secs(5),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Serves the admin endpoint on `listener` until the task is dropped; `metrics` renders
/// `/metrics` at each scrape. A connection over `limits` is closed at once.
pub async fn serve<M>(
    listener: TcpListener,
    metrics: M,
    ready: watch::Receiver<Readiness>,
    limits: Limits,
) where
    M: Fn() -> String + Send + Sync + 'static,
{
    let metrics = Arc::new(metrics);
    let all = Arc::new(Semaphore::new(limits.connections));
    let sources: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Running out of descriptors passes; the endpoint must outlive it.
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept an admin connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = all.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "closed an admin connection: too many at once");
            continue;
        };
        let Some(source) = SourceSlot::take(&sources, peer.ip(), limits.per_source) else {
            tracing::debug!(%peer, "closed an admin connection: too many from its address");
            continue;
        };
        let (metrics, ready) = (metrics.clone(), ready.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = respond(req.uri().path(), &*metrics, &ready.borrow());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.head)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(limits.lifetime, served).await;
            drop((permit, source));
        });
    }
}

/// One connection counted against its source address, until dropped.
struct SourceSlot {
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl SourceSlot {
    fn take(
        sources: &Arc<Mutex<HashMap<IpAddr, usize>>>,
        ip: IpAddr,
        limit: usize,
    ) -> Option<Self> {
        let mut counts = sources.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(ip).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            sources: sources.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut counts = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

fn respond(path: &str, metrics: &dyn Fn() -> String, ready: &Readiness) -> Response<Full<Bytes>> {
    let (status, body) = match (path, ready) {
        ("/healthz", _) | ("/readyz", Ok(())) => (StatusCode::OK, "ok\n".to_string()),
        ("/readyz", Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        ("/metrics", _) => (StatusCode::OK, metrics()),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
