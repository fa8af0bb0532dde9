//! Which protocol a Service port carries, the one rule the operator and the proxy share: only
//! ports declared HTTP are parsed as HTTP (and routed); ports declared anything else are
//! carried as opaque bytes; undeclared ports are sniffed per connection.

/// How the proxy treats a captured connection to one Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortProtocol {
    /// HTTP/1.1, h2c or gRPC: parsed, routed per request.
    Http,
    /// Anything else (TCP, TLS from the app, databases): bytes carried as they are.
    Opaque,
    /// Not declared: the first bytes the client sends decide, and a client that does not
    /// speak first gets an opaque connection.
    Detect,
}

/// `appProtocol` values that mean HTTP (Kubernetes' own and IANA service names).
const HTTP_APP_PROTOCOLS: [&str; 6] = [
    "http",
    "h2c",
    "kubernetes.io/h2c",
    "grpc",
    "kubernetes.io/ws",
    "http2",
];

/// Port-name prefixes (`<protocol>` or `<protocol>-<suffix>`, as Istio reads them) that mean
/// HTTP, and those that mean something else.
const HTTP_NAMES: [&str; 5] = ["http", "http2", "h2c", "grpc", "grpc-web"];
const OPAQUE_NAMES: [&str; 8] = [
    "tcp", "tls", "https", "mysql", "mongo", "redis", "postgres", "udp",
];

impl PortProtocol {
    /// The protocol of a Service port: its `appProtocol` when set, else its name's prefix.
    pub fn of(name: Option<&str>, app_protocol: Option<&str>) -> PortProtocol {
        if let Some(declared) = app_protocol.filter(|p| !p.is_empty()) {
            let declared = declared.to_ascii_lowercase();
            return if HTTP_APP_PROTOCOLS.contains(&declared.as_str()) {
                PortProtocol::Http
            } else {
                PortProtocol::Opaque
            };
        }
        let name = name.unwrap_or_default().to_ascii_lowercase();
        let prefix = |names: &[&str]| {
            names.iter().any(|p| {
                name == *p
                    || name
                        .strip_prefix(p)
                        .is_some_and(|rest| rest.starts_with('-'))
            })
        };
        if prefix(&HTTP_NAMES) {
            PortProtocol::Http
        } else if prefix(&OPAQUE_NAMES) {
            PortProtocol::Opaque
        } else {
            PortProtocol::Detect
        }
    }
}

/// What the first bytes of a connection say, for [`PortProtocol::Detect`] ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Http,
    Opaque,
    /// Too few bytes to tell yet.
    NeedMore,
}

/// HTTP/1 methods and the HTTP/2 connection preface, as a request's first bytes.
const HTTP_STARTS: [&[u8]; 10] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"DELETE ",
    b"HEAD ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
    b"PRI * HTTP/2.0",
];

/// Classifies the first bytes a client sent.
pub fn sniff(first: &[u8]) -> Sniffed {
    let mut undecided = false;
    for start in HTTP_STARTS {
        if first.starts_with(start) {
            return Sniffed::Http;
        }
        if start.starts_with(first) {
            undecided = true;
        }
    }
    if undecided {
        Sniffed::NeedMore
    } else {
        Sniffed::Opaque
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_protocol_decides_before_the_name() {
        let of = PortProtocol::of;
        assert_eq!(of(Some("tcp"), Some("http")), PortProtocol::Http);
        assert_eq!(
            of(Some("web"), Some("kubernetes.io/h2c")),
            PortProtocol::Http
        );
        assert_eq!(of(Some("web"), Some("GRPC")), PortProtocol::Http);
        assert_eq!(
            of(Some("web"), Some("kubernetes.io/ws")),
            PortProtocol::Http
        );
        // Any other declared value is never parsed.
        assert_eq!(of(Some("http"), Some("https")), PortProtocol::Opaque);
        assert_eq!(of(Some("http"), Some("tcp")), PortProtocol::Opaque);
        assert_eq!(
            of(Some("http"), Some("example.com/custom")),
            PortProtocol::Opaque
        );
    }

    #[test]
    fn names_are_read_by_their_prefix() {
        let of = |name| PortProtocol::of(Some(name), None);
        assert_eq!(of("http"), PortProtocol::Http);
        assert_eq!(of("http-alt"), PortProtocol::Http);
        assert_eq!(of("grpc-web"), PortProtocol::Http);
        assert_eq!(of("h2c"), PortProtocol::Http);
        assert_eq!(of("https"), PortProtocol::Opaque);
        assert_eq!(of("tcp-db"), PortProtocol::Opaque);
        assert_eq!(of("tls"), PortProtocol::Opaque);
        assert_eq!(
            of("httpbin"),
            PortProtocol::Detect,
            "a prefix ends at a dash"
        );
        assert_eq!(of("web"), PortProtocol::Detect);
        assert_eq!(PortProtocol::of(None, None), PortProtocol::Detect);
    }

    #[test]
    fn first_bytes_tell_http_from_anything_else() {
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n"), Sniffed::Http);
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n\r\nSM"), Sniffed::Http);
        assert_eq!(sniff(b"GE"), Sniffed::NeedMore);
        assert_eq!(sniff(b""), Sniffed::NeedMore);
        // A TLS ClientHello, a MySQL-ish client, plain text.
        assert_eq!(sniff(&[0x16, 0x03, 0x01, 0x02]), Sniffed::Opaque);
        assert_eq!(sniff(b"hello"), Sniffed::Opaque);
        assert_eq!(sniff(b"GETX"), Sniffed::Opaque);
    }
}
