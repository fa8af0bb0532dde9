//! Condition types and reasons used in RouteTarget, AuthorizationPolicy and Gateway API route
//! status.
//! Where Gateway API defines a reason, the same string is used.

pub const ACCEPTED: &str = "Accepted";
pub const RESOLVED_REFS: &str = "ResolvedRefs";
pub const PROGRAMMED: &str = "Programmed";

pub mod reason {
    // Accepted
    pub const ACCEPTED: &str = "Accepted";
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    pub const INCOMPATIBLE_FILTERS: &str = "IncompatibleFilters";
    /// An HTTPRoute and a GRPCRoute attach to the same Service port for the same clients;
    /// Gateway API forbids merging them, so the younger kind is refused.
    pub const CONFLICTING_ROUTE_KIND: &str = "ConflictingRouteKind";
    pub const SERVICE_NOT_FOUND: &str = "ServiceNotFound";
    /// Headless and ExternalName Services have no ClusterIP to capture.
    pub const UNSUPPORTED_SERVICE_TYPE: &str = "UnsupportedServiceType";
    /// Another hand-written RouteTarget for the same Service is in force (the oldest).
    pub const CONFLICTED: &str = "Conflicted";
    /// Every port the parentRef names is declared non-HTTP: its bytes are never parsed, so
    /// no HTTP or gRPC route applies to it.
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    /// A policy with a field that cannot be honoured (the Gateway API's policy reason).
    pub const INVALID: &str = "Invalid";

    // ResolvedRefs
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    pub const INVALID_KIND: &str = "InvalidKind";
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// Every backend exists, but one has no ready endpoint: its share of requests fails.
    pub const NO_READY_ENDPOINTS: &str = "NoReadyEndpoints";

    // Programmed
    pub const PROGRAMMED: &str = "Programmed";
    pub const PENDING: &str = "Pending";
}
