//! One bad object never stops the others: with the operator running (in-process, with exactly
//! its ServiceAccount's permissions) against the real API server, routes whose RouteTarget
//! cannot be written (a parentRef into a namespace that does not exist, into one being
//! deleted, a parentRef name no RouteTarget may carry) each get a Warning Event saying why,
//! while a good route applied after them is programmed as usual: its RouteTarget is created and
//! accepted and every node's config captures it.

mod common;

use std::time::Duration;

use aether_crds::{NodeConfig, RouteTarget};
use aether_e2e::Cluster;
use anyhow::Result;
use common::{condition, eventually, setup, start};
use kube::api::Api;

const NS: &str = "op-isolation";
const HELD: &str = "op-isolation-terminating";

fn route(name: &str, parent_namespace: &str, parent: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: \"{parent}\", namespace: {parent_namespace}, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: web, namespace: {NS}, port: 80}}]}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn routes_that_cannot_be_written_leave_the_others_converging() -> Result<()> {
    let cluster = Cluster::get().await?;
    let operator = start(setup(&cluster).await?);
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {NS}}}\n\
         spec:\n  selector: {{app: web}}\n  ports: [{{port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: late, namespace: {NS}}}\n\
         spec:\n  selector: {{app: late}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
    ))?;
    // A namespace held in Terminating by a finalizer until the test lets it go.
    let release = || {
        cluster.patch(
            HELD,
            "configmap/hold",
            "merge",
            &serde_json::json!({"metadata": {"finalizers": null}}),
        )
    };
    let _ = release();
    cluster.delete_namespaces(&[HELD])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {HELD}}}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: hold, namespace: {HELD}, finalizers: [aether.io/test-hold]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: doomed, namespace: {HELD}}}\n\
         spec:\n  ports: [{{port: 80}}]\n"
    ))?;
    cluster.kubectl(&["delete", "namespace", HELD, "--wait=false"])?;

    for (name, namespace, parent) in [
        ("to-missing-namespace", "no-such-namespace", "web"),
        ("to-terminating-namespace", HELD, "doomed"),
        ("to-invalid-name", NS, "not.a.service.name"),
    ] {
        cluster.apply_text(&route(name, namespace, parent))?;
    }
    for name in [
        "to-missing-namespace",
        "to-terminating-namespace",
        "to-invalid-name",
    ] {
        let events = eventually(&format!("a TargetNotWritten Event on {name}"), || async {
            let events = cluster.event_messages(
                NS,
                &format!("involvedObject.name={name},reason=TargetNotWritten"),
            )?;
            Ok((!events.is_empty()).then_some(events))
        })
        .await?;
        assert!(
            events.contains("cannot write RouteTarget"),
            "{name}: {events}"
        );
    }

    // Applied after the bad ones, a good route still reaches every node.
    cluster.apply_text(&route("good", NS, "late"))?;
    let targets: Api<RouteTarget> = Api::namespaced(cluster.client.clone(), NS);
    eventually("RouteTarget late accepted", || async {
        let Some(rt) = targets.get_opt("late").await? else {
            return Ok(None);
        };
        let conditions = rt.status.map(|s| s.conditions).unwrap_or_default();
        Ok((condition(&conditions, "Accepted") == Some(("True", "Accepted"))).then_some(()))
    })
    .await?;
    let ip = cluster.kubectl(&[
        "-n",
        NS,
        "get",
        "service",
        "late",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    for node in ["node-1", "node-2"] {
        eventually(&format!("{node}'s config capturing {NS}/late"), || async {
            let config = configs.get(node).await?;
            let captured = config.spec.capture_addresses.contains(&format!("{ip}:80"));
            Ok(captured.then_some(()))
        })
        .await?;
    }

    release()?;
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    operator.abort();
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}
