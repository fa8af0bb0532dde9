//! Labelling a namespace meshes its running pods with no restart, unlabelling takes them out,
//! and a reinstall of aether meshes them again:
//! - under a steady stream from a pod on one node to a route target served on the other
//!   (echo-v2, with a route of its own), the
//!   namespace is labelled `aether.io/managed=true`: within 5 s the backend sees the caller's
//!   SPIFFE ID (new connections are mTLS); the label removed, within 5 s requests arrive
//!   direct again; no request fails and no pod restarts;
//! - each pod gets an Event, and the NodeConfigs list the captured pods;
//! - a pod whose network namespace the proxy cannot find gets an Event naming the cause;
//! - `helm uninstall` then `helm install` under a stream: no request fails, and the running pods
//!   are meshed again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aether_crds::NodeConfig;
use aether_e2e::echo::Exchange;
use aether_e2e::mesh::{ECHO_IMAGE, client, install, uninstall};
use aether_e2e::stream::Stream;
use aether_e2e::{Cluster, is_ready, node_of};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

const NS: &str = "e2e-enrolment";
/// Requests a second of the stream; its request `i` leaves about `i / QPS` s after it starts.
const QPS: u64 = 10;
const LABELLED_AT: Duration = Duration::from_secs(10);
const UNLABELLED_AT: Duration = Duration::from_secs(25);
const STREAM: Duration = Duration::from_secs(45);
/// Long enough to outlast an uninstall (each proxy serves its peers for seconds more), an
/// install and the pods' enrolment, with time left to see requests meshed again.
const REINSTALL_STREAM: Duration = Duration::from_secs(60);
/// The bound for a label change to take effect, and slack for the stream's own pace.
const WITHIN: Duration = Duration::from_secs(5);
const SLACK: Duration = Duration::from_secs(2);

fn workloads() -> String {
    let deployment = |version: &str, node: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: echo-{version}, namespace: {NS}}}\n\
             spec:\n  selector: {{matchLabels: {{app: echo, version: {version}}}}}\n  template:\n\
             \x20   metadata: {{labels: {{app: echo, version: {version}}}}}\n    spec:\n\
             \x20     serviceAccountName: echo-{version}\n      nodeSelector: {{kubernetes.io/hostname: {node}}}\n\
             \x20     containers: [{{name: echo, image: \"{ECHO_IMAGE}\", args: [--port=8080]}}]\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: echo-{version}, namespace: {NS}}}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: echo-{version}, namespace: {NS}}}\n\
             spec:\n  selector: {{app: echo, version: {version}}}\n  ports: [{{name: http, port: 80, targetPort: 8080, appProtocol: http}}]\n---\n"
        )
    };
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n{}{}\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: echo-v2, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: echo-v2, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: echo-v2, port: 80}}]}}]\n",
        deployment("v1", "node-1"),
        deployment("v2", "node-2"),
    )
}

async fn running_pods(cluster: &Cluster) -> Result<BTreeMap<String, String>> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    Ok(api
        .list(&ListParams::default().labels("app=echo"))
        .await?
        .items
        .into_iter()
        .filter(is_ready)
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
            )
        })
        .collect())
}

/// The pods every NodeConfig's status lists as captured.
async fn captured(cluster: &Cluster) -> Result<Vec<String>> {
    let api: Api<NodeConfig> = Api::all(cluster.client.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .flat_map(|c| c.status.map(|s| s.captured_pods).unwrap_or_default())
        .collect())
}

/// Waits until every echo pod of the namespace is listed as captured (or, with `want` false,
/// none is).
async fn wait_captured(
    cluster: &Cluster,
    pods: &BTreeMap<String, String>,
    want: bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = captured(cluster).await?;
        let all = pods
            .keys()
            .all(|name| listed.contains(&format!("{NS}/{name}")) == want);
        if all {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "NodeConfigs list {listed:?}; expected {} of {pods:?}",
                if want { "all" } else { "none" }
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The caller identities the backend saw for the stream's requests that left between `from` and
/// `to` after it started.
fn identities(exchanges: &[Exchange], from: Duration, to: Duration) -> Vec<Option<String>> {
    let index = |at: Duration| ((at.as_secs_f64() * QPS as f64) as usize).min(exchanges.len());
    exchanges[index(from)..index(to).max(index(from))]
        .iter()
        .map(|e| e.body.identity())
        .collect()
}

fn events(cluster: &Cluster, reason: &str) -> Result<String> {
    cluster.kubectl(&[
        "-n",
        NS,
        "get",
        "events",
        "--field-selector",
        &format!("reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.involvedObject.name}: {.message}{\"\\n\"}{end}",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_pods_join_and_leave_the_mesh_with_no_restart() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&workloads())?;
    for version in ["v1", "v2"] {
        cluster.rollout_status(NS, &format!("deployment/echo-{version}"))?;
    }
    let before = running_pods(&cluster).await?;

    // A pod whose network namespace the proxy cannot see: its mount under the node's
    // /run/netns is gone (the pod runs on, its processes hold the namespace).
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: hidden, namespace: {NS}}}\n\
         spec:\n  nodeName: node-2\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n"
    ))?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(60);
    let hidden = loop {
        let pod = pods.get("hidden").await?;
        if is_ready(&pod) {
            break pod;
        }
        if Instant::now() > deadline {
            bail!("the hidden pod did not start");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let netns = cluster
        .pod_netns(&hidden)?
        .context("the hidden pod's namespace")?;
    cluster.on_node_ok(&node_of(&hidden)?, &["ip", "netns", "delete", &netns])?;

    let stream =
        Stream::start_in(&cluster, NS, "http://echo-v2/", Some("node-1"), STREAM, QPS).await?;
    let started = Instant::now();
    tokio::time::sleep(LABELLED_AT).await;
    cluster.label_namespace(NS, "aether.io/managed=true")?;
    let labelled = started.elapsed();
    tokio::time::sleep(UNLABELLED_AT.saturating_sub(started.elapsed())).await;
    cluster.kubectl(&["label", "namespace", NS, "aether.io/managed-"])?;
    let unlabelled = started.elapsed();
    let identity = stream.identity();
    let exchanges = stream.finish(&cluster, "echo-v2").await?;
    eprintln!(
        "{} requests, none failed; labelled at {labelled:?}, unlabelled at {unlabelled:?}",
        exchanges.len()
    );

    let plain_before = identities(&exchanges, Duration::ZERO, labelled.saturating_sub(SLACK));
    let meshed = identities(&exchanges, labelled + WITHIN + SLACK, unlabelled);
    let plain_after = identities(&exchanges, unlabelled + WITHIN + SLACK, STREAM);
    if plain_before.iter().any(Option::is_some) || plain_before.is_empty() {
        bail!("before the label, requests went through the mesh: {plain_before:?}");
    }
    if meshed.is_empty()
        || meshed
            .iter()
            .any(|i| i.as_deref() != Some(identity.as_str()))
    {
        bail!(
            "from {WITHIN:?} after the label on, not every request carried {identity}: {meshed:?}"
        );
    }
    if plain_after.is_empty() || plain_after.iter().any(Option::is_some) {
        bail!(
            "from {WITHIN:?} after the label went, requests still went through the mesh: {plain_after:?}"
        );
    }
    let after = running_pods(&cluster).await?;
    if after != before {
        bail!("pods were replaced: {before:?} then {after:?}");
    }
    eprintln!(
        "running pods joined the mesh within {WITHIN:?} of the label and left it within {WITHIN:?} of its removal, none restarted"
    );

    for (reason, count) in [("Meshed", before.len()), ("Unmeshed", before.len())] {
        let seen = events(&cluster, reason)?;
        for name in before.keys() {
            if !seen.contains(&format!("{name}:")) {
                bail!("no {reason} Event on pod {name} (of {count}): {seen}");
            }
        }
    }
    let failed = events(&cluster, "MeshFailed")?;
    if !failed
        .lines()
        .any(|l| l.starts_with("hidden:") && l.contains("no network namespace under"))
    {
        bail!("no MeshFailed Event naming the cause on the hidden pod: {failed}");
    }
    eprintln!("each pod got an Event; the pod without a visible network namespace says why");

    // Meshed again, then a reinstall of aether under a stream: no request fails, and the
    // running pods come back into the mesh.
    cluster.label_namespace(NS, "aether.io/managed=true")?;
    wait_captured(&cluster, &before, true).await?;
    let stream = Stream::start_in(
        &cluster,
        NS,
        "http://echo-v2/",
        Some("node-1"),
        REINSTALL_STREAM,
        QPS,
    )
    .await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    uninstall(&cluster).await?;
    install(&cluster, &[]).await?;
    wait_captured(&cluster, &before, true).await?;
    let recaptured = started.elapsed();
    if recaptured + WITHIN + SLACK + Duration::from_secs(5) > REINSTALL_STREAM {
        bail!("the reinstall took {recaptured:?}, too long for the stream to show its end");
    }
    let identity = stream.identity();
    let exchanges = stream.finish(&cluster, "echo-v2").await?;
    let meshed_again = identities(&exchanges, recaptured + WITHIN + SLACK, REINSTALL_STREAM);
    if meshed_again.is_empty()
        || meshed_again
            .iter()
            .any(|i| i.as_deref() != Some(identity.as_str()))
    {
        bail!("after the reinstall, requests did not go through the mesh again: {meshed_again:?}");
    }
    if running_pods(&cluster).await? != before {
        bail!("the reinstall replaced pods");
    }
    eprintln!(
        "helm uninstall and install under a stream of {} requests: none failed, the running pods are meshed again ({recaptured:?} after the stream started), none restarted",
        exchanges.len()
    );

    // A namespace that is strict when its running pods join gets strict tables on them too:
    // plaintext from an unmeshed pod elsewhere is refused.
    cluster.kubectl(&["label", "namespace", NS, "aether.io/managed-"])?;
    wait_captured(&cluster, &before, false).await?;
    cluster.label_namespace(NS, "aether.io/mtls=strict")?;
    cluster.label_namespace(NS, "aether.io/managed=true")?;
    wait_captured(&cluster, &before, true).await?;
    const OUTSIDE: &str = "e2e-enrolment-outside";
    cluster.delete_namespaces(&[OUTSIDE])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OUTSIDE}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: outsider, namespace: {OUTSIDE}}}\n\
         spec:\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n"
    ))?;
    cluster.kubectl(&[
        "-n",
        OUTSIDE,
        "wait",
        "--for=condition=Ready",
        "pod/outsider",
        "--timeout=60s",
    ])?;
    let outsiders: Api<Pod> = Api::namespaced(cluster.client.clone(), OUTSIDE);
    let outsider = outsiders.get("outsider").await?;
    let v2 = pods
        .list(&ListParams::default().labels("app=echo,version=v2"))
        .await?
        .items;
    let v2_ip = aether_e2e::pod_ip(v2.first().context("an echo-v2 pod")?)?;
    let refused = client(&cluster, &outsider, &[format!("http://{v2_ip}:8080/")]).await;
    if refused.is_ok() {
        bail!("plaintext reached a pod enrolled in a strict namespace: {refused:?}");
    }
    eprintln!(
        "a pod enrolled in a strict namespace refuses plaintext from its first moment in the mesh"
    );
    cluster.kubectl(&["delete", "namespace", OUTSIDE, "--wait=false"])?;

    cluster.kubectl(&["delete", "namespace", NS, "--wait"])?;
    uninstall(&cluster).await?;
    Ok(())
}
