//! The text body the echo server answers every HTTP and gRPC request with: one `Key=Value` line
//! per field, in the Istio echo app's style. The upstream conformance harness reads these lines
//! with unanchored regexes (`Hostname=(.*)`, `RequestHeader=(.*)`, first match wins), so field
//! names and the `Name:value` shape of header lines must stay exactly as they are.

use std::collections::BTreeMap;

/// Field names, shared by the server (which writes them) and the parser (which reads them).
pub mod field {
    pub const STATUS_CODE: &str = "StatusCode";
    pub const SERVICE_VERSION: &str = "ServiceVersion";
    pub const SERVICE_PORT: &str = "ServicePort";
    pub const HOST: &str = "Host";
    pub const URL: &str = "URL";
    pub const METHOD: &str = "Method";
    pub const PROTO: &str = "Proto";
    pub const IP: &str = "IP";
    pub const ALPN: &str = "Alpn";
    pub const ECHO: &str = "Echo";
    pub const REQUEST_HEADER: &str = "RequestHeader";
    pub const HOSTNAME: &str = "Hostname";
    pub const NAMESPACE: &str = "Namespace";
    pub const SERVICE_ACCOUNT: &str = "ServiceAccount";
    pub const IDENTITY: &str = "Identity";
}

/// What the server saw and who it is. Every field is text, as on the wire: a missing line parses
/// as an empty string (or `None` for the optional ones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EchoBody {
    pub status_code: String,
    pub service_version: String,
    /// The port the request arrived on (the container port, not the Service port).
    pub service_port: String,
    pub host: String,
    /// Path and query as received.
    pub url: String,
    pub method: String,
    /// `HTTP/1.1`, `HTTP/2.0`, or `GRPC`.
    pub proto: String,
    /// The client's address as the server saw it.
    pub ip: String,
    /// The ALPN protocol negotiated on a TLS port, empty otherwise.
    pub alpn: String,
    /// The gRPC request's message, for gRPC calls.
    pub echo: Option<String>,
    /// Request headers in the order received. Names are lower-case: that is how HTTP/2 carries
    /// them and how hyper hands HTTP/1.1 names over.
    pub request_headers: Vec<(String, String)>,
    /// The serving pod's name.
    pub hostname: String,
    pub namespace: String,
    pub service_account: String,
    /// The verified client identity aether's proxy passed in `x-aether-client-identity`.
    pub identity: Option<String>,
    /// `Key=Value` lines with keys this parser does not know (another echo server's extras).
    pub other: Vec<(String, String)>,
}

impl EchoBody {
    /// The body text: one line per field, each ending in `\n`.
    pub fn render(&self) -> String {
        let mut lines: Vec<(&str, &str)> = vec![
            (field::STATUS_CODE, &self.status_code),
            (field::SERVICE_VERSION, &self.service_version),
            (field::SERVICE_PORT, &self.service_port),
            (field::HOST, &self.host),
            (field::URL, &self.url),
            (field::METHOD, &self.method),
            (field::PROTO, &self.proto),
            (field::IP, &self.ip),
            (field::ALPN, &self.alpn),
        ];
        if let Some(echo) = &self.echo {
            lines.push((field::ECHO, echo));
        }
        let headers: Vec<String> = self
            .request_headers
            .iter()
            .map(|(name, value)| format!("{name}:{value}"))
            .collect();
        lines.extend(headers.iter().map(|h| (field::REQUEST_HEADER, h.as_str())));
        lines.push((field::HOSTNAME, &self.hostname));
        lines.push((field::NAMESPACE, &self.namespace));
        lines.push((field::SERVICE_ACCOUNT, &self.service_account));
        if let Some(identity) = &self.identity {
            lines.push((field::IDENTITY, identity));
        }
        lines.extend(self.other.iter().map(|(k, v)| (k.as_str(), v.as_str())));

        lines
            .into_iter()
            .map(|(key, value)| format!("{key}={}\n", one_line(value)))
            .collect()
    }

    /// Reads body lines back. Lines without `=` are skipped; for single-valued fields the first
    /// line wins, as with the upstream harness's regexes.
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> EchoBody {
        let mut body = EchoBody::default();
        let mut seen: Vec<&str> = Vec::new();
        for line in lines {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.to_string();
            let target = match key {
                field::STATUS_CODE => &mut body.status_code,
                field::SERVICE_VERSION => &mut body.service_version,
                field::SERVICE_PORT => &mut body.service_port,
                field::HOST => &mut body.host,
                field::URL => &mut body.url,
                field::METHOD => &mut body.method,
                field::PROTO => &mut body.proto,
                field::IP => &mut body.ip,
                field::ALPN => &mut body.alpn,
                field::HOSTNAME => &mut body.hostname,
                field::NAMESPACE => &mut body.namespace,
                field::SERVICE_ACCOUNT => &mut body.service_account,
                field::ECHO => {
                    body.echo.get_or_insert(value);
                    continue;
                }
                field::IDENTITY => {
                    body.identity.get_or_insert(value);
                    continue;
                }
                field::REQUEST_HEADER => {
                    if let Some((name, header_value)) = value.split_once(':') {
                        body.request_headers
                            .push((name.to_string(), header_value.to_string()));
                    }
                    continue;
                }
                _ => {
                    body.other.push((key.to_string(), value));
                    continue;
                }
            };
            if !seen.contains(&key) {
                seen.push(key);
                *target = value;
            }
        }
        body
    }

    /// All values of a request header, name compared case-insensitively, in order received.
    pub fn request_header_values(&self, name: &str) -> Vec<&str> {
        self.request_headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A request header's values joined with `,`, as the conformance harness compares them;
    /// `None` when the server did not see the header.
    pub fn request_header(&self, name: &str) -> Option<String> {
        let values = self.request_header_values(name);
        (!values.is_empty()).then(|| values.join(","))
    }

    /// The request headers as a multimap keyed by lower-case name.
    pub fn request_header_map(&self) -> BTreeMap<String, Vec<String>> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in &self.request_headers {
            map.entry(name.to_ascii_lowercase())
                .or_default()
                .push(value.clone());
        }
        map
    }
}

/// A value with line breaks would split into lines the parser reads as other fields.
pub(crate) fn one_line(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains(['\n', '\r']) {
        value.replace(['\n', '\r'], " ").into()
    } else {
        value.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EchoBody {
        EchoBody {
            status_code: "200".into(),
            service_version: "v1".into(),
            service_port: "8080".into(),
            host: "echo".into(),
            url: "/path?q=1".into(),
            method: "GET".into(),
            proto: "HTTP/1.1".into(),
            ip: "10.0.0.7".into(),
            alpn: String::new(),
            echo: None,
            request_headers: vec![
                ("host".into(), "echo".into()),
                ("x-header-add".into(), "a".into()),
                ("x-header-add".into(), "b".into()),
                ("x-time".into(), "12:30".into()),
            ],
            hostname: "echo-v1-abc-123".into(),
            namespace: "gateway-conformance-mesh".into(),
            service_account: "default".into(),
            identity: Some("spiffe://cluster.local/ns/a/sa/b".into()),
            other: vec![],
        }
    }

    #[test]
    fn renders_istio_style_lines_in_order() {
        let text = sample().render();
        assert_eq!(
            text,
            "StatusCode=200\nServiceVersion=v1\nServicePort=8080\nHost=echo\nURL=/path?q=1\n\
             Method=GET\nProto=HTTP/1.1\nIP=10.0.0.7\nAlpn=\nRequestHeader=host:echo\n\
             RequestHeader=x-header-add:a\nRequestHeader=x-header-add:b\nRequestHeader=x-time:12:30\n\
             Hostname=echo-v1-abc-123\nNamespace=gateway-conformance-mesh\nServiceAccount=default\n\
             Identity=spiffe://cluster.local/ns/a/sa/b\n"
        );
    }

    #[test]
    fn optional_lines_are_left_out() {
        let body = EchoBody {
            identity: None,
            ..sample()
        };
        assert!(!body.render().contains("Identity="));
        let grpc = EchoBody {
            echo: Some("HelloWorld".into()),
            ..sample()
        };
        assert!(grpc.render().contains("\nEcho=HelloWorld\n"));
    }

    #[test]
    fn parse_reverses_render() {
        let body = EchoBody {
            echo: Some("hi".into()),
            other: vec![("Cluster".into(), "c1".into())],
            ..sample()
        };
        assert_eq!(EchoBody::parse(body.render().lines()), body);
    }

    #[test]
    fn first_value_wins_and_junk_is_skipped() {
        let body = EchoBody::parse([
            "Hostname=first",
            "no equals sign",
            "Hostname=second",
            "RequestHeader=no-colon",
        ]);
        assert_eq!(body.hostname, "first");
        assert!(body.request_headers.is_empty());
    }

    #[test]
    fn line_breaks_in_values_cannot_forge_fields() {
        let body = EchoBody {
            url: "/x\nHostname=forged".into(),
            ..sample()
        };
        let parsed = EchoBody::parse(body.render().lines());
        assert_eq!(parsed.hostname, "echo-v1-abc-123");
        assert_eq!(parsed.url, "/x Hostname=forged");
    }

    #[test]
    fn header_lookups_are_case_insensitive_and_join_with_commas() {
        let body = sample();
        assert_eq!(body.request_header("X-Header-Add").as_deref(), Some("a,b"));
        assert_eq!(body.request_header("x-time").as_deref(), Some("12:30"));
        assert_eq!(body.request_header("absent"), None);
        let map = body.request_header_map();
        assert_eq!(map["x-header-add"], vec!["a", "b"]);
        assert_eq!(map.len(), 3);
    }
}
