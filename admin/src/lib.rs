//! The admin endpoint the operator and the proxy serve on one plain HTTP port: `/healthz`
//! (the process runs), `/readyz` (ready, or why not) and `/metrics` (Prometheus text format).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Readiness: `Ok`, or the reason `/readyz` reports while not ready.
pub type Readiness = Result<(), String>;

/// A registry's metrics in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Serves the admin endpoint on `listener` until the task is dropped; `metrics` renders
/// `/metrics` at each scrape.
pub async fn serve<M>(listener: TcpListener, metrics: M, ready: watch::Receiver<Readiness>)
where
    M: Fn() -> String + Send + Sync + 'static,
{
    let metrics = Arc::new(metrics);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Running out of descriptors passes; the endpoint must outlive it.
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept an admin connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (metrics, ready) = (metrics.clone(), ready.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = respond(req.uri().path(), &*metrics, &ready.borrow());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
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
