//! The client mode's stdout, and its parser.
//!
//! The format follows the Istio echo client, whose output the upstream conformance harness
//! parses: one block per request `i` (counting from 0), blocks separated by one blank line
//! (the harness splits a `--count` batch on `\n\n`):
//!
//! ```text
//! [0] Url=http://echo/path
//! [0] StatusCode=200
//! [0] ResponseHeader=content-type:text/plain; charset=utf-8
//! [0 body] StatusCode=200
//! [0 body] Hostname=echo-v1-6d4f9-x2x7q
//! ```
//!
//! - `[i] Url=<url>`: the URL as given on the command line; always first.
//! - `[i] StatusCode=<n>`: the HTTP status; for gRPC `200` when grpc-status is 0 (what the
//!   harness expects), the grpc-status when it is not, the HTTP status when that is not 200.
//! - `[i] GrpcStatus=<n>`, `[i] GrpcMessage=<text>`: gRPC only (the message when sent).
//! - `[i] ResponseHeader=<name>:<value>`: one line per response header value, names
//!   lower-case, in the order received (values of one name kept together).
//! - `[i body] <line>`: each non-empty line of the response body (the server's
//!   [`EchoBody`](crate::body::EchoBody) lines for an echo server).
//! - `[i error] <message>`: the request failed (connection, timeout, protocol); the client
//!   stops there and exits non-zero.

use std::fmt;
use std::str::FromStr;

use crate::body::{EchoBody, one_line};

/// One kind of output line, without its request index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Url(String),
    StatusCode(u16),
    GrpcStatus(u16),
    GrpcMessage(String),
    ResponseHeader(String, String),
    Body(String),
    Error(String),
}

/// One output line: the request index and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub index: usize,
    pub entry: Entry,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.index;
        match &self.entry {
            Entry::Url(url) => write!(f, "[{i}] Url={}", one_line(url)),
            Entry::StatusCode(code) => write!(f, "[{i}] StatusCode={code}"),
            Entry::GrpcStatus(code) => write!(f, "[{i}] GrpcStatus={code}"),
            Entry::GrpcMessage(msg) => write!(f, "[{i}] GrpcMessage={}", one_line(msg)),
            Entry::ResponseHeader(name, value) => {
                write!(f, "[{i}] ResponseHeader={name}:{}", one_line(value))
            }
            Entry::Body(line) => write!(f, "[{i} body] {}", one_line(line)),
            Entry::Error(msg) => write!(f, "[{i} error] {}", one_line(msg)),
        }
    }
}

/// Why a line or an output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("line {line}: not an echo client line: {text:?}")]
    Malformed { line: usize, text: String },
    #[error("line {line}: request index {index} after request {previous}")]
    OutOfOrder {
        line: usize,
        index: usize,
        previous: usize,
    },
}

impl FromStr for Line {
    /// The reason, without a line number (the caller knows it).
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let rest = text.strip_prefix('[').ok_or(())?;
        let (tag, rest) = rest.split_once("] ").ok_or(())?;
        let (index, kind) = match tag.split_once(' ') {
            Some((index, kind)) => (index, Some(kind)),
            None => (tag, None),
        };
        let index: usize = index.parse().map_err(|_| ())?;
        let entry = match kind {
            Some("body") => Entry::Body(rest.to_string()),
            Some("error") => Entry::Error(rest.to_string()),
            Some(_) => return Err(()),
            None => {
                let (key, value) = rest.split_once('=').ok_or(())?;
                match key {
                    "Url" => Entry::Url(value.to_string()),
                    "StatusCode" => Entry::StatusCode(value.parse().map_err(|_| ())?),
                    "GrpcStatus" => Entry::GrpcStatus(value.parse().map_err(|_| ())?),
                    "GrpcMessage" => Entry::GrpcMessage(value.to_string()),
                    "ResponseHeader" => {
                        let (name, value) = value.split_once(':').ok_or(())?;
                        Entry::ResponseHeader(name.to_string(), value.to_string())
                    }
                    _ => return Err(()),
                }
            }
        };
        Ok(Line { index, entry })
    }
}

/// Everything the client printed about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exchange {
    pub index: usize,
    pub url: String,
    /// `None` when the request failed before a response (see `error`).
    pub status: Option<u16>,
    pub grpc_status: Option<u16>,
    pub grpc_message: Option<String>,
    pub response_headers: Vec<(String, String)>,
    /// The body's lines as printed.
    pub body_lines: Vec<String>,
    /// The body read as an echo server's answer (all empty for another server's body).
    pub body: EchoBody,
    pub error: Option<String>,
}

impl Exchange {
    /// The first value of a response header, name compared case-insensitively.
    pub fn response_header(&self, name: &str) -> Option<&str> {
        self.response_headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn apply(&mut self, entry: Entry) {
        match entry {
            Entry::Url(url) => self.url = url,
            Entry::StatusCode(code) => self.status = Some(code),
            Entry::GrpcStatus(code) => self.grpc_status = Some(code),
            Entry::GrpcMessage(msg) => self.grpc_message = Some(msg),
            Entry::ResponseHeader(name, value) => self.response_headers.push((name, value)),
            Entry::Body(line) => self.body_lines.push(line),
            Entry::Error(msg) => self.error = Some(msg),
        }
    }
}

/// Parses the client's whole stdout into one [`Exchange`] per request, in order. Blank lines
/// are skipped; any other line must be a client line, with indexes never going backwards.
pub fn parse(output: &str) -> Result<Vec<Exchange>, ParseError> {
    let mut exchanges: Vec<Exchange> = Vec::new();
    for (number, text) in output.lines().enumerate() {
        let line_no = number + 1;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = text.parse().map_err(|()| ParseError::Malformed {
            line: line_no,
            text: text.to_string(),
        })?;
        match exchanges.last() {
            Some(last) if last.index == line.index => {}
            Some(last) if last.index > line.index => {
                return Err(ParseError::OutOfOrder {
                    line: line_no,
                    index: line.index,
                    previous: last.index,
                });
            }
            _ => exchanges.push(Exchange {
                index: line.index,
                ..Exchange::default()
            }),
        }
        if let Some(current) = exchanges.last_mut() {
            current.apply(line.entry);
        }
    }
    for exchange in &mut exchanges {
        exchange.body = EchoBody::parse(exchange.body_lines.iter().map(String::as_str));
    }
    Ok(exchanges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(index: usize, entry: Entry) -> String {
        Line { index, entry }.to_string()
    }

    #[test]
    fn formats_each_entry() {
        assert_eq!(
            line(0, Entry::Url("http://echo/".into())),
            "[0] Url=http://echo/"
        );
        assert_eq!(line(3, Entry::StatusCode(302)), "[3] StatusCode=302");
        assert_eq!(line(1, Entry::GrpcStatus(12)), "[1] GrpcStatus=12");
        assert_eq!(
            line(1, Entry::GrpcMessage("no\nway".into())),
            "[1] GrpcMessage=no way"
        );
        assert_eq!(
            line(
                0,
                Entry::ResponseHeader("location".into(), "http://x:80/".into())
            ),
            "[0] ResponseHeader=location:http://x:80/"
        );
        assert_eq!(
            line(12, Entry::Body("Hostname=pod".into())),
            "[12 body] Hostname=pod"
        );
        assert_eq!(
            line(2, Entry::Error("timed out".into())),
            "[2 error] timed out"
        );
    }

    #[test]
    fn every_entry_round_trips() {
        let entries = [
            Entry::Url("grpc://echo:7070".into()),
            Entry::StatusCode(200),
            Entry::GrpcStatus(0),
            Entry::GrpcMessage("ok".into()),
            Entry::ResponseHeader("date".into(), "Mon, 01 Jan 2024 10:00:00 GMT".into()),
            Entry::Body("RequestHeader=x:y".into()),
            Entry::Body(String::new()),
            Entry::Error("connection refused".into()),
        ];
        for entry in entries {
            let original = Line { index: 7, entry };
            assert_eq!(original.to_string().parse::<Line>(), Ok(original));
        }
    }

    #[test]
    fn rejects_lines_that_are_not_client_lines() {
        for text in [
            "StatusCode=200",
            "[x] StatusCode=200",
            "[0] StatusCode=abc",
            "[0] Unknown=1",
            "[0 trailer] x",
            "[0] ResponseHeader=no-colon",
            "[0]StatusCode=200",
        ] {
            assert_eq!(text.parse::<Line>(), Err(()), "{text}");
        }
    }

    const TWO_REQUESTS: &str = "\
[0] Url=http://echo/a
[0] StatusCode=200
[0] ResponseHeader=content-type:text/plain
[0] ResponseHeader=x-multi:1
[0] ResponseHeader=X-Multi:2
[0 body] StatusCode=200
[0 body] Host=echo
[0 body] URL=/a
[0 body] Method=GET
[0 body] Proto=HTTP/1.1
[0 body] RequestHeader=x-header-add:one
[0 body] RequestHeader=X-Header-Add:two
[0 body] Hostname=echo-v1-abc
[0 body] Namespace=ns
[0 body] ServiceAccount=sa
[0 body] Identity=spiffe://cluster.local/ns/ns/sa/client

[1] Url=http://echo/a
[1 error] request timed out after 5s

";

    #[test]
    fn groups_lines_per_request() {
        let exchanges = parse(TWO_REQUESTS).unwrap();
        assert_eq!(exchanges.len(), 2);

        let first = &exchanges[0];
        assert_eq!(first.index, 0);
        assert_eq!(first.url, "http://echo/a");
        assert_eq!(first.status, Some(200));
        assert_eq!(first.error, None);
        assert_eq!(first.response_header("Content-Type"), Some("text/plain"));
        assert_eq!(first.response_header("x-multi"), Some("1"));
        assert_eq!(first.body_lines.len(), 11);
        assert_eq!(first.body.hostname, "echo-v1-abc");
        assert_eq!(first.body.namespace, "ns");
        assert_eq!(first.body.service_account, "sa");
        assert_eq!(
            first.body.identity.as_deref(),
            Some("spiffe://cluster.local/ns/ns/sa/client")
        );
        assert_eq!(first.body.url, "/a");
        assert_eq!(first.body.host, "echo");
        assert_eq!(first.body.method, "GET");
        assert_eq!(first.body.proto, "HTTP/1.1");
        assert_eq!(
            first.body.request_header("x-header-add").as_deref(),
            Some("one,two")
        );

        let second = &exchanges[1];
        assert_eq!(second.status, None);
        assert_eq!(second.error.as_deref(), Some("request timed out after 5s"));
        assert_eq!(second.body, EchoBody::default());
    }

    #[test]
    fn reports_the_offending_line() {
        assert_eq!(
            parse("[0] StatusCode=200\nboom\n"),
            Err(ParseError::Malformed {
                line: 2,
                text: "boom".into()
            })
        );
        assert_eq!(
            parse("[1] StatusCode=200\n[0] StatusCode=200\n"),
            Err(ParseError::OutOfOrder {
                line: 2,
                index: 0,
                previous: 1
            })
        );
    }

    #[test]
    fn empty_output_has_no_exchanges() {
        assert_eq!(parse(""), Ok(vec![]));
        assert_eq!(parse("\n\n"), Ok(vec![]));
    }
}
