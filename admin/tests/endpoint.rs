//! The admin endpoint over a real socket: each path, and readiness changing while it serves.

use http_body_util::{BodyExt, Empty};
use hyper::StatusCode;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

async fn get(addr: std::net::SocketAddr, path: &str) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header("host", "admin")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = send.send_request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn serves_health_readiness_and_metrics() {
    let mut registry = Registry::default();
    let served = Counter::<u64>::default();
    registry.register("served", "Things served", served.clone());
    served.inc();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ready, readiness) = watch::channel(Err("watch caches not ready".to_string()));
    tokio::spawn(aether_admin::serve(
        listener,
        move || aether_admin::encode(&registry),
        readiness,
    ));

    assert_eq!(get(addr, "/healthz").await, (StatusCode::OK, "ok\n".into()));
    assert_eq!(
        get(addr, "/readyz").await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "watch caches not ready\n".into()
        )
    );
    ready.send(Ok(())).unwrap();
    assert_eq!(get(addr, "/readyz").await, (StatusCode::OK, "ok\n".into()));

    let (status, metrics) = get(addr, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(metrics.contains("served_total 1"), "{metrics}");
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");

    assert_eq!(get(addr, "/other").await.0, StatusCode::NOT_FOUND);
}
