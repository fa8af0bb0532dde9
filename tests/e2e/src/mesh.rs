//! aether in the local cluster: installing the chart, meshing the conformance workloads,
//! waiting for configuration to reach every node, and running the echo client in a pod.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use aether_test_support::cases::RouteRef;
use aether_test_support::upstream;

use crate::echo::{self, Exchange, deployment_of};
use crate::{Cluster, is_ready};

/// The echo app of the conformance manifests (Istio's echo server and client).
pub const ECHO_IMAGE: &str = "registry.k8s.io/gateway-api/echo-advanced:v1.5.1";
pub const MESH_NS: &str = "gateway-conformance-mesh";
pub const CONSUMER_NS: &str = "gateway-conformance-mesh-consumer";
pub const TRUST_DOMAIN: &str = "cluster.local";
/// The proxies' pods.
pub const PROXY_PODS: &str = "app.kubernetes.io/name=aether-proxy";
/// How long configuration may take to reach every node (the upstream harness's bound).
pub const CONSISTENCY_TIMEOUT: Duration = Duration::from_secs(30);

/// How the workloads run: the upstream manifests, or one ServiceAccount per version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accounts {
    Upstream,
    PerVersion,
}

impl Accounts {
    /// The ServiceAccount of a pod of the conformance Deployments.
    pub fn of(self, pod: &str) -> String {
        match self {
            Accounts::Upstream => "default".into(),
            Accounts::PerVersion => deployment_of(pod).to_owned(),
        }
    }
}

/// `tests/cluster/install.sh` (helm upgrade --install) with extra helm arguments, then waits for
/// every node's proxy.
pub async fn install(cluster: &Cluster, helm_args: &[&str]) -> Result<()> {
    let script = cluster.paths.repo.join("tests/cluster/install.sh");
    let status = std::process::Command::new(&script)
        .args(helm_args)
        .status()?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    cluster.rollout_status("aether-system", "daemonset/aether-proxy")?;
    Ok(())
}

/// `helm uninstall`, waiting until every pod of the release is gone.
pub async fn uninstall(cluster: &Cluster) -> Result<()> {
    let status = std::process::Command::new(cluster.paths.helm())
        .arg("--kubeconfig")
        .arg(&cluster.paths.kubeconfig)
        .args(["uninstall", "aether", "-n", "aether-system", "--wait"])
        .status()?;
    if !status.success() {
        bail!("helm uninstall failed ({status})");
    }
    wait_settled(cluster, "aether-system", 0).await?;
    Ok(())
}

/// Applies the conformance base manifests of the pinned Gateway API release (namespaces,
/// echo Deployments and Services), labels both namespaces managed and (re)starts their
/// workloads under `accounts`, so every pod goes through the CNI chain with aether in it.
pub async fn mesh_workloads(cluster: &Cluster, accounts: Accounts) -> Result<()> {
    cluster.apply(&upstream::release()?.manifest("manifests.yaml"))?;
    for ns in [MESH_NS, CONSUMER_NS] {
        cluster.label_namespace(ns, "aether.io/managed=true")?;
    }
    let deployments = [
        (MESH_NS, "echo-v1"),
        (MESH_NS, "echo-v2"),
        (CONSUMER_NS, "echo-v1"),
    ];
    for (ns, deployment) in deployments {
        let account = match accounts {
            Accounts::Upstream => "default",
            Accounts::PerVersion => {
                cluster.apply_text(&format!(
                    "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {deployment}\n  namespace: {ns}\n"
                ))?;
                deployment
            }
        };
        let patch = json!({"spec": {"template": {
            // A new value every time, so the pods are recreated (and captured) in any case.
            "metadata": {"annotations": {"aether.io/test-restart": restart_stamp()}},
            "spec": {"serviceAccountName": account},
        }}});
        cluster.patch(ns, &format!("deployment/{deployment}"), "merge", &patch)?;
    }
    for (ns, deployment) in deployments {
        cluster.rollout_status(ns, &format!("deployment/{deployment}"))?;
    }
    // Only the conformance Deployments' pods: other tests may leave pods of their own here.
    for (ns, count) in [(MESH_NS, 2), (CONSUMER_NS, 1)] {
        wait_pods(cluster, ns, "app=echo", count).await?;
    }
    Ok(())
}

fn restart_stamp() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Waits until `ns` has exactly `count` pods, all Ready (old ones of a rollout gone).
pub async fn wait_settled(cluster: &Cluster, ns: &str, count: usize) -> Result<Vec<Pod>> {
    wait_pods(cluster, ns, "", count).await
}

/// Waits until `ns` has exactly `count` pods matching `selector`, all Ready.
pub async fn wait_pods(
    cluster: &Cluster,
    ns: &str,
    selector: &str,
    count: usize,
) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = api
            .list(&ListParams::default().labels(selector))
            .await?
            .items;
        if pods.len() == count && pods.iter().all(is_ready) {
            return Ok(pods);
        }
        if Instant::now() > deadline {
            bail!("{ns}: expected {count} Ready pods, have {}", pods.len());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until every route has `Accepted=True` from aether on each of its parents, for its
/// current generation.
pub async fn wait_accepted(cluster: &Cluster, routes: &[RouteRef]) -> Result<()> {
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    for route in routes {
        let resource = format!("{}.gateway.networking.k8s.io", route.kind.to_lowercase());
        loop {
            let text = cluster.kubectl(&[
                "-n",
                &route.namespace,
                "get",
                &resource,
                &route.name,
                "-o",
                "json",
            ])?;
            let object: Value = serde_json::from_str(&text)?;
            let parents = object["status"]["parents"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ours: Vec<&Value> = parents
                .iter()
                .filter(|p| p["controllerName"] == "aether.io/mesh")
                .collect();
            let accepted = !ours.is_empty()
                && ours.iter().all(|p| {
                    p["conditions"].as_array().into_iter().flatten().any(|c| {
                        c["type"] == "Accepted"
                            && c["status"] == "True"
                            && c["observedGeneration"] == object["metadata"]["generation"]
                    })
                });
            if accepted {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} {}/{}: {:?}",
                    route.kind,
                    route.namespace,
                    route.name,
                    ours
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Waits until the operator's per-node configs are stable and every proxy applied its own.
pub async fn wait_nodes_applied(cluster: &Cluster) -> Result<()> {
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    let mut previous = String::new();
    loop {
        let text = cluster.kubectl(&["get", "nodeconfigs", "-o", "json"])?;
        let list: Value = serde_json::from_str(&text)?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let state: Vec<(Value, Value)> = items
            .iter()
            .map(|i| {
                (
                    i["metadata"]["generation"].clone(),
                    i["status"]["appliedGeneration"].clone(),
                )
            })
            .collect();
        let applied = !items.is_empty() && state.iter().all(|(g, a)| g == a);
        let fingerprint = format!("{state:?}");
        // Applied twice in a row with nothing new: the operator has caught up too.
        if applied && fingerprint == previous {
            return Ok(());
        }
        previous = fingerprint;
        if Instant::now() > deadline {
            bail!("node configs not applied within {CONSISTENCY_TIMEOUT:?}: {state:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The client pod of a case: the first (by name) Ready pod matching its selector.
pub async fn client_pod(cluster: &Cluster, ns: &str, selector: &str) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let mut pods: Vec<Pod> = api
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods.into_iter()
        .next()
        .with_context(|| format!("no Ready pod {selector} in {ns}"))
}

/// Runs the conformance echo client in the client pod (`kubectl exec`, as the upstream suite
/// does). The client exits non-zero when a request gets no answer (refused, reset, timed out):
/// that is an error here, with what it printed.
pub async fn client(cluster: &Cluster, pod: &Pod, args: &[String]) -> Result<Vec<Exchange>> {
    tokio::task::block_in_place(|| run_client(cluster, pod, args))
}

/// [`client`], blocking the calling thread (for several clients at once on threads of their own).
pub fn run_client(cluster: &Cluster, pod: &Pod, args: &[String]) -> Result<Vec<Exchange>> {
    let mut argv = vec!["client"];
    argv.extend(args.iter().map(String::as_str));
    let output = cluster.exec(pod, "echo", &argv)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "client {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(echo::parse(&stdout))
}

/// Takes the conformance workloads away again (the next test applies them anew).
pub fn unmesh_workloads(cluster: &Cluster) -> Result<()> {
    cluster.delete_namespaces(&[MESH_NS, CONSUMER_NS])?;
    Ok(())
}

/// `kubectl get pods` of the node proxies, with `args` (a field selector, `-o ...`).
pub fn get_proxy_pods(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let mut argv = vec!["-n", "aether-system", "get", "pods", "-l", PROXY_PODS];
    argv.extend_from_slice(args);
    cluster.kubectl(&argv)
}

/// A field (a JSONPath below the pod, e.g. `metadata.name`) of the proxy pod on `node`.
pub fn proxy_pod_field(cluster: &Cluster, node: &str, field: &str) -> Result<String> {
    let value = get_proxy_pods(
        cluster,
        &[
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            &format!("jsonpath={{.items[0].{field}}}"),
        ],
    )?;
    if value.trim().is_empty() {
        bail!("no proxy pod on {node} (or no {field})");
    }
    Ok(value.trim().to_owned())
}

/// Replaces every proxy pod whose proxy container has restarted before, and waits for the
/// DaemonSet: the kubelet restarts a container that crashed in the last 10 minutes only after
/// a back-off of 10 s or more, so a test that crashes a proxy starts from fresh pods.
pub fn replace_restarted_proxies(cluster: &Cluster) -> Result<()> {
    let text = get_proxy_pods(cluster, &["-o", "json"])?;
    let list: Value = serde_json::from_str(&text)?;
    let mut replaced = false;
    for pod in list["items"].as_array().context("pod list")? {
        let restarts = pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == "proxy")
            .filter_map(|c| c["restartCount"].as_u64())
            .sum::<u64>();
        if restarts > 0 {
            let name = pod["metadata"]["name"].as_str().context("pod name")?;
            cluster.kubectl(&["-n", "aether-system", "delete", "pod", name, "--wait"])?;
            replaced = true;
        }
    }
    if replaced {
        cluster.rollout_status("aether-system", "daemonset/aether-proxy")?;
    }
    Ok(())
}

/// The resident memory of `nodes`' proxies, in KiB, in that order (read from /proc: the nodes
/// share this machine's PID namespace).
pub async fn proxy_rss(cluster: &Cluster, nodes: &[&str]) -> Result<Vec<u64>> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), "aether-system");
    let proxies = api
        .list(&ListParams::default().labels(PROXY_PODS))
        .await?
        .items;
    let mut rss = Vec::new();
    for node in nodes {
        let pod = proxies
            .iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(*node))
            .with_context(|| format!("no proxy on {node}"))?;
        let pid = cluster.container_pid(pod, "proxy")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        rss.push(
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .context("no VmRSS")?,
        );
    }
    Ok(rss)
}
