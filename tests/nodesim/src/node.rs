//! The Node object and its heartbeats: a Lease renewed every 10 s and the Ready condition,
//! as the kubelet keeps them, so the node lifecycle controller treats the node as alive.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const LEASE_NAMESPACE: &str = "kube-node-lease";
const LEASE_SECONDS: i32 = 40;
const RENEW_EVERY: Duration = Duration::from_secs(10);
const STATUS_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub ip: String,
    pub pod_cidr: String,
}

fn status(info: &NodeInfo) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "status": {
            "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": info.ip}, {"type": "Hostname", "address": info.name}],
            "conditions": [
                condition("Ready", "True", "KubeletReady", "aether node simulator is posting ready status"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "simulated node"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "simulated node"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "simulated node"),
            ],
            "nodeInfo": {
                "machineID": info.name, "systemUUID": info.name, "bootID": info.name,
                "kernelVersion": "", "osImage": "aether local cluster", "containerRuntimeVersion": "aether-nodesim://0.1.0",
                "kubeletVersion": "v1.36.0", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }
    })
}

/// Creates the Node if it is missing and posts its status.
pub async fn register(client: &kube::Client, info: &NodeInfo) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(&info.name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": info.name, "labels": {
                "kubernetes.io/hostname": info.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
            "spec": {"podCIDR": info.pod_cidr, "podCIDRs": [info.pod_cidr]},
        }))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("registering Node {}", info.name))?;
    }
    nodes
        .patch_status(
            &info.name,
            &PatchParams::default(),
            &Patch::Merge(status(info)),
        )
        .await
        .with_context(|| format!("posting the status of Node {}", info.name))?;
    Ok(())
}

async fn renew_lease(client: &kube::Client, info: &NodeInfo) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let spec = LeaseSpec {
        holder_identity: Some(info.name.clone()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..Default::default()
    };
    match leases.get_opt(&info.name).await? {
        Some(mut lease) => {
            lease.spec = Some(spec);
            leases
                .replace(&info.name, &PostParams::default(), &lease)
                .await?;
        }
        None => {
            let node = Api::<Node>::all(client.clone()).get(&info.name).await?;
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(info.name.clone()),
                    owner_references: Some(vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: info.name.clone(),
                            uid: node.metadata.uid.unwrap_or_default(),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

/// Keeps the Lease and the Ready condition fresh until the task is dropped.
pub async fn heartbeat(client: kube::Client, info: NodeInfo) {
    let mut last_status = tokio::time::Instant::now();
    loop {
        if let Err(error) = renew_lease(&client, &info).await {
            tracing::warn!(node = %info.name, error = format!("{error:#}"), "cannot renew the node lease");
        }
        if last_status.elapsed() >= STATUS_EVERY {
            match register(&client, &info).await {
                Ok(()) => last_status = tokio::time::Instant::now(),
                Err(error) => {
                    tracing::warn!(node = %info.name, error = format!("{error:#}"), "cannot post node status")
                }
            }
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

/// Kubernetes' RFC 3339 time for status fields.
pub fn now() -> Time {
    Time(Timestamp::now())
}
