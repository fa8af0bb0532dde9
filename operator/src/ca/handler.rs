//! One HTTP request in, one response out: routing, the SVID flow and its audit log line, and
//! the node-scoped pod feed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aether_core::ca_api::{SVID_PATH, SvidResponse, TRUST_BUNDLE_PATH, TrustBundleResponse};
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use k8s_openapi::api::authentication::v1::TokenReviewStatus;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::api::{self, ApiError, MAX_BODY_BYTES};
use super::authority::Authority;
use super::authz::{self, NODE_NAME_EXTRA};
use super::config::CaConfig;
use super::limit::Limits;
use super::pod_feed::{self, PODS_PATH};
use super::review;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: a whole JSON answer, or the API server's pod list or watch stream.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

fn whole(response: Response<Full<Bytes>>) -> Response<Body> {
    response.map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

/// An SVID request that takes longer (a slow API server) is answered 503 so the proxy retries
/// instead of hanging.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Clone)]
pub struct Handler {
    client: kube::Client,
    config: Arc<CaConfig>,
    authority: watch::Receiver<Arc<Authority>>,
    limits: Arc<Limits>,
}

/// What the log line of one SVID request says, filled in as the request is understood.
#[derive(Debug, Default)]
struct Audit {
    caller: Option<String>,
    node: Option<String>,
    requested: Option<String>,
}

impl Handler {
    pub fn new(
        client: kube::Client,
        config: Arc<CaConfig>,
        authority: watch::Receiver<Arc<Authority>>,
    ) -> Self {
        Handler {
            client,
            config,
            authority,
            limits: Arc::default(),
        }
    }

    pub async fn handle(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let reviewed = matches!(
            (request.method(), request.uri().path()),
            (&Method::POST, SVID_PATH) | (&Method::GET, PODS_PATH)
        );
        // Refused before anything is read: a flood costs the API server nothing.
        if reviewed && !self.limits.admit(peer.ip(), Instant::now()) {
            return whole(ApiError::TooManyRequests.response());
        }
        match (request.method(), request.uri().path()) {
            (&Method::POST, SVID_PATH) => whole(self.svid(request).await),
            (&Method::GET, PODS_PATH) => self.pods(request, peer).await,
            (&Method::GET, TRUST_BUNDLE_PATH) => whole(api::json(
                StatusCode::OK,
                &TrustBundleResponse {
                    trust_domain: self.config.trust_domain.clone(),
                    trust_bundle: self.authority.borrow().bundle_pem().to_owned(),
                },
            )),
            (_, SVID_PATH) => whole(ApiError::MethodNotAllowed("POST").response()),
            (_, TRUST_BUNDLE_PATH | PODS_PATH) => {
                whole(ApiError::MethodNotAllowed("GET").response())
            }
            _ => whole(ApiError::NotFound.response()),
        }
    }

    /// The pod feed: the caller's node's pods, listed or watched through the operator.
    async fn pods(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let token = api::bearer_token(request.headers()).map(str::to_owned);
        let query = request.uri().query().map(str::to_owned);
        drop(request);
        match self.forward_pods(token, query).await {
            Ok(response) => response,
            Err(e) => {
                warn!(%peer, status = e.status().as_u16(), code = e.code(), reason = %e, "pod feed request refused");
                whole(e.response())
            }
        }
    }

    async fn forward_pods(
        &self,
        token: Result<String, ApiError>,
        query: Option<String>,
    ) -> Result<Response<Body>, ApiError> {
        let token = token?;
        let status = {
            let _slot = self
                .limits
                .review_slot()
                .await
                .ok_or(ApiError::Unavailable)?;
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                review::review_token(&self.client, &token, &self.config.token_audience),
            )
            .await
            .map_err(|_| ApiError::Unavailable)?
            .map_err(|e| {
                error!(error = %e, "TokenReview failed");
                ApiError::Unavailable
            })?
        };
        let caller = authz::identify_caller(
            &status,
            &self.config.token_audience,
            &self.config.proxy_service_account,
        )?;
        let query = pod_feed::upstream_query(query.as_deref(), &caller.node)?;
        debug!(node = caller.node, query, "serving the pod feed");
        let upstream = Request::get(format!("{PODS_PATH}?{query}"))
            .header(ACCEPT, "application/json")
            .body(kube::client::Body::from(Vec::new()))
            .map_err(|_| ApiError::Internal)?;
        let answer = self.client.send(upstream).await.map_err(|e| {
            error!(error = %e, node = caller.node, "forwarding the pod feed failed");
            ApiError::Unavailable
        })?;
        let (parts, body) = answer.into_parts();
        let mut response = Response::new(body.map_err(BoxError::from).boxed_unsync());
        *response.status_mut() = parts.status;
        if let Some(kind) = parts.headers.get(CONTENT_TYPE) {
            response.headers_mut().insert(CONTENT_TYPE, kind.clone());
        }
        Ok(response)
    }

    async fn svid(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let mut audit = Audit::default();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.issue(request, &mut audit))
            .await
            .unwrap_or_else(|_| {
                error!("SVID request timed out");
                Err(ApiError::Unavailable)
            });
        let (caller, node, requested) = (
            audit.caller.as_deref().unwrap_or("-"),
            audit.node.as_deref().unwrap_or("-"),
            audit.requested.as_deref().unwrap_or("-"),
        );
        match result {
            Ok(svid) => {
                info!(caller, node, spiffe_id = requested, expires_at = %svid.expires_at, "issued SVID");
                api::json(StatusCode::OK, &svid)
            }
            Err(e) => {
                let status = e.status().as_u16();
                let (code, reason) = (e.code(), e.to_string());
                if e.status().is_server_error() {
                    error!(
                        caller,
                        node, requested, status, code, reason, "SVID request failed"
                    );
                } else {
                    warn!(
                        caller,
                        node, requested, status, code, reason, "SVID request refused"
                    );
                }
                e.response()
            }
        }
    }

    /// The SVID flow: cheap local checks first, then the API server, then signing.
    async fn issue(
        &self,
        request: Request<Incoming>,
        audit: &mut Audit,
    ) -> Result<SvidResponse, ApiError> {
        let token = api::bearer_token(request.headers())?.to_owned();
        let body = read_body(request.into_body()).await?;
        let svid_request = api::parse_svid_request(&body, &self.config.trust_domain)?;
        audit.requested = Some(svid_request.id.uri());

        let _slot = self
            .limits
            .review_slot()
            .await
            .ok_or(ApiError::Unavailable)?;
        let status = review::review_token(&self.client, &token, &self.config.token_audience)
            .await
            .map_err(|e| {
                error!(error = %e, "TokenReview failed");
                ApiError::Unavailable
            })?;
        (audit.caller, audit.node) = claimed_caller(&status);
        let caller = authz::identify_caller(
            &status,
            &self.config.token_audience,
            &self.config.proxy_service_account,
        )?;

        let namespace = &svid_request.service_account().namespace;
        let labels = review::namespace_labels(&self.client, namespace)
            .await
            .map_err(|e| {
                error!(error = %e, namespace, "reading the namespace failed");
                ApiError::Unavailable
            })?;
        let pods = review::pods_on_node(
            &self.client,
            &svid_request.service_account().namespace,
            &caller.node,
        )
        .await
        .map_err(|e| {
            error!(error = %e, node = caller.node, "listing the node's pods failed");
            ApiError::Unavailable
        })?;
        authz::authorize_workload(&caller, &labels, &pods, svid_request.service_account())?;

        let authority = self.authority.borrow().clone();
        let svid = authority
            .issue_svid(
                &svid_request.csr,
                &svid_request.id,
                self.config.svid_ttl,
                SystemTime::now(),
            )
            .map_err(|e| {
                error!(error = %e, "signing failed");
                ApiError::Internal
            })?;
        Ok(SvidResponse {
            spiffe_id: svid_request.id.uri(),
            cert_chain: svid.cert_pem,
            trust_bundle: authority.bundle_pem().to_owned(),
            expires_at: rfc3339(svid.not_after),
        })
    }
}

/// The user and node a reviewed token claims, whether or not it is accepted: for the log.
fn claimed_caller(status: &TokenReviewStatus) -> (Option<String>, Option<String>) {
    let user = status.user.as_ref();
    (
        user.and_then(|u| u.username.clone()),
        user.and_then(|u| u.extra.as_ref())
            .and_then(|e| e.get(NODE_NAME_EXTRA))
            .and_then(|v| v.first().cloned()),
    )
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::BodyTooLarge),
        Err(e) => Err(ApiError::Body(e.to_string())),
    }
}

fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use std::collections::BTreeMap;

    #[test]
    fn formats_expiry_as_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(rfc3339(t), "2027-01-15T08:00:00Z");
    }

    #[test]
    fn logs_claims_even_of_refused_tokens() {
        let status = TokenReviewStatus {
            user: Some(UserInfo {
                username: Some("system:serviceaccount:a:b".into()),
                extra: Some(BTreeMap::from([(
                    NODE_NAME_EXTRA.into(),
                    vec!["node-2".into()],
                )])),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        };
        assert_eq!(
            claimed_caller(&status),
            (
                Some("system:serviceaccount:a:b".into()),
                Some("node-2".into())
            )
        );
        assert_eq!(claimed_caller(&TokenReviewStatus::default()), (None, None));
    }
}
