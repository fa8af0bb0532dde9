//! What the server says about a request and about itself: the [`EchoBody`] for HTTP and gRPC,
//! and the preamble on TCP connections.

use aether_echo::body::{EchoBody, field};
use http::StatusCode;
use http::header::HOST;
use http::request::Parts;

use super::Conn;

/// Set by aether's proxy to the verified client SPIFFE id; echoed as the `Identity` line.
pub const CLIENT_IDENTITY_HEADER: &str = "x-aether-client-identity";

/// `proto` is `HTTP/1.1`, `HTTP/2.0` or `GRPC`.
pub fn echo_body(parts: &Parts, conn: &Conn, status: StatusCode, proto: &str) -> EchoBody {
    let text = |value: &http::HeaderValue| String::from_utf8_lossy(value.as_bytes()).into_owned();
    // HTTP/1.1 carries the authority in Host; HTTP/2 in :authority, which hyper puts in the URI.
    let host = parts
        .headers
        .get(HOST)
        .map(text)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let pod = &conn.pod;
    EchoBody {
        status_code: status.as_u16().to_string(),
        service_version: pod.version.clone(),
        service_port: conn.port.to_string(),
        host,
        url: parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| "/".to_string()),
        method: parts.method.to_string(),
        proto: proto.to_string(),
        ip: conn.peer.to_string(),
        alpn: conn.alpn.clone(),
        echo: None,
        request_headers: parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), text(value)))
            .collect(),
        hostname: pod.identity.hostname.clone(),
        namespace: pod.identity.namespace.clone(),
        service_account: pod.identity.service_account.clone(),
        identity: parts.headers.get(CLIENT_IDENTITY_HEADER).map(text),
        other: Vec::new(),
    }
}

/// Sent once on a TCP connection, before the echoed bytes, so a test knows who answered.
pub fn tcp_preamble(conn: &Conn) -> String {
    let pod = &conn.pod;
    [
        (field::SERVICE_VERSION, pod.version.as_str()),
        (field::SERVICE_PORT, &conn.port.to_string()),
        (field::IP, &conn.peer.to_string()),
        (field::HOSTNAME, &pod.identity.hostname),
        (field::NAMESPACE, &pod.identity.namespace),
        (field::SERVICE_ACCOUNT, &pod.identity.service_account),
    ]
    .iter()
    .map(|(key, value)| format!("{key}={value}\n"))
    .collect()
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use super::*;
    use crate::identity::PodIdentity;
    use crate::server::Pod;

    fn conn() -> Conn {
        Conn {
            pod: Arc::new(Pod {
                identity: PodIdentity {
                    hostname: "echo-v1-abc".into(),
                    namespace: "mesh".into(),
                    service_account: "echo-v1".into(),
                },
                version: "v1".into(),
            }),
            port: 8080,
            peer: IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
            alpn: String::new(),
        }
    }

    fn parts(request: http::request::Builder) -> Parts {
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn describes_an_http1_request() {
        let parts = parts(
            http::Request::get("/a/b?x=1&y")
                .header("host", "echo")
                .header("x-multi", "1")
                .header("x-multi", "2")
                .header(CLIENT_IDENTITY_HEADER, "spiffe://cluster.local/ns/c/sa/d"),
        );
        let body = echo_body(&parts, &conn(), StatusCode::CREATED, "HTTP/1.1");
        assert_eq!(body.status_code, "201");
        assert_eq!(body.service_version, "v1");
        assert_eq!(body.service_port, "8080");
        assert_eq!(body.host, "echo");
        assert_eq!(body.url, "/a/b?x=1&y");
        assert_eq!(body.method, "GET");
        assert_eq!(body.proto, "HTTP/1.1");
        assert_eq!(body.ip, "10.1.2.3");
        assert_eq!(body.hostname, "echo-v1-abc");
        assert_eq!(body.namespace, "mesh");
        assert_eq!(body.service_account, "echo-v1");
        assert_eq!(
            body.identity.as_deref(),
            Some("spiffe://cluster.local/ns/c/sa/d")
        );
        assert_eq!(
            body.request_headers,
            vec![
                ("host".to_string(), "echo".to_string()),
                ("x-multi".to_string(), "1".to_string()),
                ("x-multi".to_string(), "2".to_string()),
                (
                    CLIENT_IDENTITY_HEADER.to_string(),
                    "spiffe://cluster.local/ns/c/sa/d".to_string()
                ),
            ]
        );
    }

    #[test]
    fn http2_host_comes_from_the_authority() {
        let parts = parts(http::Request::post(
            "http://echo:7070/proto.EchoTestService/Echo",
        ));
        let body = echo_body(&parts, &conn(), StatusCode::OK, "GRPC");
        assert_eq!(body.host, "echo:7070");
        assert_eq!(body.url, "/proto.EchoTestService/Echo");
        assert_eq!(body.identity, None);
    }

    #[test]
    fn tcp_preamble_names_the_pod() {
        assert_eq!(
            tcp_preamble(&conn()),
            "ServiceVersion=v1\nServicePort=8080\nIP=10.1.2.3\nHostname=echo-v1-abc\n\
             Namespace=mesh\nServiceAccount=echo-v1\n"
        );
    }
}
