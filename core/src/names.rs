//! Labels, annotations, taints and names that more than one aether component reads or writes.

/// Namespace label that opts every pod of the namespace into the mesh (value `"true"`).
pub const MANAGED_LABEL: &str = "aether.io/managed";

/// Namespace label whose value [`MTLS_STRICT`] puts the namespace's meshed pods in strict mTLS
/// mode: plaintext TCP from other hosts into them is refused (the node itself, for kubelet
/// probes, is let through).
pub const MTLS_LABEL: &str = "aether.io/mtls";
pub const MTLS_STRICT: &str = "strict";

/// Pod annotation that keeps a single pod of a managed namespace out of the mesh (value
/// [`CAPTURE_DISABLED`]).
pub const CAPTURE_ANNOTATION: &str = "aether.io/capture";
pub const CAPTURE_DISABLED: &str = "disabled";

/// Pod annotation listing extra route targets (`namespace/service` or `service`, comma
/// separated) the pod dials, so that their tables are on its node before the first request.
pub const DEPENDS_ON_ANNOTATION: &str = "aether.io/depends-on";

/// Label the operator puts on the RouteTargets it derives from Gateway API routes
/// (value `"true"`); hand-written RouteTargets do not carry it.
pub const DERIVED_LABEL: &str = "aether.io/derived";

/// `controllerName` the operator writes into Gateway API route status.
pub const CONTROLLER_NAME: &str = "aether.io/mesh";

/// Node taint that keeps pods off a node until its aether agent is ready.
pub const AGENT_NOT_READY_TAINT: &str = "aether.io/agent-not-ready";

/// Namespace label whose value [`AUTHORIZATION_DENY`] makes the namespace's meshed pods refuse
/// every caller that no ALLOW AuthorizationPolicy admits (kubelet probes still pass).
pub const AUTHORIZATION_LABEL: &str = "aether.io/authorization";
pub const AUTHORIZATION_DENY: &str = "deny";
