//! The compiler's input: a route (HTTPRoute, GRPCRoute or a RouteTarget's inline rules)
//! reduced to what routing needs, and the Services the compiler resolves references against.

use std::collections::BTreeMap;

use aether_crds::RouteTarget;
use aether_crds::http::{HttpBackendRef, HttpRouteFilter, HttpRouteRule};
use gateway_api::grpcroutes::{GrpcRoute, GrpcRouteRulesMatches};
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::table::{RouteKind, RouteRef};

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
    pub matches: Vec<GrpcRouteRulesMatches>,
    pub filters: Vec<HttpRouteFilter>,
    pub backend_refs: Vec<HttpBackendRef>,
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

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

fn route_ref(kind: RouteKind, meta: &ObjectMeta) -> RouteRef {
    RouteRef {
        kind,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Reads one generated Gateway API type as another type of the same JSON shape. The
/// `gateway-api` crate and `aether_crds::http` are both generated from or written to the
/// HTTPRoute schema, so the JSON round trip is exact for every field aether supports and
/// fails, with serde's explanation, on the ones it does not (a `CORS` filter).
fn reshape<T: serde::de::DeserializeOwned>(value: &impl serde::Serialize) -> Result<T, String> {
    serde_json::to_value(value)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())
}

impl RouteSource {
    pub fn from_http_route(route: &HttpRoute) -> Self {
        let parents = route
            .spec
            .parent_refs
            .iter()
            .flatten()
            .map(|p| ParentRef {
                group: p.group.clone(),
                kind: p.kind.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                port: p.port,
                section_name: p.section_name.clone(),
            })
            .collect();
        let rules =
            match reshape::<Vec<HttpRouteRule>>(&route.spec.rules.clone().unwrap_or_default()) {
                Ok(rules) => RouteRules::Http(rules),
                Err(e) => RouteRules::Unsupported(format!(
                    "rules use a feature aether does not support: {e}"
                )),
            };
        RouteSource {
            route: route_ref(RouteKind::HTTPRoute, &route.metadata),
            created: created(&route.metadata),
            parents,
            rules,
        }
    }

    pub fn from_grpc_route(route: &GrpcRoute) -> Self {
        let parents = route
            .spec
            .parent_refs
            .iter()
            .flatten()
            .map(|p| ParentRef {
                group: p.group.clone(),
                kind: p.kind.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                port: p.port,
                section_name: p.section_name.clone(),
            })
            .collect();
        let rules = route
            .spec
            .rules
            .iter()
            .flatten()
            .map(|rule| {
                Ok(GrpcRule {
                    name: rule.name.clone(),
                    matches: rule.matches.clone().unwrap_or_default(),
                    filters: reshape(&rule.filters.clone().unwrap_or_default())?,
                    backend_refs: reshape(&rule.backend_refs.clone().unwrap_or_default())?,
                })
            })
            .collect::<Result<Vec<_>, String>>();
        let rules = match rules {
            Ok(rules) => RouteRules::Grpc(rules),
            Err(e) => {
                RouteRules::Unsupported(format!("rules use a feature aether does not support: {e}"))
            }
        };
        RouteSource {
            route: route_ref(RouteKind::GRPCRoute, &route.metadata),
            created: created(&route.metadata),
            parents,
            rules,
        }
    }

    /// The inline rules of a hand-written RouteTarget: a producer route on every port of
    /// its Service.
    pub fn from_route_target(target: &RouteTarget) -> Self {
        let route = route_ref(RouteKind::RouteTarget, &target.metadata);
        RouteSource {
            parents: vec![ParentRef {
                group: Some(String::new()),
                kind: Some("Service".into()),
                namespace: Some(route.namespace.clone()),
                name: target.spec.service.clone(),
                port: None,
                section_name: None,
            }],
            created: created(&target.metadata),
            rules: RouteRules::Http(target.spec.rules.clone()),
            route,
        }
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
