//! What the HTTP routing fuzz target checks, as a plain function: `cargo fuzz` (proxy/fuzz,
//! nightly) drives it with coverage guidance, and `tests/fuzz.rs` drives it with seeded
//! mutations (`aether_test_support::fuzz::run`) in every test run. It panics only on a bug.
//!
//! The input is an HTTP/1.1 request head. It goes the way a captured request goes: made into
//! a request head (`http` types, as hyper makes them), viewed by the route engine, routed by a
//! table compiled from routes that use every matcher and filter, and rewritten as the
//! outbound proxy rewrites it before forwarding.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use aether_routing::{
    Outcome, RequestView, RouteSource, Router, ServiceInfo, ServiceKind, ServicePort, compile,
};
use gateway_api::experimental::httproutes::HttpRoute;
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Method, Request, Uri};

use crate::dataplane::http::rewrite_request;

const NAMESPACE: &str = "shop";

/// The routes of the table every input is routed by: producer rules for `shop/echo` and a
/// consumer route of namespace `clients`.
fn routes() -> Vec<serde_json::Value> {
    let parent = serde_json::json!([{"group": "", "kind": "Service", "name": "echo", "namespace": NAMESPACE}]);
    let backend =
        |name: &str| serde_json::json!({"name": name, "namespace": NAMESPACE, "port": 80});
    let producer = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "producer", "namespace": NAMESPACE, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"parentRefs": parent, "rules": [
            {"matches": [{"path": {"type": "Exact", "value": "/exact"}, "method": "GET"}],
             "backendRefs": [backend("v1")]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/prefix/"}}],
             "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}, "hostname": "rewritten.example"}}],
             "backendRefs": [backend("v1"), {"name": "v2", "namespace": NAMESPACE, "port": 80, "weight": 3,
                 "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-backend", "value": "v2"}]}}]}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/full"}}],
             "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/replaced/path"}}}],
             "backendRefs": [backend("v2")]},
            {"matches": [{"path": {"type": "RegularExpression", "value": "/re/[a-z]+/[0-9]*"}}],
             "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                 "add": [{"name": "x-added", "value": "1"}], "remove": ["x-remove"]}},
                 {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "x-response", "value": "1"}]}}],
             "backendRefs": [backend("v1")]},
            {"matches": [{"headers": [{"name": "x-version", "value": "two"}, {"type": "RegularExpression", "name": "x-pattern", "value": "a.*z"}],
                          "queryParams": [{"name": "q", "value": "v 2"}]}],
             "backendRefs": [backend("v2")]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/redirect"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "hostname": "elsewhere.example", "port": 8443,
                 "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/moved"}, "statusCode": 301}}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/mirror"}}],
             "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": backend("mirror")}}],
             "backendRefs": [backend("v1"), {"name": "missing", "namespace": NAMESPACE, "port": 80}]},
            {"backendRefs": [backend("v1")], "timeouts": {"request": "2s", "backendRequest": "1s"}},
        ]},
    });
    let consumer = serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "consumer", "namespace": "clients", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"parentRefs": parent, "rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/consumer"}}}]},
        ]},
    });
    vec![producer, consumer]
}

fn router() -> &'static Router {
    static ROUTER: OnceLock<Router> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let services: BTreeMap<(String, String), ServiceInfo> = ["echo", "v1", "v2", "mirror"]
            .into_iter()
            .map(|name| {
                let info = ServiceInfo {
                    namespace: NAMESPACE.into(),
                    name: name.into(),
                    kind: ServiceKind::ClusterIp,
                    ports: vec![ServicePort {
                        name: Some("http".into()),
                        port: 80,
                        app_protocol: None,
                    }],
                };
                ((NAMESPACE.to_owned(), name.to_owned()), info)
            })
            .collect();
        let sources: Vec<RouteSource> = routes()
            .into_iter()
            .map(|value| {
                let route: HttpRoute =
                    serde_json::from_value(value).expect("the fuzz routes are valid HTTPRoutes");
                RouteSource::from_http_route(&route)
            })
            .collect();
        let compiled = compile(NAMESPACE, "echo", &sources, &services);
        Router::new(&compiled.table).expect("the fuzz routes compile into a table")
    })
}

/// A request head from `METHOD TARGET [VERSION]` and `name: value` lines. Lines that are
/// not a valid header are skipped rather than failing the input, so mutations keep reaching
/// the router; what it gets is always a head hyper could have produced.
fn parse_head(data: &[u8]) -> Option<Parts> {
    let mut lines = data
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let mut request_line = lines.next()?.split(|b| *b == b' ');
    let method = Method::from_bytes(request_line.next()?).ok()?;
    let uri = Uri::try_from(request_line.next()?).ok()?;
    let mut builder = Request::builder().method(method).uri(uri);
    for line in lines.take_while(|l| !l.is_empty()) {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            builder = builder.header(name, value);
        }
    }
    Some(builder.body(()).ok()?.into_parts().0)
}

/// Routes one request head from a producer-side client and a consumer-side client, and
/// checks what the outbound proxy relies on: a rewritten path is a valid `path?query`, a
/// redirect has a 3xx status and a non-empty Location.
pub fn http_routing(data: &[u8]) {
    let Some(parts) = parse_head(data) else {
        return;
    };
    let router = router();
    let view = RequestView::from_parts(&parts);
    let random = data
        .iter()
        .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(*b));
    for client_namespace in [NAMESPACE, "clients"] {
        match router.route(80, client_namespace, &view, random) {
            Outcome::Forward(forward) => {
                if let Some(pq) = &forward.path_and_query {
                    assert!(
                        pq.parse::<PathAndQuery>().is_ok(),
                        "rewritten path {pq:?} of {:?} is not a valid path",
                        parts.uri
                    );
                }
                let mut rewritten = parts.clone();
                rewrite_request(&mut rewritten, &forward);
                let mut response = http::HeaderMap::new();
                forward.edit_response_headers(&mut response);
                let _ = forward.timeouts();
            }
            Outcome::Redirect {
                status, location, ..
            } => {
                assert!((300..400).contains(&status), "redirect status {status}");
                assert!(!location.is_empty(), "empty redirect location");
            }
            Outcome::NoRoutes | Outcome::NotFound | Outcome::NoBackend { .. } => {}
        }
    }
}
