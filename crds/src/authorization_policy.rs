//! `AuthorizationPolicy`: who may call a workload, in the shape of the Gateway API's mesh
//! authorization proposal (GEP-3779). The operator checks each field, compiles the policy into
//! the NodeConfigs of the nodes with meshed pods of its namespace, and reports `Accepted` and
//! `Programmed` on it; the backend's node proxy decides from the caller's verified certificate.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::http::HttpRouteMatch;

/// Which callers may reach the selected workloads, and how.
// kube's `printcolumn(...)` arguments repeat `type_ = ...`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "aether.io",
    version = "v1alpha1",
    kind = "AuthorizationPolicy",
    doc = "Who may call the selected workloads: ALLOW makes them admit only what a rule matches, DENY refuses what a rule matches.",
    plural = "authorizationpolicies",
    shortname = "authz",
    namespaced,
    status = "AuthorizationPolicyStatus",
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "Targets",
        type_ = "string",
        json_path = ".status.targetSummary"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    /// The Services (group `""`, kind `Service`, in this namespace) whose pods the policy
    /// applies to: the pods each one's selector selects. With `selector`, the pods of either.
    /// With neither, every pod of the namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub target_refs: Vec<PolicyTargetRef>,
    /// Pods of this namespace by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    /// `ALLOW`: the workloads admit only what some ALLOW rule matches (default deny). `DENY`:
    /// they refuse what a rule matches, whatever any ALLOW says.
    pub action: String,
    /// `Enforce` (default) or `Audit`: an audit policy refuses nothing; what it would have
    /// refused is counted (`mode="audit"`) and logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// A caller matches the policy when it matches one rule. An ALLOW policy without rules
    /// admits nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub rules: Vec<AuthorizationRule>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetRef {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// A caller matches a rule when it is one of `sources`, calls one of `ports`, and (with `http`
/// or `routeRule`) sends a request one of the matches admits.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationRule {
    #[schemars(length(max = 64))]
    pub sources: Vec<AuthorizationSource>,
    /// The pods' ports (the container port, not the Service port); none is every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ports: Vec<i32>,
    /// HTTP request matches, as in HTTPRoute rules; a non-HTTP connection matches none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub http: Vec<HttpRouteMatch>,
    /// The matches of a named rule of an HTTPRoute of this namespace, instead of `http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_rule: Option<RouteRuleRef>,
}

/// Exactly one field set.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationSource {
    /// `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Every ServiceAccount of the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A SPIFFE ID, `spiffe://<trust-domain>/ns/<namespace>/sa/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spiffe_id: Option<String>,
    /// `true`: callers without a mesh identity (unmeshed pods, host processes). Their
    /// connections do not pass through aether, so such a rule can have no ports or HTTP part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unauthenticated: Option<bool>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteRuleRef {
    /// The HTTPRoute, in this namespace.
    pub route: String,
    /// The name of one of its rules (`rules[].name`).
    pub rule: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The targets as one string, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_summary: Option<String>,
    /// The nodes whose proxies enforce the policy (those running pods it selects).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// `Accepted` (every field valid, every target found) and `Programmed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
