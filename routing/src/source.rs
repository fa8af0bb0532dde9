//! The compiler's input, in aether's own types: a route (HTTPRoute, GRPCRoute or a
//! RouteTarget's inline rules) reduced to what routing needs, and the Services the compiler
//! resolves references against. `gateway` reads them from the Kubernetes objects.

use std::collections::BTreeMap;

use aether_crds::http::{HttpBackendRef, HttpRouteFilter, HttpRouteRule};

use crate::table::RouteRef;

/// One route, as the compiler sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSource {
    pub route: RouteRef,
    /// Creation time in seconds since the epoch; older routes win precedence ties.
    pub created: Option<i64>,
    pub parents: Vec<ParentRef>,
    pub rules: RouteRules,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RouteRules {
    Http(Vec<HttpRouteRule>),
    Grpc(Vec<GrpcRule>),
    /// The route uses something aether does not implement (a `CORS` filter, say); it is
    /// refused as a whole with this explanation.
    Unsupported(String),
}

/// A GRPCRoute rule. Its filters and backendRefs have the shape of the HTTPRoute ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GrpcRule {
    pub name: Option<String>,
    pub matches: Vec<GrpcMatch>,
    pub filters: Vec<HttpRouteFilter>,
    pub backend_refs: Vec<HttpBackendRef>,
}

/// A GRPCRoute match: a gRPC service and method (empty ones are none), exact or regular
/// expressions, and headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcMatch {
    pub service: Option<String>,
    pub method: Option<String>,
    pub regex: bool,
    pub headers: Vec<GrpcHeaderMatch>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcHeaderMatch {
    pub name: String,
    pub value: String,
    pub regex: bool,
}

/// A Gateway API `parentRef`. Only core `Service` parents concern the mesh.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParentRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub port: Option<i32>,
    pub section_name: Option<String>,
}

impl ParentRef {
    /// The Service this parentRef names, `(namespace, name)`, if it names one;
    /// `route_namespace` is the default namespace. The Gateway API defaults are group
    /// `gateway.networking.k8s.io` and kind `Gateway`, so a Service parent must say
    /// `group: ""` and `kind: Service`.
    pub fn service<'a>(&'a self, route_namespace: &'a str) -> Option<(&'a str, &'a str)> {
        let core = matches!(self.group.as_deref(), Some("") | Some("core"));
        (core && self.kind.as_deref() == Some("Service")).then(|| {
            (
                self.namespace.as_deref().unwrap_or(route_namespace),
                self.name.as_str(),
            )
        })
    }

    /// Whether this parentRef names the Service `namespace/name`.
    pub fn is_service(&self, route_namespace: &str, namespace: &str, name: &str) -> bool {
        self.service(route_namespace) == Some((namespace, name))
    }
}

/// What the compiler needs to know about a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub kind: ServiceKind,
    pub ports: Vec<ServicePort>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServiceKind {
    /// Has a ClusterIP that can be captured.
    #[default]
    ClusterIp,
    Headless,
    ExternalName,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    pub port: u16,
    pub app_protocol: Option<String>,
}

/// Looks Services up by namespace and name.
pub trait ServiceLookup {
    fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo>;
}

impl ServiceLookup for BTreeMap<(String, String), ServiceInfo> {
    fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo> {
        self.get(&(namespace.to_owned(), name.to_owned()))
    }
}

impl ServiceLookup for [ServiceInfo] {
    fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo> {
        self.iter()
            .find(|s| s.namespace == namespace && s.name == name)
    }
}
