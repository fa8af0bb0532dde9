//! Control-plane faults under a steady stream of requests (a meshed pod to a route target,
//! through capture, both proxies and mTLS), each followed by a route change that must reach
//! every node:
//! - the operator's leader killed with SIGKILL (no lease release, no graceful stop): a leader
//!   is back (the restarted container, or the standby once the lease expires), and the change
//!   made while there was none is in every NodeConfig that routes the Service within 5 s of
//!   its first renewal;
//! - etcd killed and started again: the API server fails every request meanwhile; the change
//!   made after it is back converges.
//!
//! No request of the stream may fail: the data plane needs neither the operator nor the API
//! server from one moment to the next.
//!
//! Then a rolling update of the proxies' DaemonSet under a stream: each node's new proxy takes
//! over the old one's sockets, which drains, and no request may fail.
//!
//! Then a node proxy killed with SIGKILL under a stream of its node's pod: the kubelet restarts
//! it, the restarted proxy takes the sockets its holder kept, and only requests in flight at
//! the kill may fail (connections made meanwhile wait in the listeners' backlogs). It is the
//! pod's first crash: the kubelet restarts a container that crashed in the last 10 minutes
//! only after a back-off of 10 s or more.

use std::time::{Duration, Instant, SystemTime};

use aether_e2e::Cluster;
use aether_e2e::mesh::{
    Accounts, MESH_NS, get_proxy_pods, install, mesh_workloads, proxy_pod_field,
    replace_restarted_proxies, uninstall, unmesh_workloads, wait_nodes_applied,
};
use aether_e2e::process::{process_of, signal};
use aether_e2e::stream::{IN_FLIGHT, Stream, apply_split};
use anyhow::{Context, Result, bail};
use serde_json::Value;

const STREAM: Duration = Duration::from_secs(120);
const QPS: u64 = 10;
/// What the issue asks of a new leader: config converged this long after it took the lease.
const CONVERGED_AFTER_LEADER: Duration = Duration::from_secs(5);
const TIMEOUT: Duration = Duration::from_secs(90);
/// The proxy-kill stream: dense enough that a gap of a tenth of a second would fail requests.
const KILL_STREAM: Duration = Duration::from_secs(30);
const KILL_QPS: u64 = 20;
/// The rolling-update stream: long enough for both nodes' proxies to be replaced in turn.
const ROLLING_STREAM: Duration = Duration::from_secs(75);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mesh_rides_out_a_leader_kill_and_an_etcd_restart() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let split = apply_split(&cluster).await?;
    let stream = Stream::start(&cluster, STREAM, QPS).await?;

    a_killed_leader_is_replaced(&cluster).await?;
    an_etcd_restart_is_ridden_out(&cluster).await?;

    let served = stream.expect_all_served(&cluster).await?;
    eprintln!("{served} requests, none failed, through a leader kill and an etcd restart");
    a_rolling_update_of_the_proxies_fails_no_request(&cluster).await?;
    a_killed_proxy_loses_only_requests_in_flight(&cluster).await?;
    for name in ["fault-leader", "fault-etcd"] {
        cluster.kubectl(&["-n", MESH_NS, "delete", "httproute", name, "--wait"])?;
    }
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

async fn a_killed_leader_is_replaced(cluster: &Cluster) -> Result<()> {
    let leader = lease(cluster)?.0;
    let pid = process_of(&leader, "aether-operator")?;
    let killed = SystemTime::now();
    signal(pid, "KILL")?;
    eprintln!("killed the operator's leader {leader} (pid {pid})");
    // Made while no replica leads: the next leader's first pass must pick it up.
    let path = add_route(cluster, "fault-leader")?;
    let (holder, renewed) = eventually("a leader renewing the lease", || {
        let (holder, renewed) = lease(cluster)?;
        Ok((renewed > killed).then_some((holder, renewed)))
    })
    .await?;
    eventually("the route in every NodeConfig", || {
        Ok(in_every_node_config(cluster, &path)?.then_some(()))
    })
    .await?;
    let converged = SystemTime::now()
        .duration_since(renewed)
        .unwrap_or_default();
    let down = renewed.duration_since(killed).unwrap_or_default();
    eprintln!(
        "{holder} leads {down:?} after the kill; the route made meanwhile was in every NodeConfig {converged:?} after that"
    );
    if converged > CONVERGED_AFTER_LEADER {
        bail!("config converged {converged:?} after the new leader took over");
    }
    wait_nodes_applied(cluster).await
}

async fn an_etcd_restart_is_ridden_out(cluster: &Cluster) -> Result<()> {
    let pid_file = cluster.paths.state.join("run/etcd.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?;
    let pid: u32 = pid.trim().parse().context("etcd's pid file")?;
    signal(pid, "KILL")?;
    let stopped = Instant::now();
    eprintln!("killed etcd (pid {pid})");
    // Long enough for the API server's requests to fail and its watches to break.
    tokio::time::sleep(Duration::from_secs(10)).await;
    cluster.start_control_plane().await?;
    eprintln!("etcd is back after {:?}", stopped.elapsed());
    let path = add_route(cluster, "fault-etcd")?;
    let made = Instant::now();
    eventually(
        "the route in every NodeConfig after the etcd restart",
        || Ok(in_every_node_config(cluster, &path)?.then_some(())),
    )
    .await?;
    eprintln!(
        "a route made after the etcd restart was in every NodeConfig {:?} later",
        made.elapsed()
    );
    wait_nodes_applied(cluster).await
}

async fn a_rolling_update_of_the_proxies_fails_no_request(cluster: &Cluster) -> Result<()> {
    let before = proxy_pods(cluster)?;
    let stream = Stream::start(cluster, ROLLING_STREAM, KILL_QPS).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "rollout",
        "restart",
        "daemonset/aether-proxy",
    ])?;
    cluster.rollout_status("aether-system", "daemonset/aether-proxy")?;
    let after = eventually("one new proxy per node, the old ones gone", || {
        let pods = proxy_pods(cluster)?;
        let replaced = pods.len() == before.len() && pods.iter().all(|p| !before.contains(p));
        Ok(replaced.then_some(pods))
    })
    .await?;
    eprintln!(
        "the proxies {before:?} were replaced by {after:?} in {:?}",
        started.elapsed()
    );
    for pod in &after {
        let log = cluster.kubectl(&["-n", "aether-system", "logs", pod, "-c", "proxy"])?;
        if !log.contains("took over the running proxy's sockets") {
            bail!("{pod} did not take over its predecessor's sockets: {log}");
        }
    }
    let served = stream.expect_all_served(cluster).await?;
    eprintln!("{served} requests, none failed, through a rolling update of every proxy");
    Ok(())
}

/// The names of the proxies' pods, terminating ones included.
fn proxy_pods(cluster: &Cluster) -> Result<Vec<String>> {
    let names = get_proxy_pods(cluster, &["-o", "jsonpath={.items[*].metadata.name}"])?;
    Ok(names.split_whitespace().map(str::to_owned).collect())
}

async fn a_killed_proxy_loses_only_requests_in_flight(cluster: &Cluster) -> Result<()> {
    let node = "node-1";
    let proxy_of = |field: &str| proxy_pod_field(cluster, node, field);
    // The first crash is the one measured: a later one waits out the kubelet's back-off.
    replace_restarted_proxies(cluster)?;
    let stream = Stream::start_in(
        cluster,
        MESH_NS,
        "http://echo/v2",
        Some(node),
        KILL_STREAM,
        KILL_QPS,
    )
    .await?;
    tokio::time::sleep(KILL_STREAM / 4).await;
    let proxy = proxy_of("metadata.name")?;
    let pid = process_of(&proxy, "aether-proxy")?;
    signal(pid, "KILL")?;
    eprintln!("killed {node}'s proxy {proxy} (pid {pid})");
    let failed = stream.failures(cluster).await?;
    let sent = KILL_STREAM.as_secs() * KILL_QPS;
    eprintln!("{failed} of {sent} requests failed across {node}'s proxy kill");
    if failed > IN_FLIGHT {
        bail!("{failed} requests failed across {node}'s proxy kill: more than were in flight");
    }
    let log = cluster.kubectl(&["-n", "aether-system", "logs", &proxy, "-c", "proxy"])?;
    if !log.contains("took the sockets the holder kept") {
        bail!("the restarted proxy {proxy} did not take its holder's sockets: {log}");
    }
    cluster.rollout_status("aether-system", "daemonset/aether-proxy")
}

/// The operator's Lease: its holder, and when it was last renewed.
fn lease(cluster: &Cluster) -> Result<(String, SystemTime)> {
    let text = cluster.kubectl(&[
        "-n",
        "aether-system",
        "get",
        "lease",
        "aether-operator",
        "-o",
        "json",
    ])?;
    let lease: Value = serde_json::from_str(&text)?;
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .context("the lease has no holder")?
        .to_owned();
    let renewed: k8s_openapi::jiff::Timestamp = lease["spec"]["renewTime"]
        .as_str()
        .context("the lease was never renewed")?
        .parse()?;
    let renewed = SystemTime::UNIX_EPOCH
        + Duration::from_nanos(u64::try_from(renewed.as_nanosecond()).unwrap_or_default());
    Ok((holder, renewed))
}

/// Adds a route on the mesh namespace's `echo` for one more exact path; returns the path.
fn add_route(cluster: &Cluster, name: &str) -> Result<String> {
    let path = format!("/{name}");
    cluster.apply_text(&format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
  namespace: {MESH_NS}
spec:
  parentRefs:
  - group: \"\"
    kind: Service
    name: echo
  rules:
  - matches:
    - path:
        type: Exact
        value: {path}
    backendRefs:
    - name: echo-v1
      port: 80
"
    ))?;
    Ok(path)
}

/// Whether every NodeConfig that routes the mesh namespace's `echo` (the split's `/v2`; a node
/// gets only the tables its pods may dial) holds `path` too.
fn in_every_node_config(cluster: &Cluster, path: &str) -> Result<bool> {
    let text = cluster.kubectl(&["get", "nodeconfigs", "-o", "json"])?;
    let list: Value = serde_json::from_str(&text)?;
    let specs: Vec<String> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|config| config["spec"].to_string())
        .filter(|spec| spec.contains("\"/v2\""))
        .collect();
    let quoted = format!("\"{path}\"");
    Ok(!specs.is_empty() && specs.iter().all(|spec| spec.contains(&quoted)))
}

/// Polls `check` (errors count as not yet: the API server may be away) until it gives a value.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let last = match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        if Instant::now() > deadline {
            bail!("{what}: not within {TIMEOUT:?} (last error: {last:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
