//! Pod start latency of the local cluster: time from creating a pod to the pod being Ready
//! (scheduler, node simulator, CNI chain, process start, status report), for 20 pods
//! created one after another. Run: `cargo bench -p aether-e2e --bench pod_start` (as root;
//! starts the cluster if it is not running).

use std::time::{Duration, Instant};

use aether_e2e::{Cluster, is_ready};
use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};

const NAMESPACE: &str = "aether-bench-pod-start";
const PODS: usize = 20;

async fn start_one(pods: &Api<Pod>, name: &str) -> Result<Duration> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "echo", "image": "registry.k8s.io/gateway-api/echo-advanced:v1.5.1", "args": ["--port=8080"]}]},
    }))?;
    let started = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    while started.elapsed() < Duration::from_secs(60) {
        if pods.get_opt(name).await?.as_ref().is_some_and(is_ready) {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("pod {name} not Ready after 60 s")
}

#[tokio::main]
async fn main() -> Result<()> {
    let cluster = Cluster::get().await?;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    if namespaces.get_opt(NAMESPACE).await?.is_none() {
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}}))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await?;
        // Pods are refused until the namespace's default ServiceAccount exists.
        cluster.kubectl(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=create",
            "serviceaccount/default",
            "--timeout=30s",
        ])?;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let mut latencies = Vec::with_capacity(PODS);
    for i in 0..PODS {
        latencies.push(start_one(&pods, &format!("bench-{i}")).await?);
    }
    namespaces
        .delete(NAMESPACE, &DeleteParams::default())
        .await?;
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "pod start (create -> Ready), {PODS} pods: median {:.0} ms, p90 {:.0} ms, min {:.0} ms, max {:.0} ms",
        ms(latencies[PODS / 2]),
        ms(latencies[PODS * 9 / 10]),
        ms(latencies[0]),
        ms(latencies[PODS - 1])
    );
    Ok(())
}
