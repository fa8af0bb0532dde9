//! Requests can ask the server to misbehave, for error-path tests:
//! - `x-echo-status: NNN` (or query `?status=NNN`): answer with that status (200..=599);
//! - `x-echo-response-header: Name:value` (repeatable): add that header to the response,
//!   e.g. a `Location` with a 3xx status.

use http::request::Parts;
use http::{HeaderName, HeaderValue, StatusCode};

pub const STATUS_HEADER: &str = "x-echo-status";
pub const RESPONSE_HEADER_HEADER: &str = "x-echo-response-header";

#[derive(Debug, PartialEq, Eq)]
pub struct Directives {
    pub status: StatusCode,
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
}

/// The directives a request carries; `Err` says which one is unusable (answered with 400).
pub fn read(parts: &Parts) -> Result<Directives, String> {
    let requested = match parts.headers.get(STATUS_HEADER) {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| format!("{STATUS_HEADER} is not text"))?,
        ),
        None => parts.uri.query().and_then(|q| query_param(q, "status")),
    };
    let status = match requested {
        Some(text) => parse_status(text)?,
        None => StatusCode::OK,
    };
    let response_headers = parts
        .headers
        .get_all(RESPONSE_HEADER_HEADER)
        .iter()
        .map(parse_response_header)
        .collect::<Result<_, _>>()?;
    Ok(Directives {
        status,
        response_headers,
    })
}

/// Final statuses only: a 1xx cannot end an exchange.
fn parse_status(text: &str) -> Result<StatusCode, String> {
    text.trim()
        .parse::<u16>()
        .ok()
        .filter(|code| (200..=599).contains(code))
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| format!("status {text:?} is not a number in 200..=599"))
}

fn parse_response_header(value: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
    let bad = || format!("{RESPONSE_HEADER_HEADER} {value:?} is not Name:value");
    let (name, header_value) = value
        .to_str()
        .map_err(|_| bad())?
        .split_once(':')
        .ok_or_else(bad)?;
    Ok((
        HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?,
        HeaderValue::from_str(header_value.trim_start()).map_err(|_| bad())?,
    ))
}

/// The first value of `key` in a query string; values here are plain digits, so no
/// percent-decoding.
fn query_param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(request: http::request::Builder) -> Parts {
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn plain_requests_get_200() {
        let d = read(&parts(http::Request::get("/?a=b"))).unwrap();
        assert_eq!(d.status, StatusCode::OK);
        assert!(d.response_headers.is_empty());
    }

    #[test]
    fn status_from_header_or_query_header_first() {
        let d = read(&parts(http::Request::get("/x?a=1&status=503"))).unwrap();
        assert_eq!(d.status, StatusCode::SERVICE_UNAVAILABLE);
        let d = read(&parts(
            http::Request::get("/x?status=503").header(STATUS_HEADER, "418"),
        ))
        .unwrap();
        assert_eq!(d.status.as_u16(), 418);
    }

    #[test]
    fn unusable_statuses_are_errors() {
        for bad in ["abc", "100", "600", "", "99999"] {
            let result = read(&parts(http::Request::get("/").header(STATUS_HEADER, bad)));
            assert!(result.is_err(), "{bad}");
        }
        assert!(read(&parts(http::Request::get("/?status=1xx"))).is_err());
    }

    #[test]
    fn response_headers_are_collected_in_order() {
        let d = read(&parts(
            http::Request::get("/")
                .header(STATUS_HEADER, "302")
                .header(RESPONSE_HEADER_HEADER, "Location: http://echo/next")
                .header(RESPONSE_HEADER_HEADER, "x-a:1"),
        ))
        .unwrap();
        assert_eq!(d.status, StatusCode::FOUND);
        assert_eq!(
            d.response_headers,
            vec![
                (
                    http::header::LOCATION,
                    HeaderValue::from_static("http://echo/next")
                ),
                (
                    HeaderName::from_static("x-a"),
                    HeaderValue::from_static("1")
                ),
            ]
        );
        let bad = read(&parts(
            http::Request::get("/").header(RESPONSE_HEADER_HEADER, "no colon"),
        ));
        assert!(bad.is_err());
    }
}
