//! The mesh keeps serving through what a production cluster goes through: a steady stream of
//! requests from a meshed pod to a route target (through capture, both proxies and mTLS) while
//! the API server is down for 60 s, every node proxy is killed (SIGKILL) in the middle of it, and
//! every SVID is renewed.
//!
//! The restarted proxies can reach neither the API server nor the certificate authority (which
//! reviews their tokens through it): they serve from the watch caches the last run saved and the
//! SVIDs the pod kept in memory. The test asks each for its readiness and its request count on
//! the node's address while the API server is still down; only the requests in flight at the
//! kill may fail.
//!
//! SVIDs live 240 s here (the chart's `ca.svidTTLSeconds`), so the proxies renew them at 120 s,
//! inside the stream, after the outage; a renewal that fails during the outage is retried, and
//! the certificate in use stays valid long enough for that.

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{
    Accounts, install, mesh_workloads, proxy_pod_field, replace_restarted_proxies, uninstall,
    unmesh_workloads,
};
use aether_e2e::process::{admin_get, process_of, signal};
use aether_e2e::stream::{IN_FLIGHT, Stream, apply_split, svids_issued};
use anyhow::{Context, Result, bail};

const SVID_TTL_SECONDS: u64 = 240;
const STREAM: Duration = Duration::from_secs(150);
const QPS: u64 = 10;
const OUTAGE_STARTS: Duration = Duration::from_secs(15);
const OUTAGE: Duration = Duration::from_secs(60);
/// When, into the outage, the proxies are killed: the rest of it is theirs to come back in.
const KILL_AFTER: Duration = Duration::from_secs(10);
const NODES: [&str; 2] = ["node-1", "node-2"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_survives_an_api_server_outage_and_svid_renewal() -> Result<()> {
    let cluster = Cluster::get().await?;
    let ttl = format!("ca.svidTTLSeconds={SVID_TTL_SECONDS}");
    install(&cluster, &["--set", &ttl]).await?;
    replace_restarted_proxies(&cluster)?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let split = apply_split(&cluster).await?;
    let mut proxies = Vec::new();
    for node in NODES {
        let pod = proxy_pod_field(&cluster, node, "metadata.name")?;
        proxies.push((node, pod, cluster.node_ip(node)?));
    }
    // The stream runs in the client pod's namespaces while the test breaks things around it.
    let stream = Stream::start(&cluster, STREAM, QPS).await?;

    tokio::time::sleep(OUTAGE_STARTS).await;
    let apiserver = cluster.paths.state.join("run/kube-apiserver.pid");
    let apiserver_pid = std::fs::read_to_string(&apiserver)
        .with_context(|| format!("reading {}", apiserver.display()))?;
    signal(apiserver_pid.trim().parse()?, "TERM")?;
    let outage = Instant::now();
    eprintln!("stopped the API server for {OUTAGE:?}");
    tokio::time::sleep(KILL_AFTER).await;
    let mut killed = Vec::new();
    for (node, pod, _) in &proxies {
        let pid = process_of(pod, "aether-proxy")?;
        signal(pid, "KILL")?;
        killed.push(pid);
        eprintln!(
            "killed {node}'s proxy (pid {pid}) {:?} into the outage",
            outage.elapsed()
        );
    }
    let restarted = back_without_the_api_server(&proxies, &killed, outage).await;
    let left = OUTAGE.saturating_sub(outage.elapsed());
    tokio::time::sleep(left).await;
    cluster.start_control_plane().await?;
    eprintln!("the API server is back after {:?}", outage.elapsed());
    restarted?;

    let failed = stream.failures(&cluster).await?;
    if failed > IN_FLIGHT {
        bail!(
            "{failed} requests failed across the outage and the proxies' restart: more than were in flight at the kill"
        );
    }
    for (node, pod, _) in &proxies {
        let log = cluster.kubectl(&["-n", "aether-system", "logs", pod, "-c", "proxy"])?;
        for said in [
            "serving the watch cache saved by the last run",
            "restored the SVID kept by the proxy before",
            "took the sockets the holder kept",
        ] {
            if !log.contains(said) {
                bail!("{node}'s restarted proxy never said {said:?}: {log}");
            }
        }
    }
    // Every proxy was restarted, with the SVIDs it had: all its processes obtained since are
    // renewals, about one per ServiceAccount on each node (at half of 240 s); far more would
    // be a renewal loop.
    let renewals = svids_issued(&cluster)?;
    if renewals == 0 || renewals > 20 {
        bail!("{renewals} SVID renewals since the proxies' restart: expected a few");
    }
    eprintln!(
        "{failed} requests failed through a {OUTAGE:?} API server outage, the proxies' kill in it and {renewals} SVID renewals"
    );

    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

/// Each killed proxy is started again by its kubelet and serves, while the API server is down:
/// a new process, ready on the node's admin port, and (between two looks, 5 s apart, before the
/// outage ends) requests served.
async fn back_without_the_api_server(
    proxies: &[(&str, String, String)],
    killed: &[u32],
    outage: Instant,
) -> Result<()> {
    let deadline = outage + OUTAGE - Duration::from_secs(10);
    for ((node, pod, ip), old) in proxies.iter().zip(killed) {
        loop {
            let new = process_of(pod, "aether-proxy")
                .ok()
                .filter(|pid| pid != old);
            let ready = new.is_some() && admin_get(ip, "/readyz").is_ok_and(|(s, _)| s == 200);
            if ready {
                eprintln!(
                    "{node}'s proxy is back and ready {:?} into the outage",
                    outage.elapsed()
                );
                break;
            }
            if Instant::now() > deadline {
                bail!("{node}'s proxy was not back and ready while the API server was down");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let requests = || -> Result<u64> {
        let mut total = 0;
        for (_, _, ip) in proxies {
            let (_, metrics) = admin_get(ip, "/metrics")?;
            total += metrics
                .lines()
                .filter(|l| l.starts_with("aether_proxy_requests_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        Ok(total)
    };
    let before = requests()?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = requests()?;
    if outage.elapsed() >= OUTAGE {
        bail!("the outage was over before the restarted proxies were seen serving");
    }
    // 5 s of the stream cross two proxies: about 100 requests counted.
    if after < before + QPS * 5 {
        bail!(
            "the restarted proxies served {} requests in 5 s without the API server",
            after.saturating_sub(before)
        );
    }
    eprintln!(
        "the restarted proxies served {} requests in 5 s without the API server",
        after.saturating_sub(before)
    );
    Ok(())
}
