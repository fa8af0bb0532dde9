//! One plain-text HTTP request (HTTP/1.1, or h2c with `--http2`).

use aether_echo::report::Entry;
use anyhow::Context;
use http::header::HOST;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use super::{Call, body_entries, header_entries, transport};

pub async fn exchange(call: &Call) -> anyhow::Result<Vec<Entry>> {
    let request = build(call)?;
    let stream = transport::connect(&call.target.host, call.target.port).await?;
    let response = if call.http2 {
        transport::send_http2(stream, request).await?
    } else {
        transport::send_http1(stream, request).await?
    };
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .context("reading the response body")?
        .to_bytes();

    let mut entries = vec![Entry::StatusCode(parts.status.as_u16())];
    entries.extend(header_entries(&parts.headers));
    entries.extend(body_entries(&body));
    Ok(entries)
}

/// HTTP/1.1 sends the path in the request line and the authority as Host; HTTP/2 sends both in
/// pseudo-headers, which hyper takes from an absolute URI.
fn build(call: &Call) -> anyhow::Result<Request<Full<Bytes>>> {
    let authority = call.authority().context("the Host value")?;
    let path = &call.target.path_and_query;
    let mut builder = Request::builder().method(call.method.clone());
    builder = if call.http2 {
        let authority = authority.to_str().context("the Host value")?;
        let uri = Uri::try_from(format!("http://{authority}{path}"))
            .with_context(|| format!("{authority}{path} is not a valid URI"))?;
        builder.uri(uri)
    } else {
        let uri =
            Uri::try_from(path.as_str()).with_context(|| format!("{path} is not a valid path"))?;
        builder.uri(uri).header(HOST, authority)
    };
    if let Some(headers) = builder.headers_mut() {
        headers.extend(call.headers.clone());
    }
    builder
        .body(Full::new(Bytes::new()))
        .context("building the request")
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, Method, Version};

    use super::*;
    use crate::client::target;

    fn call(url: &str, http2: bool, host: Option<&'static str>) -> Call {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        Call {
            target: target::parse(url).unwrap(),
            method: Method::POST,
            headers,
            host: host.map(HeaderValue::from_static),
            http2,
            message: String::new(),
        }
    }

    #[test]
    fn http1_request_has_origin_form_and_host() {
        let request = build(&call("http://echo:8080/p?q=1", false, None)).unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "/p?q=1");
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()[HOST], "echo:8080");
        let values: Vec<_> = request.headers().get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
    }

    #[test]
    fn host_override_replaces_the_authority() {
        let request = build(&call("http://echo/", false, Some("example.org"))).unwrap();
        assert_eq!(request.headers()[HOST], "example.org");
        let request = build(&call("http://echo/x", true, Some("example.org:81"))).unwrap();
        assert_eq!(request.uri(), "http://example.org:81/x");
        assert!(request.headers().get(HOST).is_none());
    }

    #[test]
    fn unusable_paths_are_errors() {
        assert!(build(&call("http://echo/a b", false, None)).is_err());
        assert!(build(&call("http://echo/", true, Some("bad host/"))).is_err());
    }
}
