//! gRPC ports: the unary `proto.EchoTestService/Echo`, answering with the
//! [`EchoBody`](aether_echo::body::EchoBody) text as the EchoResponse message.

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};

use super::{Conn, MAX_REQUEST_BODY, ResponseBody, describe};
use crate::grpc_wire::{self, code};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

pub async fn handle(
    request: Request<Incoming>,
    conn: Arc<Conn>,
) -> Result<Response<ResponseBody>, Infallible> {
    let path = request.uri().path();
    if path != grpc_wire::ECHO_PATH {
        let message = format!("unknown method {path}");
        return Ok(status_only(code::UNIMPLEMENTED, &message));
    }
    let (parts, body) = request.into_parts();
    let bytes = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => {
            let message = format!("request over {MAX_REQUEST_BODY} bytes");
            return Ok(status_only(code::RESOURCE_EXHAUSTED, &message));
        }
        Err(error) => return Ok(status_only(code::INTERNAL, &error.to_string())),
    };
    let message = match grpc_wire::unframe(&bytes).and_then(grpc_wire::decode_message_field) {
        Ok(message) => message,
        Err(error) => return Ok(status_only(code::INTERNAL, &error.to_string())),
    };

    let mut body = describe::echo_body(&parts, &conn, StatusCode::OK, "GRPC");
    body.echo = Some(message);
    tracing::debug!(authority = %body.host, "answered Echo");
    let reply = grpc_wire::frame(&grpc_wire::encode_message_field(&body.render()));

    let mut trailers = HeaderMap::new();
    trailers.insert(GRPC_STATUS, HeaderValue::from(code::OK));
    let body = Full::new(Bytes::from(reply))
        .with_trailers(ready(Some(Ok(trailers))))
        .boxed();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, APPLICATION_GRPC);
    Ok(response)
}

/// A "trailers-only" answer: the status rides in the headers and there is no message.
fn status_only(status: u16, message: &str) -> Response<ResponseBody> {
    tracing::debug!(status, message, "gRPC error");
    let mut response = Response::new(Empty::new().boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, APPLICATION_GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(status));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    response
}

/// grpc-message is percent-encoded: printable ASCII other than `%` goes as is.
fn percent_encode(message: &str) -> String {
    message
        .bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'%' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_encoding() {
        assert_eq!(
            percent_encode("unknown method /a.B/C"),
            "unknown method /a.B/C"
        );
        assert_eq!(percent_encode("50% é\n"), "50%25 %C3%A9%0A");
    }

    #[test]
    fn errors_are_trailers_only() {
        let response = status_only(code::UNIMPLEMENTED, "nope");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[GRPC_STATUS], "12");
        assert_eq!(response.headers()[GRPC_MESSAGE], "nope");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
    }
}
