//! The conformance echo app (Istio's echo server and client, the image
//! `registry.k8s.io/gateway-api/echo-advanced`): how its client's output reads.
//!
//! The client prints one block per request `i`, blocks separated by a blank line:
//!
//! ```text
//! [0] Url=http://echo/v2
//! [0] StatusCode=200
//! [0] ResponseHeader=Content-Type:text/plain; charset=utf-8
//! [0 body] ServicePort=8080
//! [0 body] URL=/v2
//! [0 body] RequestHeader=X-Aether-Client-Identity:spiffe://cluster.local/ns/a/sa/b
//! [0 body] Hostname=echo-v2-5d8f7c9b6-abcde
//! ```
//!
//! `[i] Key=Value` lines are the client's (for gRPC it prints no status line of its own: the
//! server's `StatusCode=` body line stands for it, as the upstream harness reads it), and
//! `[i body] Key=Value` lines are the body, which the echo server writes about the request it
//! saw. Anything else on the output (log lines) is not part of a block and is skipped.

/// The header in which aether's inbound proxy passes the verified caller's SPIFFE ID.
pub const IDENTITY_HEADER: &str = "x-aether-client-identity";

/// What the echo server saw, from the body lines of one request. Single-valued fields take
/// their first line, as the upstream harness's regular expressions do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EchoBody {
    pub status_code: String,
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
    /// Request headers in the order printed (the Go server canonicalises HTTP names).
    pub request_headers: Vec<(String, String)>,
    /// The serving pod's name.
    pub hostname: String,
}

impl EchoBody {
    fn read(&mut self, line: &str) {
        let Some((key, value)) = line.split_once('=') else {
            return;
        };
        let field = match key {
            "StatusCode" => &mut self.status_code,
            "ServicePort" => &mut self.service_port,
            "Host" => &mut self.host,
            "URL" => &mut self.url,
            "Method" => &mut self.method,
            "Proto" => &mut self.proto,
            "IP" => &mut self.ip,
            "Hostname" => &mut self.hostname,
            "RequestHeader" => {
                if let Some((name, value)) = value.split_once(':') {
                    self.request_headers.push((name.into(), value.into()));
                }
                return;
            }
            _ => return,
        };
        if field.is_empty() {
            *field = value.to_owned();
        }
    }

    /// All values of a request header, name compared case-insensitively, in order.
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

    /// The caller's SPIFFE ID as aether's inbound proxy passed it to the app.
    pub fn identity(&self) -> Option<String> {
        self.request_header(IDENTITY_HEADER)
    }
}

/// Everything the client printed about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exchange {
    pub index: usize,
    pub url: String,
    /// The client's `StatusCode` line, else the server's (gRPC).
    pub status: Option<u16>,
    pub response_headers: Vec<(String, String)>,
    /// The body lines as printed.
    pub body_lines: Vec<String>,
    pub body: EchoBody,
}

impl Exchange {
    /// The first value of a response header, name compared case-insensitively.
    pub fn response_header(&self, name: &str) -> Option<&str> {
        self.response_headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn read_client_line(&mut self, line: &str) {
        let Some((key, value)) = line.split_once('=') else {
            return;
        };
        match key {
            "Url" if self.url.is_empty() => self.url = value.to_owned(),
            "StatusCode" if self.status.is_none() => self.status = value.parse().ok(),
            "ResponseHeader" => {
                if let Some((name, value)) = value.split_once(':') {
                    self.response_headers.push((name.into(), value.into()));
                }
            }
            _ => {}
        }
    }
}

/// One line of the output: `[i] text`, `[i body] text`, or neither.
fn split_line(line: &str) -> Option<(usize, bool, &str)> {
    let rest = line.strip_prefix('[')?;
    let (tag, text) = rest.split_once("] ")?;
    let (index, body) = match tag.strip_suffix(" body") {
        Some(index) => (index, true),
        None => (tag, false),
    };
    Some((index.parse().ok()?, body, text))
}

/// The client's whole stdout, one [`Exchange`] per request index, in the order they first
/// appear.
pub fn parse(output: &str) -> Vec<Exchange> {
    let mut exchanges: Vec<Exchange> = Vec::new();
    for line in output.lines() {
        let Some((index, body, text)) = split_line(line) else {
            continue;
        };
        let position = match exchanges.iter().position(|e| e.index == index) {
            Some(position) => position,
            None => {
                exchanges.push(Exchange {
                    index,
                    ..Exchange::default()
                });
                exchanges.len() - 1
            }
        };
        let exchange = &mut exchanges[position];
        if body {
            exchange.body_lines.push(text.to_owned());
            exchange.body.read(text);
        } else {
            exchange.read_client_line(text);
        }
    }
    for exchange in &mut exchanges {
        if exchange.status.is_none() {
            exchange.status = exchange.body.status_code.parse().ok();
        }
    }
    exchanges
}

/// The Deployment a pod belongs to: its name without the last two `-` parts (the ReplicaSet
/// and pod hashes), as the upstream weighted tests count backends.
pub fn deployment_of(pod: &str) -> &str {
    let mut cut = pod;
    for _ in 0..2 {
        if let Some((head, _)) = cut.rsplit_once('-') {
            cut = head;
        }
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP: &str = "\
[0] Url=http://echo/v2
[0] Header=Version:two
[0] Latency=2.3ms
[0] StatusCode=200
[0] ResponseHeader=Content-Type:text/plain; charset=utf-8
[0] ResponseHeader=X-Multi:1
[0] ResponseHeader=x-multi:2
[0 body] ServiceVersion=
[0 body] ServicePort=8080
[0 body] Host=echo
[0 body] URL=/v2?x=y
[0 body] Method=GET
[0 body] Proto=HTTP/1.1
[0 body] IP=10.244.1.7
[0 body] RequestHeader=X-Header-Add:one
[0 body] RequestHeader=X-Header-Add:two
[0 body] RequestHeader=X-Aether-Client-Identity:spiffe://cluster.local/ns/a/sa/b
[0 body] RequestHeader=X-Time:12:30
[0 body] Hostname=echo-v2-5d8f7c9b6-abcde

[1] Url=http://echo/v2
[1] StatusCode=503
[1 body] no healthy upstream

2026-12-01T11:23:21.560294Z	info	All requests succeeded
";

    #[test]
    fn reads_each_request_of_an_http_run() {
        let exchanges = parse(HTTP);
        assert_eq!(exchanges.len(), 2);
        let first = &exchanges[0];
        assert_eq!((first.index, first.url.as_str()), (0, "http://echo/v2"));
        assert_eq!(first.status, Some(200));
        assert_eq!(
            first.response_header("content-type"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(first.response_header("X-MULTI"), Some("1"));
        let body = &first.body;
        assert_eq!(body.hostname, "echo-v2-5d8f7c9b6-abcde");
        assert_eq!(body.url, "/v2?x=y");
        assert_eq!(body.host, "echo");
        assert_eq!(body.service_port, "8080");
        assert_eq!(
            body.request_header("x-header-add").as_deref(),
            Some("one,two")
        );
        assert_eq!(body.request_header("x-time").as_deref(), Some("12:30"));
        assert_eq!(body.request_header("absent"), None);
        assert_eq!(
            body.identity().as_deref(),
            Some("spiffe://cluster.local/ns/a/sa/b")
        );
        let second = &exchanges[1];
        assert_eq!(second.status, Some(503));
        assert_eq!(second.body_lines, ["no healthy upstream"]);
        assert_eq!(second.body.hostname, "");
    }

    #[test]
    fn a_grpc_status_comes_from_the_servers_line() {
        let output = "\
[0] grpcecho.Echo(count:1)
[0 body] RequestHeader=x-request-id:0
[0 body] Host=echo:7070
[0 body] StatusCode=200
[0 body] Proto=GRPC
[0 body] Hostname=echo-v1-6d446bb84-25q84
[0] ResponseHeader=content-type:application/grpc
";
        let exchanges = parse(output);
        assert_eq!(exchanges.len(), 1);
        assert_eq!(exchanges[0].status, Some(200));
        assert_eq!(exchanges[0].body.proto, "GRPC");
        assert_eq!(
            exchanges[0].response_header("Content-Type"),
            Some("application/grpc")
        );
    }

    #[test]
    fn first_value_wins_and_other_lines_are_skipped() {
        let output =
            "[0 body] Hostname=first\n[0 body] Hostname=second\nnot a line\n[x] Url=y\n[0] \n";
        let exchanges = parse(output);
        assert_eq!(exchanges.len(), 1);
        assert_eq!(exchanges[0].body.hostname, "first");
        assert_eq!(parse(""), vec![]);
    }

    #[test]
    fn the_deployment_of_a_pod() {
        assert_eq!(deployment_of("echo-v1-5669c67cc7-p29hd"), "echo-v1");
        assert_eq!(deployment_of("echo"), "echo");
    }
}
