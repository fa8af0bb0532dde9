//! Shared set-up of the operator's integration tests: the CRDs, the chart's RBAC, the
//! conformance workloads in managed namespaces, and the operator running in-process with
//! exactly its ServiceAccount's permissions.

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use aether_e2e::Cluster;
use aether_operator::controller::{self, Config};
use aether_operator::metrics::Metrics;
use aether_test_support::upstream;
use anyhow::{Result, bail};
use gateway_api::experimental::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use tokio::sync::watch;

pub const INSTALL: &str = "aether-system";
pub const MESH: &str = "gateway-conformance-mesh";

/// Installs what the operator needs and returns a client with the operator's permissions.
pub async fn setup(cluster: &Cluster) -> Result<kube::Client> {
    let repo = &cluster.paths.repo;
    let release = upstream::release()?;
    cluster.apply(&repo.join("charts/aether/crds"))?;
    cluster.apply_kustomization(&release.crds())?;
    cluster.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/httproutes.gateway.networking.k8s.io",
        "--timeout=30s",
    ])?;
    let _ = cluster.kubectl(&["create", "namespace", INSTALL]);
    cluster.apply_text(&cluster.chart_template(INSTALL, "templates/operator-rbac.yaml")?)?;
    cluster.apply(&release.manifest("manifests.yaml"))?;
    for ns in [MESH, "gateway-conformance-mesh-consumer"] {
        cluster.kubectl(&[
            "label",
            "--overwrite",
            "namespace",
            ns,
            "aether.io/managed=true",
        ])?;
    }
    cluster.client_as(INSTALL, "aether-operator").await
}

/// Runs the controller as leader until the returned task is aborted.
pub fn start(client: kube::Client) -> tokio::task::JoinHandle<()> {
    let (leader_tx, leader) = watch::channel(true);
    let (ready_tx, _ready) = watch::channel(Err("starting".to_string()));
    tokio::spawn(async move {
        let _leader = leader_tx;
        controller::run(
            client,
            Config {
                trust_domain: "cluster.local".into(),
            },
            leader,
            Arc::new(Metrics::new()),
            ready_tx,
        )
        .await;
    })
}

/// Polls `check` until it returns Some, for up to 30 s.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    for _ in 0..150 {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("timed out waiting for {what}")
}

pub fn condition<'a>(conditions: &'a [Condition], kind: &str) -> Option<(&'a str, &'a str)> {
    conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// aether's condition `kind` in a route's status.parents: (status, reason).
pub async fn route_condition(
    routes: &Api<HttpRoute>,
    name: &str,
    kind: &str,
) -> Result<Option<(String, String)>> {
    let Some(route) = routes.get_opt(name).await? else {
        return Ok(None);
    };
    let parents = route.status.map(|s| s.parents).unwrap_or_default();
    let ours = parents
        .iter()
        .find(|p| p.controller_name == "aether.io/mesh");
    Ok(ours
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == kind))
        .map(|c| (c.status.clone(), c.reason.clone())))
}
