//! The proxy's Prometheus metrics (served by `aether_admin` with the health endpoints).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::inpod::listeners::{Limit, Role};

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Direction {
    /// A captured request of a local pod.
    Outbound,
    /// A mesh request to a local pod.
    Inbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}

impl EncodeLabelValue for Direction {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub direction: Direction,
    /// The route target, `namespace/service` (empty inbound). Shared, as a connection's
    /// requests all have the same.
    pub target: Arc<str>,
    /// The route, `Kind/namespace/name` (empty when none applied).
    pub route: String,
    /// The backend Service and port, `namespace/name:port` (inbound: the pod,
    /// `namespace/name`, shared by the connection's requests).
    pub backend: Arc<str>,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    pub direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// `client` (outbound) or `server` (inbound).
    pub side: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    /// `table`, `listeners` or `cni_config`.
    pub what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `capture` or `inbound`.
    pub listener: &'static str,
    /// `listener` (the pod's own share) or `node`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub direction: Direction,
    /// [`crate::dataplane::error::Error::reason`].
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EnrolmentLabels {
    /// `enrol` or `leave`.
    pub action: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    /// `release` or `debug`: a benchmark of a debug build measures the compiler, not aether.
    profile: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthzLabels {
    /// `namespace/name`, or `namespace/*` for a namespace's default deny.
    pub policy: String,
    /// `allow` or `deny`.
    pub decision: &'static str,
    /// `enforce` or `audit` (a refusal an audit policy would have made).
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    /// The route, `Kind/namespace/name`.
    pub route: String,
    /// `retried`, or `budget_exhausted` (a retry the route's retry budget refused).
    pub outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    /// The request latency histograms of the two directions, looked up once.
    outbound_latency: Histogram,
    inbound_latency: Histogram,
    handshakes: Family<HandshakeLabels, Counter>,
    svids: Family<ResultLabels, Counter>,
    drift: Family<DriftLabels, Counter>,
    enrolments: Family<EnrolmentLabels, Counter>,
    inbound_refused: Family<ReasonLabels, Counter>,
    outbound_refused: Family<ReasonLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    over_limit: Family<LimitLabels, Counter>,
    authz: Family<AuthzLabels, Counter>,
    retries: Family<RetryLabels, Counter>,
    ejections: Counter,
    pub captured_pods: Gauge,
    pub config_generation: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("aether_proxy");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<DirectionLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
        });
        // A histogram from the family shares its buckets with the family's.
        let latency_of = |direction| {
            latency
                .get_or_create(&DirectionLabels { direction })
                .clone()
        };
        let handshakes = Family::<HandshakeLabels, Counter>::default();
        let svids = Family::<ResultLabels, Counter>::default();
        let drift = Family::<DriftLabels, Counter>::default();
        let enrolments = Family::<EnrolmentLabels, Counter>::default();
        let inbound_refused = Family::<ReasonLabels, Counter>::default();
        let outbound_refused = Family::<ReasonLabels, Counter>::default();
        let failures = Family::<FailureLabels, Counter>::default();
        let over_limit = Family::<LimitLabels, Counter>::default();
        let authz = Family::<AuthzLabels, Counter>::default();
        let retries = Family::<RetryLabels, Counter>::default();
        let ejections = Counter::default();
        let captured_pods = Gauge::default();
        let config_generation = Gauge::default();
        registry.register(
            "requests",
            "HTTP requests by direction, route target, route, backend and status",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response headers",
            latency.clone(),
        );
        registry.register(
            "tls_handshakes",
            "mTLS handshakes of the mesh hop by side and result",
            handshakes.clone(),
        );
        registry.register(
            "svid_requests",
            "SVID requests to the certificate authority by result",
            svids.clone(),
        );
        registry.register(
            "drift_repairs",
            "Captured pods found without their nftables table or listeners, and repaired",
            drift.clone(),
        );
        registry.register(
            "enrolments",
            "Running pods meshed (enrol) or taken out of the mesh (leave) with no restart, by result",
            enrolments.clone(),
        );
        registry.register(
            "inbound_refused",
            "Mesh connections or requests to local pods refused, by reason (port: a port the pod does not serve)",
            inbound_refused.clone(),
        );
        registry.register(
            "outbound_refused",
            "Captured connections to route targets refused rather than sent in plaintext, by reason (no_table: the node's config lacks the target's table; unknown_service: the Service is not in the proxy's watch yet; not_captured: the pod's table captured an address that is no longer captured, nor any known Service's)",
            outbound_refused.clone(),
        );
        registry.register(
            "failures",
            "Requests and opaque connections not carried to their backend (outbound) or app (inbound), by direction and reason (no_endpoint, timeout, no_source_identity, no_svid, connect, handshake, peer_identity, request, invalid_request, tunnel)",
            failures.clone(),
        );
        registry.register(
            "connections_over_limit",
            "Connections reset on accept because a listener or the node holds its most, by listener and limit",
            over_limit.clone(),
        );
        registry.register(
            "authz_decisions",
            "Authorization decisions on mesh requests and connections to pods an AuthorizationPolicy selects, by deciding policy, decision and mode (audit: what an audit policy would have refused)",
            authz.clone(),
        );
        registry.register(
            "retries",
            "Backend attempts retried under a route rule's retry, by route and outcome (retried; budget_exhausted: refused by the route's retry budget)",
            retries.clone(),
        );
        registry.register(
            "endpoint_ejections",
            "Endpoints left out of load balancing for a while after failing in a row (passive health)",
            ejections.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                profile: if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                },
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1: the proxy's version and build profile",
            build,
        );
        registry.register(
            "captured_pods",
            "Pods registered with this proxy",
            captured_pods.clone(),
        );
        registry.register(
            "config_generation",
            "The NodeConfig generation this proxy applies",
            config_generation.clone(),
        );
        Metrics {
            registry,
            requests,
            outbound_latency: latency_of(Direction::Outbound),
            inbound_latency: latency_of(Direction::Inbound),
            handshakes,
            svids,
            drift,
            enrolments,
            inbound_refused,
            outbound_refused,
            failures,
            over_limit,
            authz,
            retries,
            ejections,
            captured_pods,
            config_generation,
        }
    }

    pub fn request(&self, labels: RequestLabels, took: Duration) {
        let latency = match labels.direction {
            Direction::Outbound => &self.outbound_latency,
            Direction::Inbound => &self.inbound_latency,
        };
        latency.observe(took.as_secs_f64());
        self.requests.get_or_create(&labels).inc();
    }

    pub fn authz(&self, policy: String, allowed: bool, mode: &'static str) {
        let decision = if allowed { "allow" } else { "deny" };
        self.authz
            .get_or_create(&AuthzLabels {
                policy,
                decision,
                mode,
            })
            .inc();
    }

    pub fn retry(&self, route: String, retried: bool) {
        let outcome = if retried {
            "retried"
        } else {
            "budget_exhausted"
        };
        self.retries
            .get_or_create(&RetryLabels { route, outcome })
            .inc();
    }

    pub fn endpoint_ejected(&self) {
        self.ejections.inc();
    }

    pub fn handshake(&self, side: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.handshakes
            .get_or_create(&HandshakeLabels { side, result })
            .inc();
    }

    pub fn svid_issued(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.svids.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn drift_repaired(&self, what: &'static str) {
        self.drift.get_or_create(&DriftLabels { what }).inc();
    }

    pub fn enrolment(&self, action: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.enrolments
            .get_or_create(&EnrolmentLabels { action, result })
            .inc();
    }

    pub fn inbound_refused(&self, reason: &'static str) {
        self.inbound_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn outbound_refused(&self, reason: &'static str) {
        self.outbound_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn failure(&self, direction: Direction, reason: &'static str) {
        self.failures
            .get_or_create(&FailureLabels { direction, reason })
            .inc();
    }

    pub fn connection_refused(&self, role: Role, limit: Limit) {
        let listener = match role {
            Role::Capture => "capture",
            Role::Inbound => "inbound",
        };
        self.over_limit
            .get_or_create(&LimitLabels {
                listener,
                limit: limit.as_str(),
            })
            .inc();
    }

    pub fn text(&self) -> String {
        aether_admin::encode(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_labels_and_timed_by_direction() {
        let metrics = Metrics::new();
        let outbound = RequestLabels {
            direction: Direction::Outbound,
            target: "shop/echo".into(),
            route: "HTTPRoute/shop/split".into(),
            backend: "shop/echo-v1:8080".into(),
            status: 200,
        };
        metrics.request(outbound.clone(), Duration::from_micros(80));
        metrics.request(outbound, Duration::from_micros(120));
        metrics.request(
            RequestLabels {
                direction: Direction::Inbound,
                target: "".into(),
                route: String::new(),
                backend: "shop/echo-v1-abc".into(),
                status: 503,
            },
            Duration::from_millis(2),
        );
        let text = metrics.text();
        let has = |line: &str| text.lines().any(|l| l == line);
        assert!(
            has(
                r#"aether_proxy_requests_total{direction="outbound",target="shop/echo",route="HTTPRoute/shop/split",backend="shop/echo-v1:8080",status="200"} 2"#
            ),
            "{text}"
        );
        assert!(
            has(
                r#"aether_proxy_requests_total{direction="inbound",target="",route="",backend="shop/echo-v1-abc",status="503"} 1"#
            ),
            "{text}"
        );
        assert!(
            has(r#"aether_proxy_request_duration_seconds_count{direction="outbound"} 2"#),
            "{text}"
        );
        assert!(
            has(r#"aether_proxy_request_duration_seconds_count{direction="inbound"} 1"#),
            "{text}"
        );
        // 2 ms falls in the 3.2 ms bucket, not in the 1.6 ms one.
        assert!(has(
            r#"aether_proxy_request_duration_seconds_bucket{le="0.0016",direction="inbound"} 0"#
        ));
        assert!(has(
            r#"aether_proxy_request_duration_seconds_bucket{le="0.0032",direction="inbound"} 1"#
        ));
    }
}
