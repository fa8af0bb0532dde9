//! The HTTP API: how each request body is read and each failure answered. The bodies and
//! paths are `aether_core::ca_api`, shared with the proxy.
//!
//! `GET /api/v1/pods?fieldSelector=spec.nodeName=<caller's node>` (list or watch, with the
//! same bearer token as `POST /v1/svid`) answers what the API server answers (see `pod_feed`).
//! Errors answer `{"error": "<message>", "code": "<StableName>"}`.

use aether_core::ca_api::{ErrorBody, SvidRequest};
use aether_core::identity::{IdentityError, ServiceAccount, SpiffeId};
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use serde::Serialize;

use super::authz::Denial;
use super::csr::{CsrError, ValidCsr, parse_csr};

/// Largest accepted request body: a CSR with an RSA-4096 key is about 2 KiB.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A well-formed SVID request, not yet authorized.
#[derive(Debug)]
pub struct CheckedSvidRequest {
    pub id: SpiffeId,
    pub csr: ValidCsr,
}

impl CheckedSvidRequest {
    pub fn service_account(&self) -> &ServiceAccount {
        self.id.service_account()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing bearer token: send `Authorization: Bearer <ServiceAccount token>`")]
    MissingToken,
    #[error("request body is larger than {MAX_BODY_BYTES} bytes")]
    BodyTooLarge,
    #[error("cannot read the request body: {0}")]
    Body(String),
    #[error("request body is not the expected JSON: {0}")]
    Json(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error(transparent)]
    Denied(#[from] Denial),
    #[error("too many requests from this address, retry later")]
    TooManyRequests,
    #[error("cannot check the request right now, retry later")]
    Unavailable,
    #[error("cannot sign right now, retry later")]
    Internal,
    #[error("not found")]
    NotFound,
    #[error("method not allowed (use {0})")]
    MethodNotAllowed(&'static str),
    #[error(
        "a proxy on node {node} may read the pods of its node only (fieldSelector=spec.nodeName={node}), not {selector:?}"
    )]
    OtherNode { node: String, selector: String },
    #[error("pod feed: {0}")]
    PodFeed(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingToken => StatusCode::UNAUTHORIZED,
            ApiError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Body(_)
            | ApiError::Json(_)
            | ApiError::Identity(_)
            | ApiError::Csr(_)
            | ApiError::PodFeed(_) => StatusCode::BAD_REQUEST,
            ApiError::Denied(_) | ApiError::OtherNode { .. } => StatusCode::FORBIDDEN,
            ApiError::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MissingToken => "MissingToken",
            ApiError::BodyTooLarge => "BodyTooLarge",
            ApiError::Body(_) | ApiError::Json(_) => "MalformedRequest",
            ApiError::Identity(_) => "InvalidIdentity",
            ApiError::Csr(_) => "InvalidCsr",
            ApiError::Denied(denial) => denial.code(),
            ApiError::TooManyRequests => "RateLimited",
            ApiError::Unavailable => "Unavailable",
            ApiError::Internal => "Internal",
            ApiError::NotFound => "NotFound",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowed",
            ApiError::OtherNode { .. } => "OtherNode",
            ApiError::PodFeed(_) => "MalformedRequest",
        }
    }

    pub fn response(&self) -> Response<Full<Bytes>> {
        let mut response = json(
            self.status(),
            &ErrorBody {
                error: self.to_string(),
                code: self.code().to_owned(),
            },
        );
        let headers = response.headers_mut();
        match self {
            ApiError::MissingToken => {
                headers.insert(
                    http::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer"),
                );
            }
            ApiError::MethodNotAllowed(allowed) => {
                headers.insert(http::header::ALLOW, HeaderValue::from_static(allowed));
            }
            ApiError::TooManyRequests => {
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

/// The bearer token of the `Authorization` header.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, ApiError> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::MissingToken)
}

/// Parses and checks everything in the body that can be checked without the cluster.
pub fn parse_svid_request(body: &[u8], trust_domain: &str) -> Result<CheckedSvidRequest, ApiError> {
    let body: SvidRequest =
        serde_json::from_slice(body).map_err(|e| ApiError::Json(e.to_string()))?;
    let service_account = ServiceAccount::new(body.namespace, body.service_account);
    let id = SpiffeId::new(trust_domain, &service_account)?;
    let csr = parse_csr(&body.csr)?;
    Ok(CheckedSvidRequest { id, csr })
}

/// A JSON response. Serializing our own plain structs cannot fail; if it ever did, the
/// client still gets a well-formed (empty object) answer rather than a dropped connection.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn reads_bearer_tokens() {
        assert_eq!(bearer_token(&headers("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(&headers("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer ", "abc"] {
            assert!(matches!(
                bearer_token(&headers(bad)),
                Err(ApiError::MissingToken)
            ));
        }
        assert!(matches!(
            bearer_token(&HeaderMap::new()),
            Err(ApiError::MissingToken)
        ));
    }

    #[test]
    fn malformed_requests_are_400() {
        let key = rcgen::KeyPair::generate().unwrap();
        let csr = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let body = |ns: &str, sa: &str, csr: &str| {
            serde_json::json!({"namespace": ns, "serviceAccount": sa, "csr": csr}).to_string()
        };
        let ok = parse_svid_request(body("shop", "web", &csr).as_bytes(), "cluster.local").unwrap();
        assert_eq!(ok.id.uri(), "spiffe://cluster.local/ns/shop/sa/web");

        for bad in [
            "{".to_string(),
            r#"{"namespace":"shop"}"#.to_string(),
            body("shop/x", "web", &csr),
            body("shop", "web", "not a csr"),
        ] {
            let err = parse_svid_request(bad.as_bytes(), "cluster.local").unwrap_err();
            assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn errors_are_json_with_a_code() {
        let response = ApiError::MissingToken.response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[http::header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let denied = ApiError::from(Denial::NoNode);
        assert_eq!(denied.status(), StatusCode::FORBIDDEN);
        assert_eq!(denied.code(), "TokenNotNodeBound");
    }
}
