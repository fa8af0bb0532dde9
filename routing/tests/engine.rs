//! Matchers, precedence, filters, weights and errors of the route engine, one behaviour per test.

use aether_routing::table::RouteKind;
use aether_routing::{
    Outcome, RequestView, RouteSource, RouteTable, Router, ServiceInfo, ServiceKind, ServicePort,
    compile,
};
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::grpcroutes::GrpcRoute;

const NS: &str = "mesh";

fn service(namespace: &str, name: &str, kind: ServiceKind) -> ServiceInfo {
    let port = |name: &str, port| ServicePort {
        name: Some(name.into()),
        port,
        app_protocol: None,
    };
    ServiceInfo {
        namespace: namespace.into(),
        name: name.into(),
        kind,
        ports: vec![port("http", 80), port("http-alt", 8080), port("grpc", 7070)],
    }
}

fn services() -> Vec<ServiceInfo> {
    let mut all: Vec<ServiceInfo> = ["echo", "v1", "v2", "v3", "mirror"]
        .iter()
        .map(|n| service(NS, n, ServiceKind::ClusterIp))
        .collect();
    all.push(service(NS, "headless", ServiceKind::Headless));
    all.push(service(NS, "external", ServiceKind::ExternalName));
    all.push(service("other", "v1", ServiceKind::ClusterIp));
    all
}

/// An HTTPRoute in `namespace`, created at `created` (seconds), with the given parentRefs
/// and rules (YAML lists, indented for `spec:`).
fn http_route_full(
    namespace: &str,
    name: &str,
    created: &str,
    parents: &str,
    rules: &str,
) -> RouteSource {
    let yaml = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  creationTimestamp: \"{created}\"\nspec:\n  parentRefs:\n{parents}\n  rules:\n{rules}\n"
    );
    let route: HttpRoute = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    RouteSource::from_http_route(&route)
}

const ECHO_PARENT: &str = "  - {group: \"\", kind: Service, name: echo}";

fn http_route(name: &str, rules: &str) -> RouteSource {
    http_route_full(NS, name, "2026-01-01T00:00:00Z", ECHO_PARENT, rules)
}

fn grpc_route(name: &str, created: &str, rules: &str) -> RouteSource {
    let yaml = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata:\n  name: {name}\n  namespace: {NS}\n  creationTimestamp: \"{created}\"\nspec:\n  parentRefs:\n  - {{group: \"\", kind: Service, name: echo, port: 7070}}\n  rules:\n{rules}\n"
    );
    let route: GrpcRoute = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    RouteSource::from_grpc_route(&route)
}

fn router(routes: &[RouteSource]) -> Router {
    let compiled = compile(NS, "echo", routes, services().as_slice());
    for outcome in &compiled.routes {
        for parent in &outcome.parents {
            assert!(
                parent.accepted.ok,
                "{} not accepted: {:?}",
                outcome.route, parent.accepted
            );
        }
    }
    Router::new(&compiled.table).expect("table loads")
}

/// Sends a request and describes the outcome: the backend Service name, `404`, `500`,
/// `pass` (no routes), or `302 <Location>`.
fn send_from(
    router: &Router,
    client: &str,
    port: u16,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
) -> String {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "echo");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let (parts, ()) = builder.body(()).unwrap().into_parts();
    match router.route(port, client, &RequestView::from_parts(&parts), 7) {
        Outcome::NoRoutes => "pass".into(),
        Outcome::NotFound => "404".into(),
        Outcome::NoBackend { .. } => "500".into(),
        Outcome::Redirect {
            status, location, ..
        } => format!("{status} {location}"),
        Outcome::Forward(f) => f.backend.name.clone(),
    }
}

fn send(router: &Router, uri: &str, headers: &[(&str, &str)]) -> String {
    send_from(router, NS, 80, "GET", uri, headers)
}

fn rule(matches: &str, backend: &str) -> String {
    format!("  - matches: {matches}\n    backendRefs: [{{name: {backend}, port: 80}}]")
}

#[test]
fn exact_path_matches_only_that_path() {
    let r = router(&[http_route(
        "r",
        &rule("[{path: {type: Exact, value: /foo}}]", "v1"),
    )]);
    assert_eq!(send(&r, "/foo", &[]), "v1");
    assert_eq!(send(&r, "/foo?x=1", &[]), "v1");
    for miss in ["/foo/", "/foo/bar", "/fo", "/foobar"] {
        assert_eq!(send(&r, miss, &[]), "404", "{miss}");
    }
}

#[test]
fn path_prefix_matches_whole_segments() {
    let r = router(&[http_route(
        "r",
        &rule("[{path: {type: PathPrefix, value: /foo}}]", "v1"),
    )]);
    for hit in ["/foo", "/foo/", "/foo/bar", "/foo/bar/baz"] {
        assert_eq!(send(&r, hit, &[]), "v1", "{hit}");
    }
    for miss in ["/foobar", "/fo", "/", "/bar/foo"] {
        assert_eq!(send(&r, miss, &[]), "404", "{miss}");
    }
    let r = router(&[http_route(
        "r",
        &rule("[{path: {type: PathPrefix, value: /foo/}}]", "v1"),
    )]);
    assert_eq!(
        send(&r, "/foo", &[]),
        "v1",
        "a trailing slash in the prefix is ignored"
    );
    assert_eq!(send(&r, "/foo/bar", &[]), "v1");
}

#[test]
fn regular_expression_path_must_match_the_whole_path() {
    let r = router(&[http_route(
        "r",
        &rule(
            "[{path: {type: RegularExpression, value: \"/v[0-9]+/items\"}}]",
            "v1",
        ),
    )]);
    assert_eq!(send(&r, "/v12/items", &[]), "v1");
    assert_eq!(send(&r, "/v12/items/1", &[]), "404");
    assert_eq!(send(&r, "/x/v12/items", &[]), "404");
}

#[test]
fn header_names_are_case_insensitive_and_values_exact() {
    let r = router(&[http_route(
        "r",
        &rule("[{headers: [{name: X-Version, value: One}]}]", "v1"),
    )]);
    assert_eq!(send(&r, "/", &[("x-version", "One")]), "v1");
    assert_eq!(send(&r, "/", &[("X-VERSION", "One")]), "v1");
    assert_eq!(send(&r, "/", &[("x-version", "one")]), "404");
    assert_eq!(send(&r, "/", &[]), "404");
    assert_eq!(
        send(&r, "/", &[("x-version", "On"), ("x-version", "e")]),
        "404",
        "repeated header lines join with ','"
    );
    let r = router(&[http_route(
        "r",
        &rule("[{headers: [{name: x-list, value: \"a,b\"}]}]", "v1"),
    )]);
    assert_eq!(send(&r, "/", &[("x-list", "a"), ("x-list", "b")]), "v1");
}

#[test]
fn header_regular_expression_matches_the_whole_value() {
    let r = router(&[http_route(
        "r",
        &rule(
            "[{headers: [{type: RegularExpression, name: x-user, value: \"user-[0-9]+\"}]}]",
            "v1",
        ),
    )]);
    assert_eq!(send(&r, "/", &[("x-user", "user-42")]), "v1");
    assert_eq!(send(&r, "/", &[("x-user", "user-42x")]), "404");
}

#[test]
fn query_parameters_match_by_exact_name_and_first_value() {
    let r = router(&[http_route(
        "r",
        &rule("[{queryParams: [{name: animal, value: whale}]}]", "v1"),
    )]);
    assert_eq!(send(&r, "/?animal=whale", &[]), "v1");
    assert_eq!(send(&r, "/?x=1&animal=whale", &[]), "v1");
    assert_eq!(
        send(&r, "/?animal=wh%61le", &[]),
        "v1",
        "values are percent-decoded"
    );
    assert_eq!(
        send(&r, "/?animal=dolphin&animal=whale", &[]),
        "404",
        "the first value counts"
    );
    assert_eq!(
        send(&r, "/?Animal=whale", &[]),
        "404",
        "names are case-sensitive"
    );
    assert_eq!(send(&r, "/?animal=whaledolphin", &[]), "404");
    let r = router(&[http_route(
        "r",
        &rule(
            "[{queryParams: [{type: RegularExpression, name: id, value: \"[0-9]{3}\"}]}]",
            "v1",
        ),
    )]);
    assert_eq!(send(&r, "/?id=123", &[]), "v1");
    assert_eq!(send(&r, "/?id=1234", &[]), "404");
}

#[test]
fn method_match() {
    let r = router(&[http_route("r", &rule("[{method: POST}]", "v1"))]);
    assert_eq!(send_from(&r, NS, 80, "POST", "/", &[]), "v1");
    assert_eq!(send_from(&r, NS, 80, "GET", "/", &[]), "404");
}

#[test]
fn matches_of_a_rule_are_ored_and_conditions_anded() {
    let r = router(&[http_route(
        "r",
        &rule(
            "[{path: {type: PathPrefix, value: /a}, headers: [{name: x, value: \"1\"}]}, {path: {type: Exact, value: /b}}]",
            "v1",
        ),
    )]);
    assert_eq!(send(&r, "/a", &[("x", "1")]), "v1");
    assert_eq!(send(&r, "/a", &[]), "404");
    assert_eq!(send(&r, "/b", &[]), "v1");
}

#[test]
fn precedence_exact_then_regex_then_longest_prefix() {
    let rules = [
        rule("[{path: {type: PathPrefix, value: /}}]", "v1"),
        rule("[{path: {type: PathPrefix, value: /api}}]", "v2"),
        rule("[{path: {type: PathPrefix, value: /api/v1}}]", "v3"),
        rule(
            "[{path: {type: RegularExpression, value: \"/api/.*/special\"}}]",
            "mirror",
        ),
        rule("[{path: {type: Exact, value: /api/v1/special}}]", "echo"),
    ]
    .join("\n");
    let r = router(&[http_route("r", &rules)]);
    assert_eq!(send(&r, "/other", &[]), "v1");
    assert_eq!(send(&r, "/api/x", &[]), "v2");
    assert_eq!(send(&r, "/api/v1/x", &[]), "v3");
    assert_eq!(
        send(&r, "/api/v1/special", &[]),
        "echo",
        "exact beats everything"
    );
    assert_eq!(
        send(&r, "/api/v2/special", &[]),
        "mirror",
        "regex beats prefixes"
    );
}

#[test]
fn precedence_method_then_header_count_then_query_count() {
    let rules = [
        rule("[{path: {type: PathPrefix, value: /p}, queryParams: [{name: a, value: \"1\"}, {name: b, value: \"2\"}]}]", "v1"),
        rule("[{path: {type: PathPrefix, value: /p}, headers: [{name: h, value: \"1\"}]}]", "v2"),
        rule("[{path: {type: PathPrefix, value: /p}, method: GET}]", "v3"),
    ]
    .join("\n");
    let r = router(&[http_route("r", &rules)]);
    assert_eq!(
        send(&r, "/p?a=1&b=2", &[("h", "1")]),
        "v3",
        "a method match outranks header and query matches"
    );
    assert_eq!(
        send_from(&r, NS, 80, "PUT", "/p?a=1&b=2", &[("h", "1")]),
        "v2",
        "one header outranks two query params"
    );
    assert_eq!(send_from(&r, NS, 80, "PUT", "/p?a=1&b=2", &[]), "v1");
}

#[test]
fn ties_go_to_the_oldest_route_then_by_name_then_rule_order() {
    let catch_all = |backend: &str| rule("[{path: {type: PathPrefix, value: /}}]", backend);
    let old = http_route_full(
        NS,
        "zzz",
        "2025-01-01T00:00:00Z",
        ECHO_PARENT,
        &catch_all("v1"),
    );
    let new = http_route_full(
        NS,
        "aaa",
        "2026-01-01T00:00:00Z",
        ECHO_PARENT,
        &catch_all("v2"),
    );
    assert_eq!(
        send(&router(&[new.clone(), old]), "/", &[]),
        "v1",
        "oldest route wins"
    );
    let same_age = http_route_full(
        NS,
        "bbb",
        "2026-01-01T00:00:00Z",
        ECHO_PARENT,
        &catch_all("v3"),
    );
    assert_eq!(
        send(&router(&[same_age, new]), "/", &[]),
        "v2",
        "then namespace/name order"
    );
    let two_rules = http_route("r", &[catch_all("v1"), catch_all("v2")].join("\n"));
    assert_eq!(
        send(&router(&[two_rules]), "/", &[]),
        "v1",
        "then the first rule"
    );
}

#[test]
fn a_rule_without_matches_matches_everything() {
    let r = router(&[http_route("r", "  - backendRefs: [{name: v1, port: 80}]")]);
    assert_eq!(send(&r, "/any/path?x=y", &[]), "v1");
}

#[test]
fn consumer_routes_apply_only_to_clients_in_their_namespace() {
    let producer = http_route("producer", "  - backendRefs: [{name: v1, port: 80}]");
    let consumer = http_route_full(
        "other",
        "consumer",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo, namespace: mesh}",
        "  - backendRefs: [{name: v2, namespace: mesh, port: 80}]",
    );
    let compiled = compile(NS, "echo", &[producer, consumer], services().as_slice());
    let outcome = &compiled.routes[1];
    assert!(
        outcome.parents[0].consumer && outcome.parents[0].accepted.ok,
        "{outcome:?}"
    );
    let r = Router::new(&compiled.table).unwrap();
    assert_eq!(send_from(&r, NS, 80, "GET", "/", &[]), "v1");
    assert_eq!(send_from(&r, "third", 80, "GET", "/", &[]), "v1");
    assert_eq!(send_from(&r, "other", 80, "GET", "/", &[]), "v2");
}

#[test]
fn parent_port_and_section_name_limit_the_route() {
    let by_port = http_route_full(
        NS,
        "p",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo, port: 8080}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let r = router(&[by_port]);
    assert_eq!(send_from(&r, NS, 8080, "GET", "/", &[]), "v1");
    assert_eq!(
        send_from(&r, NS, 80, "GET", "/", &[]),
        "pass",
        "other ports pass through to the Service"
    );
    let by_name = http_route_full(
        NS,
        "s",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo, sectionName: http}",
        "  - backendRefs: [{name: v2, port: 80}]",
    );
    let r = router(&[by_name]);
    assert_eq!(send_from(&r, NS, 80, "GET", "/", &[]), "v2");
    assert_eq!(send_from(&r, NS, 8080, "GET", "/", &[]), "pass");
}

#[test]
fn routes_never_apply_to_ports_declared_non_http() {
    let mut all = services();
    let echo = all.iter_mut().find(|s| s.name == "echo").unwrap();
    echo.ports.push(ServicePort {
        name: Some("tcp".into()),
        port: 9090,
        app_protocol: None,
    });
    echo.ports.push(ServicePort {
        name: Some("web".into()),
        port: 443,
        app_protocol: Some("https".into()),
    });
    let every_port = http_route_full(
        NS,
        "all",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let tcp_only = http_route_full(
        NS,
        "tcp",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo, port: 9090}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let compiled = compile(NS, "echo", &[every_port, tcp_only], all.as_slice());
    let every = &compiled.routes[0].parents[0];
    assert!(every.accepted.ok);
    assert_eq!(every.ports, [80, 8080, 7070]);
    assert!(
        every
            .accepted
            .message
            .contains("not its non-HTTP port 9090, 443"),
        "{}",
        every.accepted.message
    );
    let tcp = &compiled.routes[1].parents[0];
    assert_eq!(tcp.accepted.reason, "UnsupportedProtocol");
    assert!(
        tcp.accepted
            .message
            .contains("port 9090 of Service mesh/echo is declared non-HTTP")
    );
    assert!(
        compiled
            .table
            .ports
            .iter()
            .all(|p| p.port != 9090 && p.port != 443),
        "no table for an opaque port"
    );
}

#[test]
fn parent_refs_that_do_not_fit_the_service_are_refused_with_reasons() {
    let bad_port = http_route_full(
        NS,
        "p",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo, port: 9999}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let bad_section = http_route_full(
        NS,
        "s",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo, sectionName: nope}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let gateway_parent = http_route_full(
        NS,
        "g",
        "2026-01-01T00:00:00Z",
        "  - {name: echo}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let compiled = compile(
        NS,
        "echo",
        &[bad_port, bad_section, gateway_parent],
        services().as_slice(),
    );
    assert_eq!(
        compiled.routes[0].parents[0].accepted.reason,
        "NoMatchingParent"
    );
    assert!(
        compiled.routes[0].parents[0]
            .accepted
            .message
            .contains("no port 9999")
    );
    assert_eq!(
        compiled.routes[1].parents[0].accepted.reason,
        "NoMatchingParent"
    );
    assert!(
        compiled.routes[2].parents.is_empty(),
        "a Gateway parentRef named echo is not this Service"
    );
    assert_eq!(compiled.table, RouteTable::default());

    let headless = http_route_full(
        NS,
        "h",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: headless}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let compiled = compile(
        NS,
        "headless",
        std::slice::from_ref(&headless),
        services().as_slice(),
    );
    assert_eq!(
        compiled.routes[0].parents[0].accepted.reason,
        "UnsupportedServiceType"
    );
    let compiled = compile(NS, "missing", &[headless], services().as_slice());
    assert!(compiled.routes[0].parents.is_empty());
    let to_missing = http_route_full(
        NS,
        "m",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: missing}",
        "  - backendRefs: [{name: v1, port: 80}]",
    );
    let compiled = compile(NS, "missing", &[to_missing], services().as_slice());
    assert_eq!(
        compiled.routes[0].parents[0].accepted.reason,
        "ServiceNotFound"
    );
}

#[test]
fn grpc_method_matches() {
    let rules = [
        "  - matches: [{method: {service: pkg.Svc, method: Get}}]\n    backendRefs: [{name: v1, port: 7070}]",
        "  - matches: [{method: {service: pkg.Svc}}]\n    backendRefs: [{name: v2, port: 7070}]",
        "  - matches: [{method: {method: Ping}}]\n    backendRefs: [{name: v3, port: 7070}]",
        "  - matches: [{method: {type: RegularExpression, service: \"pkg\\\\.Other.*\"}, headers: [{name: x-tenant, value: a}]}]\n    backendRefs: [{name: echo, port: 7070}]",
    ]
    .join("\n");
    let r = router(&[grpc_route("g", "2026-01-01T00:00:00Z", &rules)]);
    let call =
        |path: &str, headers: &[(&str, &str)]| send_from(&r, NS, 7070, "POST", path, headers);
    assert_eq!(call("/pkg.Svc/Get", &[]), "v1");
    assert_eq!(call("/pkg.Svc/List", &[]), "v2");
    assert_eq!(call("/other.Svc/Ping", &[]), "v3");
    assert_eq!(call("/pkg.OtherThing/Any", &[("x-tenant", "a")]), "echo");
    assert_eq!(call("/pkg.OtherThing/Any", &[]), "404");
    assert_eq!(call("/pkg.SvcX/Get", &[]), "404");
}

#[test]
fn http_and_grpc_routes_on_one_port_are_not_merged() {
    let grpc = grpc_route(
        "g",
        "2025-01-01T00:00:00Z",
        "  - backendRefs: [{name: v1, port: 7070}]",
    );
    let http = http_route_full(
        NS,
        "h",
        "2026-01-01T00:00:00Z",
        "  - {group: \"\", kind: Service, name: echo}",
        "  - backendRefs: [{name: v2, port: 80}]",
    );
    let compiled = compile(NS, "echo", &[http, grpc], services().as_slice());
    let http_parent = &compiled.routes[0].parents[0];
    assert!(!http_parent.accepted.ok);
    assert_eq!(http_parent.accepted.reason, "ConflictingRouteKind");
    assert!(
        http_parent.accepted.message.contains("GRPCRoute mesh/g"),
        "{}",
        http_parent.accepted.message
    );
    assert!(compiled.routes[1].parents[0].accepted.ok);
    let r = Router::new(&compiled.table).unwrap();
    assert_eq!(send_from(&r, NS, 7070, "POST", "/a.B/C", &[]), "v1");
    assert_eq!(send_from(&r, NS, 80, "GET", "/", &[]), "pass");
}

fn forward_headers(
    router: &Router,
    uri: &str,
    request: &[(&str, &str)],
) -> (String, http::HeaderMap, http::HeaderMap, Option<String>) {
    let mut builder = http::Request::builder().uri(uri).header("host", "echo");
    for (name, value) in request {
        builder = builder.header(*name, *value);
    }
    let (parts, ()) = builder.body(()).unwrap().into_parts();
    match router.route(80, NS, &RequestView::from_parts(&parts), 1) {
        Outcome::Forward(f) => {
            let mut req = parts.headers.clone();
            f.edit_request_headers(&mut req);
            let mut resp = http::HeaderMap::new();
            f.edit_response_headers(&mut resp);
            (f.backend.name.clone(), req, resp, f.path_and_query.clone())
        }
        other => panic!("not forwarded: {other:?}"),
    }
}

#[test]
fn rule_and_backend_header_filters_apply_in_that_order() {
    let r = router(&[http_route(
        "r",
        "  - filters:\n    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: rule}], add: [{name: X-B, value: rule}]}}\n    - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-R, value: rule}]}}\n    backendRefs:\n    - name: v1\n      port: 80\n      filters:\n      - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-a, value: backend}], remove: [x-c]}}\n      - {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: X-R, value: backend}]}}",
    )]);
    let (backend, req, resp, _) = forward_headers(
        &r,
        "/",
        &[("x-a", "client"), ("x-b", "client"), ("x-c", "gone")],
    );
    assert_eq!(backend, "v1");
    assert_eq!(req.get_all("x-a").iter().collect::<Vec<_>>(), ["backend"]);
    assert_eq!(
        req.get_all("x-b").iter().collect::<Vec<_>>(),
        ["client", "rule"]
    );
    assert!(req.get("x-c").is_none());
    assert_eq!(
        resp.get_all("x-r").iter().collect::<Vec<_>>(),
        ["rule", "backend"]
    );
}

#[test]
fn url_rewrite_replaces_host_and_path() {
    let r = router(&[http_route(
        "r",
        "  - matches: [{path: {type: PathPrefix, value: /old}}]\n    filters: [{type: URLRewrite, urlRewrite: {hostname: new.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]\n    backendRefs: [{name: v1, port: 80}]\n  - matches: [{path: {type: Exact, value: /full}}]\n    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /replaced}}}]\n    backendRefs: [{name: v2, port: 80}]",
    )]);
    let (_, _, _, path) = forward_headers(&r, "/old/x?q=1", &[]);
    assert_eq!(path.as_deref(), Some("/new/x?q=1"));
    let (_, _, _, path) = forward_headers(&r, "/full", &[]);
    assert_eq!(path.as_deref(), Some("/replaced"));
    let (parts, ()) = http::Request::get("/old")
        .header("host", "echo")
        .body(())
        .unwrap()
        .into_parts();
    let Outcome::Forward(f) = r.route(80, NS, &RequestView::from_parts(&parts), 1) else {
        panic!()
    };
    assert_eq!(f.authority, Some("new.example"));
}

#[test]
fn redirect_answers_with_status_and_location() {
    let r = router(&[http_route(
        "r",
        "  - matches: [{path: {type: PathPrefix, value: /old}}]\n    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.org, statusCode: 301, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]\n  - matches: [{path: {type: PathPrefix, value: /port}}]\n    filters: [{type: RequestRedirect, requestRedirect: {port: 8443}}]",
    )]);
    assert_eq!(
        send(&r, "/old/a?b=c", &[]),
        "301 https://example.org/new/a?b=c"
    );
    assert_eq!(send(&r, "/port", &[]), "302 http://echo:8443/port");
    assert_eq!(
        send_from(&r, NS, 8080, "GET", "/old", &[]),
        "301 https://example.org/new"
    );
}

#[test]
fn mirrors_copy_the_configured_share_of_requests() {
    let r = router(&[http_route(
        "r",
        "  - filters:\n    - {type: RequestMirror, requestMirror: {backendRef: {name: mirror, port: 80}, percent: 25}}\n    - {type: RequestMirror, requestMirror: {backendRef: {name: v3, port: 80}}}\n    backendRefs: [{name: v1, port: 80}]",
    )]);
    let (parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
    let view = RequestView::from_parts(&parts);
    let (mut to_mirror, mut to_v3) = (0, 0);
    for random in 0..10_000u64 {
        let Outcome::Forward(f) =
            r.route(80, NS, &view, random.wrapping_mul(0x2545_f491_4f6c_dd1d))
        else {
            panic!()
        };
        to_mirror += f.mirrors.iter().filter(|m| m.name == "mirror").count();
        to_v3 += f.mirrors.iter().filter(|m| m.name == "v3").count();
    }
    assert!(
        (2_300..2_700).contains(&to_mirror),
        "25% mirrored, got {to_mirror}"
    );
    assert_eq!(to_v3, 10_000, "no percent means every request");
}

#[test]
fn timeouts_are_carried_and_zero_disables() {
    let r = router(&[http_route(
        "r",
        "  - timeouts: {request: 10s, backendRequest: 1500ms}\n    backendRefs: [{name: v1, port: 80}]",
    )]);
    let (parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
    let Outcome::Forward(f) = r.route(80, NS, &RequestView::from_parts(&parts), 1) else {
        panic!()
    };
    assert_eq!(f.timeouts().request_ms, Some(10_000));
    assert_eq!(f.timeouts().backend_request_ms, Some(1_500));
    let r = router(&[http_route(
        "r",
        "  - timeouts: {request: 0s}\n    backendRefs: [{name: v1, port: 80}]",
    )]);
    let Outcome::Forward(f) = r.route(80, NS, &RequestView::from_parts(&parts), 1) else {
        panic!()
    };
    assert_eq!(f.timeouts().request_ms, None);
}

fn split(router: &Router) -> std::collections::BTreeMap<String, u32> {
    let (parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
    let view = RequestView::from_parts(&parts);
    let mut counts = std::collections::BTreeMap::new();
    for random in 0..20_000u64 {
        let key = match router.route(80, NS, &view, random.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            Outcome::Forward(f) => f.backend.name.clone(),
            Outcome::NoBackend { .. } => "500".into(),
            other => panic!("{other:?}"),
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

#[test]
fn weights_split_traffic_and_zero_weight_gets_none() {
    let r = router(&[http_route(
        "r",
        "  - backendRefs: [{name: v1, port: 80, weight: 3}, {name: v2, port: 80, weight: 1}, {name: v3, port: 80, weight: 0}]",
    )]);
    let counts = split(&r);
    assert!(!counts.contains_key("v3"), "{counts:?}");
    assert!((14_500..15_500).contains(&counts["v1"]), "{counts:?}");
}

#[test]
fn unresolved_backends_get_a_500_for_exactly_their_share() {
    let r = router(&[http_route(
        "r",
        "  - backendRefs: [{name: v1, port: 80, weight: 1}, {name: gone, port: 80, weight: 1}]",
    )]);
    let counts = split(&r);
    assert!((9_500..10_500).contains(&counts["500"]), "{counts:?}");
    let r = router(&[http_route(
        "r",
        "  - backendRefs: [{name: v1, port: 80, weight: 0}]",
    )]);
    assert_eq!(
        split(&r).keys().collect::<Vec<_>>(),
        ["500"],
        "all-zero weights answer 500"
    );
    let r = router(&[http_route(
        "r",
        "  - matches: [{path: {type: PathPrefix, value: /}}]",
    )]);
    assert_eq!(send(&r, "/", &[]), "500", "no backends answer 500");
}

#[test]
fn unresolved_references_are_reported_with_gateway_reasons() {
    let route = http_route(
        "r",
        "  - backendRefs: [{name: gone, port: 80}, {group: example.com, kind: Bucket, name: b, port: 80}, {name: v1, port: 81}, {name: external, port: 80}]",
    );
    let compiled = compile(NS, "echo", &[route], services().as_slice());
    let parent = &compiled.routes[0].parents[0];
    assert!(
        parent.accepted.ok,
        "unresolved backends do not refuse the route"
    );
    assert!(!parent.resolved_refs.ok);
    assert_eq!(parent.resolved_refs.reason, "BackendNotFound");
    for part in [
        "Service mesh/gone not found",
        "Bucket.example.com",
        "has no port 81",
        "ExternalName",
    ] {
        assert!(
            parent.resolved_refs.message.contains(part),
            "{part} in {}",
            parent.resolved_refs.message
        );
    }
    let kind_only = http_route(
        "k",
        "  - backendRefs: [{group: example.com, kind: Bucket, name: b, port: 80}]",
    );
    let compiled = compile(NS, "echo", &[kind_only], services().as_slice());
    assert_eq!(
        compiled.routes[0].parents[0].resolved_refs.reason,
        "InvalidKind"
    );
}

fn refusal(rules: &str) -> (String, String) {
    let compiled = compile(
        NS,
        "echo",
        &[http_route("bad", rules)],
        services().as_slice(),
    );
    assert_eq!(
        compiled.table,
        RouteTable::default(),
        "a refused route contributes nothing"
    );
    let accepted = &compiled.routes[0].parents[0].accepted;
    assert!(!accepted.ok);
    (accepted.reason.clone(), accepted.message.clone())
}

#[test]
fn rules_that_cannot_compile_refuse_the_route_with_a_reason() {
    let (reason, message) =
        refusal("  - matches: [{path: {type: RegularExpression, value: \"/(unclosed\"}}]");
    assert_eq!(reason, "UnsupportedValue");
    assert!(
        message.contains("rule 0: invalid regular expression"),
        "{message}"
    );
    let (reason, _) =
        refusal("  - matches: [{headers: [{type: RegularExpression, name: x, value: \"[\"}]}]");
    assert_eq!(reason, "UnsupportedValue");
    let (reason, message) = refusal(
        "  - filters: [{type: RequestRedirect, requestRedirect: {port: 1}}, {type: URLRewrite, urlRewrite: {hostname: a}}]",
    );
    assert_eq!(
        (reason.as_str(), message.contains("cannot be used together")),
        ("IncompatibleFilters", true),
        "{message}"
    );
    let (reason, _) = refusal(
        "  - filters: [{type: URLRewrite, urlRewrite: {hostname: a}}, {type: URLRewrite, urlRewrite: {hostname: b}}]",
    );
    assert_eq!(reason, "IncompatibleFilters");
    let (reason, _) = refusal(
        "  - matches: [{path: {type: Exact, value: /a}}]\n    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]",
    );
    assert_eq!(reason, "IncompatibleFilters");
    let (reason, message) = refusal("  - filters: [{type: CORS, cors: {allowOrigins: [\"*\"]}}]");
    assert_eq!(reason, "UnsupportedValue");
    assert!(message.contains("CORS"), "{message}");
    let (reason, message) = refusal("  - filters: [{type: RequestHeaderModifier}]");
    assert_eq!(reason, "UnsupportedValue");
    assert!(
        message.contains("needs its requestHeaderModifier"),
        "{message}"
    );
    let (_, message) = refusal("  - timeouts: {request: 1s, backendRequest: 2s}");
    assert!(message.contains("longer than"), "{message}");
    let (_, message) = refusal(
        "  - backendRefs: [{name: v1, port: 80, filters: [{type: RequestRedirect, requestRedirect: {port: 1}}]}]",
    );
    assert!(
        message.contains("not supported on a backendRef"),
        "{message}"
    );
}

#[test]
fn inline_route_target_rules_merge_with_attached_routes() {
    let target: aether_crds::RouteTarget = serde_saphyr::from_str(
        "apiVersion: aether.io/v1alpha1\nkind: RouteTarget\nmetadata: {name: echo, namespace: mesh, creationTimestamp: \"2024-01-01T00:00:00Z\"}\nspec:\n  service: echo\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /inline}}]\n    backendRefs: [{name: v3, port: 80}]\n  - backendRefs: [{name: v2, port: 80}]",
    )
    .unwrap();
    let inline = RouteSource::from_route_target(&target);
    assert_eq!(inline.route.kind, RouteKind::RouteTarget);
    let route = http_route("r", &rule("[{path: {type: PathPrefix, value: /}}]", "v1"));
    let r = router(&[route, inline]);
    assert_eq!(send(&r, "/inline/x", &[]), "v3");
    assert_eq!(
        send(&r, "/x", &[]),
        "v2",
        "the RouteTarget is older, so its catch-all wins the tie"
    );
}

#[test]
fn tables_survive_serialisation_and_bad_tables_are_errors() {
    let routes = [http_route(
        "r",
        &rule(
            "[{path: {type: RegularExpression, value: \"/a.*\"}, headers: [{name: x, value: \"1\"}]}]",
            "v1",
        ),
    )];
    let table = compile(NS, "echo", &routes, services().as_slice()).table;
    let json = serde_json::to_string(&table).unwrap();
    let back: RouteTable = serde_json::from_str(&json).unwrap();
    assert_eq!(back, table);
    let corrupt: RouteTable = serde_json::from_str(&json.replace("/a.*", "/a(")).unwrap();
    let error = Router::new(&corrupt).expect_err("bad regex refused");
    assert!(
        error.to_string().contains("invalid regular expression"),
        "{error}"
    );
    let dangling: RouteTable =
        serde_json::from_str(&json.replace("\"rule\":0", "\"rule\":5")).unwrap();
    assert!(Router::new(&dangling).is_err());
}
