//! The data plane: what happens to a connection a pod's listener accepted.
//!
//! - [`outbound`]: a captured connection of a local pod. To a route target whose table this
//!   node holds, it is HTTP (1.1 or 2) routed per request; anything else passes through as TCP
//!   to its original destination.
//! - [`inbound`]: an mTLS connection of another proxy to a local pod, forwarded to the app at
//!   the pod's own address with the verified client identity.
//! - [`authz`]: who may call a local pod, decided from the caller's verified identity.
//! - [`probe`]: the node's probes of a strict pod, which its table sends to the inbound
//!   listener: only the probes' requests pass, with no identity.
//! - [`clients`]: connections made from inside a pod's network namespace, pooled: plain
//!   HTTP to unmeshed endpoints and apps, HTTP/2 over mTLS between proxies.
//! - [`copy`]: bytes both ways between two connections, for everything not HTTP.
//! - [`error`]: why a request or connection was not carried, its status code and metric label.
//! - [`snapshot`]: the routes, endpoints and identities the data plane reads, rebuilt by a pure
//!   function after each change of the cluster.
//! - [`balancer`]: endpoint choice (power of two choices over EWMA latency) and passive
//!   health (outlier ejection).
//! - [`retry_budgets`]: how many retries each route rule may still make.

pub mod authz;
pub mod balancer;
pub mod clients;
pub mod copy;
pub mod error;
pub mod http;
pub mod inbound;
pub mod outbound;
pub mod probe;
pub mod retry_budgets;
pub mod snapshot;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ::http::HeaderName;
use aether_cni::protocol::PodRef;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::dataplane::balancer::Balancer;
use crate::dataplane::snapshot::Snapshot;
use crate::identity::ServiceAccount;
use crate::identity::tls::Certs;
use crate::inpod::listeners::{Drain, Handler, Limit, Opening, PodInfo, Role};
use crate::inpod::netns::Netns;
use crate::inpod::probes::Probes;
use crate::metrics::Metrics;
use clients::PodClients;

/// The header through which the inbound side tells the app who called: the caller's SPIFFE ID,
/// verified by mTLS. Any copy a client sends is removed first, so only aether sets it.
pub const CLIENT_IDENTITY_HEADER: HeaderName = HeaderName::from_static("x-aether-client-identity");

/// Who a local pod is, for the mesh: its ServiceAccount and declared ports come from the
/// cluster.
pub trait Workloads: Send + Sync {
    fn service_account(&self, pod: &PodRef) -> Option<ServiceAccount>;
    /// The TCP ports the pod's containers declare.
    fn declared_ports(&self, pod: &PodRef) -> Vec<u16>;
    /// How the kubelet probes the pod: what the node may send it in strict mode.
    fn probes(&self, pod: &PodRef) -> Probes;
    /// The pod's labels, which decide the AuthorizationPolicies that select it.
    fn labels(&self, pod: &PodRef) -> std::collections::BTreeMap<String, String>;
}

/// The current snapshot, swapped whole when the cluster changes; what lives as long as a
/// connection (a tunnel's authorization) watches it.
#[derive(Debug)]
pub struct SnapshotCell(watch::Sender<Arc<Snapshot>>);

impl Default for SnapshotCell {
    fn default() -> Self {
        SnapshotCell(watch::Sender::new(Arc::default()))
    }
}

impl SnapshotCell {
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.borrow().clone()
    }

    pub fn store(&self, snapshot: Arc<Snapshot>) {
        self.0.send_replace(snapshot);
    }

    pub fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.0.subscribe()
    }
}

/// Counters of captured connections, for tests and logs.
#[derive(Debug, Default)]
pub struct ForwardStats {
    accepted: AtomicU64,
    forwarded: AtomicU64,
    failed: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardCounts {
    /// Connections accepted on a capture listener.
    pub accepted: u64,
    /// Of those, passed through or served as HTTP.
    pub forwarded: u64,
    /// Of those, refused or not connected.
    pub failed: u64,
}

impl ForwardStats {
    pub fn counts(&self) -> ForwardCounts {
        ForwardCounts {
            accepted: self.accepted.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// Route targets local pods dialled whose tables this node's config does not hold (the cold
/// path): reported on the NodeConfig's status, so the operator adds them to the node's scope.
#[derive(Debug, Default)]
pub struct Demand {
    targets: Mutex<std::collections::BTreeSet<String>>,
    pub changed: tokio::sync::Notify,
}

impl Demand {
    /// Records `target`; wakes the reporter if it is new.
    pub fn want(&self, target: &crate::dataplane::snapshot::ServiceKey) {
        let added = self
            .targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target.to_string());
        if added {
            self.changed.notify_one();
        }
    }

    /// Forgets the targets `keep` refuses; wakes the reporter if any went.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let removed = {
            let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
            let before = targets.len();
            targets.retain(|t| keep(t));
            targets.len() != before
        };
        if removed {
            self.changed.notify_one();
        }
    }

    pub fn targets(&self) -> Vec<String> {
        let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets.iter().cloned().collect()
    }
}

/// What the mesh part of the data plane needs (absent when the proxy runs without a cluster:
/// then captured connections only pass through).
pub struct Mesh {
    pub snapshot: Arc<SnapshotCell>,
    pub certs: Arc<Certs>,
    pub workloads: Arc<dyn Workloads>,
    pub metrics: Arc<Metrics>,
    /// The inbound mTLS port of every meshed pod.
    pub inbound_port: u16,
    pub demand: Arc<Demand>,
}

pub struct DataPlane {
    mesh: Option<Arc<Mesh>>,
    balancer: Balancer,
    retry_budgets: retry_budgets::RetryBudgets,
    stats: ForwardStats,
    /// Connections made from each local pod, by its network namespace.
    clients: Mutex<HashMap<Netns, Arc<PodClients>>>,
}

impl DataPlane {
    pub fn new(mesh: Option<Mesh>) -> Arc<Self> {
        Arc::new(DataPlane {
            mesh: mesh.map(Arc::new),
            balancer: Balancer::default(),
            retry_budgets: retry_budgets::RetryBudgets::default(),
            stats: ForwardStats::default(),
            clients: Mutex::default(),
        })
    }

    pub fn counts(&self) -> ForwardCounts {
        self.stats.counts()
    }

    /// Drops the balancer's state of endpoints `snapshot` no longer has.
    pub fn prune(&self, snapshot: &Snapshot) {
        let live: std::collections::HashSet<SocketAddr> = snapshot
            .services
            .values()
            .flat_map(|service| service.ports.values().flatten())
            .map(|endpoint| endpoint.addr)
            .collect();
        let kept = self.balancer.retain(|addr| live.contains(addr));
        tracing::debug!(kept, "pruned the balancer's endpoints");
        // A deleted Service is demanded no more: a namespace made again under the same name
        // starts with no table on this node.
        if let Some(mesh) = &self.mesh {
            let services: std::collections::HashSet<String> =
                snapshot.services.keys().map(ToString::to_string).collect();
            mesh.demand.retain(|target| services.contains(target));
        }
    }

    /// Whether a local pod must refuse plaintext from other hosts for its policies: an
    /// unmeshed caller never passes through this proxy, so only the pod's table can refuse it.
    pub fn refuses_plaintext(&self, pod: &PodRef) -> bool {
        let Some(mesh) = &self.mesh else {
            return false;
        };
        let snapshot = mesh.snapshot.load();
        let labels = mesh.workloads.labels(pod);
        snapshot
            .authz
            .policies
            .applicable(&pod.namespace, &labels)
            .refuses_unauthenticated()
    }

    fn clients(&self, netns: &Netns) -> Arc<PodClients> {
        let mut all = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(netns.clone())
            .or_insert_with(|| Arc::new(PodClients::new(netns.clone())))
            .clone()
    }
}

impl Handler for DataPlane {
    fn serve(
        self: Arc<Self>,
        role: Role,
        stream: TcpStream,
        peer: SocketAddr,
        pod: Arc<PodInfo>,
        drain: Drain,
        opening: Opening,
    ) -> BoxFuture<'static, ()> {
        match role {
            Role::Capture => {
                self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                outbound::serve(self, stream, peer, pod, drain, opening).boxed()
            }
            Role::Inbound => inbound::serve(self, stream, peer, pod, drain, opening).boxed(),
        }
    }

    fn forget(&self, pod: &PodInfo) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod.netns);
    }

    fn over_limit(&self, role: Role, pod: &PodInfo, limit: Limit) {
        if role == Role::Capture {
            self.stats.accepted.fetch_add(1, Ordering::Relaxed);
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(mesh) = &self.mesh {
            mesh.metrics.connection_refused(role, limit);
        }
        // A flood would flood the log too: the metric is the signal.
        tracing::debug!(pod = %pod.pod, ?role, limit = limit.as_str(), "reset a connection over the limit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::snapshot::ServiceKey;

    /// Whether the reporter would be woken now (taking the wake-up).
    fn woken(demand: &Demand) -> bool {
        let notified = demand.changed.notified();
        tokio::pin!(notified);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        notified.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn demand_forgets_targets_that_are_gone_and_says_so() {
        let demand = Demand::default();
        demand.want(&ServiceKey::new("shop", "web"));
        demand.want(&ServiceKey::new("shop", "gone"));
        assert!(woken(&demand));
        demand.retain(|t| t != "shop/elsewhere");
        assert!(!woken(&demand), "nothing went: nothing to report");
        demand.retain(|t| t == "shop/web");
        assert_eq!(demand.targets(), ["shop/web"]);
        assert!(woken(&demand), "the shorter list is reported");
    }
}
