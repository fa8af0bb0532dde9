//! The operator against the real API server, running with exactly the RBAC of the chart:
//! GAMMA routes become RouteTargets with status, the routes get aether's status.parents,
//! every node gets its NodeConfig, and a bad route is refused without stopping it.

mod common;

use aether_crds::{NodeConfig, RouteTarget};
use aether_e2e::Cluster;
use aether_test_support::upstream;
use anyhow::{Context, Result};
use common::{MESH, condition, eventually, route_condition, setup, start};
use gateway_api::experimental::httproutes::HttpRoute;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};

#[tokio::test(flavor = "multi_thread")]
async fn routes_become_route_targets_with_status_and_node_configs() -> Result<()> {
    let cluster = Cluster::get().await?;
    let operator = start(setup(&cluster).await?);

    cluster.apply(&upstream::release()?.manifest("mesh-split.yaml"))?;
    let targets: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), MESH);
    let echo = eventually("RouteTarget echo accepted with both backends", || async {
        let Some(rt) = targets.get_opt("echo").await? else {
            return Ok(None);
        };
        let Some(status) = rt.status.clone() else {
            return Ok(None);
        };
        let ready = condition(&status.conditions, "Accepted") == Some(("True", "Accepted"))
            && status.backends.len() == 2;
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
    assert_eq!(
        condition(&status.conditions, "ResolvedRefs"),
        Some(("True", "ResolvedRefs"))
    );

    let routes: Api<HttpRoute> = Api::namespaced(cluster.client.clone(), MESH);
    let accepted = eventually("mesh-split Accepted", || {
        route_condition(&routes, "mesh-split", "Accepted")
    })
    .await?;
    assert_eq!(accepted, ("True".to_owned(), "Accepted".to_owned()));

    // Every node captures echo; the nodes running meshed pods of its namespace get its table.
    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    let cluster_ip = status.cluster_ip.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH);
    let client_nodes: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    for node in ["node-1", "node-2"] {
        let wants_table = client_nodes.contains(node);
        let config = eventually("NodeConfig capturing echo", || async {
            let config = configs.get_opt(node).await?;
            Ok(config.filter(|c| {
                c.spec
                    .capture_addresses
                    .contains(&format!("{cluster_ip}:80"))
                    && c.spec.tables.iter().any(|t| t.service == "echo") == wants_table
            }))
        })
        .await?;
        assert_eq!(
            config.spec.capture_count as usize,
            config.spec.capture_addresses.len()
        );
    }

    // A route with a bad regex is refused with a reason, and the operator keeps going.
    cluster.apply_text(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: bad-regex, namespace: gateway-conformance-mesh}\n\
         spec:\n  parentRefs: [{group: \"\", kind: Service, name: echo-v2}]\n  rules:\n  - matches: [{path: {type: RegularExpression, value: \"/(\"}}]\n\
         \x20   backendRefs: [{name: echo-v2, port: 80}]\n",
    )?;
    let refused = eventually("bad-regex refused", || {
        route_condition(&routes, "bad-regex", "Accepted")
    })
    .await?;
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
