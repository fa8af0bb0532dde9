//! The mesh keeps serving through what a production cluster goes through: a steady stream of
//! requests from a meshed pod to a route target (through capture, both proxies and mTLS) gets
//! no failure while the API server is down for 60 s and while every SVID is renewed.
//!
//! SVIDs live 240 s here (the chart's `ca.svidTTLSeconds`), so the proxies renew them at 120 s,
//! inside the stream, after the outage; a renewal that fails during the outage is retried, and
//! the certificate in use stays valid long enough for that.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::cases::RouteRef;
use aether_e2e::mesh::{
    Accounts, MESH_NS, TRUST_DOMAIN, client_pod, install, mesh_workloads, uninstall,
    unmesh_workloads, wait_accepted, wait_nodes_applied,
};
use anyhow::{Context, Result, bail};

const SVID_TTL_SECONDS: u64 = 240;
const STREAM: Duration = Duration::from_secs(150);
const QPS: u64 = 10;
const OUTAGE_STARTS: Duration = Duration::from_secs(15);
const OUTAGE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_survives_an_api_server_outage_and_svid_renewal() -> Result<()> {
    let cluster = Cluster::get().await?;
    let ttl = format!("ca.svidTTLSeconds={SVID_TTL_SECONDS}");
    install(&cluster, &["--set", &ttl]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let split = aether_e2e::conformance_dir().join("manifests/mesh-split.yaml");
    cluster.apply(&split)?;
    let route = RouteRef {
        kind: "HTTPRoute".into(),
        name: "mesh-split".into(),
        namespace: MESH_NS.into(),
        parent_ref: None,
    };
    wait_accepted(&cluster, std::slice::from_ref(&route)).await?;
    wait_nodes_applied(&cluster).await?;
    let issued_before = svids_issued(&cluster)?;

    let pod = client_pod(&cluster, MESH_NS, "app=echo,version=v1").await?;
    let count = (STREAM.as_secs() * QPS).to_string();
    let qps = QPS.to_string();
    let program = cluster.program("aether-echo");
    let program = program.to_string_lossy();
    let pid = cluster.container_pid(&pod, "echo")?.to_string();
    // The stream runs in the client pod's namespaces while the test breaks things around it.
    let stream = std::process::Command::new("nsenter")
        .args(["-t", &pid, "-n", "-m", "-u", "--"])
        .args([
            &*program,
            "client",
            "http://echo/v2",
            "--count",
            &count,
            "--qps",
            &qps,
        ])
        .args(["--timeout", "5s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;

    tokio::time::sleep(OUTAGE_STARTS).await;
    let apiserver = cluster.paths.state.join("run/kube-apiserver.pid");
    let apiserver_pid = std::fs::read_to_string(&apiserver)
        .with_context(|| format!("reading {}", apiserver.display()))?;
    kill(apiserver_pid.trim())?;
    let outage = Instant::now();
    eprintln!("stopped the API server for {OUTAGE:?}");
    tokio::time::sleep(OUTAGE).await;
    // The controller manager and the scheduler exit when they cannot renew their leases (a
    // supervisor restarts them in a real cluster); `up` starts whatever is not running. It is
    // retried, as a controller may still be exiting during the first attempt.
    let control_plane = cluster.paths.repo.join("tests/cluster/control-plane.sh");
    let mut restarted = false;
    for _ in 0..5 {
        restarted = std::process::Command::new(&control_plane)
            .arg("up")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?
            .success();
        if restarted {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if !restarted {
        bail!("cannot start the control plane again");
    }
    eprintln!("the API server is back after {:?}", outage.elapsed());

    let output = tokio::task::spawn_blocking(move || stream.wait_with_output()).await??;
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
    if !output.status.success()
        || exchanges.len() as u64 != STREAM.as_secs() * QPS
        || !failed.is_empty()
    {
        bail!(
            "the stream saw failures ({} of {} answered; exit {}): {:?}\n{}",
            exchanges.len(),
            count,
            output.status,
            failed.iter().take(10).collect::<Vec<_>>(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let issued_after = svids_issued(&cluster)?;
    // Each ServiceAccount on each node is renewed about once in the stream (at half of 240 s);
    // far more would be a renewal loop.
    let renewals = issued_after.saturating_sub(issued_before);
    if renewals == 0 || renewals > 20 {
        bail!(
            "{renewals} SVID renewals during the stream: expected a few ({issued_before} before, {issued_after} after)"
        );
    }
    eprintln!(
        "{} requests, none failed, through a {OUTAGE:?} API server outage and {} SVID renewals",
        exchanges.len(),
        renewals
    );

    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

fn kill(pid: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-TERM", pid])
        .status()?;
    if !status.success() {
        bail!("cannot stop process {pid}");
    }
    Ok(())
}

/// SVIDs the node proxies obtained so far, from their `/metrics` (on each node's address).
fn svids_issued(cluster: &Cluster) -> Result<u64> {
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
