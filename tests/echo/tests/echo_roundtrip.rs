//! The built `aether-echo` binary, end to end on loopback: a server on HTTP, gRPC, TCP and TLS
//! ports, driven by the binary's own client mode (and by raw sockets where the client has no
//! say), its output read back with `aether_echo::report`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use aether_echo::report::{self, Exchange};

const BINARY: &str = env!("CARGO_BIN_EXE_aether-echo");

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A running `aether-echo` server, killed when dropped.
struct Server {
    child: Child,
    http: u16,
    grpc: u16,
    tcp: u16,
    tls: u16,
}

impl Server {
    /// `with_cert`: give the TLS port the fixture certificate, or paths that do not exist.
    fn start(with_cert: bool) -> Server {
        let (http, grpc, tcp, tls) = (free_port(), free_port(), free_port(), free_port());
        let (crt, key) = if with_cert {
            (fixture("cert.pem"), fixture("key.pem"))
        } else {
            (
                PathBuf::from("/nonexistent/cert.crt"),
                PathBuf::from("/nonexistent/cert.key"),
            )
        };
        let child = Command::new(BINARY)
            .arg(format!("--tcp={tcp}"))
            .arg(format!("--port={http}"))
            .arg(format!("--grpc={grpc}"))
            .arg(format!("--port={tls}"))
            .arg(format!("--tls={tls}"))
            .arg("--crt")
            .arg(crt)
            .arg("--key")
            .arg(key)
            .arg("--version=v9")
            .env("POD_NAME", "echo-v1-5d8f7c-x2x7q")
            .env("POD_NAMESPACE", "gateway-conformance-mesh")
            .env("SERVICE_ACCOUNT", "echo-v1")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start aether-echo");
        let server = Server {
            child,
            http,
            grpc,
            tcp,
            tls,
        };
        let mut ports = vec![http, grpc, tcp];
        if with_cert {
            ports.push(tls);
        }
        for port in ports {
            wait_for_port(port);
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never opened");
        thread::sleep(Duration::from_millis(20));
    }
}

fn client(args: &[&str]) -> Output {
    Command::new(BINARY)
        .arg("client")
        .args(args)
        .output()
        .expect("run aether-echo client")
}

/// Runs the client, expects success, and parses what it printed.
fn exchanges(args: &[&str]) -> Vec<Exchange> {
    let output = client(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "client {args:?} failed: {}\nstdout:\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    report::parse(&stdout).unwrap_or_else(|e| panic!("{e}\nstdout:\n{stdout}"))
}

#[test]
fn http1_echoes_method_path_headers_and_identity() {
    let server = Server::start(false);
    let url = format!("http://127.0.0.1:{}/some/path?x=1&y=2", server.http);
    let got = exchanges(&[
        &url,
        "--method=POST",
        "-H",
        "X-Header-Set: set-value",
        "-H",
        "x-multi:one",
        "-H",
        "x-multi:two",
        "-H",
        "Host: echo",
        "-H",
        "x-aether-client-identity:spiffe://cluster.local/ns/gateway-conformance-mesh/sa/client",
    ]);
    assert_eq!(got.len(), 1);
    let exchange = &got[0];
    assert_eq!(exchange.url, url);
    assert_eq!(exchange.status, Some(200));
    assert_eq!(
        exchange.response_header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    let body = &exchange.body;
    assert_eq!(body.status_code, "200");
    assert_eq!(body.service_version, "v9");
    assert_eq!(body.service_port, server.http.to_string());
    assert_eq!(body.method, "POST");
    assert_eq!(body.url, "/some/path?x=1&y=2");
    assert_eq!(body.host, "echo");
    assert_eq!(body.proto, "HTTP/1.1");
    assert_eq!(body.alpn, "");
    assert_eq!(body.ip, "127.0.0.1");
    assert_eq!(body.hostname, "echo-v1-5d8f7c-x2x7q");
    assert_eq!(body.namespace, "gateway-conformance-mesh");
    assert_eq!(body.service_account, "echo-v1");
    assert_eq!(
        body.identity.as_deref(),
        Some("spiffe://cluster.local/ns/gateway-conformance-mesh/sa/client")
    );
    assert_eq!(
        body.request_header("x-header-set").as_deref(),
        Some("set-value")
    );
    assert_eq!(body.request_header("X-Multi").as_deref(), Some("one,two"));
    assert_eq!(body.request_header("host").as_deref(), Some("echo"));
}

#[test]
fn url_authority_is_the_default_host() {
    let server = Server::start(false);
    let authority = format!("127.0.0.1:{}", server.http);
    let got = exchanges(&[&format!("http://{authority}")]);
    assert_eq!(got[0].body.host, authority);
    assert_eq!(got[0].body.url, "/");
    assert_eq!(got[0].body.method, "GET");
}

#[test]
fn h2c_on_the_http_port() {
    let server = Server::start(false);
    let got = exchanges(&[
        &format!("http://127.0.0.1:{}/h2", server.http),
        "--http2",
        "-H",
        "x-a:1",
    ]);
    let body = &got[0].body;
    assert_eq!(got[0].status, Some(200));
    assert_eq!(body.proto, "HTTP/2.0");
    assert_eq!(body.url, "/h2");
    assert_eq!(body.host, format!("127.0.0.1:{}", server.http));
    assert_eq!(body.request_header("x-a").as_deref(), Some("1"));
}

#[test]
fn grpc_echo_round_trip_with_metadata_in_a_batch() {
    let server = Server::start(false);
    let url = format!("grpc://127.0.0.1:{}", server.grpc);
    // The conformance harness passes --method=GET for gRPC too; it must be accepted.
    let args = [
        url.as_str(),
        "--method=GET",
        "-H",
        "x-test-case:set",
        "-H",
        "x-header-add: a",
        "-H",
        "x-header-add:b",
        "--count=3",
        "--msg=ping",
    ];
    let output = client(&args);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The upstream harness splits a batch on blank lines.
    assert_eq!(
        stdout
            .split("\n\n")
            .filter(|b| !b.trim().is_empty())
            .count(),
        3
    );

    let got = report::parse(&stdout).unwrap();
    assert_eq!(got.len(), 3);
    for (i, exchange) in got.iter().enumerate() {
        assert_eq!(exchange.index, i);
        assert_eq!(exchange.status, Some(200));
        assert_eq!(exchange.grpc_status, Some(0));
        let body = &exchange.body;
        assert_eq!(body.proto, "GRPC");
        assert_eq!(body.url, "/proto.EchoTestService/Echo");
        assert_eq!(body.echo.as_deref(), Some("ping"));
        assert_eq!(body.host, format!("127.0.0.1:{}", server.grpc));
        assert_eq!(body.service_port, server.grpc.to_string());
        assert_eq!(body.hostname, "echo-v1-5d8f7c-x2x7q");
        assert_eq!(body.request_header("x-test-case").as_deref(), Some("set"));
        assert_eq!(body.request_header("x-header-add").as_deref(), Some("a,b"));
        assert_eq!(
            body.request_header("content-type").as_deref(),
            Some("application/grpc")
        );
    }
}

#[tokio::test]
async fn grpc_unknown_method_is_unimplemented() {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let server = Server::start(false);
    let stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, server.grpc))
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!(
        "http://127.0.0.1:{}/proto.EchoTestService/ForwardEcho",
        server.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "12");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
}

#[test]
fn requested_status_is_returned_and_reported() {
    let server = Server::start(false);
    let got = exchanges(&[
        &format!("http://127.0.0.1:{}/fail", server.http),
        "-H",
        "x-echo-status: 503",
    ]);
    assert_eq!(got[0].status, Some(503));
    assert_eq!(got[0].body.status_code, "503");

    let got = exchanges(&[&format!(
        "http://127.0.0.1:{}/teapot?status=418",
        server.http
    )]);
    assert_eq!(got[0].status, Some(418));

    let got = exchanges(&[
        &format!("http://127.0.0.1:{}/", server.http),
        "-H",
        "x-echo-status:abc",
    ]);
    assert_eq!(got[0].status, Some(400));
}

#[test]
fn redirects_are_reported_not_followed() {
    let server = Server::start(false);
    let elsewhere = format!("http://127.0.0.1:{}/elsewhere", server.http);
    let got = exchanges(&[
        &format!("http://127.0.0.1:{}/original", server.http),
        "-H",
        "x-echo-status:302",
        "-H",
        &format!("x-echo-response-header:Location:{elsewhere}"),
    ]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, Some(302));
    assert_eq!(got[0].response_header("location"), Some(elsewhere.as_str()));
    assert_eq!(got[0].body.url, "/original");
}

#[test]
fn tcp_echoes_after_an_identity_preamble() {
    let server = Server::start(false);
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, server.tcp)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(b"hello over tcp\n").unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert_eq!(
        reply,
        format!(
            "ServiceVersion=v9\nServicePort={}\nIP=127.0.0.1\nHostname=echo-v1-5d8f7c-x2x7q\n\
             Namespace=gateway-conformance-mesh\nServiceAccount=echo-v1\nhello over tcp\n",
            server.tcp
        )
    );
}

#[test]
fn tls_port_without_a_certificate_stays_closed() {
    let server = Server::start(false);
    // The plain ports are up (Server::start waited for them); the TLS one must not be.
    assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, server.tls)).is_err());
}

#[tokio::test]
async fn tls_port_serves_https_with_the_certificate() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let server = Server::start(true);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(fixture("cert.pem")).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, server.tls)))
        .await
        .unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /secure HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tls.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\n\r\nStatusCode=200\n"), "{response}");
    assert!(response.contains("\nURL=/secure\n"), "{response}");
    assert!(response.contains("\nAlpn=http/1.1\n"), "{response}");
    assert!(
        response.contains(&format!("\nServicePort={}\n", server.tls)),
        "{response}"
    );
}

#[test]
fn connection_errors_fail_with_a_message() {
    let closed = free_port();
    let output = client(&[&format!("http://127.0.0.1:{closed}/"), "--count=3"]);
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let got = report::parse(&stdout).unwrap();
    assert_eq!(got.len(), 1, "stops at the first failure:\n{stdout}");
    assert!(got[0].error.is_some());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("request 0 to"), "{stderr}");
}

#[test]
fn timeouts_fail_with_a_message() {
    // Accepts connections but never answers.
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = silent.local_addr().unwrap().port();
    let output = client(&[&format!("http://127.0.0.1:{port}/"), "--timeout=300ms"]);
    assert!(!output.status.success());
    let got = report::parse(&String::from_utf8_lossy(&output.stdout)).unwrap();
    assert!(
        got[0].error.as_deref().unwrap_or("").contains("timed out"),
        "{got:?}"
    );
    drop(silent);
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut server = Server::start(false);
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
        thread::sleep(Duration::from_millis(20));
    }
}
