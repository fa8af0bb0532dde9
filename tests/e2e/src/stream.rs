//! A steady stream of requests through the mesh, for the tests that break or rotate things
//! around it: a meshed pod of its own in the mesh namespace (ServiceAccount `stream`) runs the
//! echo client against the `mesh-split` route target's `/v2` (capture, both proxies, mTLS).
//! It is a pod, not a `kubectl exec`, so that it goes on while the API server is down; its
//! answers are read from its log at the end, request by request.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use aether_test_support::cases::RouteRef;
use aether_test_support::upstream;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::Value;

use crate::Cluster;
use crate::echo;
use crate::mesh::{ECHO_IMAGE, MESH_NS, TRUST_DOMAIN, wait_accepted, wait_nodes_applied};

const POD: &str = "stream";

/// Applies the conformance `mesh-split` route (echo: `/v1` to echo-v1, `/v2` to echo-v2) and
/// waits until every node has it. Returns its manifest, to delete it afterwards.
pub async fn apply_split(cluster: &Cluster) -> Result<PathBuf> {
    let split = upstream::release()?.manifest("mesh-split.yaml");
    cluster.apply(&split)?;
    let route = RouteRef {
        kind: "HTTPRoute".into(),
        name: "mesh-split".into(),
        namespace: MESH_NS.into(),
        parent_ref: None,
    };
    wait_accepted(cluster, std::slice::from_ref(&route)).await?;
    wait_nodes_applied(cluster).await?;
    Ok(split)
}

pub struct Stream {
    pods: Api<Pod>,
    count: u64,
    length: Duration,
}

impl Stream {
    /// Starts `qps` requests a second for `length` from a new pod, once it runs.
    pub async fn start(cluster: &Cluster, length: Duration, qps: u64) -> Result<Stream> {
        let count = length.as_secs() * qps;
        // The client's timeout bounds the whole run, not one request.
        let timeout = format!("{}s", length.as_secs() + 60);
        cluster.apply_text(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {POD}, namespace: {MESH_NS}}}\n"
        ))?;
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
        if pods.get_opt(POD).await?.is_some() {
            pods.delete(POD, &DeleteParams::default()).await?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while pods.get_opt(POD).await?.is_some() {
                if Instant::now() > deadline {
                    bail!("the previous stream pod is not gone");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        let manifest = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "namespace": MESH_NS, "labels": {"app": "stream"}},
            "spec": {
                "serviceAccountName": POD,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "client", "image": ECHO_IMAGE, "command": ["client"],
                    "args": ["http://echo/v2", "--count", count.to_string(), "--qps", qps.to_string(), "--timeout", timeout],
                }],
            },
        });
        cluster.apply_text(&manifest.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let phase = phase(&pods.get(POD).await?);
            if phase != "Pending" {
                break;
            }
            if Instant::now() > deadline {
                bail!("the stream pod did not start within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(Stream {
            pods,
            count,
            length,
        })
    }

    /// Waits for the end of the stream and checks that every request was answered 200 by
    /// echo-v2, which saw the stream pod's SPIFFE ID. Returns the number of requests.
    pub async fn expect_all_served(self, cluster: &Cluster) -> Result<usize> {
        let Stream {
            pods,
            count,
            length,
        } = self;
        let deadline = Instant::now() + length + Duration::from_secs(120);
        let pod = loop {
            let pod = pods.get(POD).await?;
            if matches!(phase(&pod).as_str(), "Succeeded" | "Failed") {
                break pod;
            }
            if Instant::now() > deadline {
                bail!("the stream pod did not finish");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let log = cluster.logs(&pod, "client")?;
        let exchanges = echo::parse(&log);
        let expected = format!("spiffe://{TRUST_DOMAIN}/ns/{MESH_NS}/sa/{POD}");
        let failed: Vec<String> = exchanges
            .iter()
            .filter(|e| {
                e.status != Some(200)
                    || !e.body.hostname.starts_with("echo-v2")
                    || e.body.identity().as_deref() != Some(expected.as_str())
            })
            .map(|e| format!("#{}: {:?} {:?}", e.index, e.status, e.body.hostname))
            .collect();
        let succeeded = phase(&pod) == "Succeeded";
        pods.delete(POD, &DeleteParams::default()).await?;
        if !succeeded || exchanges.len() as u64 != count || !failed.is_empty() {
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "the stream saw failures ({} of {count} answered; client {}): {:?}; last lines: {tail:?}",
                exchanges.len(),
                if succeeded { "succeeded" } else { "failed" },
                failed.iter().take(10).collect::<Vec<_>>(),
            );
        }
        Ok(exchanges.len())
    }
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// SVIDs the node proxies obtained so far, from each proxy's `/metrics` (through the API
/// server's proxy to the pod's admin port).
pub fn svids_issued(cluster: &Cluster) -> Result<u64> {
    let text = cluster.kubectl(&[
        "-n",
        "aether-system",
        "get",
        "pods",
        "-l",
        crate::mesh::PROXY_PODS,
        "-o",
        "json",
    ])?;
    let list: Value = serde_json::from_str(&text)?;
    let mut total = 0;
    for pod in list["items"].as_array().context("pod list")? {
        let name = pod["metadata"]["name"].as_str().context("pod name")?;
        let metrics = cluster.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/aether-system/pods/{name}:15020/proxy/metrics"),
        ])?;
        total += metrics
            .lines()
            .filter(|l| l.starts_with("aether_proxy_svid_requests_total{result=\"ok\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}
