//! `NodeConfig`: what one node's proxy needs, written by the operator and read by that
//! node's proxy. One object per node, named after it; nothing secret is in it, and
//! endpoints stay in EndpointSlices.

use aether_core::authz::NodeAuthorization;
use aether_core::lenient::Lenient;
use aether_core::route_table::RouteTable;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The per-node configuration of the mesh.
// kube's `printcolumn(...)` arguments repeat `type_ = ...`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "aether.io",
    version = "v1alpha1",
    kind = "NodeConfig",
    doc = "The route targets, route tables and backend identities one node's aether proxy needs.",
    plural = "nodeconfigs",
    shortname = "nc",
    status = "NodeConfigStatus",
    printcolumn(name = "Capture", type_ = "integer", json_path = ".spec.captureCount"),
    printcolumn(name = "Tables", type_ = "integer", json_path = ".spec.tableCount"),
    printcolumn(
        name = "Applied",
        type_ = "integer",
        json_path = ".status.appliedGeneration"
    ),
    printcolumn(
        name = "Captured",
        type_ = "integer",
        json_path = ".status.capturedPodCount"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigSpec {
    /// What every meshed pod captures: the `ClusterIP:port` of every route target with a
    /// producer route and of every Service with a meshed endpoint (`10.96.0.10:80`,
    /// `[fd00::10]:80`), and the `podIP:port` of the meshed endpoints of headless Services.
    /// A meshed pod never reaches them unmeshed, whatever it dials. Plain strings, because
    /// every node holds all of them; the proxy knows which Service each is from its watch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capture_addresses: Vec<String>,
    /// Addresses captured for the pods of one namespace only: the route targets whose only
    /// routes are consumer routes of that namespace (GEP-1294), with no meshed endpoint. A
    /// route in one namespace never changes how the pods of another reach a Service. Only
    /// the namespaces with meshed pods on the node are listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_capture: Vec<NamespaceCapture>,
    /// How many addresses `captureAddresses` and `namespaceCapture` hold together.
    #[serde(default)]
    pub capture_count: i32,

    /// Compiled route tables of the route targets this node's meshed pods may dial
    /// (their namespaces, their `aether.io/depends-on` targets, and those targets' backends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TargetTable>,
    #[serde(default)]
    pub table_count: i32,

    /// The SPIFFE identities each backend Service may present, and which of its endpoints
    /// take mTLS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<ServiceIdentities>,

    /// The AuthorizationPolicies of the namespaces with meshed pods on the node, compiled, and
    /// which of those namespaces deny by default.
    #[serde(default, skip_serializing_if = "NodeAuthorization::is_empty")]
    #[schemars(schema_with = "opaque_object")]
    pub authorization: NodeAuthorization,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceCapture {
    pub namespace: String,
    /// `ClusterIP:port`, as in `captureAddresses`.
    pub addresses: Vec<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TargetTable {
    pub namespace: String,
    pub service: String,
    /// The route table, as the route engine compiled it. A table of another shape (a newer
    /// operator's) fails this target alone.
    #[schemars(schema_with = "opaque_object")]
    pub table: Lenient<RouteTable>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceIdentities {
    pub namespace: String,
    pub service: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<String>,
    /// The pod addresses of the Service's endpoints that have aether's inbound listener (their
    /// node's proxy captures them): these get mTLS, every other endpoint a plain connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub meshed_addresses: Vec<String>,
}

/// Reported by the node's proxy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigStatus {
    /// The `metadata.generation` the proxy has applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Route targets (`namespace/service`) this node's pods dialled whose tables the config
    /// did not hold: the operator adds them to the node's scope.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub demand: Vec<String>,
    /// The pods (`namespace/name`) this node's proxy captures now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured_pods: Vec<String>,
    /// How many pods this node's proxy captures now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured_pod_count: Option<i32>,
}

/// An object whose fields the API server keeps as they are: the route engine's own
/// format, validated by the operator that writes it.
fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
