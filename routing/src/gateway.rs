//! The one adapter from Kubernetes objects (HTTPRoute, GRPCRoute, RouteTarget) to the
//! engine's [`RouteSource`]: everything of `gateway_api` the engine needs is read here.

use aether_crds::RouteTarget;
use aether_crds::http::HttpRouteRule;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::grpcroutes::{
    GrpcRoute, GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType,
    GrpcRouteRulesMatchesMethodType,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::source::{GrpcHeaderMatch, GrpcMatch, GrpcRule, ParentRef, RouteRules, RouteSource};
use crate::table::{RouteKind, RouteRef};

/// The parentRefs of an HTTPRoute or a GRPCRoute: two generated types of one shape.
macro_rules! parent_refs {
    ($route:expr) => {
        ($route.spec.parent_refs.iter().flatten())
            .map(|p| ParentRef {
                group: p.group.clone(),
                kind: p.kind.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                port: p.port,
                section_name: p.section_name.clone(),
            })
            .collect()
    };
}

impl RouteSource {
    pub fn from_http_route(route: &HttpRoute) -> Self {
        let parents = parent_refs!(route);
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
        let parents = parent_refs!(route);
        let rules = route
            .spec
            .rules
            .iter()
            .flatten()
            .map(|rule| {
                Ok(GrpcRule {
                    name: rule.name.clone(),
                    matches: (rule.matches.iter().flatten())
                        .map(GrpcMatch::from_gateway)
                        .collect(),
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

impl GrpcMatch {
    fn from_gateway(m: &GrpcRouteRulesMatches) -> Self {
        let method = m.method.as_ref();
        let non_empty = |s: Option<&String>| s.filter(|s| !s.is_empty()).cloned();
        GrpcMatch {
            service: non_empty(method.and_then(|x| x.service.as_ref())),
            method: non_empty(method.and_then(|x| x.method.as_ref())),
            regex: matches!(
                method.and_then(|x| x.r#type.as_ref()),
                Some(GrpcRouteRulesMatchesMethodType::RegularExpression)
            ),
            headers: (m.headers.iter().flatten())
                .map(|h| GrpcHeaderMatch {
                    name: h.name.clone(),
                    value: h.value.clone(),
                    regex: matches!(
                        h.r#type,
                        Some(GrpcRouteRulesMatchesHeadersType::RegularExpression)
                    ),
                })
                .collect(),
        }
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
