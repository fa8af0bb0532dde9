//! What the RouteTarget fuzz target checks, as a plain function: a stable test
//! (`tests/fuzz.rs`) drives it with seeded mutations (`aether_test_support::fuzz`) in every
//! test run. It panics only on a bug.

use aether_crds::{RouteTarget, RouteTargetSpec};

use crate::{RequestView, RouteSource, Router, ServiceInfo, ServiceKind, ServicePort, compile};

/// A RouteTarget spec, as JSON, through the operator's compile path: any spec that reads
/// compiles without a panic; every refusal carries a reason and a message that says what is
/// wrong; what compiles loads into the proxy's router, which decides a request. Returns
/// whether the input read as a spec.
pub fn route_target_spec(data: &[u8]) -> bool {
    let Ok(spec) = serde_json::from_slice::<RouteTargetSpec>(data) else {
        return false;
    };
    let mut target = RouteTarget::new("web", spec);
    target.metadata.namespace = Some("shop".into());
    let service = |name: &str| ServiceInfo {
        namespace: "shop".into(),
        name: name.into(),
        kind: ServiceKind::ClusterIp,
        ports: vec![
            ServicePort {
                name: Some("http".into()),
                port: 80,
                app_protocol: Some("http".into()),
            },
            ServicePort {
                name: Some("grpc".into()),
                port: 7070,
                app_protocol: None,
            },
        ],
    };
    let services = [service("web"), service("v1"), service("v2")];
    let compiled = compile(
        "shop",
        "web",
        &[RouteSource::from_route_target(&target)],
        services.as_slice(),
    );
    for route in &compiled.routes {
        for parent in &route.parents {
            for verdict in [&parent.accepted, &parent.resolved_refs] {
                assert!(
                    verdict.ok || (!verdict.reason.is_empty() && !verdict.message.is_empty()),
                    "a refusal without a reason or message: {verdict:?}"
                );
            }
        }
    }
    let router = match Router::new(&compiled.table) {
        Ok(router) => router,
        Err(e) => panic!("a compiled table does not load: {e}"),
    };
    let request = http::Request::builder()
        .uri("/v2/a?x=1")
        .header("host", "web")
        .header("x-version", "two")
        .body(())
        .expect("a request");
    let (parts, ()) = request.into_parts();
    let _ = router.route(80, "shop", &RequestView::from_parts(&parts), 7);
    true
}
