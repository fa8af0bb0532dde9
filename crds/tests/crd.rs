//! The committed CRD YAML matches the Rust types, and the schema's CEL rules refuse the
//! mistakes they are written for.

use aether_crds::http::*;
use aether_crds::{RouteTarget, RouteTargetSpec};
use kube::core::cel::validate_cel;

#[test]
fn committed_crds_match_the_rust_types() {
    let chart_crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/aether/crds");
    for (file, generated) in aether_crds::crd_documents().expect("CRDs render") {
        let path = chart_crds.join(&file);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert!(
            committed == generated,
            "{} is out of date with crds/src; regenerate it with `cargo run --bin aether-crdgen -- charts/aether/crds`",
            path.display()
        );
    }
}

fn target(rules: Vec<HttpRouteRule>) -> RouteTarget {
    RouteTarget::new(
        "echo",
        RouteTargetSpec {
            service: "echo".into(),
            rules,
        },
    )
}

fn prefix_match(path: &str) -> HttpRouteMatch {
    HttpRouteMatch {
        path: Some(HttpPathMatch {
            r#type: Some(PathMatchType::PathPrefix),
            value: Some(path.into()),
        }),
        ..Default::default()
    }
}

fn filter(r#type: HttpFilterType) -> HttpRouteFilter {
    HttpRouteFilter {
        r#type,
        request_header_modifier: None,
        response_header_modifier: None,
        request_redirect: None,
        url_rewrite: None,
        request_mirror: None,
    }
}

fn redirect(status_code: Option<i32>, path: Option<HttpPathModifier>) -> HttpRouteFilter {
    HttpRouteFilter {
        request_redirect: Some(RequestRedirect {
            status_code,
            path,
            ..Default::default()
        }),
        ..filter(HttpFilterType::RequestRedirect)
    }
}

fn rewrite() -> HttpRouteFilter {
    HttpRouteFilter {
        url_rewrite: Some(UrlRewrite {
            hostname: Some("example.org".into()),
            path: None,
        }),
        ..filter(HttpFilterType::UrlRewrite)
    }
}

fn backend(name: &str, port: Option<i32>) -> HttpBackendRef {
    HttpBackendRef {
        name: name.into(),
        port,
        ..Default::default()
    }
}

fn refused_with(rt: &RouteTarget, message: &str) {
    match validate_cel(rt) {
        Ok(()) => panic!("expected refusal mentioning {message:?}, but it was accepted"),
        Err(errors) => {
            let text = errors.to_string();
            assert!(text.contains(message), "expected {message:?} in {text}");
        }
    }
}

#[test]
fn a_valid_target_passes_every_rule() {
    let rt = target(vec![HttpRouteRule {
        name: Some("v2".into()),
        matches: Some(vec![prefix_match("/v2")]),
        filters: Some(vec![redirect(
            Some(301),
            Some(HttpPathModifier {
                r#type: PathModifierType::ReplacePrefixMatch,
                replace_full_path: None,
                replace_prefix_match: Some("/v3".into()),
            }),
        )]),
        backend_refs: Some(vec![backend("echo-v2", Some(8080))]),
        timeouts: Some(HttpRouteTimeouts {
            request: Some("10s".into()),
            backend_request: Some("2s".into()),
        }),
        retry: Some(HttpRouteRetry {
            codes: Some(vec![503]),
            attempts: Some(3),
            backoff: Some("100ms".into()),
        }),
    }]);
    validate_cel(&rt).expect("valid RouteTarget");
}

#[test]
fn redirect_and_rewrite_together_are_refused() {
    let rt = target(vec![HttpRouteRule {
        filters: Some(vec![redirect(None, None), rewrite()]),
        ..Default::default()
    }]);
    refused_with(&rt, "both a RequestRedirect and a URLRewrite");
}

#[test]
fn a_filter_type_twice_is_refused() {
    let rt = target(vec![HttpRouteRule {
        filters: Some(vec![rewrite(), rewrite()]),
        ..Default::default()
    }]);
    refused_with(&rt, "at most once");
}

#[test]
fn a_filter_without_its_field_is_refused() {
    let rt = target(vec![HttpRouteRule {
        filters: Some(vec![filter(HttpFilterType::RequestHeaderModifier)]),
        ..Default::default()
    }]);
    refused_with(&rt, "requestHeaderModifier must be set");
}

#[test]
fn a_bad_redirect_status_is_refused() {
    let rt = target(vec![HttpRouteRule {
        filters: Some(vec![redirect(Some(304), None)]),
        ..Default::default()
    }]);
    refused_with(&rt, "statusCode must be one of");
}

#[test]
fn replace_prefix_match_needs_prefix_matches() {
    let exact = HttpRouteMatch {
        path: Some(HttpPathMatch {
            r#type: Some(PathMatchType::Exact),
            value: Some("/v2".into()),
        }),
        ..Default::default()
    };
    let rt = target(vec![HttpRouteRule {
        matches: Some(vec![exact]),
        filters: Some(vec![redirect(
            None,
            Some(HttpPathModifier {
                r#type: PathModifierType::ReplacePrefixMatch,
                replace_full_path: None,
                replace_prefix_match: Some("/v3".into()),
            }),
        )]),
        ..Default::default()
    }]);
    refused_with(&rt, "ReplacePrefixMatch needs every match");
}

#[test]
fn a_relative_path_is_refused() {
    let rt = target(vec![HttpRouteRule {
        matches: Some(vec![prefix_match("v2")]),
        ..Default::default()
    }]);
    refused_with(&rt, "must start with '/'");
    let rt = target(vec![HttpRouteRule {
        matches: Some(vec![prefix_match("/a//b")]),
        ..Default::default()
    }]);
    refused_with(&rt, "must not contain");
}

#[test]
fn a_service_backend_needs_a_port() {
    let rt = target(vec![HttpRouteRule {
        backend_refs: Some(vec![backend("echo-v1", None)]),
        ..Default::default()
    }]);
    refused_with(&rt, "port is required");
}

#[test]
fn backend_timeout_longer_than_request_timeout_is_refused() {
    let rt = target(vec![HttpRouteRule {
        timeouts: Some(HttpRouteTimeouts {
            request: Some("1s".into()),
            backend_request: Some("2s".into()),
        }),
        ..Default::default()
    }]);
    refused_with(&rt, "backendRequest must not be longer");
}

#[test]
fn the_service_is_immutable() {
    let old = target(vec![]);
    let mut new = old.clone();
    new.spec.service = "other".into();
    let errors =
        kube::core::cel::validate_cel_update(&new, &old).expect_err("service change refused");
    assert!(
        errors.to_string().contains("service is immutable"),
        "{errors}"
    );
}
