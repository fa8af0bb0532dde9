//! The mesh keeps serving through what a production cluster goes through: a steady stream of
//! requests from a meshed pod to a route target (through capture, both proxies and mTLS) gets
//! no failure while the API server is down for 60 s and while every SVID is renewed.
//!
//! SVIDs live 240 s here (the chart's `ca.svidTTLSeconds`), so the proxies renew them at 120 s,
//! inside the stream, after the outage; a renewal that fails during the outage is retried, and
//! the certificate in use stays valid long enough for that.

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{Accounts, install, mesh_workloads, uninstall, unmesh_workloads};
use aether_e2e::stream::{Stream, apply_split, svids_issued};
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
    let split = apply_split(&cluster).await?;
    let issued_before = svids_issued(&cluster)?;
    // The stream runs in the client pod's namespaces while the test breaks things around it.
    let stream = Stream::start(&cluster, STREAM, QPS).await?;

    tokio::time::sleep(OUTAGE_STARTS).await;
    let apiserver = cluster.paths.state.join("run/kube-apiserver.pid");
    let apiserver_pid = std::fs::read_to_string(&apiserver)
        .with_context(|| format!("reading {}", apiserver.display()))?;
    kill(apiserver_pid.trim())?;
    let outage = Instant::now();
    eprintln!("stopped the API server for {OUTAGE:?}");
    tokio::time::sleep(OUTAGE).await;
    cluster.start_control_plane().await?;
    eprintln!("the API server is back after {:?}", outage.elapsed());

    let served = stream.expect_all_served(&cluster).await?;
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
        "{served} requests, none failed, through a {OUTAGE:?} API server outage and {renewals} SVID renewals"
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
