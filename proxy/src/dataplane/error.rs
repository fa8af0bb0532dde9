//! Why the data plane could not carry a request or a connection to where it was going: one
//! type for both directions, which decides the status code of the answer the proxy makes and
//! the `reason` label it is counted under (`aether_proxy_failures_total`).

use std::net::SocketAddr;
use std::time::Duration;

use ::http::StatusCode;
use aether_cni::protocol::PodRef;

use crate::dataplane::snapshot::ServiceKey;
use crate::identity::ServiceAccount;
use crate::inpod::netns::NetnsError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("backend {0} has no ready endpoint")]
    NoEndpoint(String),
    #[error("backend {backend} did not answer within {limit:?}")]
    Timeout { backend: String, limit: Duration },
    #[error("the ServiceAccount of pod {0} is not known yet")]
    NoSourceIdentity(PodRef),
    #[error("no SVID for {0} yet")]
    NoSvid(ServiceAccount),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("connecting to {0} timed out")]
    ConnectTimeout(SocketAddr),
    #[error("cannot connect to {to}: {reason}")]
    Connect { to: SocketAddr, reason: String },
    #[error("mTLS handshake with {to} failed: {reason}")]
    Handshake { to: SocketAddr, reason: String },
    #[error("{to} presented no identity of the mesh")]
    NoPeerIdentity { to: SocketAddr },
    #[error("{0}")]
    PeerNotAllowed(Box<WrongPeer>),
    #[error("request to {to} failed: {reason}")]
    Request { to: SocketAddr, reason: String },
    #[error("the request names {what} {value:?}, which is not valid: {reason}")]
    InvalidRequest {
        what: &'static str,
        value: String,
        reason: String,
    },
    #[error("endpoint {endpoint} refused the tunnel: {status}")]
    TunnelRefused {
        endpoint: SocketAddr,
        status: StatusCode,
    },
    #[error("the tunnel to {endpoint} did not open: {reason}")]
    Tunnel {
        endpoint: SocketAddr,
        reason: String,
    },
}

/// A backend's peer must prove one of the identities its Service may present (the
/// ServiceAccounts of its pods): `allowed` is empty while those are not known.
#[derive(Debug)]
pub struct WrongPeer {
    pub endpoint: SocketAddr,
    pub service: ServiceKey,
    pub peer: String,
    pub allowed: Vec<String>,
}

impl std::fmt::Display for WrongPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let WrongPeer {
            endpoint,
            service,
            peer,
            allowed,
        } = self;
        write!(f, "endpoint {endpoint} of {service} presented {peer}, ")?;
        if allowed.is_empty() {
            f.write_str("but no identity is known for the Service yet")
        } else {
            write!(f, "not one of the allowed identities {allowed:?}")
        }
    }
}

impl Error {
    /// The status of the answer a client gets in place of the backend's.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Error::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Whether another attempt, at the same or another endpoint, may succeed where this one
    /// failed: the connection failures GEP-1731 says to retry (refused, reset, timed out).
    /// A wrong peer identity or a bad request fails the same way again.
    pub fn retriable(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::ConnectTimeout(_)
                | Error::Connect { .. }
                | Error::Handshake { .. }
                | Error::Request { .. }
        )
    }

    /// The metric label: a few values, stable across releases.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NoEndpoint(_) => "no_endpoint",
            Error::Timeout { .. } => "timeout",
            Error::NoSourceIdentity(_) => "no_source_identity",
            Error::NoSvid(_) => "no_svid",
            Error::Netns(_) | Error::ConnectTimeout(_) | Error::Connect { .. } => "connect",
            Error::Handshake { .. } => "handshake",
            Error::NoPeerIdentity { .. } | Error::PeerNotAllowed(_) => "peer_identity",
            Error::Request { .. } => "request",
            Error::InvalidRequest { .. } => "invalid_request",
            Error::TunnelRefused { .. } | Error::Tunnel { .. } => "tunnel",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_peer_says_what_it_presented_and_what_was_allowed() {
        let refused = |allowed: Vec<String>| {
            Error::PeerNotAllowed(Box::new(WrongPeer {
                endpoint: "10.0.0.7:8080".parse().unwrap(),
                service: ServiceKey::new("shop", "echo"),
                peer: "spiffe://cluster.local/ns/shop/sa/intruder".into(),
                allowed,
            }))
        };
        let known = refused(vec!["spiffe://cluster.local/ns/shop/sa/v1".into()]);
        assert_eq!(
            known.to_string(),
            "endpoint 10.0.0.7:8080 of shop/echo presented spiffe://cluster.local/ns/shop/sa/intruder, \
             not one of the allowed identities [\"spiffe://cluster.local/ns/shop/sa/v1\"]"
        );
        assert!(
            refused(Vec::new())
                .to_string()
                .ends_with("but no identity is known for the Service yet")
        );
        assert_eq!(known.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(known.reason(), "peer_identity");
    }

    #[test]
    fn only_a_timeout_and_a_bad_request_are_not_503() {
        let timeout = Error::Timeout {
            backend: "shop/echo:80".into(),
            limit: Duration::from_millis(500),
        };
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        let invalid = Error::InvalidRequest {
            what: "authority",
            value: "a b".into(),
            reason: "invalid character".into(),
        };
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        assert_eq!(invalid.reason(), "invalid_request");
        let no_endpoint = Error::NoEndpoint("shop/echo:80".into());
        assert_eq!(no_endpoint.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(no_endpoint.reason(), "no_endpoint");
    }
}
