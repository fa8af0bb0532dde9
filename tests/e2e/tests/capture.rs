//! Proof that aether captures for real, as a user would check it on their cluster, through the
//! Kubernetes API only (commands in pods, and a shell pod on each node for its network
//! namespaces and CNI config):
//! - a route target's ports that are not HTTP (raw TCP, TLS from the app) reach the backend
//!   through the mesh tunnel;
//! - with every proxy stopped, a request to a route target fails closed, a new meshed pod
//!   waits in ContainerCreating with aether-cni's error in its Events, and both recover by
//!   themselves once the proxies are back (which also remove the nodes' not-ready taint);
//! - a pod's nft table deleted by hand, aether-cni's entry dropped from a node's CNI config and
//!   the node's table of strict pods deleted are put back by the node's proxy, with an Event;
//! - strict mTLS refuses plaintext into meshed pods, running ones and new ones; from its own
//!   node a strict pod takes plaintext only as its probes send it (the kubelet's probes keep it
//!   Ready): the probes' requests through the inbound proxy, with no forged identity, and
//!   data-less connections to ports probed by connecting; NodePort traffic and UDP are refused;
//! - with the operator stopped and a node's NodeConfig deleted, that node's pods keep their
//!   capture set and routes, also across a restart of its proxy (which, without a CA, refuses
//!   rather than send plaintext);
//! - a route target whose table the caller's node lacks, with the operator stopped, gets 503
//!   rather than plaintext, and mTLS once the operator is back;
//! - the proxies' DaemonSet deleted with `--cascade=orphan` and its proxies stopped is not an
//!   uninstall: every pod stays captured, and a reinstall serves them again;
//! - `helm uninstall` leaves no table in any pod and no aether-cni on any node, and pods
//!   keep working unmeshed.

use std::time::{Duration, Instant};

use aether_core::names::{AGENT_NOT_READY_TAINT, MTLS_LABEL, MTLS_STRICT};
use aether_e2e::mesh::{
    Accounts, CONSISTENCY_TIMEOUT, CONSUMER_NS, ECHO_IMAGE, MESH_NS, PROXY_PODS, TRUST_DOMAIN,
    client, client_pod, install, mesh_workloads, uninstall, unmesh_workloads, wait_accepted,
    wait_nodes_applied, wait_pods,
};
use aether_e2e::stream::apply_split;
use aether_e2e::{Cluster, is_ready, pod_ip};
use aether_test_support::cases::RouteRef;
use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

const FAILURE_DELAY: Duration = Duration::from_secs(1);
/// The node's primary network config, which aether-cni chains itself into.
const CONFLIST: &str = "/etc/cni/net.d/10-aether-node.conflist";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_fails_closed_repairs_itself_is_strict_and_uninstalls_cleanly() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    opaque_ports_are_tunnelled_over_mtls(&cluster).await?;
    fails_closed_without_proxies(&cluster).await?;
    repairs_drift(&cluster).await?;
    missing_config_keeps_capture(&cluster).await?;
    a_target_without_its_table_fails_closed(&cluster).await?;
    orphaned_proxies_keep_capture(&cluster).await?;
    strict_mode_refuses_plaintext(&cluster).await?;
    uninstall_leaves_nothing(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

/// A route target's ports that are not HTTP carry bytes as they are, through the mesh: raw TCP
/// to echo's port `tcp` (9090) and TLS from the app to its port `https` (443, the backend's own
/// certificate) are answered by a backend that saw the connection come from its own address,
/// i.e. from its node's inbound proxy, which takes nothing but mTLS. Before, both were parsed
/// as HTTP (`400 Bad Request`, a failed handshake).
async fn opaque_ports_are_tunnelled_over_mtls(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    let from = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
    let ips: std::collections::BTreeMap<String, String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, pod_ip(p).ok()?)))
        .collect();
    for args in [
        vec!["tcp://echo:9090".to_string()],
        vec![
            "https://echo:443".to_string(),
            "--insecure-skip-verify".to_string(),
        ],
    ] {
        let answered = client(cluster, &from, &args).await?;
        eprintln!("{args:?}: {answered:?}");
        let Some(first) = answered.first() else {
            bail!("{args:?}: no answer");
        };
        let backend = &first.body.hostname;
        let own = ips.get(backend);
        if own.is_none() || own != Some(&first.body.ip) {
            bail!(
                "{args:?}: backend {backend} ({own:?}) saw the connection from {}, not from its own inbound proxy: {first:?}",
                first.body.ip
            );
        }
    }
    eprintln!("raw TCP and the app's own TLS to a route target went through the mesh tunnel");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

/// With every proxy stopped (their DaemonSet scheduled nowhere), a request to a route target
/// fails: the pod's table still redirects it to a listener that is gone. Without capture it
/// would have reached the Service through kube-proxy. A meshed pod created meanwhile cannot
/// start (aether-cni refuses it and says why) and starts by itself once the proxies are back;
/// restarted proxies reopen the listeners of every registered pod.
async fn fails_closed_without_proxies(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let v1 = vec!["http://echo/v1".to_string()];
    let served = client(cluster, &pod, &v1).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("before stopping the proxies, /v1 did not work: {served:?}");
    }

    let park = json!({"spec": {"template": {"spec": {"nodeSelector": {"aether.io/test-parked": "true"}}}}});
    cluster.patch("aether-system", "daemonset/aether-proxy", "merge", &park)?;
    wait_pods(cluster, "aether-system", PROXY_PODS, 0).await?;
    let failed = client(cluster, &pod, &v1).await;
    if let Ok(exchanges) = &failed {
        bail!("with no proxy running, a route-target request still got an answer: {exchanges:?}");
    }
    eprintln!("with the proxies stopped, a route-target request fails closed");

    let waiting = "created-without-proxy";
    cluster.apply_text(
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": waiting, "namespace": MESH_NS},
            "spec": {"containers": [{"name": "echo", "image": ECHO_IMAGE}]},
        })
        .to_string(),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = cluster.event_messages(
            MESH_NS,
            &format!("involvedObject.name={waiting},reason=FailedCreatePodSandBox"),
        )?;
        if events.contains("aether node proxy not reachable") {
            break;
        }
        if Instant::now() > deadline {
            bail!("no FailedCreatePodSandBox event with aether-cni's error: {events:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
    let state = pods.get(waiting).await?;
    let reason = state
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone());
    if is_ready(&state) || reason.as_deref().is_some_and(|r| r != "ContainerCreating") {
        bail!(
            "a meshed pod started without its node's proxy: {:?}",
            state.status
        );
    }
    eprintln!(
        "with the proxies stopped, a new meshed pod waits in ContainerCreating with aether-cni's error"
    );

    // Nodes come up tainted until their proxy can capture pods; the restarted proxies
    // remove the taint.
    let taint = format!("{AGENT_NOT_READY_TAINT}=true:NoSchedule");
    for node in ["node-1", "node-2"] {
        cluster.kubectl(&["taint", "nodes", node, &taint, "--overwrite"])?;
    }
    let unpark = json!([{"op": "remove", "path": "/spec/template/spec/nodeSelector/aether.io~1test-parked"}]);
    cluster.patch("aether-system", "daemonset/aether-proxy", "json", &unpark)?;
    cluster.rollout_status("aether-system", "daemonset/aether-proxy")?;
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let again = client(cluster, &pod, &v1).await;
        if let Ok(exchanges) = &again
            && exchanges.first().and_then(|e| e.status) == Some(200)
            && exchanges[0].body.hostname.starts_with("echo-v1")
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("restarted proxies did not serve the registered pod again: {again:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    eprintln!("restarted proxies reopened the listeners of the registered pods");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !is_ready(&pods.get(waiting).await?) {
        if Instant::now() > deadline {
            bail!("the pod created without a proxy did not start once the proxies were back");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    eprintln!("the pod created without a proxy started by itself once the proxies were back");
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let taints = cluster.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}: {.spec.taints[*].key}{'\\n'}{end}",
        ])?;
        let tainted: Vec<&str> = taints
            .lines()
            .filter(|l| l.contains(AGENT_NOT_READY_TAINT))
            .collect();
        if tainted.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("restarted proxies left the {AGENT_NOT_READY_TAINT} taint: {tainted:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    eprintln!("restarted proxies removed the {AGENT_NOT_READY_TAINT} taint from their nodes");
    pods.delete(waiting, &DeleteParams::default()).await?;
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

/// A pod's nft table deleted by hand, aether-cni's entry dropped from a node's CNI config (as
/// another network plugin rewriting its config would) and the node's table of strict pods
/// deleted are all put back by the node's proxy, and the pod gets a `CaptureRepaired` Event.
async fn repairs_drift(cluster: &Cluster) -> Result<()> {
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let node = aether_e2e::node_of(&pod)?;
    let deleted = cluster.nft_in_pod(&pod, &["delete", "table", "inet", "aether"])?;
    if !deleted.status.success() {
        bail!(
            "pod {:?} had no aether table to delete: {deleted:?}",
            pod.metadata.name
        );
    }
    let node_table = ["nft", "list", "table", "inet", "aether-node"];
    cluster.on_node_ok(&node, &["nft", "delete", "table", "inet", "aether-node"])?;
    let mut config: Value = serde_json::from_str(&cluster.on_node_ok(&node, &["cat", CONFLIST])?)?;
    if let Some(plugins) = config["plugins"].as_array_mut() {
        plugins.retain(|p| p["type"] != "aether-cni");
    }
    let write = format!("printf '%s' \"$1\" > {CONFLIST}");
    cluster.on_node_ok(
        &node,
        &[
            "sh",
            "-c",
            &write,
            "sh",
            &serde_json::to_string_pretty(&config)?,
        ],
    )?;

    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let table = cluster
            .nft_in_pod(&pod, &["list", "table", "inet", "aether"])?
            .status
            .success();
        let chained = cluster
            .on_node_ok(&node, &["cat", CONFLIST])?
            .contains("aether-cni");
        let node_table = cluster.on_node(&node, &node_table)?.status.success();
        if table && chained && node_table {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "drift not repaired within 40 s: table {table}, CNI entry {chained}, node table \
                 {node_table}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let events = cluster.event_messages(
        MESH_NS,
        &format!("involvedObject.name={name},reason=CaptureRepaired"),
    )?;
    if events.trim().is_empty() {
        bail!("no CaptureRepaired Event on pod {name}");
    }
    // And the repaired pod is served through the mesh again.
    let served = client(cluster, &pod, &["http://echo-v2/".to_string()]).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("after the repair, echo-v2 is not reachable: {served:?}");
    }
    eprintln!(
        "a deleted pod table, a dropped CNI entry and a deleted node table were repaired, with an \
         Event"
    );
    Ok(())
}

/// Deletes the proxy pods (of one node, or all) and waits until they are gone: each gets
/// SIGTERM, as in a rollout.
fn delete_proxies(cluster: &Cluster, node: Option<&str>) -> Result<()> {
    let on_node = node.map(|node| format!("spec.nodeName={node}"));
    let mut args = vec!["-n", "aether-system", "delete", "pod", "-l", PROXY_PODS];
    if let Some(selector) = &on_node {
        args.extend(["--field-selector", selector]);
    }
    args.extend(["--wait", "--timeout=120s"]);
    cluster.kubectl(&args)?;
    Ok(())
}

/// A node whose NodeConfig is gone (deleted while the operator is stopped, so nobody writes it
/// again) is not a node with nothing to capture: its pods' tables keep the last set, and so
/// does its proxy restarted meanwhile (from the set and the config it saved). The mesh keeps
/// serving; the restarted proxy, with no CA to get an SVID from, refuses instead of sending
/// plaintext, and serves over mTLS once the operator is back.
async fn missing_config_keeps_capture(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    wait_nodes_applied(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let node = aether_e2e::node_of(&pod)?;
    let table = |cluster: &Cluster| -> Result<String> {
        let listed = cluster.nft_in_pod(&pod, &["list", "table", "inet", "aether"])?;
        Ok(String::from_utf8_lossy(&listed.stdout).into_owned())
    };
    let before = table(cluster)?;
    if !before.contains("10.96.") {
        bail!(
            "pod {:?} captures no Service before the test: {before}",
            pod.metadata.name
        );
    }
    let replicas = stop_operator(cluster).await?;
    cluster.kubectl(&["delete", "nodeconfig", &node, "--wait"])?;
    // The proxy sees the deletion within its debounce; give it ample time to (wrongly) act.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let orphaned = table(cluster)?;
    if orphaned != before {
        bail!("{node}'s NodeConfig deleted, pod table changed:\n{before}\n---\n{orphaned}");
    }
    let served = client(cluster, &pod, &["http://echo/v1".to_string()]).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("without {node}'s NodeConfig, /v1 is not served: {served:?}");
    }
    delete_proxies(cluster, Some(&node))?;
    cluster.rollout_status("aether-system", "daemonset/aether-proxy")?;
    let restarted = table(cluster)?;
    if restarted != before {
        bail!(
            "{node}'s proxy restarted without a NodeConfig, pod table changed:\n{before}\n---\n{restarted}"
        );
    }
    // Its routes come from the config it saved; the CA is the stopped operator, so it has no
    // SVID, and refuses rather than send plaintext.
    let refused = client(cluster, &pod, &["http://echo/v1".to_string()]).await?;
    let first = refused.first();
    if first.and_then(|e| e.status) != Some(503)
        || !first.is_some_and(|e| e.body_lines.iter().any(|l| l.contains("no SVID")))
    {
        bail!(
            "{node}'s proxy restarted without a NodeConfig or a CA did not refuse /v1: {refused:?}"
        );
    }
    start_operator(cluster, &replicas)?;
    wait_nodes_applied(cluster).await?;
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let served = client(cluster, &pod, &["http://echo/v1".to_string()]).await;
        let meshed = served
            .as_ref()
            .ok()
            .and_then(|e| e.first())
            .is_some_and(|e| e.status == Some(200) && e.body.identity().is_some());
        if meshed {
            break;
        }
        if Instant::now() > deadline {
            bail!("with the operator back, /v1 is not served over mTLS: {served:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    eprintln!(
        "a deleted NodeConfig with the operator stopped left {node}'s pods captured, across a proxy restart that refused rather than send plaintext"
    );
    Ok(())
}

/// Scales the operator to none and waits until none runs; gives back its replica count.
async fn stop_operator(cluster: &Cluster) -> Result<String> {
    let replicas = cluster.kubectl(&[
        "-n",
        "aether-system",
        "get",
        "deployment/aether-operator",
        "-o",
        "jsonpath={.spec.replicas}",
    ])?;
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "scale",
        "deployment/aether-operator",
        "--replicas=0",
    ])?;
    wait_pods(
        cluster,
        "aether-system",
        "app.kubernetes.io/name=aether-operator",
        0,
    )
    .await?;
    Ok(replicas.trim().to_owned())
}

fn start_operator(cluster: &Cluster, replicas: &str) -> Result<()> {
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "scale",
        "deployment/aether-operator",
        &format!("--replicas={replicas}"),
    ])?;
    cluster.rollout_status("aether-system", "deployment/aether-operator")
}

/// A route target whose table the caller's node lacks (its namespace has no pod there, and
/// the operator that would add it on demand is stopped) fails closed: after the cold path's
/// wait the request gets 503 from the caller's proxy, never a plaintext connection to the
/// backend. With the operator back, the node's demand brings the table and the request goes
/// through the mesh.
async fn a_target_without_its_table_fails_closed(cluster: &Cluster) -> Result<()> {
    const FAR: &str = "e2e-capture-far";
    const NEAR: &str = "e2e-capture-near";
    cluster.delete_namespaces(&[FAR, NEAR])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {FAR}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: far, namespace: {FAR}, labels: {{app: far}}}}\n\
         spec:\n  nodeName: node-2\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\", args: [--port=8080]}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: far, namespace: {FAR}}}\n\
         spec:\n  selector: {{app: far}}\n  ports: [{{name: http, port: 80, targetPort: 8080, appProtocol: http}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: far, namespace: {FAR}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: far, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: far, port: 80}}]}}]\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NEAR}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: caller, namespace: {NEAR}}}\n\
         spec:\n  nodeName: node-1\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n"
    ))?;
    cluster.wait_ready(FAR, 1, Duration::from_secs(60)).await?;
    let caller = cluster
        .wait_ready(NEAR, 1, Duration::from_secs(60))
        .await?
        .remove(0);
    wait_accepted(
        cluster,
        &[RouteRef {
            kind: "HTTPRoute".into(),
            name: "far".into(),
            namespace: FAR.into(),
            parent_ref: None,
        }],
    )
    .await?;
    wait_nodes_applied(cluster).await?;
    let tables = cluster.kubectl(&[
        "get",
        "nodeconfig",
        "node-1",
        "-o",
        "jsonpath={.spec.tables[*].namespace}",
    ])?;
    if tables.contains(FAR) {
        bail!("node-1 already holds {FAR}'s table before any request: {tables}");
    }
    let replicas = stop_operator(cluster).await?;
    let url = format!("http://far.{FAR}/");
    let args = [url.clone(), "--timeout=20s".to_string()];
    let refused = client(cluster, &caller, &args).await;
    let status = refused
        .as_ref()
        .ok()
        .and_then(|e| e.first())
        .and_then(|e| e.status);
    if status != Some(503) {
        start_operator(cluster, &replicas)?;
        bail!("a route target without its table on the node was not refused with 503: {refused:?}");
    }
    eprintln!("a route target without its table on the caller's node gets 503, not plaintext");
    start_operator(cluster, &replicas)?;
    let identity = format!("spiffe://{TRUST_DOMAIN}/ns/{NEAR}/sa/default");
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let served = client(cluster, &caller, &args).await;
        let meshed = served
            .as_ref()
            .ok()
            .and_then(|e| e.first())
            .is_some_and(|e| {
                e.status == Some(200) && e.body.identity().as_deref() == Some(identity.as_str())
            });
        if meshed {
            break;
        }
        if Instant::now() > deadline {
            bail!("with the operator back, {url} was not served through the mesh: {served:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    eprintln!("with the operator back, the node's demand brought the table and mTLS");
    cluster.delete_namespaces(&[FAR, NEAR])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

/// Only `helm uninstall` uninstalls: with the DaemonSet deleted as orphaning and then its
/// proxies stopped (what a botched upgrade or a careless `kubectl delete` does), every pod
/// keeps its table and every node aether-cni; reinstalled, the proxies serve them again.
async fn orphaned_proxies_keep_capture(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let node = aether_e2e::node_of(&pod)?;
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "delete",
        "daemonset",
        "aether-proxy",
        "--cascade=orphan",
        "--wait",
    ])?;
    delete_proxies(cluster, None)?;
    let table = cluster.nft_in_pod(&pod, &["list", "table", "inet", "aether"])?;
    if !table.status.success() {
        bail!(
            "the proxies of an orphaned DaemonSet stopped and took pod {:?}'s table with them",
            pod.metadata.name
        );
    }
    if !cluster
        .on_node_ok(&node, &["cat", CONFLIST])?
        .contains("aether-cni")
    {
        bail!("the proxies of an orphaned DaemonSet stopped and took aether-cni out of {node}");
    }
    install(cluster, &[]).await?;
    wait_nodes_applied(cluster).await?;
    let served = client(cluster, &pod, &["http://echo/v1".to_string()]).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("after reinstalling, /v1 is not served: {served:?}");
    }
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    eprintln!("an orphaning DaemonSet delete and stopped proxies left every pod captured");
    Ok(())
}

/// The status a request to `url` from `from` was answered with; `None` when it got no answer
/// (a refused or reset connection makes the client fail).
async fn answered(cluster: &Cluster, from: &Pod, url: &str) -> Option<u16> {
    let exchanges = client(cluster, from, &[url.to_string()]).await;
    exchanges
        .ok()
        .and_then(|e| e.first().and_then(|x| x.status))
}

/// Waits until a request to `url` is answered (`Some(status)`) or refused (`None`).
async fn wait_answer(cluster: &Cluster, from: &Pod, url: &str, want: Option<u16>) -> Result<()> {
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let got = answered(cluster, from, url).await;
        if got == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{url}: expected {want:?}, still {got:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
}

/// Strict mTLS mode: with the namespace labelled `aether.io/mtls=strict`, plaintext to a
/// meshed pod's IP is refused, for the pods running then (the proxies change their tables)
/// and for a pod created then (the CNI plugin installs it strict), while requests through a
/// route target still arrive over mTLS; removing the label lets plaintext in again.
async fn strict_mode_refuses_plaintext(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    let from = client_pod(cluster, MESH_NS, "app=echo,version=v2").await?;
    let server = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let plaintext = format!("http://{}:8080/", pod_ip(&server)?);
    wait_answer(cluster, &from, &plaintext, Some(200)).await?;

    let label = format!("{MTLS_LABEL}={MTLS_STRICT}");
    cluster.kubectl(&["label", "namespace", MESH_NS, &label, "--overwrite"])?;
    wait_answer(cluster, &from, &plaintext, None).await?;
    wait_answer(cluster, &from, "http://echo/v1", Some(200)).await?;
    eprintln!("strict mode: plaintext into a running meshed pod is refused, mTLS gets through");

    cluster.kubectl(&["-n", MESH_NS, "rollout", "restart", "deployment/echo-v1"])?;
    cluster.rollout_status(MESH_NS, "deployment/echo-v1")?;
    wait_pods(cluster, MESH_NS, "app=echo,version=v1", 1).await?;
    let new = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let new_plaintext = format!("http://{}:8080/", pod_ip(&new)?);
    if let Some(status) = answered(cluster, &from, &new_plaintext).await {
        bail!("a pod created in strict mode answered plaintext with {status}");
    }
    wait_answer(cluster, &from, "http://echo/v1", Some(200)).await?;
    eprintln!("strict mode: a pod created in it refuses plaintext from its first packet");
    let node_port = strict_mode_admits_only_the_nodes_probes(cluster).await?;

    cluster.kubectl(&["label", "namespace", MESH_NS, &format!("{MTLS_LABEL}-")])?;
    wait_answer(cluster, &from, &new_plaintext, Some(200)).await?;
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    while node_connect(cluster, "node-1", &node_port)? != Reached::Connected {
        if Instant::now() > deadline {
            bail!("strict mode off: NodePort {node_port} is still refused");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    let probed = wait_pods(cluster, MESH_NS, "app=probed", 1)
        .await?
        .remove(0);
    if !udp_answered(cluster, &probed)? {
        bail!("strict mode off: a DNS query over UDP to the probed pod gets no answer");
    }
    cluster.kubectl(&[
        "-n",
        MESH_NS,
        "delete",
        "--wait",
        "pod/probed",
        "service/probed",
    ])?;
    eprintln!("strict mode off: plaintext is let in again, NodePort too");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum Reached {
    Connected,
    Refused(String),
}

/// What `script` printed (both streams) in `node`'s own network (its node shell).
fn node_sh(cluster: &Cluster, node: &str, script: &str) -> Result<String> {
    let shell = aether_e2e::node::shell(cluster, node)?;
    let output = cluster.exec(&shell, "shell", &["sh", "-c", &format!("{script} 2>&1")])?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A plaintext TCP connection from `node`'s own network (its node shell) to `to`.
fn node_connect(cluster: &Cluster, node: &str, to: &str) -> Result<Reached> {
    let (host, port) = to.rsplit_once(':').unwrap_or((to, ""));
    let text = node_sh(
        cluster,
        node,
        &format!("nc -w 2 {host} {port} </dev/null; echo exit=$?"),
    )?;
    Ok(if text.trim_end().ends_with("exit=0") {
        Reached::Connected
    } else {
        Reached::Refused(text)
    })
}

/// Whether a DNS query over UDP from `node-1` gets an answer from the probed pod's `dns`
/// container (CoreDNS's `whoami` on port 5353).
fn udp_answered(cluster: &Cluster, probed: &Pod) -> Result<bool> {
    let ip = pod_ip(probed)?;
    let script = format!("nslookup whoami.test {ip}:5353; echo exit=$?");
    Ok(node_sh(cluster, "node-1", &script)?
        .trim_end()
        .ends_with("exit=0"))
}

/// The image of the cluster's DNS, CoreDNS.
fn coredns_image(cluster: &Cluster) -> Result<String> {
    cluster.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "deployment",
        "coredns",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ])
}

/// In strict mode a pod whose readiness probe GETs /ready on 8080 and whose liveness probe
/// connects to 9000 becomes Ready: the kubelet's probes get in. From the pod's node, GET
/// /ready reaches the app through the inbound proxy without the caller identity it forged,
/// another path of 8080 gets 403, 9000 takes a connection but no data, and 9001, which no probe
/// names, is refused. Its NodePort, reached from the other node, is refused; so is UDP. Returns
/// that NodePort's `node-ip:port`.
async fn strict_mode_admits_only_the_nodes_probes(cluster: &Cluster) -> Result<String> {
    let dns = coredns_image(cluster)?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: probed, namespace: {MESH_NS}, labels: {{app: probed}}}}\n\
         spec:\n  nodeName: node-2\n  containers:\n  - name: echo\n    image: \"{ECHO_IMAGE}\"\n\
         \x20   args: [--port=8080, --port=9000, --port=9001]\n\
         \x20   readinessProbe: {{httpGet: {{path: /ready, port: 8080}}, periodSeconds: 1}}\n\
         \x20   livenessProbe: {{tcpSocket: {{port: 9000}}, periodSeconds: 1}}\n\
         \x20 - name: dns\n    image: \"{dns}\"\n    args: [-dns.port=5353]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: probed, namespace: {MESH_NS}}}\n\
         spec:\n  type: NodePort\n  selector: {{app: probed}}\n  ports: [{{name: tcp, port: 8080}}]\n"
    ))?;
    let probed = wait_pods(cluster, MESH_NS, "app=probed", 1)
        .await?
        .remove(0);
    let ip = pod_ip(&probed)?;
    eprintln!("strict mode: a pod probed by the kubelet over HTTP and TCP became Ready");

    let forged = node_sh(
        cluster,
        "node-2",
        &format!(
            "wget -q -O - --header 'x-aether-client-identity: spiffe://forged' http://{ip}:8080/ready"
        ),
    )?;
    if !forged.contains("/ready") || forged.contains("forged") {
        bail!("strict mode: the node's GET /ready with a forged identity got {forged:?}");
    }
    let other_path = node_sh(
        cluster,
        "node-2",
        &format!("wget -q -O - http://{ip}:8080/admin"),
    )?;
    if !other_path.contains("403") {
        bail!("strict mode: the node's GET /admin of a probed port got {other_path:?}");
    }
    let connect_only = node_connect(cluster, "node-2", &format!("{ip}:9000"))?;
    let data = node_sh(
        cluster,
        "node-2",
        &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 9000"),
    )?;
    let other_port = node_connect(cluster, "node-2", &format!("{ip}:9001"))?;
    if connect_only != Reached::Connected
        || data.contains("HTTP/")
        || other_port == Reached::Connected
    {
        bail!(
            "strict mode, from the pod's node: connect-only probe port {connect_only:?}, its data \
             answered {data:?}, other port {other_port:?}"
        );
    }
    eprintln!(
        "strict mode: the node's requests pass only as probes, without a forged identity; \
         a connect-only probe port takes no data"
    );

    let service: Value = serde_json::from_str(
        &cluster.kubectl(&["-n", MESH_NS, "get", "service", "probed", "-o", "json"])?,
    )?;
    let node_ip = cluster.node_ip("node-2")?;
    let node_port = format!("{node_ip}:{}", service["spec"]["ports"][0]["nodePort"]);
    if let Reached::Connected = node_connect(cluster, "node-1", &node_port)? {
        bail!("strict mode: NodePort {node_port} reached the pod in plaintext");
    }
    if udp_answered(cluster, &probed)? {
        bail!("strict mode: a DNS query over UDP from another node was answered");
    }
    eprintln!("strict mode: NodePort traffic and UDP are refused");
    Ok(node_port)
}

async fn uninstall_leaves_nothing(cluster: &Cluster) -> Result<()> {
    uninstall(cluster).await?;
    let mut leftovers = Vec::new();
    for ns in [MESH_NS, CONSUMER_NS] {
        let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        for pod in api.list(&ListParams::default()).await?.items {
            if cluster
                .nft_in_pod(&pod, &["list", "table", "inet", "aether"])?
                .status
                .success()
            {
                leftovers.push(format!("table inet aether in pod {:?}", pod.metadata.name));
            }
        }
    }
    for node in ["node-1", "node-2"] {
        let found = cluster.on_node_ok(
            node,
            &[
                "sh",
                "-c",
                "grep -l aether-cni /etc/cni/net.d/*.conflist; ls /opt/cni/bin | grep aether; true",
            ],
        )?;
        leftovers.extend(found.lines().map(|l| format!("{l} on {node}")));
        let node_table = ["nft", "list", "table", "inet", "aether-node"];
        if cluster.on_node(node, &node_table)?.status.success() {
            leftovers.push(format!("table inet aether-node on {node}"));
        }
    }
    if !leftovers.is_empty() {
        bail!("helm uninstall left aether behind: {leftovers:?}");
    }
    // Pods keep working unmeshed.
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let plain = client(cluster, &pod, &["http://echo/".to_string()]).await?;
    if plain.first().and_then(|e| e.status) != Some(200) {
        bail!("after uninstall, echo is not reachable: {plain:?}");
    }
    eprintln!("helm uninstall left no table in any pod and no aether-cni on any node");
    Ok(())
}
