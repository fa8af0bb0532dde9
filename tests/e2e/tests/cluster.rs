//! The local cluster itself: the conformance base manifests run for real (scheduler,
//! controllers, node simulators, CNI), pods reach each other by pod IP, by ClusterIP
//! through kube-proxy and by name through CoreDNS, on one node and across nodes, and a
//! deleted pod leaves nothing behind.

use std::collections::BTreeSet;
use std::time::Duration;

use aether_e2e::{Cluster, conformance_dir};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const MESH: &str = "gateway-conformance-mesh";
/// The namespace of the pod deletion test, independent of the conformance manifests.
const SCRATCH: &str = "aether-e2e-cluster";
/// The namespace of the DaemonSet test.
const DAEMONS: &str = "aether-e2e-daemons";

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn ip_of(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

/// A client pod pinned to `node`, running the echo server so it is Ready like any pod.
async fn client_pod(cluster: &Cluster, namespace: &str, name: &str, node: &str) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let _ = pods
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    for _ in 0..100 {
        if pods.get_opt(name).await?.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"role": "test-client"}},
        "spec": {"nodeName": node, "containers": [{
            "name": "echo", "image": "registry.k8s.io/gateway-api/echo-advanced:v1.5.1", "args": ["--port=8080"]}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    for _ in 0..300 {
        let pod = pods.get(name).await?;
        if aether_e2e::is_ready(&pod) {
            return Ok(pod);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("client pod {name} on {node} did not become Ready")
}

/// Sends one HTTP request from inside `client` and returns the serving pod's name.
fn request(cluster: &Cluster, client: &Pod, url: &str) -> Result<String> {
    let echo = cluster.program("aether-echo");
    let output = cluster.exec(
        client,
        "echo",
        &[&echo.to_string_lossy(), "client", url, "--timeout", "5s"],
    )?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "request to {url} from {} failed: {stdout}{}",
            client.metadata.name.as_deref().unwrap_or(""),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report = aether_echo::report::parse(&stdout)
        .with_context(|| format!("parsing the answer of {url}: {stdout}"))?;
    let first = report
        .first()
        .with_context(|| format!("no answer from {url}"))?;
    if first.status != Some(200) {
        bail!("{url} answered {:?}: {:?}", first.status, first.error);
    }
    Ok(first.body.hostname.clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_base_runs_and_pods_reach_each_other() -> Result<()> {
    let cluster = Cluster::get().await?;
    cluster.apply(&conformance_dir().join("manifests/manifests.yaml"))?;
    let mesh = cluster
        .wait_ready(MESH, 2, Duration::from_secs(120))
        .await?;
    cluster
        .wait_ready(
            "gateway-conformance-mesh-consumer",
            1,
            Duration::from_secs(120),
        )
        .await?;

    let v1 = mesh
        .iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .starts_with("echo-v1")
        })
        .context("an echo-v1 pod")?;
    let v1_name = v1.metadata.name.clone().unwrap_or_default();

    // The EndpointSlice controller lists the simulator-reported pod IP.
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), MESH);
    let listed: BTreeSet<String> = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=echo-v1"))
        .await?
        .items
        .iter()
        .flat_map(|s| {
            s.endpoints
                .iter()
                .flatten()
                .flat_map(|e| e.addresses.clone())
        })
        .collect();
    assert!(
        listed.contains(&ip_of(v1)),
        "EndpointSlices of echo-v1 list {listed:?}, not the pod IP {}",
        ip_of(v1)
    );

    let services: Api<Service> = Api::namespaced(cluster.client.clone(), MESH);
    let cluster_ip = services
        .get("echo-v1")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("echo-v1 ClusterIP")?;

    let nodes = ["node-1", "node-2"];
    let same = client_pod(&cluster, MESH, "client-same-node", &node_of(v1)).await?;
    let other_node = nodes
        .iter()
        .find(|n| **n != node_of(v1))
        .context("a second node")?;
    let across = client_pod(&cluster, MESH, "client-other-node", other_node).await?;
    for client in [&same, &across] {
        for url in [
            format!("http://{}:8080/", ip_of(v1)),
            format!("http://{cluster_ip}:80/"),
            format!("http://echo-v1.{MESH}:80/"),
            "http://echo-v1/".to_owned(),
        ] {
            let served_by = request(&cluster, client, &url)?;
            assert_eq!(
                served_by,
                v1_name,
                "{url} from {}",
                client.metadata.name.as_deref().unwrap_or("")
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_pod_leaves_no_netns_and_no_endpoint() -> Result<()> {
    let cluster = Cluster::get().await?;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    if namespaces.get_opt(SCRATCH).await?.is_none() {
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": SCRATCH}}))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
    }
    let pod = client_pod(&cluster, SCRATCH, "doomed", "node-2").await?;
    let netns = Cluster::netns(&pod);
    assert!(
        netns.exists(),
        "{} exists while the pod runs",
        netns.display()
    );
    let pid = cluster.container_pid(&pod, "echo")?;

    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "doomed"},
        "spec": {"selector": {"role": "test-client"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))?;
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), SCRATCH);
    let _ = services.delete("doomed", &DeleteParams::default()).await;
    services.create(&PostParams::default(), &service).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), SCRATCH);
    let addresses = || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=doomed"))
            .await?;
        anyhow::Ok(
            list.items
                .iter()
                .flat_map(|s| {
                    s.endpoints
                        .iter()
                        .flatten()
                        .flat_map(|e| e.addresses.clone())
                })
                .collect::<BTreeSet<_>>(),
        )
    };
    let ip = ip_of(&pod);
    let mut listed = false;
    for _ in 0..100 {
        if addresses().await?.contains(&ip) {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(listed, "the pod's endpoint was never listed");

    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), SCRATCH);
    pods.delete("doomed", &DeleteParams::default()).await?;
    let mut gone = false;
    for _ in 0..300 {
        if pods.get_opt("doomed").await?.is_none()
            && !netns.exists()
            && !addresses().await?.contains(&ip)
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        gone,
        "pod object, netns {} or endpoint {ip} still there",
        netns.display()
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}/exe")).exists(),
        "the container process {pid} is still running"
    );
    services.delete("doomed", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_network_daemonset_runs_on_every_node() -> Result<()> {
    let cluster = Cluster::get().await?;
    let file =
        std::env::temp_dir().join(format!("aether-e2e-daemonset-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {DAEMONS}}}\n---\n\
             apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: agent, namespace: {DAEMONS}}}\n\
             spec:\n  selector: {{matchLabels: {{app: agent}}}}\n  template:\n    metadata: {{labels: {{app: agent}}}}\n\
             \x20   spec:\n      hostNetwork: true\n      containers:\n      - name: echo\n\
             \x20       image: registry.k8s.io/gateway-api/echo-advanced:v1.5.1\n        args: [\"--port=18080\"]\n\
             \x20       readinessProbe: {{tcpSocket: {{port: 18080}}, periodSeconds: 1}}\n"
        ),
    )?;
    cluster.apply(&file)?;
    std::fs::remove_file(&file)?;
    let pods = cluster
        .wait_ready(DAEMONS, 2, Duration::from_secs(60))
        .await?;
    let nodes: BTreeSet<String> = pods.iter().map(node_of).collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["node-1".to_owned(), "node-2".to_owned()])
    );
    for pod in &pods {
        // A host-network pod has its node's address and is served from there.
        let node_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .unwrap_or_default();
        assert_eq!(
            ip_of(pod),
            node_ip,
            "{}",
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let client = &pods[0];
        let served_by = request(&cluster, client, &format!("http://{node_ip}:18080/"))?;
        assert_eq!(
            served_by,
            node_of(pod),
            "a host-network pod's hostname is its node's"
        );
    }
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    namespaces.delete(DAEMONS, &DeleteParams::default()).await?;
    Ok(())
}
