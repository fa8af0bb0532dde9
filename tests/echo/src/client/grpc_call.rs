//! One unary `proto.EchoTestService/Echo` call over h2c; `-H` entries go as metadata.

use aether_echo::report::Entry;
use anyhow::Context;
use http::header::{CONTENT_TYPE, TE, USER_AGENT};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use super::{Call, body_entries, header_entries, transport};
use crate::grpc_wire::{self, code};

pub async fn exchange(call: &Call) -> anyhow::Result<Vec<Entry>> {
    let request = build(call)?;
    let stream = transport::connect(&call.target.host, call.target.port).await?;
    let response = transport::send_http2(stream, request).await?;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.context("reading the response")?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let data = collected.to_bytes();

    // A "trailers-only" response carries the status in its headers.
    let status = grpc_header(&trailers, &parts.headers, "grpc-status");
    let message = grpc_header(&trailers, &parts.headers, "grpc-message");
    let mut entries = status_entries(parts.status, status.as_deref(), message.as_deref())?;
    entries.extend(header_entries(&parts.headers));
    if parts.status == StatusCode::OK && status.as_deref() == Some("0") {
        let reply = grpc_wire::unframe(&data)
            .and_then(grpc_wire::decode_message_field)
            .context("decoding the EchoResponse")?;
        entries.extend(body_entries(reply.as_bytes()));
    }
    Ok(entries)
}

fn build(call: &Call) -> anyhow::Result<Request<Full<Bytes>>> {
    let authority = call.authority().context("the Host value")?;
    let authority = authority.to_str().context("the Host value")?;
    let uri = Uri::try_from(format!("http://{authority}{}", grpc_wire::ECHO_PATH))
        .with_context(|| format!("{authority} is not a valid authority"))?;
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(CONTENT_TYPE, "application/grpc")
        // Required by gRPC over HTTP/2: tells proxies the client understands trailers.
        .header(TE, "trailers")
        .header(USER_AGENT, "aether-echo")
        .body(Full::new(Bytes::from(grpc_wire::frame(
            &grpc_wire::encode_message_field(&call.message),
        ))))
        .context("building the request")?;
    request.headers_mut().extend(call.headers.clone());
    Ok(request)
}

fn grpc_header(trailers: &HeaderMap, headers: &HeaderMap, name: &str) -> Option<String> {
    trailers
        .get(name)
        .or_else(|| headers.get(name))
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
}

/// `StatusCode=200` for grpc-status 0, as the conformance harness expects; the grpc-status for
/// other gRPC outcomes; the HTTP status when the answer is not HTTP 200 (e.g. a proxy's 503).
fn status_entries(
    http_status: StatusCode,
    grpc_status: Option<&str>,
    grpc_message: Option<&str>,
) -> anyhow::Result<Vec<Entry>> {
    let grpc_status = grpc_status
        .map(|text| {
            text.trim()
                .parse::<u16>()
                .with_context(|| format!("grpc-status {text:?} is not a number"))
        })
        .transpose()?;
    let mut entries = match (http_status, grpc_status) {
        (StatusCode::OK, Some(code::OK)) => vec![Entry::StatusCode(200), Entry::GrpcStatus(0)],
        (StatusCode::OK, Some(status)) => {
            vec![Entry::StatusCode(status), Entry::GrpcStatus(status)]
        }
        (StatusCode::OK, None) => anyhow::bail!("the response carried no grpc-status"),
        (http_status, grpc_status) => std::iter::once(Entry::StatusCode(http_status.as_u16()))
            .chain(grpc_status.map(Entry::GrpcStatus))
            .collect(),
    };
    if let Some(message) = grpc_message.filter(|m| !m.is_empty()) {
        entries.push(Entry::GrpcMessage(message.to_string()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::client::target;

    #[test]
    fn ok_is_reported_as_200() {
        assert_eq!(
            status_entries(StatusCode::OK, Some("0"), None).unwrap(),
            vec![Entry::StatusCode(200), Entry::GrpcStatus(0)]
        );
    }

    #[test]
    fn grpc_errors_report_their_code() {
        assert_eq!(
            status_entries(StatusCode::OK, Some("12"), Some("unknown method")).unwrap(),
            vec![
                Entry::StatusCode(12),
                Entry::GrpcStatus(12),
                Entry::GrpcMessage("unknown method".into())
            ]
        );
    }

    #[test]
    fn non_200_answers_report_the_http_status() {
        assert_eq!(
            status_entries(StatusCode::SERVICE_UNAVAILABLE, None, None).unwrap(),
            vec![Entry::StatusCode(503)]
        );
        assert_eq!(
            status_entries(StatusCode::NOT_FOUND, Some("12"), Some("")).unwrap(),
            vec![Entry::StatusCode(404), Entry::GrpcStatus(12)]
        );
    }

    #[test]
    fn missing_or_garbled_status_is_an_error() {
        assert!(status_entries(StatusCode::OK, None, None).is_err());
        assert!(status_entries(StatusCode::OK, Some("ok"), None).is_err());
    }

    #[test]
    fn request_carries_metadata_and_a_framed_message() {
        let mut headers = HeaderMap::new();
        headers.append("x-test-case", HeaderValue::from_static("set"));
        let call = Call {
            target: target::parse("grpc://echo:7070").unwrap(),
            method: Method::GET,
            headers,
            host: None,
            http2: false,
            message: "hi".into(),
        };
        let request = build(&call).unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "http://echo:7070/proto.EchoTestService/Echo");
        assert_eq!(request.headers()["x-test-case"], "set");
        assert_eq!(request.headers()[TE], "trailers");
    }
}
