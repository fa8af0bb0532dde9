//! `RouteTarget`: a Service that clients dial and whose traffic aether routes.
//!
//! A route target is keyed by Service (`<namespace>/<service>`); it has no pods and no
//! identity of its own. The operator derives one for every Service named as a GAMMA
//! `parentRef`, or honours a hand-written one with inline rules.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::http::HttpRouteRule;

/// The desired routing of one Service.
// kube's `printcolumn(...)` arguments repeat `type_ = ...`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "aether.io",
    version = "v1alpha1",
    kind = "RouteTarget",
    doc = "A Service whose ClusterIP:ports aether captures and routes by its effective route table.",
    plural = "routetargets",
    shortname = "rt",
    namespaced,
    status = "RouteTargetStatus",
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.service"),
    printcolumn(name = "Cluster-IP", type_ = "string", json_path = ".status.clusterIP"),
    printcolumn(name = "Ports", type_ = "string", json_path = ".status.portSummary"),
    printcolumn(name = "Routes", type_ = "integer", json_path = ".status.routeCount"),
    printcolumn(
        name = "Backends",
        type_ = "integer",
        json_path = ".status.backendCount"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RouteTargetSpec {
    /// Name of the Service, in this RouteTarget's namespace, whose ClusterIP:ports are routed.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("service is immutable; create another RouteTarget instead"))]
    pub service: String,

    /// Inline rules in the shape of HTTPRoute rules. They apply to every client and every
    /// port of the Service, and are merged with the rules of attached routes by the
    /// Gateway API precedence rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub rules: Vec<HttpRouteRule>,
}

/// What the operator observed and resolved for this route target.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteTargetStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The Service's primary ClusterIP.
    #[serde(default, rename = "clusterIP", skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,

    /// All ClusterIPs of the Service (one per IP family).
    #[serde(default, rename = "clusterIPs", skip_serializing_if = "Vec::is_empty")]
    pub cluster_ips: Vec<String>,

    /// The Service ports that are captured and routed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<TargetPort>,

    /// The ports as one comma-separated string, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_summary: Option<String>,

    /// Routes attached to this Service (accepted or not; see each route's own status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<AttachedRoute>,

    /// Number of accepted attached routes.
    #[serde(default)]
    pub route_count: i32,

    /// Backend Services the effective route table sends traffic to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<ResolvedBackend>,

    /// Number of backends.
    #[serde(default)]
    pub backend_count: i32,

    /// `Accepted`, `ResolvedRefs` and `Programmed`, with Gateway API style reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TargetPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AttachedRoute {
    /// `gateway.networking.k8s.io`, or `aether.io` for this RouteTarget's inline rules.
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Whether the route is accepted for this Service.
    pub accepted: bool,
    /// Set for a consumer route: it applies only to clients in its own namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consumer: bool,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedBackend {
    pub namespace: String,
    pub service: String,
    pub port: i32,
    /// Sum of the weights this backend has in the rules that name it.
    pub weight: i64,
    /// Ready endpoints behind the Service port.
    pub ready_endpoints: i32,
    /// SPIFFE identities of the pods serving it; the only identities the proxy accepts
    /// from this backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<String>,
}
