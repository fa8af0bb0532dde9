//! HTTP ports: answer every request with its [`EchoBody`](aether_echo::body::EchoBody).

use std::convert::Infallible;
use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};

use super::{Conn, MAX_REQUEST_BODY, ResponseBody, describe, directives};

pub async fn handle(
    request: Request<Incoming>,
    conn: Arc<Conn>,
) -> Result<Response<ResponseBody>, Infallible> {
    let (parts, body) = request.into_parts();
    // Read the body to its end so the connection stays usable; its content is not echoed.
    if let Err(error) = Limited::new(body, MAX_REQUEST_BODY).collect().await {
        if error.is::<LengthLimitError>() {
            return Ok(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over {MAX_REQUEST_BODY} bytes\n"),
            ));
        }
        tracing::debug!(%error, "request body cut short");
    }
    let directives = match directives::read(&parts) {
        Ok(directives) => directives,
        Err(reason) => return Ok(text(StatusCode::BAD_REQUEST, format!("{reason}\n"))),
    };
    let proto = format!("{:?}", parts.version);
    let body = describe::echo_body(&parts, &conn, directives.status, &proto);
    tracing::debug!(method = %parts.method, uri = %parts.uri, status = %directives.status, "answered");

    let mut response = text(directives.status, body.render());
    for (name, value) in directives.response_headers {
        response.headers_mut().append(name, value);
    }
    Ok(response)
}

fn text(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
