//! Changes reach the status and the per-node configs: a route's backend changes, a backend
//! or the parent Service is deleted, references are missing or of the wrong kind, a pod
//! moves to another node, and a hand-written RouteTarget replaces a derived one.

mod common;

use aether_crds::{NodeConfig, RouteTarget};
use aether_e2e::Cluster;
use anyhow::Result;
use common::{MESH, condition, eventually, route_condition, setup, start};
use gateway_api::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};

const MOVES: &str = "aether-op-moves";
const FAR: &str = "aether-op-far";

fn route(name: &str, namespace: &str, parent: &str, backend: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: {parent}}}]\n  rules:\n  - backendRefs: [{backend}]\n"
    )
}

fn service(name: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  selector: {{app: echo, version: v1}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n"
    )
}

async fn backends(targets: &Api<RouteTarget>, name: &str) -> Result<Option<Vec<String>>> {
    let status = targets.get_opt(name).await?.and_then(|t| t.status);
    Ok(status.map(|s| s.backends.iter().map(|b| b.service.clone()).collect()))
}

async fn has_table(configs: &Api<NodeConfig>, node: &str, service: &str) -> Result<bool> {
    Ok(configs
        .get_opt(node)
        .await?
        .is_some_and(|c| c.spec.tables.iter().any(|t| t.service == service)))
}

async fn pinned_client(pods: &Api<Pod>, node: &str) -> Result<()> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "client", "annotations": {"aether.io/depends-on": format!("{FAR}/far")}},
        "spec": {"nodeName": node, "containers": [{"name": "echo", "image": "registry.k8s.io/gateway-api/echo-advanced:v1.5.1"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_show_up_in_status_and_node_configs() -> Result<()> {
    let cluster = Cluster::get().await?;
    let operator = start(setup(&cluster).await?);
    let targets: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), MESH);
    let routes: Api<HttpRoute> = Api::namespaced(cluster.client.clone(), MESH);
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), MESH);

    // A route's backend changes.
    cluster.apply_text(&route("changes", MESH, "echo", "{name: echo-v1, port: 80}"))?;
    eventually("echo -> echo-v1", || async {
        Ok(backends(&targets, "echo")
            .await?
            .filter(|b| *b == ["echo-v1"]))
    })
    .await?;
    cluster.apply_text(&route("changes", MESH, "echo", "{name: echo-v2, port: 80}"))?;
    eventually("echo -> echo-v2", || async {
        Ok(backends(&targets, "echo")
            .await?
            .filter(|b| *b == ["echo-v2"]))
    })
    .await?;

    // Missing backends and backends of the wrong kind.
    cluster.apply_text(&route(
        "missing-backend",
        MESH,
        "echo-v1",
        "{name: nope, port: 80}",
    ))?;
    cluster.apply_text(&route(
        "wrong-kind",
        MESH,
        "echo-v1",
        "{group: example.com, kind: Bucket, name: b, port: 80}",
    ))?;
    let missing = eventually("missing-backend", || {
        route_condition(&routes, "missing-backend", "ResolvedRefs")
    })
    .await?;
    assert_eq!(missing, ("False".to_owned(), "BackendNotFound".to_owned()));
    let wrong = eventually("wrong-kind", || {
        route_condition(&routes, "wrong-kind", "ResolvedRefs")
    })
    .await?;
    assert_eq!(wrong, ("False".to_owned(), "InvalidKind".to_owned()));
    let accepted = route_condition(&routes, "wrong-kind", "Accepted").await?;
    assert_eq!(
        accepted,
        Some(("True".to_owned(), "Accepted".to_owned())),
        "unresolved backends do not refuse the route"
    );

    // A backend Service is deleted.
    cluster.apply_text(&service("tmp-backend", MESH))?;
    cluster.apply_text(&route(
        "to-tmp",
        MESH,
        "echo-v2",
        "{name: tmp-backend, port: 80}",
    ))?;
    eventually("to-tmp resolved", || async {
        Ok(route_condition(&routes, "to-tmp", "ResolvedRefs")
            .await?
            .filter(|c| c.0 == "True"))
    })
    .await?;
    services
        .delete("tmp-backend", &DeleteParams::default())
        .await?;
    eventually("to-tmp unresolved", || async {
        Ok(route_condition(&routes, "to-tmp", "ResolvedRefs")
            .await?
            .filter(|c| c.1 == "BackendNotFound"))
    })
    .await?;

    // The parent Service is deleted.
    cluster.apply_text(&service("tmp-parent", MESH))?;
    cluster.apply_text(&route(
        "on-tmp",
        MESH,
        "tmp-parent",
        "{name: echo-v1, port: 80}",
    ))?;
    eventually("tmp-parent accepted", || async {
        let status = targets.get_opt("tmp-parent").await?.and_then(|t| t.status);
        Ok(status.filter(|s| condition(&s.conditions, "Accepted") == Some(("True", "Accepted"))))
    })
    .await?;
    services
        .delete("tmp-parent", &DeleteParams::default())
        .await?;
    eventually("tmp-parent not found", || async {
        let status = targets.get_opt("tmp-parent").await?.and_then(|t| t.status);
        Ok(status
            .filter(|s| condition(&s.conditions, "Accepted") == Some(("False", "ServiceNotFound"))))
    })
    .await?;
    let parent = eventually("on-tmp refused", || async {
        Ok(route_condition(&routes, "on-tmp", "Accepted")
            .await?
            .filter(|c| c.0 == "False"))
    })
    .await?;
    assert_eq!(parent.1, "ServiceNotFound");

    // A pod that depends on a target in another namespace moves from node-1 to node-2:
    // the target's table follows it.
    for ns in [MOVES, FAR] {
        let _ = cluster.kubectl(&["create", "namespace", ns]);
    }
    cluster.kubectl(&[
        "label",
        "--overwrite",
        "namespace",
        MOVES,
        "aether.io/managed=true",
    ])?;
    cluster.kubectl(&[
        "-n",
        MOVES,
        "wait",
        "--for=create",
        "serviceaccount/default",
        "--timeout=30s",
    ])?;
    cluster.apply_text(&service("far", FAR))?;
    cluster.apply_text(&route("far", FAR, "far", "{name: far, port: 80}"))?;
    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MOVES);
    pinned_client(&pods, "node-1").await?;
    eventually("far on node-1 only", || async {
        Ok((has_table(&configs, "node-1", "far").await?
            && !has_table(&configs, "node-2", "far").await?)
            .then_some(()))
    })
    .await?;
    pods.delete(
        "client",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await?;
    eventually("client gone", || async {
        Ok(pods.get_opt("client").await?.is_none().then_some(()))
    })
    .await?;
    pinned_client(&pods, "node-2").await?;
    eventually("far on node-2 only", || async {
        Ok((has_table(&configs, "node-2", "far").await?
            && !has_table(&configs, "node-1", "far").await?)
            .then_some(()))
    })
    .await?;

    // A hand-written RouteTarget for echo-v1 replaces the derived one.
    eventually("derived echo-v1", || async {
        Ok(targets.get_opt("echo-v1").await?)
    })
    .await?;
    cluster.apply_text(
        "apiVersion: aether.io/v1alpha1\nkind: RouteTarget\nmetadata: {name: handwritten, namespace: gateway-conformance-mesh}\n\
         spec:\n  service: echo-v1\n  rules:\n  - backendRefs: [{name: echo-v2, port: 80}]\n",
    )?;
    eventually("derived echo-v1 deleted", || async {
        Ok(targets.get_opt("echo-v1").await?.is_none().then_some(()))
    })
    .await?;
    // Its first status already comes from a model that has seen it: its own rules and the
    // Service's HTTPRoutes.
    let hand = eventually("handwritten status", || async {
        Ok(targets.get_opt("handwritten").await?.and_then(|t| t.status))
    })
    .await?;
    for (kind, name) in [
        ("RouteTarget", "handwritten"),
        ("HTTPRoute", "missing-backend"),
    ] {
        assert!(
            hand.routes.iter().any(|r| r.kind == kind && r.name == name),
            "{kind} {name} not in {:?}",
            hand.routes
        );
    }
    assert_eq!(hand.observed_generation, Some(1));

    for name in [
        "changes",
        "missing-backend",
        "wrong-kind",
        "to-tmp",
        "on-tmp",
    ] {
        routes.delete(name, &DeleteParams::default()).await?;
    }
    targets
        .delete("handwritten", &DeleteParams::default())
        .await?;
    for ns in [MOVES, FAR] {
        cluster.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    }
    assert!(!operator.is_finished(), "the operator is still running");
    operator.abort();
    Ok(())
}
