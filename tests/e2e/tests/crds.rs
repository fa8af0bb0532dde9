//! The aether CRDs on a real API server: they install, a bad RouteTarget is refused with
//! the schema's message, and `kubectl get routetargets` shows the printer columns.

use std::path::Path;

use aether_crds::RouteTarget;
use aether_e2e::Cluster;
use anyhow::Result;
use kube::api::{Api, Patch, PatchParams, PostParams};

const NAMESPACE: &str = "aether-e2e-crds";

async fn setup(cluster: &Cluster) -> Result<Api<RouteTarget>> {
    cluster.apply(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/aether/crds"))?;
    cluster.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/routetargets.aether.io",
        "--timeout=30s",
    ])?;
    let _ = cluster.kubectl(&["create", "namespace", NAMESPACE]);
    Ok(Api::namespaced(cluster.client.clone(), NAMESPACE))
}

fn target(name: &str, spec: serde_json::Value) -> Result<RouteTarget> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "aether.io/v1alpha1", "kind": "RouteTarget",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec,
    }))?)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_refuses_bad_route_targets_with_clear_messages() -> Result<()> {
    let cluster = Cluster::get().await?;
    let api = setup(&cluster).await?;
    let refused = [
        (serde_json::json!({"service": "Not_A_Name"}), "spec.service"),
        (
            serde_json::json!({"service": "echo", "rules": [{"filters": [{"type": "RequestRedirect"}]}]}),
            "requestRedirect must be set exactly when type is RequestRedirect",
        ),
        (
            serde_json::json!({"service": "echo", "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "v1"}}]}]}),
            "an Exact or PathPrefix path must start with '/'",
        ),
        (
            serde_json::json!({"service": "echo", "rules": [{"backendRefs": [{"name": "echo-v1"}]}]}),
            "port is required when the backend is a Service",
        ),
        (
            serde_json::json!({"service": "echo", "rules": [{"filters": [
                {"type": "RequestRedirect", "requestRedirect": {"statusCode": 302}},
                {"type": "URLRewrite", "urlRewrite": {"hostname": "a"}}]}]}),
            "a rule may not have both a RequestRedirect and a URLRewrite filter",
        ),
        (
            serde_json::json!({"service": "echo", "rules": [{"timeouts": {"request": "1s", "backendRequest": "5s"}}]}),
            "backendRequest must not be longer than request",
        ),
    ];
    for (i, (spec, message)) in refused.into_iter().enumerate() {
        let error = api
            .create(&PostParams::default(), &target(&format!("bad-{i}"), spec)?)
            .await
            .expect_err("the API server refuses it");
        assert!(
            error.to_string().contains(message),
            "refusal {i}: want {message:?} in {error}"
        );
    }

    let good = target(
        "echo",
        serde_json::json!({"service": "echo", "rules": [{"backendRefs": [{"name": "echo-v1", "port": 8080}]}]}),
    )?;
    let _ = api.delete("echo", &Default::default()).await;
    api.create(&PostParams::default(), &good).await?;
    let change = serde_json::json!({"spec": {"service": "other"}});
    let error = api
        .patch("echo", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .expect_err("service is immutable");
    assert!(
        error.to_string().contains("service is immutable"),
        "{error}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_get_routetargets_shows_the_columns() -> Result<()> {
    let cluster = Cluster::get().await?;
    let api = setup(&cluster).await?;
    let _ = api.delete("columns", &Default::default()).await;
    api.create(
        &PostParams::default(),
        &target("columns", serde_json::json!({"service": "columns"}))?,
    )
    .await?;
    let status = serde_json::json!({"status": {
        "clusterIP": "10.96.7.7", "clusterIPs": ["10.96.7.7"], "portSummary": "80,8080", "routeCount": 2, "backendCount": 3,
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status("columns", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let table = cluster.kubectl(&["-n", NAMESPACE, "get", "rt", "columns"])?;
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "SERVICE",
            "CLUSTER-IP",
            "PORTS",
            "ROUTES",
            "BACKENDS",
            "ACCEPTED",
            "AGE"
        ]
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..7],
        [
            "columns",
            "columns",
            "10.96.7.7",
            "80,8080",
            "2",
            "3",
            "True"
        ],
        "{table}"
    );
    Ok(())
}
