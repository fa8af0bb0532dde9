//! The operator against the real API server, running with exactly the RBAC of the chart:
//! GAMMA routes become RouteTargets with status, the routes get aether's status.parents,
//! every node gets its NodeConfig, and changes and bad routes show up as they should.

use std::sync::Arc;
use std::time::Duration;

use aether_crds::{NodeConfig, RouteTarget};
use aether_e2e::{Cluster, conformance_dir};
use aether_operator::controller::{self, Config};
use aether_operator::metrics::Metrics;
use anyhow::{Context, Result, bail};
use gateway_api::httproutes::HttpRoute;
use kube::api::{Api, DeleteParams};
use tokio::sync::watch;

const INSTALL: &str = "aether-system";
const MESH: &str = "gateway-conformance-mesh";

/// Polls `check` until it returns Some, for up to 30 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> Result<T>
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

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    kind: &str,
) -> Option<&'a str> {
    conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.as_str())
}

async fn route_accepted(routes: &Api<HttpRoute>, name: &str) -> Result<Option<(String, String)>> {
    let Some(route) = routes.get_opt(name).await? else {
        return Ok(None);
    };
    let parents = route.status.map(|s| s.parents).unwrap_or_default();
    let ours = parents
        .iter()
        .find(|p| p.controller_name == "aether.io/mesh");
    Ok(ours
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == "Accepted"))
        .map(|c| (c.status.clone(), c.reason.clone())))
}

#[tokio::test(flavor = "multi_thread")]
async fn routes_become_route_targets_with_status_and_node_configs() -> Result<()> {
    let cluster = Cluster::get().await?;
    let repo = &cluster.paths.repo;
    cluster.apply(&repo.join("charts/aether/crds"))?;
    cluster.apply(&conformance_dir().join("../gateway-api-crds"))?;
    cluster.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/httproutes.gateway.networking.k8s.io",
        "--timeout=30s",
    ])?;
    let _ = cluster.kubectl(&["create", "namespace", INSTALL]);
    cluster.apply_text(&cluster.chart_template(INSTALL, "templates/operator-rbac.yaml")?)?;
    cluster.apply(&conformance_dir().join("manifests/manifests.yaml"))?;
    for ns in [MESH, "gateway-conformance-mesh-consumer"] {
        cluster.kubectl(&[
            "label",
            "--overwrite",
            "namespace",
            ns,
            "aether.io/managed=true",
        ])?;
    }

    let client = cluster.client_as(INSTALL, "aether-operator").await?;
    let (_leader_tx, leader) = watch::channel(true);
    let (ready_tx, _ready) = watch::channel(false);
    let operator = tokio::spawn(controller::run(
        client,
        Config {
            trust_domain: "cluster.local".into(),
        },
        leader,
        Arc::new(Metrics::new()),
        ready_tx,
    ));

    cluster.apply(&conformance_dir().join("manifests/mesh-split.yaml"))?;
    let targets: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), MESH);
    let echo = eventually("RouteTarget echo accepted with both backends", || async {
        let Some(rt) = targets.get_opt("echo").await? else {
            return Ok(None);
        };
        let Some(status) = rt.status.clone() else {
            return Ok(None);
        };
        let ready =
            condition(&status.conditions, "Accepted") == Some("True") && status.backends.len() == 2;
        Ok(ready.then_some(rt))
    })
    .await?;
    assert_eq!(
        echo.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("aether.io/derived"))
            .map(String::as_str),
        Some("true")
    );
    let status = echo.status.context("status")?;
    assert!(
        status
            .cluster_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.96.")),
        "{status:?}"
    );
    assert_eq!(
        status.port_summary.as_deref(),
        Some("80,8080,443,9090,7070")
    );
    assert_eq!(status.route_count, 1);
    for backend in &status.backends {
        assert_eq!(
            backend.identities,
            ["spiffe://cluster.local/ns/gateway-conformance-mesh/sa/default"],
            "{backend:?}"
        );
        assert!(backend.ready_endpoints >= 1, "{backend:?}");
    }
    assert_eq!(condition(&status.conditions, "ResolvedRefs"), Some("True"));

    let routes: Api<HttpRoute> = Api::namespaced(cluster.client.clone(), MESH);
    let accepted = eventually("mesh-split Accepted", || {
        route_accepted(&routes, "mesh-split")
    })
    .await?;
    assert_eq!(accepted, ("True".to_owned(), "Accepted".to_owned()));

    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    let cluster_ip = status.cluster_ip.clone().unwrap_or_default();
    for node in ["node-1", "node-2"] {
        let config = eventually("NodeConfig with echo", || async {
            let config = configs.get_opt(node).await?;
            Ok(config.filter(|c| c.spec.tables.iter().any(|t| t.service == "echo")))
        })
        .await?;
        assert!(
            config
                .spec
                .capture
                .iter()
                .any(|c| c.ip == cluster_ip && c.port == 80),
            "{node} captures echo:80"
        );
    }

    // A route with a bad regex is refused with a reason, and the operator keeps going.
    cluster.apply_text(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: bad-regex, namespace: gateway-conformance-mesh}\n\
         spec:\n  parentRefs: [{group: \"\", kind: Service, name: echo-v2}]\n  rules:\n  - matches: [{path: {type: RegularExpression, value: \"/(\"}}]\n\
         \x20   backendRefs: [{name: echo-v2, port: 80}]\n",
    )?;
    let refused = eventually("bad-regex refused", || route_accepted(&routes, "bad-regex")).await?;
    assert_eq!(refused, ("False".to_owned(), "UnsupportedValue".to_owned()));

    // Deleting the route deletes the derived RouteTarget.
    routes
        .delete("mesh-split", &DeleteParams::default())
        .await?;
    eventually("derived RouteTarget echo deleted", || async {
        Ok(targets.get_opt("echo").await?.is_none().then_some(()))
    })
    .await?;
    routes.delete("bad-regex", &DeleteParams::default()).await?;

    assert!(!operator.is_finished(), "the operator is still running");
    operator.abort();
    Ok(())
}
