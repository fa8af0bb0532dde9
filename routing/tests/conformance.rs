//! Table test: every GAMMA mesh conformance case in `tests/gateway-conformance/cases.yaml`,
//! decided by the route engine from the manifests of the pinned Gateway API release, checked
//! on everything the engine decides: the backend Service (hence the serving pods), 404s and
//! 500s, redirect status and `Location`, request and response headers, the path the backend
//! sees, and weighted splits.

use std::collections::{BTreeMap, BTreeSet};

use aether_routing::table::BackendTarget;
use aether_routing::{
    Outcome, RequestView, RouteSource, Router, ServiceInfo, ServiceKind, ServicePort, compile,
};
use aether_test_support::cases::{Case, Cases, Request, Test, Weighted};
use aether_test_support::upstream::{self, Release};
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::grpcroutes::GrpcRoute;
use http::HeaderMap;
use serde_json::Value;

/// The base infrastructure: Services, and which Deployment's pods each one selects.
struct Mesh {
    services: Vec<ServiceInfo>,
    /// (namespace, service) -> pod name prefixes (Deployment names) behind it.
    pods: BTreeMap<(String, String), BTreeSet<String>>,
}

fn yaml_documents(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn str_of<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn load_mesh(release: &Release) -> Mesh {
    let docs = yaml_documents(&release.manifest("manifests.yaml"));
    let mut services = Vec::new();
    let mut selectors = Vec::new();
    let mut deployments = Vec::new();
    for doc in &docs {
        let namespace = str_of(doc, "/metadata/namespace").to_owned();
        let name = str_of(doc, "/metadata/name").to_owned();
        match str_of(doc, "/kind") {
            "Service" => {
                let ports = doc["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| ServicePort {
                        name: p["name"].as_str().map(Into::into),
                        port: p["port"].as_u64().expect("service port") as u16,
                        app_protocol: p["appProtocol"].as_str().map(Into::into),
                    })
                    .collect();
                let kind = if str_of(doc, "/spec/clusterIP") == "None" {
                    ServiceKind::Headless
                } else {
                    ServiceKind::ClusterIp
                };
                selectors.push((
                    (namespace.clone(), name.clone()),
                    doc["spec"]["selector"].clone(),
                ));
                services.push(ServiceInfo {
                    namespace,
                    name,
                    kind,
                    ports,
                });
            }
            "Deployment" => deployments.push((
                namespace,
                name,
                doc["spec"]["template"]["metadata"]["labels"].clone(),
            )),
            _ => {}
        }
    }
    let mut pods = BTreeMap::new();
    for (key, selector) in selectors {
        let selector = selector.as_object().cloned().unwrap_or_default();
        let matching = deployments
            .iter()
            .filter(|(ns, _, labels)| {
                *ns == key.0 && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
            .map(|(_, name, _)| name.clone())
            .collect();
        pods.insert(key, matching);
    }
    Mesh { services, pods }
}

/// Drops JSON nulls so that a typed round trip can be compared with the manifest.
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// Loads the routes of a test manifest through the gateway-api crate's types, checking
/// that those types keep every field the manifest uses.
fn load_routes(release: &Release, manifest: &str) -> Vec<RouteSource> {
    let mut routes = Vec::new();
    for (i, doc) in yaml_documents(&release.manifest(manifest))
        .into_iter()
        .enumerate()
    {
        let (source, reserialised) = match str_of(&doc, "/kind") {
            "HTTPRoute" => {
                let route: HttpRoute = serde_json::from_value(doc.clone())
                    .unwrap_or_else(|e| panic!("{manifest}#{i}: {e}"));
                (
                    RouteSource::from_http_route(&route),
                    serde_json::to_value(&route).unwrap(),
                )
            }
            "GRPCRoute" => {
                let route: GrpcRoute = serde_json::from_value(doc.clone())
                    .unwrap_or_else(|e| panic!("{manifest}#{i}: {e}"));
                (
                    RouteSource::from_grpc_route(&route),
                    serde_json::to_value(&route).unwrap(),
                )
            }
            other => panic!("{manifest}#{i}: unexpected kind {other}"),
        };
        assert_eq!(
            without_nulls(&reserialised["spec"]),
            without_nulls(&doc["spec"]),
            "{manifest}#{i}: the gateway-api crate's types lose a field of this manifest"
        );
        routes.push(source);
    }
    routes
}

/// A small deterministic generator for the simulated weighted runs.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Built {
    parts: http::request::Parts,
}

fn build_request(req: &Request) -> Built {
    let uri: http::Uri = req
        .url
        .parse()
        .unwrap_or_else(|e| panic!("url {}: {e}", req.url));
    let grpc = req.protocol == "grpc";
    let path = if grpc {
        "/proto.EchoTestService/Echo".to_owned()
    } else {
        req.path.clone().unwrap_or_else(|| "/".into())
    };
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let method = if grpc {
        "POST"
    } else {
        req.method.as_deref().unwrap_or("GET")
    };
    let mut builder = http::Request::builder().method(method).uri(path_and_query);
    let host = req
        .headers
        .get("Host")
        .cloned()
        .or(req.host_header.clone())
        .unwrap_or_else(|| req.dial_host.clone());
    builder = builder.header(http::header::HOST, host);
    for (name, value) in req
        .headers
        .iter()
        .chain(&req.metadata)
        .filter(|(n, _)| n.as_str() != "Host")
    {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if grpc {
        builder = builder.header(http::header::CONTENT_TYPE, "application/grpc");
    }
    let (parts, ()) = builder.body(()).expect("request").into_parts();
    Built { parts }
}

fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii header"))
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

struct Context<'a> {
    mesh: &'a Mesh,
    routes: &'a [RouteSource],
}

impl Context<'_> {
    fn router(&self, namespace: &str, service: &str) -> Router {
        let compiled = compile(
            namespace,
            service,
            self.routes,
            self.mesh.services.as_slice(),
        );
        Router::new(&compiled.table).expect("compiled tables load")
    }

    fn pods_of(&self, namespace: &str, service: &str) -> &BTreeSet<String> {
        &self.mesh.pods[&(namespace.to_owned(), service.to_owned())]
    }
}

/// Checks one case; returns `Err(reason)` when the engine cannot decide it.
fn check_case(ctx: &Context<'_>, test: &Test, case: &Case) -> Result<(), String> {
    let label = format!("{} / {}", test.short_name, case.go_subtest_name);
    let client = case.client.clone().or(test.client.clone()).expect("client");
    let req = &case.request;
    if req.dial_host.starts_with('<') {
        return Err(format!(
            "{label}: dials a pod IP, not a Service: no route target, nothing for the engine to decide"
        ));
    }
    let (service, namespace) = match req.dial_host.split_once('.') {
        Some((service, namespace)) => (service, namespace),
        None => (req.dial_host.as_str(), client.namespace.as_str()),
    };
    let router = ctx.router(namespace, service);
    let built = build_request(req);
    let view = RequestView::from_parts(&built.parts);
    let expect = &case.expect;
    let outcome = router.route(req.dial_port, &client.namespace, &view, 0x5eed);

    let mut request_headers = built.parts.headers.clone();
    let mut response_headers = HeaderMap::new();
    let (status, backend, backend_path) = match &outcome {
        Outcome::NoRoutes => (
            200,
            Some((namespace.to_owned(), service.to_owned())),
            req.path.clone(),
        ),
        Outcome::NotFound => (404, None, None),
        Outcome::NoBackend { .. } => (500, None, None),
        Outcome::Redirect {
            status, location, ..
        } => {
            if let Some(intended) = &expect.intended_redirect_not_asserted {
                assert_eq!(location, &intended.location, "{label}: redirect Location");
            }
            (*status, None, None)
        }
        Outcome::Forward(forward) => {
            forward.edit_request_headers(&mut request_headers);
            forward.edit_response_headers(&mut response_headers);
            let path = forward
                .path_and_query
                .as_deref()
                .map(|pq| pq.split('?').next().unwrap_or(pq).to_owned())
                .or(req.path.clone());
            (
                200,
                Some((
                    forward.backend.namespace.clone(),
                    forward.backend.name.clone(),
                )),
                path,
            )
        }
    };
    assert!(
        expect.status.contains(&status),
        "{label}: status {status}, want one of {:?} (outcome {outcome:?})",
        expect.status
    );
    if let (Some(prefix), Some((ns, svc))) = (&expect.backend_pod_prefix, &backend) {
        let pods = ctx.pods_of(ns, svc);
        assert!(
            pods.len() == 1 && pods.contains(prefix),
            "{label}: backend Service {ns}/{svc} is served by {pods:?}, want only {prefix}"
        );
    }
    for (name, value) in &expect.backend_request_headers {
        assert_eq!(
            joined(&request_headers, name).as_deref(),
            Some(value.as_str()),
            "{label}: backend request header {name}"
        );
    }
    for name in &expect.backend_absent_request_headers {
        assert!(
            request_headers.get(name).is_none(),
            "{label}: backend request header {name} must be absent"
        );
    }
    for (name, value) in &expect.response_headers {
        assert_eq!(
            joined(&response_headers, name).as_deref(),
            Some(value.as_str()),
            "{label}: response header {name}"
        );
    }
    for name in &expect.response_absent_headers {
        assert!(
            response_headers.get(name).is_none(),
            "{label}: response header {name} must be absent"
        );
    }
    if let Some(path) = &expect.intended_backend_path_not_asserted {
        assert_eq!(
            backend_path.as_deref(),
            Some(path.as_str()),
            "{label}: path seen by the backend"
        );
    }
    Ok(())
}

/// Simulates 10,000 requests of a weighted test and checks the split per serving Deployment.
fn check_weights(ctx: &Context<'_>, test: &Test, weighted: &Weighted) {
    let case = &test.cases[0];
    let namespace = &test.client.as_ref().expect("client").namespace;
    let router = ctx.router(namespace, &case.request.dial_host);
    let built = build_request(&case.request);
    let view = RequestView::from_parts(&built.parts);
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    const REQUESTS: u32 = 10_000;
    for _ in 0..REQUESTS {
        match router.route(case.request.dial_port, namespace, &view, rng.next()) {
            Outcome::Forward(forward) => {
                let pods = ctx.pods_of(&forward.backend.namespace, &forward.backend.name);
                assert_eq!(
                    pods.len(),
                    1,
                    "{}: weighted backend {} is ambiguous",
                    test.short_name,
                    forward.backend
                );
                *counts
                    .entry(pods.iter().next().unwrap().clone())
                    .or_default() += 1;
            }
            other => panic!(
                "{}: weighted request not forwarded: {other:?}",
                test.short_name
            ),
        }
    }
    assert_eq!(
        counts.keys().collect::<BTreeSet<_>>(),
        weighted.expected_fractions.keys().collect::<BTreeSet<_>>(),
        "{}: backends seen",
        test.short_name
    );
    for (backend, expected) in &weighted.expected_fractions {
        let observed = f64::from(counts[backend]) / f64::from(REQUESTS);
        assert!(
            (observed - expected).abs() <= weighted.tolerance_abs,
            "{}: {backend} got {observed:.3}, want {expected} ± {}",
            test.short_name,
            weighted.tolerance_abs
        );
    }
}

/// Every route of the conformance manifests is accepted; only `echo-v3` (deliberately
/// missing) fails to resolve.
fn check_route_status(ctx: &Context<'_>, test: &Test) {
    let targets: BTreeSet<(String, String)> = ctx
        .routes
        .iter()
        .flat_map(|r| {
            r.parents.iter().map(|p| {
                (
                    p.namespace.clone().unwrap_or(r.route.namespace.clone()),
                    p.name.clone(),
                )
            })
        })
        .collect();
    for (namespace, service) in targets {
        let compiled = compile(
            &namespace,
            &service,
            ctx.routes,
            ctx.mesh.services.as_slice(),
        );
        for outcome in &compiled.routes {
            for parent in &outcome.parents {
                assert!(
                    parent.accepted.ok,
                    "{}: {} not accepted: {:?}",
                    test.short_name, outcome.route, parent.accepted
                );
                let missing_backend = compiled.table.ports.iter().any(|p| {
                    p.producer.iter().chain(p.consumers.values()).any(|set| {
                        set.rules.iter().any(|rule| {
                            rule.backends
                                .iter()
                                .any(|b| matches!(b.target, BackendTarget::Unresolved { .. }))
                        })
                    })
                });
                assert_eq!(
                    parent.resolved_refs.ok, !missing_backend,
                    "{}: {:?}",
                    test.short_name, parent.resolved_refs
                );
                if !parent.resolved_refs.ok {
                    assert_eq!(parent.resolved_refs.reason, "BackendNotFound");
                    assert!(
                        parent.resolved_refs.message.contains("echo-v3"),
                        "{}",
                        parent.resolved_refs.message
                    );
                }
            }
        }
    }
}

#[test]
fn every_mesh_conformance_case_the_engine_can_decide() {
    let release = upstream::release().expect("the pinned Gateway API release");
    let cases = Cases::load().expect("cases.yaml");
    let mesh = load_mesh(&release);

    let (mut checked, mut weighted, mut undecidable) = (0, 0, Vec::new());
    let mut total = 0;
    for test in &cases.tests {
        let routes: Vec<RouteSource> = test
            .manifests
            .iter()
            .flat_map(|m| load_routes(&release, m))
            .collect();
        let ctx = Context {
            mesh: &mesh,
            routes: &routes,
        };
        check_route_status(&ctx, test);
        for case in &test.cases {
            total += 1;
            match check_case(&ctx, test, case) {
                Ok(()) => checked += 1,
                Err(why) => undecidable.push(why),
            }
        }
        if let Some(w) = &test.weighted {
            check_weights(&ctx, test, w);
            weighted += 1;
        }
    }
    let tests = cases.tests.len();
    println!(
        "conformance table: {tests} tests, {checked} of {total} cases checked, {weighted} weighted splits checked over 10000 requests"
    );
    for why in &undecidable {
        println!("  not decided by the engine: {why}");
    }
    assert_eq!(cases.tests.len(), 22, "cases.yaml lists the 22 mesh tests");
    assert!(
        undecidable.len() <= 1,
        "only the pod-IP case is outside the engine: {undecidable:?}"
    );
}
