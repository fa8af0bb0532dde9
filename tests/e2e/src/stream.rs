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
/// The echo client, its output cut to the lines read here (status, backend, identity, errors):
/// its whole output (about 20 lines a request) written as it exits can lose its tail in the
/// runtime's log (containerd/containerd#7289). The client's own status is the pod's.
const CLIENT: &str = "set -o pipefail; client \"$@\" 2>&1 | grep -iE '^\\[[0-9]+\\] StatusCode=|^\\[[0-9]+ body\\] (Hostname=|RequestHeader=x-aether-client-identity:)|error'";

/// Requests a SIGKILL of a proxy may fail: those it was serving at that moment (a stream's
/// requests take milliseconds, 50 ms apart or more; its client may hold two connections).
pub const IN_FLIGHT: u64 = 2;

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
    namespace: String,
    count: u64,
    length: Duration,
}

impl Stream {
    /// Starts `qps` requests a second for `length` to the mesh namespace's `http://echo/v2`,
    /// from a new pod there, once it runs.
    pub async fn start(cluster: &Cluster, length: Duration, qps: u64) -> Result<Stream> {
        Stream::start_in(cluster, MESH_NS, "http://echo/v2", None, length, qps).await
    }

    /// Starts `qps` requests a second for `length` to `url` from a new pod in `namespace`
    /// (ServiceAccount `stream`, on `node` if given), once it runs.
    pub async fn start_in(
        cluster: &Cluster,
        namespace: &str,
        url: &str,
        node: Option<&str>,
        length: Duration,
        qps: u64,
    ) -> Result<Stream> {
        let count = length.as_secs() * qps;
        // The client's timeout bounds the whole run, not one request.
        let timeout = format!("{}s", length.as_secs() + 60);
        cluster.apply_text(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {POD}, namespace: {namespace}}}\n"
        ))?;
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
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
        let mut manifest = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "namespace": namespace, "labels": {"app": "stream"}},
            "spec": {
                "serviceAccountName": POD,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "client", "image": ECHO_IMAGE, "command": ["sh", "-c", CLIENT, "sh"],
                    "args": [url, "--count", count.to_string(), "--qps", qps.to_string(), "--timeout", timeout],
                }],
            },
        });
        if let Some(node) = node {
            manifest["spec"]["nodeName"] = serde_json::json!(node);
        }
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
            namespace: namespace.to_owned(),
            count,
            length,
        })
    }

    /// The identity the stream's requests carry when they go through the mesh.
    pub fn identity(&self) -> String {
        format!("spiffe://{TRUST_DOMAIN}/ns/{}/sa/{POD}", self.namespace)
    }

    /// Waits for the end of the stream and returns every request's answer, in order; fails
    /// unless every request was answered 200 by a pod of `backend`.
    pub async fn finish(self, cluster: &Cluster, backend: &str) -> Result<Vec<echo::Exchange>> {
        let count = self.count;
        let (exchanges, succeeded, log) = self.answers(cluster).await?;
        check_answers(&exchanges, succeeded, &log, count, backend)?;
        Ok(exchanges)
    }

    /// Waits for the end of the stream and returns what each request got, in order, whatever
    /// it was; whether the client pod succeeded; its log.
    pub async fn answers(self, cluster: &Cluster) -> Result<(Vec<echo::Exchange>, bool, String)> {
        let deadline = Instant::now() + self.length + Duration::from_secs(120);
        let pod = loop {
            let pod = self.pods.get(POD).await?;
            if matches!(phase(&pod).as_str(), "Succeeded" | "Failed") {
                break pod;
            }
            if Instant::now() > deadline {
                bail!("the stream pod did not finish");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let log = cluster.logs(&pod, "client")?;
        let mut exchanges = echo::parse(&log);
        exchanges.sort_by_key(|e| e.index);
        let succeeded = phase(&pod) == "Succeeded";
        self.pods.delete(POD, &DeleteParams::default()).await?;
        Ok((exchanges, succeeded, log))
    }

    /// Waits for the end of the stream and returns how many of its requests failed. With none
    /// failed, checks every answer as [`Stream::expect_all_served`] does (with any error, the
    /// client prints no answer, only how many requests had one).
    pub async fn failures(self, cluster: &Cluster) -> Result<u64> {
        let (expected, count) = (self.identity(), self.count);
        let (exchanges, succeeded, log) = self.answers(cluster).await?;
        if succeeded {
            check_answers(&exchanges, succeeded, &log, count, "echo-v2")?;
            check_identity(&exchanges, &expected)?;
            return Ok(0);
        }
        failed_requests(&log).with_context(|| {
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            format!("the stream client failed without counting its errors: {tail:?}")
        })
    }

    /// Waits for the end of the stream and checks that every request was answered 200 by
    /// echo-v2, which saw the stream pod's SPIFFE ID. Returns the number of requests.
    pub async fn expect_all_served(self, cluster: &Cluster) -> Result<usize> {
        let expected = self.identity();
        let exchanges = self.finish(cluster, "echo-v2").await?;
        check_identity(&exchanges, &expected)?;
        Ok(exchanges.len())
    }
}

/// Every one of `count` requests answered 200 by a pod of `backend`, and the client succeeded.
fn check_answers(
    exchanges: &[echo::Exchange],
    succeeded: bool,
    log: &str,
    count: u64,
    backend: &str,
) -> Result<()> {
    let failed: Vec<String> = exchanges
        .iter()
        .filter(|e| e.status != Some(200) || !e.body.hostname.starts_with(backend))
        .map(|e| format!("#{}: {:?} {:?}", e.index, e.status, e.body.hostname))
        .collect();
    if !succeeded || exchanges.len() as u64 != count || !failed.is_empty() {
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        bail!(
            "the stream saw failures ({} of {count} answered; client {}): {:?}; last lines: {tail:?}",
            exchanges.len(),
            if succeeded { "succeeded" } else { "failed" },
            failed.iter().take(10).collect::<Vec<_>>(),
        );
    }
    Ok(())
}

/// Every request reached its backend with the caller's SPIFFE ID.
fn check_identity(exchanges: &[echo::Exchange], expected: &str) -> Result<()> {
    let unidentified: Vec<usize> = exchanges
        .iter()
        .filter(|e| e.body.identity().as_deref() != Some(expected))
        .map(|e| e.index)
        .collect();
    if !unidentified.is_empty() {
        bail!(
            "{} requests reached echo-v2 without the caller's identity, the first {:?}",
            unidentified.len(),
            &unidentified[..unidentified.len().min(10)]
        );
    }
    Ok(())
}

/// `N` of the stream client's closing `Error N/M requests had errors`.
fn failed_requests(log: &str) -> Option<u64> {
    let (_, after) = log.rsplit_once("Error ")?;
    let (count, _) = after.split_once('/')?;
    count.trim().parse().ok()
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
    let text = crate::mesh::get_proxy_pods(cluster, &["-o", "json"])?;
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
