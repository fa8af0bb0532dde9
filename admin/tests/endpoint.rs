//! The admin endpoint over a real socket: each path, readiness changing while it serves, and
//! clients that hold connections without asking anything.

use http_body_util::{BodyExt, Empty};
use hyper::StatusCode;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

async fn get(addr: std::net::SocketAddr, path: &str) -> (StatusCode, String) {
    request(TcpStream::connect(addr).await.unwrap(), path).await
}

/// A connection to `to` from the source address `from`.
async fn connect_from(from: &str, to: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

async fn request(stream: TcpStream, path: &str) -> (StatusCode, String) {
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
        aether_admin::Limits::default(),
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

/// Whether the endpoint closes `stream` (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn silent_clients_are_bounded_per_address_and_in_time() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_ready, readiness) = watch::channel(Ok(()));
    let limits = aether_admin::Limits {
        connections: 8,
        per_source: 3,
        head: std::time::Duration::from_millis(300),
        lifetime: std::time::Duration::from_secs(2),
    };
    tokio::spawn(aether_admin::serve(
        listener,
        String::new,
        readiness,
        limits,
    ));
    let endpoint: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let attacker = || connect_from("127.0.0.1", endpoint);

    // Three silent connections from one address are held; a fourth is closed at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(attacker().await);
    }
    let mut fourth = attacker().await;
    assert!(
        closed_within(&mut fourth, std::time::Duration::from_millis(200)).await,
        "a fourth connection from one address is closed"
    );
    // Another address is still served meanwhile.
    let other = connect_from("127.0.0.2", endpoint).await;
    assert_eq!(request(other, "/healthz").await.0, StatusCode::OK);
    // A client that never sends its head is dropped after the head timeout, freeing its slot.
    for stream in &mut held {
        assert!(closed_within(stream, std::time::Duration::from_secs(1)).await);
    }
    assert_eq!(
        request(attacker().await, "/healthz").await.0,
        StatusCode::OK
    );
}
