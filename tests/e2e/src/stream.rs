//! A steady stream of requests through the mesh, for the tests that break or rotate things
//! around it: from the `echo-v1` pod of the mesh namespace to the `mesh-split` route target's
//! `/v2` (capture, both proxies, mTLS), checked request by request at the end.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::Cluster;
use crate::cases::RouteRef;
use crate::mesh::{MESH_NS, TRUST_DOMAIN, client_pod, wait_accepted, wait_nodes_applied};

/// Applies the conformance `mesh-split` route (echo: `/v1` to echo-v1, `/v2` to echo-v2) and
/// waits until every node has it. Returns its manifest, to delete it afterwards.
pub async fn apply_split(cluster: &Cluster) -> Result<PathBuf> {
    let split = crate::conformance_dir().join("manifests/mesh-split.yaml");
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
    child: Child,
    count: u64,
}

impl Stream {
    /// Starts `qps` requests a second for `length`, in the client pod's namespaces.
    pub async fn start(cluster: &Cluster, length: Duration, qps: u64) -> Result<Stream> {
        let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
        let count = length.as_secs() * qps;
        let pid = cluster.container_pid(&pod, "echo")?.to_string();
        let child = Command::new("nsenter")
            .args(["-t", &pid, "-n", "-m", "-u", "--"])
            .arg(cluster.program("aether-echo"))
            .args(["client", "http://echo/v2", "--timeout", "5s"])
            .args(["--count", &count.to_string(), "--qps", &qps.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the echo client")?;
        Ok(Stream { child, count })
    }

    /// Waits for the end of the stream and checks that every request was answered 200 by
    /// echo-v2, which saw the client's SPIFFE ID. Returns the number of requests.
    pub async fn expect_all_served(self) -> Result<usize> {
        let Stream { child, count } = self;
        let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let exchanges = aether_echo::report::parse(&stdout)
            .map_err(|e| anyhow::anyhow!("unreadable client output: {e}"))?;
        let expected = format!("spiffe://{TRUST_DOMAIN}/ns/{MESH_NS}/sa/echo-v1");
        let failed: Vec<String> = exchanges
            .iter()
            .filter(|e| {
                e.error.is_some()
                    || e.status != Some(200)
                    || !e.body.hostname.starts_with("echo-v2")
                    || e.body.identity.as_deref() != Some(expected.as_str())
            })
            .map(|e| {
                format!(
                    "#{}: {:?} {:?} {:?}",
                    e.index, e.status, e.error, e.body.hostname
                )
            })
            .collect();
        if !output.status.success() || exchanges.len() as u64 != count || !failed.is_empty() {
            bail!(
                "the stream saw failures ({} of {count} answered; exit {}): {:?}\n{}",
                exchanges.len(),
                output.status,
                failed.iter().take(10).collect::<Vec<_>>(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(exchanges.len())
    }
}

/// SVIDs the node proxies obtained so far, from their `/metrics` (on each node's address).
pub fn svids_issued(cluster: &Cluster) -> Result<u64> {
    let nodes = cluster.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.status.addresses[?(@.type==\"InternalIP\")].address}{\"\\n\"}{end}",
    ])?;
    let mut total = 0;
    for ip in nodes.lines().filter(|l| !l.is_empty()) {
        let text = http_get(&format!("{ip}:15020"), "/metrics")?;
        total += text
            .lines()
            .filter(|l| l.starts_with("aether_proxy_svid_requests_total{result=\"ok\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(total)
}

fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}
