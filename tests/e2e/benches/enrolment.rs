//! Meshing running pods with no restart: 100 running pods on one node, in a namespace that is
//! then labelled `aether.io/managed=true`; the time from the label to every pod captured (as
//! the node's NodeConfig status lists them), and back to none once the label is removed. Run
//! (root): `cargo bench -p aether-e2e --bench enrolment`; starts the cluster if it is not
//! running, installs aether, and leaves it installed.

use std::time::{Duration, Instant};

use aether_crds::NodeConfig;
use aether_e2e::Cluster;
use aether_e2e::mesh::{ECHO_IMAGE, install};
use anyhow::{Result, bail};
use kube::api::Api;

const NS: &str = "bench-enrolment";
const PODS: usize = 100;
const NODE: &str = "node-1";

async fn captured(configs: &Api<NodeConfig>) -> Result<usize> {
    let config = configs.get(NODE).await?;
    Ok(config
        .status
        .map(|s| {
            s.captured_pods
                .iter()
                .filter(|p| p.starts_with(&format!("{NS}/")))
                .count()
        })
        .unwrap_or(0))
}

async fn time_until(configs: &Api<NodeConfig>, want: usize) -> Result<Duration> {
    let started = Instant::now();
    while captured(configs).await? != want {
        if started.elapsed() > Duration::from_secs(120) {
            bail!(
                "{} of {PODS} pods captured after 120 s",
                captured(configs).await?
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: pods, namespace: {NS}}}\n\
         spec:\n  replicas: {PODS}\n  selector: {{matchLabels: {{app: pods}}}}\n  template:\n\
         \x20   metadata: {{labels: {{app: pods}}}}\n    spec:\n\
         \x20     nodeSelector: {{kubernetes.io/hostname: {NODE}}}\n      terminationGracePeriodSeconds: 0\n\
         \x20     containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n"
    ))?;
    cluster.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deployment/pods",
        "--timeout=600s",
    ])?;
    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    if captured(&configs).await? != 0 {
        bail!("pods of the unlabelled namespace are captured");
    }
    cluster.kubectl(&["label", "namespace", NS, "aether.io/managed=true"])?;
    let meshed = time_until(&configs, PODS).await?;
    cluster.kubectl(&["label", "namespace", NS, "aether.io/managed-"])?;
    let unmeshed = time_until(&configs, 0).await?;
    cluster.kubectl(&["delete", "namespace", NS, "--wait=false"])?;
    println!(
        "{PODS} running pods on {NODE}: label -> every pod captured in {:.2} s (goal 5 s); label removed -> none captured in {:.2} s",
        meshed.as_secs_f64(),
        unmeshed.as_secs_f64()
    );
    Ok(())
}
