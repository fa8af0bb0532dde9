//! Route decisions against a 1,000-rule table with mixed path, header, query and regex
//! matches. Run: `cargo bench -p aether-routing --bench matching`; the throughput line of
//! `route/1000-rules` is decisions per second on one core.

use std::hint::black_box;

use aether_routing::{
    Outcome, RequestView, RouteSource, Router, ServiceInfo, ServiceKind, ServicePort, compile,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway_api::experimental::httproutes::HttpRoute;

const NS: &str = "bench";
const RULES: usize = 1_000;
/// Gateway API allows at most 16 rules per HTTPRoute.
const RULES_PER_ROUTE: usize = 16;

fn services() -> Vec<ServiceInfo> {
    ["echo", "v1", "v2"]
        .iter()
        .map(|name| ServiceInfo {
            namespace: NS.into(),
            name: (*name).into(),
            kind: ServiceKind::ClusterIp,
            ports: vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                app_protocol: None,
            }],
        })
        .collect()
}

/// Rule `k` of the table, in YAML. A tenth of the rules share the `/shared` prefix and
/// differ only by header, so some requests have many candidates to check.
fn rule(k: usize) -> String {
    let backend = if k.is_multiple_of(2) { "v1" } else { "v2" };
    let matches = match k % 10 {
        0 => format!(
            "[{{path: {{type: PathPrefix, value: /shared}}, headers: [{{name: x-tenant, value: t{k}}}]}}]"
        ),
        1 | 5 => format!("[{{path: {{type: Exact, value: /svc{k}/item}}}}]"),
        2 | 6 => format!(
            "[{{path: {{type: PathPrefix, value: /svc{k}/api}}, headers: [{{name: x-tenant, value: t{k}}}]}}]"
        ),
        3 | 7 => format!(
            "[{{path: {{type: PathPrefix, value: /svc{k}}}, queryParams: [{{name: version, value: v{k}}}]}}]"
        ),
        4 => format!("[{{path: {{type: RegularExpression, value: \"/re{k}/[0-9]+\"}}}}]"),
        _ => format!("[{{path: {{type: PathPrefix, value: /svc{k}/v1}}, method: GET}}]"),
    };
    format!(
        "  - matches: {matches}\n    backendRefs: [{{name: {backend}, port: 80, weight: 3}}, {{name: echo, port: 80}}]"
    )
}

fn routes() -> Vec<RouteSource> {
    (0..RULES)
        .step_by(RULES_PER_ROUTE)
        .map(|first| {
            let rules: Vec<String> = (first..(first + RULES_PER_ROUTE).min(RULES)).map(rule).collect();
            let yaml = format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{first}, namespace: {NS}, creationTimestamp: \"2026-01-01T00:00:00Z\"}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo}}]\n  rules:\n{}\n",
                rules.join("\n")
            );
            let route: HttpRoute = serde_saphyr::from_str(&yaml).expect("bench route parses");
            RouteSource::from_http_route(&route)
        })
        .collect()
}

/// A request aimed at rule `k`, or at nothing for every ninth one (a 404).
fn request(k: usize) -> http::request::Parts {
    let (uri, header) = match k % 10 {
        _ if k % 9 == 8 => (format!("/nothing/{k}"), None),
        0 => ("/shared/x".to_owned(), Some(format!("t{k}"))),
        1 | 5 => (format!("/svc{k}/item"), None),
        2 | 6 => (format!("/svc{k}/api/list"), Some(format!("t{k}"))),
        3 | 7 => (format!("/svc{k}/x?page=2&version=v{k}"), None),
        4 => (format!("/re{k}/12345"), None),
        _ => (format!("/svc{k}/v1/users/7"), None),
    };
    let mut builder = http::Request::get(uri)
        .header("host", "echo")
        .header("user-agent", "bench");
    if let Some(tenant) = header {
        builder = builder.header("x-tenant", tenant);
    }
    builder.body(()).expect("bench request").into_parts().0
}

fn bench(c: &mut Criterion) {
    let routes = routes();
    let services = services();
    let compiled = compile(NS, "echo", &routes, services.as_slice());
    assert!(
        compiled
            .routes
            .iter()
            .all(|r| r.parents.iter().all(|p| p.accepted.ok))
    );
    let router = Router::new(&compiled.table).expect("table loads");
    let requests: Vec<http::request::Parts> = (0..RULES).map(request).collect();
    let views: Vec<RequestView<'_>> = requests.iter().map(RequestView::from_parts).collect();
    let forwarded = views
        .iter()
        .filter(|v| matches!(router.route(80, NS, v, 1), Outcome::Forward(_)))
        .count();
    eprintln!(
        "{RULES} rules, {} requests per iteration, {forwarded} forwarded, the rest 404",
        views.len()
    );

    let mut group = c.benchmark_group("route");
    group.throughput(Throughput::Elements(views.len() as u64));
    group.bench_function("1000-rules", |b| {
        let mut random = 0x9e37_79b9_7f4a_7c15u64;
        b.iter(|| {
            for view in &views {
                random = random.wrapping_add(0x2545_f491_4f6c_dd1d);
                black_box(router.route(80, NS, black_box(view), random));
            }
        })
    });
    group.finish();

    c.bench_function("compile/1000-rules", |b| {
        b.iter(|| compile(NS, "echo", black_box(&routes), services.as_slice()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
