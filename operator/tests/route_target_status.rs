//! A RouteTarget's status never says more than is true: one test per case, each in a
//! namespace of its own, against the real API server, with one operator running in-process
//! (as leader, with exactly its ServiceAccount's permissions) for the whole binary. Nothing runs
//! the node proxies here, so no node applies a NodeConfig unless a test plays one.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use aether_crds::{NodeConfig, RouteTarget};
use aether_e2e::Cluster;
use anyhow::{Context, Result, bail};
use common::{eventually, setup, start};
use kube::api::{Api, DeleteParams, Patch, PatchParams};

static OPERATOR: OnceLock<Result<(), String>> = OnceLock::new();

/// The shared cluster with the operator running, started once for all tests of the binary on
/// a runtime of its own (each test's runtime ends with the test).
async fn cluster() -> Result<Cluster> {
    tokio::task::spawn_blocking(|| {
        OPERATOR
            .get_or_init(|| {
                let (ready, started) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("a runtime for the operator");
                    runtime.block_on(async move {
                        let set_up = async {
                            let cluster = Cluster::get().await?;
                            setup(&cluster).await
                        };
                        match set_up.await {
                            Ok(client) => {
                                let _ = ready.send(Ok(()));
                                let _ = start(client).await;
                            }
                            Err(e) => {
                                let _ = ready.send(Err(format!("{e:#}")));
                            }
                        }
                    });
                });
                started
                    .recv()
                    .unwrap_or_else(|_| Err("the operator thread ended".into()))
            })
            .clone()
    })
    .await?
    .map_err(anyhow::Error::msg)?;
    Cluster::get().await
}

/// A fresh namespace with a Service `web` (selecting pods `app=web`, none of which exist
/// unless a test makes them).
fn namespace(cluster: &Cluster, ns: &str) -> Result<()> {
    cluster.kubectl(&[
        "delete",
        "namespace",
        ns,
        "--ignore-not-found",
        "--wait",
        "--timeout=120s",
    ])?;
    cluster.kubectl(&["create", "namespace", ns])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {ns}}}\n\
         spec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n"
    ))
}

fn route_target(ns: &str, name: &str, service: &str, rules: &str) -> String {
    format!(
        "apiVersion: aether.io/v1alpha1\nkind: RouteTarget\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  service: {service}\n  rules: {rules}\n"
    )
}

/// Waits until `name`'s condition `kind` has `status` and `reason`, for its current
/// generation; returns the message.
async fn wait_condition(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    kind: &str,
    want: (&str, &str),
) -> Result<String> {
    let api: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), ns);
    let mut last = None;
    for _ in 0..150 {
        if let Some(rt) = api.get_opt(name).await? {
            let generation = rt.metadata.generation;
            let condition = rt
                .status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .find(|c| c.type_ == kind);
            if let Some(c) = &condition
                && (c.status.as_str(), c.reason.as_str()) == want
                && c.observed_generation == generation
            {
                return Ok(c.message.clone());
            }
            last = condition;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("timed out waiting for {ns}/{name} {kind}={want:?}; last: {last:?}")
}

/// The Warning events on a RouteTarget with `reason`.
fn warnings(cluster: &Cluster, ns: &str, name: &str, reason: &str) -> Result<String> {
    cluster.event_messages(
        ns,
        &format!("involvedObject.name={name},involvedObject.kind=RouteTarget,reason={reason},type=Warning"),
    )
}

fn backend(name: &str) -> String {
    format!("[{{backendRefs: [{{name: {name}, port: 80}}]}}]")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_regex_is_refused_with_the_rule_named_and_an_event() -> Result<()> {
    const NS: &str = "rt-status-regex";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    let rules = "[{matches: [{path: {type: RegularExpression, value: \"([\"}}], backendRefs: [{name: web, port: 80}]}]";
    cluster.apply_text(&route_target(NS, "web", "web", rules))?;
    let message = wait_condition(
        &cluster,
        NS,
        "web",
        "Accepted",
        ("False", "UnsupportedValue"),
    )
    .await?;
    assert!(
        message.contains("rule 0") && message.contains("invalid regular expression"),
        "{message}"
    );
    let events = eventually("the Warning event", || async {
        let events = warnings(&cluster, NS, "web", "UnsupportedValue")?;
        Ok((!events.is_empty()).then_some(events))
    })
    .await?;
    assert!(events.contains("rule 0"), "{events}");
    // Fixed, it is accepted.
    cluster.apply_text(&route_target(NS, "web", "web", &backend("web")))?;
    wait_condition(&cluster, NS, "web", "Accepted", ("True", "Accepted")).await?;
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicting_and_unimplemented_filters_are_refused_at_admission() -> Result<()> {
    const NS: &str = "rt-status-filters";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    for (rules, expected) in [
        (
            "[{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 302}}, {type: URLRewrite, urlRewrite: {hostname: x}}], backendRefs: [{name: web, port: 80}]}]",
            "both a RequestRedirect and a URLRewrite filter",
        ),
        (
            "[{filters: [{type: CORS}], backendRefs: [{name: web, port: 80}]}]",
            "Unsupported value: \"CORS\"",
        ),
    ] {
        let refused = cluster.apply_text(&route_target(NS, "web", "web", rules));
        let error = format!("{:#}", refused.err().context("the API server accepted it")?);
        assert!(error.contains(expected), "{error}");
    }
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_backend_and_one_without_ready_endpoints_are_named() -> Result<()> {
    const NS: &str = "rt-status-backends";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    cluster.apply_text(&route_target(NS, "web", "web", &backend("nothing")))?;
    let message = wait_condition(
        &cluster,
        NS,
        "web",
        "ResolvedRefs",
        ("False", "BackendNotFound"),
    )
    .await?;
    assert!(message.contains("nothing"), "{message}");
    // `web` exists but selects no pod.
    cluster.apply_text(&route_target(NS, "web", "web", &backend("web")))?;
    let message = wait_condition(
        &cluster,
        NS,
        "web",
        "ResolvedRefs",
        ("False", "NoReadyEndpoints"),
    )
    .await?;
    assert!(message.contains(&format!("{NS}/web:80")), "{message}");
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_in_another_namespace_resolves() -> Result<()> {
    const NS: &str = "rt-status-cross";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    // echo-v1 of the conformance namespace has ready pods; no ReferenceGrant is needed.
    let rules = format!(
        "[{{backendRefs: [{{name: echo-v1, namespace: {}, port: 8080}}]}}]",
        common::MESH
    );
    cluster.apply_text(&route_target(NS, "web", "web", &rules))?;
    wait_condition(&cluster, NS, "web", "Accepted", ("True", "Accepted")).await?;
    wait_condition(
        &cluster,
        NS,
        "web",
        "ResolvedRefs",
        ("True", "ResolvedRefs"),
    )
    .await?;
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn of_two_route_targets_for_one_service_the_oldest_is_in_force_and_hands_over() -> Result<()>
{
    const NS: &str = "rt-status-conflict";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    cluster.apply_text(&route_target(NS, "first", "web", &backend("web")))?;
    wait_condition(&cluster, NS, "first", "Accepted", ("True", "Accepted")).await?;
    // creationTimestamp has a resolution of a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    cluster.apply_text(&route_target(NS, "second", "web", &backend("web")))?;
    let message =
        wait_condition(&cluster, NS, "second", "Accepted", ("False", "Conflicted")).await?;
    assert!(
        message.contains(&format!("RouteTarget {NS}/first is in force")),
        "{message}"
    );
    wait_condition(
        &cluster,
        NS,
        "second",
        "Programmed",
        ("False", "Conflicted"),
    )
    .await?;
    wait_condition(&cluster, NS, "first", "Accepted", ("True", "Accepted")).await?;
    let events = warnings(&cluster, NS, "second", "Conflicted")?;
    assert!(events.contains("first"), "{events}");

    let api: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), NS);
    api.delete("first", &DeleteParams::default()).await?;
    wait_condition(&cluster, NS, "second", "Accepted", ("True", "Accepted")).await?;
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_route_target_for_a_missing_service_is_not_accepted() -> Result<()> {
    const NS: &str = "rt-status-missing";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    cluster.apply_text(&route_target(NS, "ghost", "ghost", &backend("web")))?;
    let message = wait_condition(
        &cluster,
        NS,
        "ghost",
        "Accepted",
        ("False", "ServiceNotFound"),
    )
    .await?;
    assert!(message.contains(&format!("{NS}/ghost")), "{message}");
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn programmed_names_the_nodes_that_have_not_applied_it() -> Result<()> {
    const NS: &str = "rt-status-programmed";
    let cluster = cluster().await?;
    namespace(&cluster, NS)?;
    cluster.apply_text(&route_target(NS, "web", "web", &backend("web")))?;
    let message = wait_condition(&cluster, NS, "web", "Programmed", ("False", "Pending")).await?;
    assert!(
        message.contains("node-1") && message.contains("node-2"),
        "{message}"
    );

    // Playing node-1's proxy: it reports having applied every generation there will be, so
    // only node-2 lags.
    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    configs
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"appliedGeneration": 1_000_000}})),
        )
        .await?;
    let api: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), NS);
    let message = eventually("Programmed naming node-2 only", || async {
        let rt = api.get("web").await?;
        let message = rt
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Programmed" && c.status == "False")
            .map(|c| c.message)
            .filter(|m| !m.contains("node-1") && m.contains("node-2"));
        Ok(message)
    })
    .await?;
    assert!(message.contains("applied by 1 of 2 nodes"), "{message}");
    configs
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"appliedGeneration": null}})),
        )
        .await?;
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}
