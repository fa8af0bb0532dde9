//! One pod cannot degrade another's traffic through the node proxy they share. A victim pod on
//! node-1 sends a steady stream of requests to a route target (capture, both proxies, mTLS);
//! its p99 latency is measured alone, then while a flooding pod on the same node opens more
//! connections to the same Service than its capture listener admits and holds every one it gets
//! by sending its request head a byte a second (slowloris), opening new ones as the proxy closes
//! them. Under the flood the victim's p99 must stay within 2x of its quiet p99, and no request
//! of it may fail.
//!
//! Both pods' traffic is made by this process inside their network namespaces (the nodes run on
//! this machine), so that the flood is as dense as a pod could make it and the victim's
//! latencies are measured at the client, request by request.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aether_e2e::mesh::{
    Accounts, ECHO_IMAGE, MESH_NS, install, mesh_workloads, uninstall, unmesh_workloads,
};
use aether_e2e::stream::apply_split;
use aether_e2e::{Cluster, is_ready};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const NODE: &str = "node-1";
/// The victim's requests: one every 20 ms for each phase.
const PHASE: Duration = Duration::from_secs(15);
const INTERVAL: Duration = Duration::from_millis(20);
/// More than the capture listener's cap (`--max-connections-per-listener`, 4096).
const FLOOD_CONNECTIONS: usize = 5000;
/// The victim's p99 under the flood, at most this many times its quiet p99.
const MAX_RATIO: f64 = 2.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_pod_does_not_slow_a_victim_on_its_node() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let split = apply_split(&cluster).await?;
    let victim = start_pod(&cluster, "flood-victim").await?;
    let flooder = start_pod(&cluster, "flood-flooder").await?;
    let echo = cluster.kubectl(&[
        "-n",
        MESH_NS,
        "get",
        "service",
        "echo",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    let echo: SocketAddr = format!("{}:80", echo.trim())
        .parse()
        .context("echo's ClusterIP")?;
    let (victim_ns, flooder_ns) = (
        cluster.netns_of(&victim, "app")?,
        cluster.netns_of(&flooder, "app")?,
    );

    // Warm the victim's path (pooled mTLS connections, SVIDs), then measure it alone.
    measure(victim_ns.clone(), echo, Duration::from_secs(2)).await?;
    let quiet = measure(victim_ns.clone(), echo, PHASE).await?;
    let flooding = Arc::new(AtomicBool::new(true));
    let flood = flood(flooder_ns, echo, flooding.clone())?;
    // The flood at full strength first: every connection it can hold.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loud = measure(victim_ns, echo, PHASE).await;
    flooding.store(false, Ordering::Release);
    let flood = tokio::task::spawn_blocking(move || flood.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the flooding thread panicked"))??;
    let loud = loud?;

    eprintln!(
        "victim p50/p99: alone {:?}/{:?}, under the flood {:?}/{:?}; the flood held up to {} connections, opened {} in all",
        quiet.p50, quiet.p99, loud.p50, loud.p99, flood.held, flood.opened
    );
    if flood.held < 1000 {
        bail!(
            "the flood held only {} connections: it was no flood",
            flood.held
        );
    }
    if quiet.failed + loud.failed > 0 {
        bail!(
            "the victim's requests failed: {} alone, {} under the flood",
            quiet.failed,
            loud.failed
        );
    }
    let ratio = loud.p99.as_secs_f64() / quiet.p99.as_secs_f64();
    if ratio > MAX_RATIO {
        bail!(
            "the victim's p99 went from {:?} to {:?} under the flood ({ratio:.2}x, more than {MAX_RATIO}x)",
            quiet.p99,
            loud.p99
        );
    }

    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
    for name in ["flood-victim", "flood-flooder"] {
        pods.delete(name, &Default::default()).await?;
    }
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

/// A meshed pod on [`NODE`] that only serves (the echo server), running.
async fn start_pod(cluster: &Cluster, name: &str) -> Result<Pod> {
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": MESH_NS},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "app", "image": ECHO_IMAGE, "args": ["--port=8080"]}],
        },
    });
    cluster.apply_text(&manifest.to_string())?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let pod = pods.get(name).await?;
        if is_ready(&pod) {
            return Ok(pod);
        }
        if Instant::now() > deadline {
            bail!("pod {name} is not ready after 90 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

struct Latencies {
    p50: Duration,
    p99: Duration,
    failed: usize,
}

/// Requests `GET /v2` of `echo` every [`INTERVAL`] for `length` over one keep-alive connection
/// (a new one after a failure), from inside `netns`.
async fn measure(netns: PathBuf, echo: SocketAddr, length: Duration) -> Result<Latencies> {
    tokio::task::spawn_blocking(move || {
        enter(&netns)?;
        let mut took = Vec::new();
        let mut failed = 0;
        let mut conn: Option<TcpStream> = None;
        let end = Instant::now() + length;
        let mut next = Instant::now();
        while next < end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += INTERVAL;
            let started = Instant::now();
            let answered = match conn.take() {
                Some(c) => Ok(c),
                None => TcpStream::connect_timeout(&echo, Duration::from_secs(5)),
            }
            .and_then(|c| get(c, "/v2"));
            match answered {
                Ok(c) => {
                    took.push(started.elapsed());
                    conn = Some(c);
                }
                Err(e) => {
                    eprintln!("a victim request failed: {e}");
                    failed += 1;
                }
            }
        }
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
        if took.is_empty() {
            bail!("no request of the victim was answered");
        }
        Ok(Latencies {
            p50: at(0.50),
            p99: at(0.99),
            failed,
        })
    })
    .await?
}

/// One request on `conn`, which is given back once the whole answer (200, by its
/// Content-Length) is read.
fn get(mut conn: TcpStream, path: &str) -> std::io::Result<TcpStream> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_nodelay(true)?;
    write!(conn, "GET {path} HTTP/1.1\r\nHost: echo\r\n\r\n")?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    let (head_end, length) = loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        answer.extend_from_slice(&buf[..n]);
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                return Err(std::io::Error::other(format!(
                    "answered {:?}",
                    head.lines().next()
                )));
            }
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| std::io::Error::other("no Content-Length"))?;
            break (end + 4, length);
        }
    };
    while answer.len() < head_end + length {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        answer.extend_from_slice(&buf[..n]);
    }
    Ok(conn)
}

fn enter(netns: &PathBuf) -> Result<()> {
    let ns = std::fs::File::open(netns).with_context(|| format!("{}", netns.display()))?;
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering {}", netns.display()))
}

struct Flood {
    /// The most connections held open at once.
    held: usize,
    /// Connections opened in all.
    opened: usize,
}

/// From inside `netns`, until `flooding` is false: keeps [`FLOOD_CONNECTIONS`] connections to
/// `echo` open, each sending its request head a byte a second, and opens a new one for each
/// the proxy closes or refuses.
fn flood(
    netns: PathBuf,
    echo: SocketAddr,
    flooding: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<Flood>>> {
    Ok(std::thread::spawn(move || {
        enter(&netns)?;
        let head =
            b"GET /v2 HTTP/1.1\r\nHost: echo\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        // Each connection with how much of the head it sent.
        let mut conns: Vec<(TcpStream, usize)> = Vec::new();
        let (mut held, mut opened) = (0, 0);
        let mut drip = [0u8; 1];
        while flooding.load(Ordering::Acquire) {
            let round = Instant::now();
            while conns.len() < FLOOD_CONNECTIONS && round.elapsed() < Duration::from_millis(500) {
                match TcpStream::connect_timeout(&echo, Duration::from_secs(1)) {
                    Ok(conn) => {
                        conn.set_nonblocking(true)?;
                        opened += 1;
                        conns.push((conn, 0));
                    }
                    Err(_) => break,
                }
            }
            // A byte of the head on each; a connection that is closed (or reset) goes.
            conns.retain_mut(|(conn, sent)| {
                let byte = head[*sent % head.len()];
                match conn.write(&[byte]) {
                    Ok(0) => false,
                    Ok(_) => {
                        *sent += 1;
                        // Anything read back (a 408, a close, a reset) ends it too.
                        matches!(conn.read(&mut drip), Err(e) if e.kind() == ErrorKind::WouldBlock)
                    }
                    Err(e) => e.kind() == ErrorKind::WouldBlock,
                }
            });
            held = held.max(conns.len());
            std::thread::sleep(Duration::from_secs(1).saturating_sub(round.elapsed()));
        }
        Ok(Flood { held, opened })
    }))
}
