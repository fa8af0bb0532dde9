//! The local cluster itself, without aether: every node is a real kubelet with containerd
//! (`kubectl get nodes` shows the runtime), pods run from the images the project builds and
//! reach each other by pod IP, by ClusterIP through kube-proxy and by name through CoreDNS, on
//! one node and across nodes; `kubectl logs`, `exec` and `port-forward` work through the API
//! server; a deleted pod leaves no container, network namespace or endpoint behind; a
//! host-network pod runs in its node's network with its node's name; an image missing from
//! the node gives the pod a clear event. Each test has a namespace of its own.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aether_e2e::echo;
use aether_e2e::mesh::ECHO_IMAGE;
use aether_e2e::{Cluster, node_of, pod_ip};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

/// Makes `namespace` anew (deleting what an earlier run left).
fn fresh_namespace(cluster: &Cluster, namespace: &str) -> Result<()> {
    cluster.delete_namespaces(&[namespace])?;
    cluster.kubectl(&["create", "namespace", namespace])?;
    // Pods are refused until the namespace's default ServiceAccount exists.
    cluster.kubectl(&[
        "-n",
        namespace,
        "wait",
        "--for=create",
        "serviceaccount/default",
        "--timeout=30s",
    ])?;
    Ok(())
}

/// An echo pod pinned to `node`, Ready.
async fn echo_pod(cluster: &Cluster, namespace: &str, name: &str, node: &str) -> Result<Pod> {
    cluster.apply_text(
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "echo", "image": ECHO_IMAGE}]},
        })
        .to_string(),
    )?;
    wait_pod_ready(cluster, namespace, name).await
}

async fn wait_pod_ready(cluster: &Cluster, namespace: &str, name: &str) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let pod = pods.get(name).await?;
        if aether_e2e::is_ready(&pod) {
            return Ok(pod);
        }
        if Instant::now() > deadline {
            bail!("pod {namespace}/{name} not Ready: {:?}", pod.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One request from `client` with the echo client; the name of the pod that answered.
fn request(cluster: &Cluster, client: &Pod, url: &str) -> Result<String> {
    let output = cluster.exec(client, "echo", &["client", url])?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "request to {url} from {:?} failed: {stdout}{}",
            client.metadata.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let exchanges = echo::parse(&stdout);
    let first = exchanges
        .first()
        .with_context(|| format!("no answer from {url}: {stdout}"))?;
    if first.status != Some(200) {
        bail!("{url} answered {:?}", first.status);
    }
    Ok(first.body.hostname.clone())
}

fn nodes() -> [&'static str; 2] {
    ["node-1", "node-2"]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_node_is_a_kubelet_with_containerd() -> Result<()> {
    let cluster = Cluster::get().await?;
    let api: Api<Node> = Api::all(cluster.client.clone());
    for name in nodes() {
        let node = api.get(name).await?;
        let info = node
            .status
            .and_then(|s| s.node_info)
            .context("node without nodeInfo")?;
        assert!(
            info.container_runtime_version.starts_with("containerd://"),
            "{name} runs {}",
            info.container_runtime_version
        );
        assert!(
            info.kubelet_version.starts_with("v1.36."),
            "{name}: {}",
            info.kubelet_version
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_reach_each_other_by_ip_cluster_ip_and_name_on_one_node_and_across() -> Result<()> {
    const NS: &str = "e2e-cluster-network";
    let cluster = Cluster::get().await?;
    fresh_namespace(&cluster, NS)?;
    let server = echo_pod(&cluster, NS, "server", "node-1").await?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {NS}}}\n\
         spec:\n  selector: {{app: server}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
    ))?;
    // The EndpointSlice controller lists the pod IP the kubelet reported.
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), NS);
    let ip = pod_ip(&server)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed: BTreeSet<String> = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
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
        if listed.contains(&ip) {
            break;
        }
        if Instant::now() > deadline {
            bail!("EndpointSlices of web list {listed:?}, not the pod IP {ip}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), NS);
    let cluster_ip = services
        .get("web")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("web ClusterIP")?;
    let same = echo_pod(&cluster, NS, "client-same-node", "node-1").await?;
    let across = echo_pod(&cluster, NS, "client-other-node", "node-2").await?;
    for client in [&same, &across] {
        for url in [
            format!("http://{ip}:8080/"),
            format!("http://{cluster_ip}/"),
            format!("http://web.{NS}.svc.cluster.local/"),
            "http://web/".to_owned(),
        ] {
            let served_by = request(&cluster, client, &url)?;
            assert_eq!(served_by, "server", "{url} from {:?}", client.metadata.name);
        }
    }
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_exec_and_port_forward_go_through_the_api_server() -> Result<()> {
    const NS: &str = "e2e-cluster-kubectl";
    let cluster = Cluster::get().await?;
    fresh_namespace(&cluster, NS)?;
    let pod = echo_pod(&cluster, NS, "target", "node-2").await?;

    let logs = cluster.logs(&pod, "echo")?;
    assert!(
        logs.contains("8080"),
        "the echo server's log does not mention its port: {logs}"
    );

    let output = cluster.exec(&pod, "echo", &["hostname"])?;
    assert!(output.status.success(), "exec: {output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "target");
    let failing = cluster.exec(&pod, "echo", &["sh", "-c", "exit 7"])?;
    assert_eq!(
        failing.status.code(),
        Some(7),
        "exec passes the exit code on"
    );

    // A free local port, then kubectl port-forward to the pod's 8080.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut forward = Command::new(&cluster.paths.kubectl)
        .arg("--kubeconfig")
        .arg(&cluster.paths.kubeconfig)
        .args([
            "-n",
            NS,
            "port-forward",
            "pod/target",
            &format!("{port}:8080"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(stream, "GET /forwarded HTTP/1.0\r\nHost: target\r\n\r\n")?;
            let mut text = String::new();
            stream.read_to_string(&mut text)?;
            Ok(text)
        })();
        match attempt {
            Ok(text) if text.contains("Hostname=target") => break text,
            _ if Instant::now() > deadline => {
                let _ = forward.kill();
                bail!("port-forward never answered: {attempt:?}");
            }
            _ => std::thread::sleep(Duration::from_millis(300)),
        }
    };
    forward.kill()?;
    forward.wait()?;
    assert!(answer.contains("URL=/forwarded"), "{answer}");
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_pod_leaves_no_container_netns_or_endpoint() -> Result<()> {
    const NS: &str = "e2e-cluster-deletion";
    let cluster = Cluster::get().await?;
    fresh_namespace(&cluster, NS)?;
    let pod = echo_pod(&cluster, NS, "doomed", "node-2").await?;
    let node = node_of(&pod)?;
    let ip = pod_ip(&pod)?;
    let netns = cluster
        .pod_netns(&pod)?
        .context("no network namespace on the node holds the running pod")?;
    let container = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .context("no container id")?;
    let container = container
        .strip_prefix("containerd://")
        .context("not a containerd container")?
        .to_owned();
    let tasks = || {
        cluster.on_node_ok(
            &node,
            &[
                "ctr",
                "--address",
                "/run/containerd/containerd.sock",
                "-n",
                "k8s.io",
                "tasks",
                "ls",
                "-q",
            ],
        )
    };
    assert!(
        tasks()?.contains(&container),
        "the container runs on {node}"
    );

    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: doomed, namespace: {NS}}}\n\
         spec:\n  selector: {{app: doomed}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
    ))?;
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), NS);
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
    let deadline = Instant::now() + Duration::from_secs(30);
    while !addresses().await?.contains(&ip) {
        if Instant::now() > deadline {
            bail!("the pod's endpoint was never listed");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    pods.delete("doomed", &DeleteParams::default()).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let namespaces = cluster.on_node_ok(&node, &["ip", "netns", "list"])?;
        let gone = pods.get_opt("doomed").await?.is_none()
            && !namespaces.contains(&netns)
            && !addresses().await?.contains(&ip)
            && !tasks()?.contains(&container);
        if gone {
            break;
        }
        if Instant::now() > deadline {
            bail!("pod object, container {container}, netns {netns} or endpoint {ip} still there");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_network_daemonset_runs_on_every_node_as_the_node() -> Result<()> {
    const NS: &str = "e2e-cluster-daemons";
    let cluster = Cluster::get().await?;
    fresh_namespace(&cluster, NS)?;
    cluster.apply_text(&format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: agent, namespace: {NS}}}\n\
         spec:\n  selector: {{matchLabels: {{app: agent}}}}\n  template:\n    metadata: {{labels: {{app: agent}}}}\n\
         \x20   spec:\n      hostNetwork: true\n      containers:\n      - name: echo\n\
         \x20       image: {ECHO_IMAGE}\n        args: [\"--port=18080\"]\n\
         \x20       readinessProbe: {{tcpSocket: {{port: 18080}}, periodSeconds: 1}}\n"
    ))?;
    let pods = cluster.wait_ready(NS, 2, Duration::from_secs(90)).await?;
    let on: BTreeSet<String> = pods.iter().map(node_of).collect::<Result<_>>()?;
    assert_eq!(on, BTreeSet::from(nodes().map(str::to_owned)));
    for pod in &pods {
        // A host-network pod has its node's address and its node's name.
        let node_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .unwrap_or_default();
        assert_eq!(pod_ip(pod)?, node_ip, "{:?}", pod.metadata.name);
        let served_by = request(&cluster, &pods[0], &format!("http://{node_ip}:18080/"))?;
        assert_eq!(
            served_by,
            node_of(pod)?,
            "a host-network pod's hostname is its node's"
        );
    }
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_missing_from_the_node_gives_a_clear_event() -> Result<()> {
    const NS: &str = "e2e-cluster-images";
    const IMAGE: &str = "localhost/aether-test/not-built:1";
    let cluster = Cluster::get().await?;
    fresh_namespace(&cluster, NS)?;
    cluster.apply_text(
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "missing", "namespace": NS},
            "spec": {"containers": [{"name": "app", "image": IMAGE}]},
        })
        .to_string(),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events =
            cluster.event_messages(NS, "involvedObject.name=missing,type=Warning,reason=Failed")?;
        if events.contains(IMAGE) {
            break;
        }
        if Instant::now() > deadline {
            bail!("no Failed event naming {IMAGE} within 60 s: {events}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    Ok(())
}
