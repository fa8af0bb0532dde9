//! Authorization at the inbound side: the decision of [`aether_core::authz`] for the caller
//! mTLS proved, counted, logged when it refuses (or an audit policy would have), and turned into
//! the 403 the caller gets. An open tunnel is decided again whenever the policies change, and
//! closed once they refuse it.

use std::collections::BTreeMap;

use ::http::request::Parts;
use ::http::{Response, StatusCode};
use aether_cni::protocol::PodRef;
use std::sync::{Arc, Mutex};

use aether_core::authz::{Applicable, HttpHead, Peer, PolicySet, Refusal, Request, Verdict};
use tokio::sync::watch;
use tracing::{info, warn};

use super::Mesh;
use super::http::{Body, answer};
use super::snapshot::{Authorization, Snapshot};
use crate::identity::ServiceAccount;

/// Who called, as the peer's certificate proved.
pub struct Caller {
    pub service_account: ServiceAccount,
    pub spiffe_id: String,
}

impl Caller {
    fn peer(&self) -> Peer<'_> {
        Peer {
            service_account: &self.service_account,
            spiffe_id: &self.spiffe_id,
        }
    }
}

/// The pod being called, for its policies: its namespace and labels, and the policies that
/// select it, found again only when the node's policies change.
pub struct Callee {
    pod: PodRef,
    /// The pod's own SPIFFE ID, for the access log.
    spiffe_id: String,
    labels: BTreeMap<String, String>,
    found: Mutex<Option<Found>>,
}

type Found = (Arc<Authorization>, Arc<Applicable>);

impl Callee {
    pub fn new(pod: PodRef, spiffe_id: String, labels: BTreeMap<String, String>) -> Self {
        Callee {
            pod,
            spiffe_id,
            labels,
            found: Mutex::new(None),
        }
    }

    fn applicable(&self, authz: &Arc<Authorization>) -> Arc<Applicable> {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((of, applicable)) = &*found
            && Arc::ptr_eq(of, authz)
        {
            return applicable.clone();
        }
        let applicable = Arc::new(authz.policies.applicable(&self.pod.namespace, &self.labels));
        *found = Some((authz.clone(), applicable.clone()));
        applicable
    }
}

/// An HTTP request head, as a policy's matches read it.
pub struct Head<'a>(pub &'a Parts);

impl HttpHead for Head<'_> {
    fn method(&self) -> &str {
        self.0.method.as_str()
    }

    fn path(&self) -> &str {
        self.0.uri.path()
    }

    fn query(&self) -> Option<&str> {
        self.0.uri.query()
    }

    fn header_values(&self, name: &str) -> Vec<&str> {
        self.0
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }
}

/// The decision on `caller` asking `port` (and `head`, for HTTP) of `callee`, from `snapshot`'s
/// policies: counted and, when it refuses or an audit policy would have, logged with both
/// identities. `None` when no policy selects the pod.
pub fn decide(
    mesh: &Mesh,
    snapshot: &Snapshot,
    callee: &Callee,
    caller: &Caller,
    port: u16,
    head: Option<&Head<'_>>,
) -> Option<Verdict> {
    let applicable = callee.applicable(&snapshot.authz);
    if applicable.is_open() {
        return None;
    }
    let http = head.map(|h| h as &dyn HttpHead);
    let verdict = PolicySet::decide(&applicable, Some(caller.peer()), Request { port, http });
    let decider = verdict
        .refused
        .as_ref()
        .map(Refusal::policy)
        .or_else(|| verdict.policy.as_deref().map(str::to_owned))
        .unwrap_or_default();
    mesh.metrics.authz(decider, verdict.allowed(), "enforce");
    let (method, path) = head
        .map(|h| (h.0.method.as_str(), h.0.uri.path()))
        .unwrap_or(("", ""));
    if let Some(refusal) = &verdict.refused {
        warn!(
            target: "aether::access",
            decision = "deny",
            mode = "enforce",
            policy = %refusal.policy(),
            source_principal = %caller.spiffe_id,
            destination_principal = %callee.spiffe_id,
            destination_pod = %callee.pod,
            port,
            method,
            path,
            reason = %refusal,
            "authorization denied a mesh request"
        );
    }
    if let Some(audit) = &verdict.audit {
        mesh.metrics.authz(audit.policy(), false, "audit");
        info!(
            target: "aether::access",
            decision = "deny",
            mode = "audit",
            policy = %audit.policy(),
            source_principal = %caller.spiffe_id,
            destination_principal = %callee.spiffe_id,
            destination_pod = %callee.pod,
            port,
            method,
            path,
            reason = %audit,
            "an audit policy would have denied a mesh request; it was let through"
        );
    }
    Some(verdict)
}

/// The 403 for a refused request: the body names the policy.
pub fn forbidden(refusal: &Refusal) -> Response<Body> {
    answer(StatusCode::FORBIDDEN, format!("aether: {refusal}"))
}

/// Resolves once the policies, decided again at each change of the snapshot, refuse what an
/// open tunnel carries: the tunnel is then closed.
pub async fn revoked(
    mesh: &Mesh,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    callee: &Callee,
    caller: &Caller,
    port: u16,
) -> Refusal {
    let mut current = snapshots.borrow_and_update().authz.clone();
    loop {
        if snapshots.changed().await.is_err() {
            return std::future::pending().await;
        }
        let snapshot = snapshots.borrow_and_update().clone();
        if Arc::ptr_eq(&current, &snapshot.authz) {
            continue;
        }
        current = snapshot.authz.clone();
        if let Some(Verdict {
            refused: Some(refusal),
            ..
        }) = decide(mesh, &snapshot, callee, caller, port, None)
        {
            return refusal;
        }
    }
}
