//! A node whose containerd and kubelet stop: the node goes NotReady, its pods keep running
//! (their shims outlive containerd), and when both start again the node is Ready, the same pods
//! are back under it and still captured: their nft table is in place and a request through a
//! route target reaches its backend over mTLS, which sees the caller's identity.

use std::time::{Duration, Instant};

use aether_e2e::mesh::{
    Accounts, MESH_NS, TRUST_DOMAIN, client, client_pod, install, mesh_workloads, uninstall,
    unmesh_workloads,
};
use aether_e2e::stream::apply_split;
use aether_e2e::{Cluster, is_ready, node_of};
use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;

/// `tests/cluster/nodes.sh stop|start NODE COMPONENT`.
fn nodes_sh(cluster: &Cluster, args: &[&str]) -> Result<()> {
    let script = cluster.paths.repo.join("tests/cluster/nodes.sh");
    let status = std::process::Command::new(&script).args(args).status()?;
    if !status.success() {
        bail!("{} {} failed ({status})", script.display(), args.join(" "));
    }
    Ok(())
}

async fn wait_ready_status(cluster: &Cluster, node: &str, want: bool) -> Result<Duration> {
    let api: Api<Node> = Api::all(cluster.client.clone());
    let started = Instant::now();
    loop {
        let ready = api
            .get(node)
            .await?
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready == want {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!(
                "{node} did not become {} within 120 s",
                if want { "Ready" } else { "NotReady" }
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_runtime_and_kubelet_restart_keeps_its_pods_captured() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let split = apply_split(&cluster).await?;
    let pod = client_pod(&cluster, MESH_NS, "app=echo,version=v1").await?;
    let node = node_of(&pod)?;
    let uid = pod.metadata.uid.clone();

    for component in ["containerd", "kubelet"] {
        nodes_sh(&cluster, &["stop", &node, component])?;
    }
    let down = wait_ready_status(&cluster, &node, false).await?;
    eprintln!("{node} NotReady {down:?} after its containerd and kubelet stopped");
    for component in ["containerd", "kubelet"] {
        nodes_sh(&cluster, &["start", &node, component])?;
    }
    let up = wait_ready_status(&cluster, &node, true).await?;
    eprintln!("{node} Ready again {up:?} after they started");

    // The node controller marked the node's pods not Ready; its kubelet reports them again.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let again = pods.get(&name).await?;
        if again.metadata.uid != uid {
            bail!("the pod on {node} was replaced instead of kept");
        }
        if is_ready(&again) {
            break again;
        }
        if Instant::now() > deadline {
            bail!("the pod on {node} is not Ready again: {:?}", again.status);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    if !cluster
        .nft_in_pod(&again, &["list", "table", "inet", "aether"])?
        .status
        .success()
    {
        bail!("the pod on {node} lost its capture table");
    }
    let caller = format!("spiffe://{TRUST_DOMAIN}/ns/{MESH_NS}/sa/echo-v1");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = client(&cluster, &again, &["http://echo/v2".to_string()]).await;
        if let Ok(exchanges) = &answer
            && let Some(first) = exchanges.first()
            && first.status == Some(200)
            && first.body.hostname.starts_with("echo-v2")
            && first.body.identity().as_deref() == Some(caller.as_str())
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("after the restart, the pod's request did not go through the mesh: {answer:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("the pod on {node} kept its capture through the restart");

    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}
