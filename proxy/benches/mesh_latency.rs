//! Added latency and throughput of the mesh hop, on the local cluster, in one run:
//!
//! - **direct**: the client pod to the server pod's IP (no proxy);
//! - **aether**: the client pod to the route target's ClusterIP, captured, routed, over
//!   HTTP/2 + mTLS between the two node proxies, to the server pod;
//! - **nginx pair**: the same two hops with Debian's nginx: one in the client pod's network
//!   namespace, one in the server pod's, mutual TLS 1.3 between them, keep-alive pools;
//! - **authz aether**: the same with 10 AuthorizationPolicies on the server's Service (DENY
//!   and ALLOW for other callers, the client's ALLOW last), there for this path's turns only;
//! - **tcp relay pair**: two plain TCP relays in the same places, copying bytes (no TLS, no
//!   HTTP): what any two user-space hops cost on this machine, the floor under both proxies.
//!
//! Client `echo-v1` and server `echo-v2` run on different nodes. For each, 1,000 requests/s for
//! a few seconds (latency p50/p99, measured from each request's send to its response's end),
//! then saturation: keep-alive connections in a closed loop, 16, 64 and 256 of them, the best
//! of the three in requests/s (with few connections a chain of single-threaded hops leaves the
//! machine idle between wake-ups, so one level alone is not the path's limit; every level's
//! figure is printed too). At both loads, the CPU time the two proxies spent per request; at
//! saturation (the best level), the whole machine's too. The paths take turns for a few
//! rounds, so that the machine's noise hits them alike; the table shows each figure's median
//! over the rounds. Also the node proxy's RSS per captured pod.
//!
//! With `--tcp`, each exchange is 64 bytes written and read back over a TCP connection, to an
//! echo server the bench runs in the server pod, behind a Service port declared
//! `appProtocol: tcp`: the mesh carries it opaque, in an HTTP/2 CONNECT tunnel over the pooled
//! mTLS connection; the nginx pair is then its `stream` module (TLS 1.3 with client
//! certificates, one TLS connection per client connection). Two more figures then: **bulk**,
//! one connection writing 64 KiB buffers for a few seconds while it reads the echo back (the
//! bytes per second echoed), and **connection setup**, a new connection for each of a few
//! hundred exchanges in a row (the median of connect, write and echo read).
//!
//! `cargo bench -p aether-proxy --bench mesh_latency [-- --tcp]` (root; installs nginx-light and
//! its stream module with apt if they are missing, and aether with helm; leaves the cluster as it
//! found it). Names after `--` pick paths by prefix (`-- aether nginx`); direct, the baseline,
//! always runs.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{
    Accounts, MESH_NS, client_pod, install, mesh_workloads, uninstall, unmesh_workloads,
    wait_accepted, wait_nodes_applied, wait_pods,
};
use aether_e2e::process::admin_get;
use aether_test_support::cases::RouteRef;
use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

const RATE: u64 = 1_000;
const RATE_SECONDS: u64 = 5;
const SATURATION_CONNECTIONS: [usize; 3] = [16, 64, 256];
const SATURATION_SECONDS: u64 = 5;
const ROUNDS: usize = 3;
/// The paths measured, in the order they take turns.
const PATHS: [&str; 5] = [
    "direct",
    "tcp relay pair",
    "aether",
    "authz aether",
    "nginx pair",
];
/// The AuthorizationPolicies on the server's Service during the `authz aether` path's turns.
const POLICIES: usize = 10;
const EXTRA_PODS: usize = 20;
const NGINX_CLIENT_PORT: u16 = 18080;
const NGINX_SERVER_PORT: u16 = 18443;
const RELAY_CLIENT_PORT: u16 = 18082;
const RELAY_SERVER_PORT: u16 = 18445;
/// The server pod's port of the bench's TCP echo server, and of the Service in front of it.
const TCP_PORT: u16 = 19090;
/// The bytes of one TCP exchange.
const TCP_MESSAGE: usize = 64;
const BULK_SECONDS: u64 = 5;
const BULK_BUFFER: usize = 64 * 1024;
/// New connections made in a row for the connection setup figure.
const SETUPS: usize = 300;

/// What one exchange of the load is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    /// `GET /` over HTTP/1.1 keep-alive, to the echo app.
    Http,
    /// [`TCP_MESSAGE`] bytes written and read back, to the bench's echo server.
    Tcp,
}

impl Proto {
    /// The app's port in the server pod.
    fn app_port(self) -> u16 {
        match self {
            Proto::Http => 8080,
            Proto::Tcp => TCP_PORT,
        }
    }
}

#[derive(Debug)]
struct Figures {
    p50: Duration,
    p99: Duration,
    errors: usize,
    /// The best of `by_connections`, and the figures below at that level.
    saturation_rps: f64,
    /// Requests/s at each of `SATURATION_CONNECTIONS`.
    by_connections: [f64; SATURATION_CONNECTIONS.len()],
    /// CPU time of the path's proxy processes per request at the fixed rate and at
    /// saturation, when they are processes of their own.
    proxy_cpu_at_rate: Option<Duration>,
    proxy_cpu: Option<Duration>,
    /// CPU time of the whole machine per request at saturation (load generator, app, both
    /// proxies, the kernel's network path), and how busy the machine was.
    machine_cpu: Duration,
    machine_busy: f64,
    /// `--tcp` only: bytes per second echoed on one connection, and the median time of a new
    /// connection's first exchange, connect included.
    bulk: Option<f64>,
    setup: Option<Duration>,
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let proto = if args.iter().any(|a| a == "--tcp") {
        Proto::Tcp
    } else {
        Proto::Http
    };
    let picked: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    if let Some(unknown) = picked
        .iter()
        .find(|p| !PATHS.iter().any(|name| name.starts_with(p.as_str())))
    {
        bail!("no path starts with {unknown:?}; the paths are {PATHS:?}");
    }
    let cluster = Cluster::get().await?;
    ensure_nginx()?;
    install(&cluster, &[]).await?;
    mesh_workloads(&cluster, Accounts::Upstream).await?;
    let (client, server) = pods_on_two_nodes(&cluster).await?;
    // A route on echo-v2 makes it a route target: its ClusterIP is captured.
    cluster.apply_text(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: bench\n  namespace: {MESH_NS}\nspec:\n  parentRefs:\n  - {{group: \"\", kind: Service, name: echo-v2, port: 80}}\n  rules:\n  - backendRefs:\n    - {{name: echo-v2, port: 80}}\n"
    ))?;
    let route = RouteRef {
        kind: "HTTPRoute".into(),
        name: "bench".into(),
        namespace: MESH_NS.into(),
        parent_ref: None,
    };
    wait_accepted(&cluster, std::slice::from_ref(&route)).await?;
    // The TCP echo server's Service: a meshed Service with no route is captured too, and a
    // port declared TCP is carried opaque.
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: bench-tcp\n  namespace: {MESH_NS}\nspec:\n  selector: {{app: echo, version: v2}}\n  ports:\n  - {{name: echo, port: {TCP_PORT}, targetPort: {TCP_PORT}, appProtocol: tcp}}\n"
    ))?;
    wait_nodes_applied(&cluster).await?;

    let server_ip = pod_ip(&server)?;
    let service = match proto {
        Proto::Http => "echo-v2",
        Proto::Tcp => "bench-tcp",
    };
    let cluster_ip = cluster.kubectl(&[
        "-n",
        MESH_NS,
        "get",
        "service",
        service,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    let client_netns = cluster.netns_of(&client, "echo")?;
    let server_netns = cluster.netns_of(&server, "echo")?;
    tcp_echo_in(&server_netns)?;
    let nginx = NginxPair::start(&client_netns, &server_netns, &server_ip, proto)?;
    start_relays(&client_netns, &server_netns, &server_ip, proto.app_port())?;

    let proxies = [
        node_proxy(&cluster, &client)?,
        node_proxy(&cluster, &server)?,
    ];
    let debug_build = debug_proxies(&cluster, [&client, &server])?;
    if let Some(nodes) = &debug_build {
        eprintln!(
            "the proxies of {nodes} are a debug build: their figures measure the compiler, not aether; start the cluster with AETHER_PROFILE=release tests/cluster/up.sh"
        );
    }
    let aether_addr = format!(
        "{cluster_ip}:{}",
        match proto {
            Proto::Http => 80,
            Proto::Tcp => TCP_PORT,
        }
    );
    // Where each of PATHS is dialled, and its proxies' pids.
    let places = [
        (format!("{server_ip}:{}", proto.app_port()), Vec::new()),
        (format!("127.0.0.1:{RELAY_CLIENT_PORT}"), Vec::new()),
        (aether_addr.clone(), proxies.to_vec()),
        (aether_addr.clone(), proxies.to_vec()),
        (format!("127.0.0.1:{NGINX_CLIENT_PORT}"), nginx.pids()),
    ];
    let targets: Vec<_> = PATHS
        .into_iter()
        .zip(places)
        .map(|(name, (addr, pids))| (name, addr, pids))
        .filter(|(name, _, _)| {
            *name == "direct" || picked.is_empty() || picked.iter().any(|p| name.starts_with(p))
        })
        .collect();
    let mut rounds: Vec<Vec<Figures>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        for ((name, addr, pids), figures) in targets.iter().zip(&mut rounds) {
            let addr: SocketAddr = addr.parse().with_context(|| format!("address {addr}"))?;
            // The policies close the server pod to the plaintext of the other paths: they
            // are there for this path's turn only.
            let authz = *name == "authz aether";
            if authz {
                cluster.apply_text(&policies())?;
                wait_nodes_applied(&cluster).await?;
            }
            let measured =
                measure_in(&client_netns, addr, pids.clone(), proto).map_err(|e| match *name {
                    "nginx pair" => e.context(nginx.logs()),
                    _ => e,
                });
            if authz {
                cluster.kubectl(&[
                    "-n",
                    MESH_NS,
                    "delete",
                    "authorizationpolicies",
                    "--all",
                    "--wait",
                ])?;
                wait_nodes_applied(&cluster).await?;
                // The pod's strict mode follows the snapshot a moment later.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let measured = measured?;
            eprintln!("round {round}, {name}: {measured:?}");
            figures.push(measured);
        }
    }
    let results: Vec<(&str, Figures)> = targets
        .iter()
        .zip(&rounds)
        .map(|((name, _, _), figures)| (*name, median(figures)))
        .collect();
    drop(nginx);
    let rss = rss_per_pod(&cluster, &client).await?;

    cluster.kubectl(&["-n", MESH_NS, "delete", "httproute", "bench", "--wait"])?;
    cluster.kubectl(&["-n", MESH_NS, "delete", "service", "bench-tcp", "--wait"])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;

    let figures = |path: &str| {
        results
            .iter()
            .find(|(name, _)| *name == path)
            .map(|(_, f)| f)
            .with_context(|| format!("no figures for {path}"))
    };
    let direct = figures("direct")?;
    let exchange = match proto {
        Proto::Http => "HTTP/1.1 requests".to_string(),
        Proto::Tcp => format!("{TCP_MESSAGE}-byte TCP echoes"),
    };
    println!(
        "mesh hop between two pods on different nodes, {exchange}; {RATE}/s for {RATE_SECONDS} s, then closed-loop for {SATURATION_SECONDS} s with each of {SATURATION_CONNECTIONS:?} connections (sat. rps: the best); medians of {ROUNDS} rounds"
    );
    println!(
        "{:<14} {:>10} {:>10} {:>12} {:>12} {:>10} {:>22} {:>16} {:>8}",
        "path",
        "p50",
        "p99",
        "added p50",
        "added p99",
        "sat. rps",
        "proxy CPU/req rate|sat",
        "machine CPU/req",
        "errors"
    );
    for (name, f) in &results {
        println!(
            "{:<14} {:>10} {:>10} {:>12} {:>12} {:>10.0} {:>22} {:>16} {:>8}",
            name,
            micros(f.p50),
            micros(f.p99),
            micros(f.p50.saturating_sub(direct.p50)),
            micros(f.p99.saturating_sub(direct.p99)),
            f.saturation_rps,
            match (f.proxy_cpu_at_rate, f.proxy_cpu) {
                (Some(rate), Some(sat)) => format!("{rate:.1?} | {sat:.1?}"),
                _ => "-".to_string(),
            },
            format!("{:.1?} ({:.0}%)", f.machine_cpu, f.machine_busy * 100.0),
            f.errors
        );
    }
    println!("sat. rps by closed-loop connections {SATURATION_CONNECTIONS:?}:");
    for (name, f) in &results {
        let levels: Vec<String> = f
            .by_connections
            .iter()
            .map(|rps| format!("{rps:.0}"))
            .collect();
        println!("{:<14} {}", name, levels.join(" / "));
    }
    if proto == Proto::Tcp {
        println!(
            "bulk (one connection, {BULK_BUFFER}-byte writes for {BULK_SECONDS} s, bytes echoed) and connection setup (median of {SETUPS} new connections, connect to echo):"
        );
        for (name, f) in &results {
            let bulk = f.bulk.unwrap_or_default();
            println!(
                "{:<14} {:>8.0} MB/s ({:.2}x direct) {:>10}",
                name,
                bulk / 1e6,
                bulk / direct.bulk.unwrap_or_default().max(1.0),
                micros(f.setup.unwrap_or_default()),
            );
        }
    }
    if let (Ok(aether), Ok(pair)) = (figures("aether"), figures("nginx pair")) {
        let ratio = |aether: &Figures, pair: &Figures| {
            format!(
                "{:.2}",
                aether.saturation_rps / pair.saturation_rps.max(1.0)
            )
        };
        let rounds_of = |path: &'static str| {
            targets
                .iter()
                .zip(&rounds)
                .filter(move |((name, _, _), _)| *name == path)
                .flat_map(|(_, figures)| figures)
        };
        let per_round: Vec<String> = rounds_of("aether")
            .zip(rounds_of("nginx pair"))
            .map(|(a, n)| ratio(a, n))
            .collect();
        println!(
            "aether / nginx pair saturation: {} (by round: {})",
            ratio(aether, pair),
            per_round.join(", ")
        );
        if aether.saturation_rps < pair.saturation_rps {
            println!(
                "REGRESSION: aether saturates below the nginx pair ({} < 1.00); aether has been at or above it since December 2026 (docs/performance.md)",
                ratio(aether, pair)
            );
        }
        if let (Some(a), Some(n)) = (aether.bulk, pair.bulk) {
            println!("aether / nginx pair bulk: {:.2}", a / n.max(1.0));
        }
    }
    if let (Ok(with), Ok(without)) = (figures("authz aether"), figures("aether")) {
        println!(
            "aether with {POLICIES} AuthorizationPolicies / without: saturation {:.3}, proxy CPU per request at {RATE}/s {:.3}",
            with.saturation_rps / without.saturation_rps.max(1.0),
            with.proxy_cpu_at_rate.unwrap_or_default().as_secs_f64()
                / without
                    .proxy_cpu_at_rate
                    .unwrap_or_default()
                    .as_secs_f64()
                    .max(1e-9),
        );
    }
    println!("proxy RSS per captured pod: {rss}");
    if let Some(nodes) = debug_build {
        println!(
            "NOT COMPARABLE: the proxies of {nodes} are a debug build (AETHER_PROFILE=release tests/cluster/up.sh)"
        );
    }
    Ok(())
}

/// [`POLICIES`] policies on the server's Service that every request is checked against: DENY
/// and ALLOW policies for other ServiceAccounts (some with HTTP matches), and last the ALLOW
/// that admits the client's namespace.
fn policies() -> String {
    (0..POLICIES)
        .map(|i| {
            let (action, rule) = match i {
                _ if i == POLICIES - 1 => ("ALLOW", format!("{{sources: [{{namespace: {MESH_NS}}}]}}")),
                _ if i % 3 == 0 => ("DENY", format!("{{sources: [{{serviceAccount: {MESH_NS}/bench-{i}}}]}}")),
                _ => (
                    "ALLOW",
                    format!("{{sources: [{{serviceAccount: {MESH_NS}/bench-{i}}}], http: [{{path: {{type: PathPrefix, value: /only-{i}}}, method: GET}}]}}"),
                ),
            };
            format!(
                "apiVersion: aether.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: bench-{i}, namespace: {MESH_NS}}}\n\
                 spec:\n  targetRefs: [{{group: \"\", kind: Service, name: echo-v2}}]\n  action: {action}\n  rules: [{rule}]\n---\n"
            )
        })
        .collect()
}

/// The nodes of `pods` whose proxy says (`aether_proxy_build_info`) it is not a release build.
fn debug_proxies(cluster: &Cluster, pods: [&Pod; 2]) -> Result<Option<String>> {
    let mut debug = Vec::new();
    for pod in pods {
        let node = aether_e2e::node_of(pod)?;
        let (_, metrics) = admin_get(&cluster.node_ip(&node)?, "/metrics")?;
        let release = metrics.lines().any(|l| {
            l.starts_with("aether_proxy_build_info{") && l.contains("profile=\"release\"")
        });
        if !release {
            debug.push(node);
        }
    }
    Ok((!debug.is_empty()).then(|| debug.join(", ")))
}

/// Where Debian's nginx stream module is.
const NGINX_STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

fn ensure_nginx() -> Result<()> {
    if Path::new("/usr/sbin/nginx").exists() && Path::new(NGINX_STREAM_MODULE).exists() {
        return Ok(());
    }
    let status = Command::new("apt-get")
        .args([
            "-qq",
            "-o",
            "DPkg::Lock::Timeout=600",
            "install",
            "-y",
            "nginx-light",
            "libnginx-mod-stream",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    if !status.success() {
        bail!("apt-get install nginx-light libnginx-mod-stream failed ({status})");
    }
    // The package starts a system nginx on port 80; the bench runs its own.
    let _ = Command::new("systemctl")
        .args(["disable", "--now", "nginx"])
        .status();
    Ok(())
}

/// The first echo-v1 pod and an echo-v2 pod on another node: when they share one, echo-v2's
/// pod is recreated while the client's node is cordoned.
async fn pods_on_two_nodes(cluster: &Cluster) -> Result<(Pod, Pod)> {
    let client = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let server = client_pod(cluster, MESH_NS, "app=echo,version=v2").await?;
    let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let client_node = node(&client).context("client pod without a node")?;
    if node(&server).as_ref() != Some(&client_node) {
        return Ok((client, server));
    }
    cluster.kubectl(&["cordon", &client_node])?;
    let moved = async {
        let name = server.metadata.name.clone().unwrap_or_default();
        cluster.kubectl(&["-n", MESH_NS, "delete", "pod", &name, "--wait"])?;
        wait_pods(cluster, MESH_NS, "app=echo,version=v2", 1).await?;
        client_pod(cluster, MESH_NS, "app=echo,version=v2").await
    }
    .await;
    cluster.kubectl(&["uncordon", &client_node])?;
    let server = moved?;
    if node(&server).as_ref() == Some(&client_node) {
        bail!("echo-v2 landed on the cordoned node {client_node}");
    }
    Ok((client, server))
}

fn pod_ip(pod: &Pod) -> Result<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("pod without an IP")
}

/// Runs the load inside `netns` on a thread of its own (sockets belong to the namespace of the
/// thread that creates them), with its own single-threaded runtime.
fn measure_in(netns: &Path, addr: SocketAddr, proxies: Vec<u32>, proto: Proto) -> Result<Figures> {
    let ns = std::fs::File::open(netns).with_context(|| format!("{}", netns.display()))?;
    std::thread::spawn(move || -> Result<Figures> {
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            // Warm the path (connections, TLS, pools) before measuring.
            saturate(addr, 4, Duration::from_secs(1), proto).await?;
            let cpu_before = cpu_time(&proxies)?;
            let (latencies, errors) = fixed_rate(addr, proto).await?;
            let cpu_at_rate = cpu_time(&proxies)?.saturating_sub(cpu_before);
            let mut by_connections = [0.0; SATURATION_CONNECTIONS.len()];
            let mut best: Option<Saturation> = None;
            for (connections, rps) in SATURATION_CONNECTIONS.into_iter().zip(&mut by_connections) {
                let level = saturation(addr, connections, &proxies, proto).await?;
                *rps = level.rps;
                if best.as_ref().is_none_or(|b| level.rps > b.rps) {
                    best = Some(level);
                }
            }
            let best = best.context("no saturation level")?;
            let (bulk, setup) = match proto {
                Proto::Tcp => (Some(bulk(addr).await?), Some(setup(addr).await?)),
                Proto::Http => (None, None),
            };
            let proxy_cpu_at_rate =
                (!proxies.is_empty()).then(|| cpu_at_rate.div_f64(latencies.len().max(1) as f64));
            Ok(Figures {
                p50: percentile(&latencies, 0.50),
                p99: percentile(&latencies, 0.99),
                errors,
                saturation_rps: best.rps,
                by_connections,
                proxy_cpu_at_rate,
                proxy_cpu: best.proxy_cpu,
                machine_cpu: best.machine_cpu,
                machine_busy: best.machine_busy,
                bulk,
                setup,
            })
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the load thread panicked"))?
}

/// One closed-loop level: its requests/s, and the CPU spent per request meanwhile.
struct Saturation {
    rps: f64,
    proxy_cpu: Option<Duration>,
    machine_cpu: Duration,
    machine_busy: f64,
}

async fn saturation(
    addr: SocketAddr,
    connections: usize,
    proxies: &[u32],
    proto: Proto,
) -> Result<Saturation> {
    let cpu_before = cpu_time(proxies)?;
    let machine_before = machine_time()?;
    let rps = saturate(
        addr,
        connections,
        Duration::from_secs(SATURATION_SECONDS),
        proto,
    )
    .await?;
    let cpu = cpu_time(proxies)?.saturating_sub(cpu_before);
    let machine = machine_time()?.since(machine_before);
    let requests = (rps * SATURATION_SECONDS as f64).max(1.0);
    Ok(Saturation {
        rps,
        proxy_cpu: (!proxies.is_empty()).then(|| cpu.div_f64(requests)),
        machine_cpu: machine.busy.div_f64(requests),
        machine_busy: machine.busy.as_secs_f64() / machine.total.as_secs_f64().max(1e-9),
    })
}

/// A connection of the load.
enum Conn {
    Http(SendRequest<Empty<Bytes>>),
    Tcp(tokio::net::TcpStream),
}

async fn connect(addr: SocketAddr, proto: Proto) -> Result<Conn> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    if proto == Proto::Tcp {
        return Ok(Conn::Tcp(stream));
    }
    let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(Conn::Http(send))
}

/// One exchange on `conn`: a request and its whole response, or a message and its echo.
async fn exchange(conn: &mut Conn, host: &str) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let send = match conn {
        Conn::Http(send) => send,
        Conn::Tcp(stream) => {
            let message = [b'a'; TCP_MESSAGE];
            stream.write_all(&message).await?;
            let mut echo = [0u8; TCP_MESSAGE];
            stream.read_exact(&mut echo).await?;
            if echo != message {
                bail!("the echo differs from the message");
            }
            return Ok(());
        }
    };
    send.ready().await?;
    let response = send
        .send_request(
            http::Request::get("/")
                .header(http::header::HOST, host)
                .body(Empty::new())?,
        )
        .await?;
    let status = response.status();
    response.into_body().collect().await?;
    if !status.is_success() {
        bail!("status {status}");
    }
    Ok(())
}

/// `RATE` requests per second for `RATE_SECONDS`, each on an idle keep-alive connection (a new
/// one when none is idle). Returns every latency and the number of failures.
async fn fixed_rate(addr: SocketAddr, proto: Proto) -> Result<(Vec<Duration>, usize)> {
    let idle: Arc<Mutex<VecDeque<Conn>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let errors = Arc::new(Mutex::new(0usize));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let host = addr.to_string();
    for _ in 0..RATE * RATE_SECONDS {
        tick.tick().await;
        let (idle, latencies, errors, host) = (
            idle.clone(),
            latencies.clone(),
            errors.clone(),
            host.clone(),
        );
        tasks.spawn(async move {
            let pooled = idle.lock().unwrap().pop_front();
            let conn = match pooled {
                Some(conn) => Ok(conn),
                None => connect(addr, proto).await,
            };
            let started = Instant::now();
            let result = match conn {
                Ok(mut conn) => exchange(&mut conn, &host).await.map(|()| conn),
                Err(e) => Err(e),
            };
            match result {
                Ok(conn) => {
                    latencies.lock().unwrap().push(started.elapsed());
                    idle.lock().unwrap().push_back(conn);
                }
                Err(_) => *errors.lock().unwrap() += 1,
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let latencies = std::mem::take(&mut *latencies.lock().unwrap());
    let errors = *errors.lock().unwrap();
    Ok((latencies, errors))
}

/// Bytes per second echoed on one connection that writes [`BULK_BUFFER`]s for
/// [`BULK_SECONDS`] while it reads.
async fn bulk(addr: SocketAddr) -> Result<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut reader, mut writer) = stream.into_split();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(BULK_SECONDS);
    let write = async {
        let buffer = vec![b'b'; BULK_BUFFER];
        while tokio::time::Instant::now() < deadline {
            writer.write_all(&buffer).await?;
        }
        writer.shutdown().await?;
        Ok::<_, anyhow::Error>(())
    };
    let read = async {
        let mut buffer = vec![0u8; BULK_BUFFER];
        let mut echoed = 0u64;
        loop {
            match tokio::time::timeout_at(deadline, reader.read(&mut buffer)).await {
                Ok(Ok(0)) => bail!("the echo server closed the bulk connection"),
                Ok(Ok(n)) => echoed += n as u64,
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Ok(echoed),
            }
        }
    };
    let ((), echoed) = tokio::try_join!(write, read)?;
    Ok(echoed as f64 / BULK_SECONDS as f64)
}

/// The median time of [`SETUPS`] new connections in a row, each connected, one exchange and
/// closed.
async fn setup(addr: SocketAddr) -> Result<Duration> {
    let mut times = Vec::with_capacity(SETUPS);
    for _ in 0..SETUPS {
        let started = Instant::now();
        let mut conn = connect(addr, Proto::Tcp).await?;
        exchange(&mut conn, "").await?;
        times.push(started.elapsed());
    }
    Ok(percentile(&times, 0.5))
}

/// Requests per second with `connections` keep-alive connections in a closed loop.
async fn saturate(
    addr: SocketAddr,
    connections: usize,
    length: Duration,
    proto: Proto,
) -> Result<f64> {
    let deadline = Instant::now() + length;
    let host = addr.to_string();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let host = host.clone();
        tasks.spawn(async move {
            let mut conn = connect(addr, proto).await?;
            let mut done = 0u64;
            while Instant::now() < deadline {
                exchange(&mut conn, &host).await?;
                done += 1;
            }
            Ok::<_, anyhow::Error>(done)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    Ok(total as f64 / length.as_secs_f64())
}

/// User and system CPU time of the processes `pids` (all their threads), from /proc.
fn cpu_time(pids: &[u32]) -> Result<Duration> {
    let mut total = 0u64;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("/proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces), from the state on: utime
        // and stime are the 12th and 13th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        for i in [11, 12] {
            total += fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .with_context(|| format!("no CPU times in /proc/{pid}/stat"))?;
        }
    }
    Ok(clock_ticks(total))
}

/// A count of the kernel's clock ticks (the unit of /proc's CPU times) as a duration.
fn clock_ticks(count: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(count as f64 / per_second)
}

/// A latency in whole microseconds, whatever its size (`Debug` would print 1.19 ms as "1ms").
fn micros(d: Duration) -> String {
    format!("{}µs", d.as_micros())
}

/// Busy and total CPU time of all the machine's CPUs since boot, from /proc/stat.
#[derive(Clone, Copy)]
struct MachineTime {
    busy: Duration,
    total: Duration,
}

impl MachineTime {
    fn since(self, before: MachineTime) -> MachineTime {
        MachineTime {
            busy: self.busy.saturating_sub(before.busy),
            total: self.total.saturating_sub(before.total),
        }
    }
}

fn machine_time() -> Result<MachineTime> {
    let stat = std::fs::read_to_string("/proc/stat").context("/proc/stat")?;
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(|f| f.parse().context("a field of /proc/stat's cpu line"))
        .collect::<Result<_>>()?;
    // user nice system idle iowait irq softirq steal (guest times are inside user and nice).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok(MachineTime {
        busy: clock_ticks(total.saturating_sub(idle)),
        total: clock_ticks(total),
    })
}

/// Each figure's median over the rounds; errors are summed.
fn median(rounds: &[Figures]) -> Figures {
    fn mid<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
        values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        values[values.len() / 2]
    }
    Figures {
        p50: mid(rounds.iter().map(|f| f.p50).collect()),
        p99: mid(rounds.iter().map(|f| f.p99).collect()),
        errors: rounds.iter().map(|f| f.errors).sum(),
        saturation_rps: mid(rounds.iter().map(|f| f.saturation_rps).collect()),
        by_connections: std::array::from_fn(|level| {
            mid(rounds.iter().map(|f| f.by_connections[level]).collect())
        }),
        proxy_cpu_at_rate: mid(rounds.iter().map(|f| f.proxy_cpu_at_rate).collect()),
        proxy_cpu: mid(rounds.iter().map(|f| f.proxy_cpu).collect()),
        machine_cpu: mid(rounds.iter().map(|f| f.machine_cpu).collect()),
        machine_busy: mid(rounds.iter().map(|f| f.machine_busy).collect()),
        bulk: mid(rounds.iter().map(|f| f.bulk).collect()),
        setup: mid(rounds.iter().map(|f| f.setup).collect()),
    }
}

fn percentile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The proxy's resident memory on the client's node before and after `EXTRA_PODS` more meshed
/// pods, per added pod on that node.
async fn rss_per_pod(cluster: &Cluster, client: &Pod) -> Result<String> {
    let node = client
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("client without node")?;
    let before = proxy_rss_kib(cluster, &node)?;
    let pods_before = registered_pods(cluster, &node).await?;
    cluster.apply_text(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: bench-pods\n  namespace: {MESH_NS}\nspec:\n  replicas: {EXTRA_PODS}\n  selector:\n    matchLabels: {{app: bench-pods}}\n  template:\n    metadata:\n      labels: {{app: bench-pods}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.k8s.io/gateway-api/echo-advanced:v1.5.1\n"
    ))?;
    wait_pods(cluster, MESH_NS, "app=bench-pods", EXTRA_PODS).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = proxy_rss_kib(cluster, &node)?;
    let added = registered_pods(cluster, &node).await? - pods_before;
    cluster.kubectl(&[
        "-n",
        MESH_NS,
        "delete",
        "deployment",
        "bench-pods",
        "--wait",
    ])?;
    wait_pods(cluster, MESH_NS, "app=bench-pods", 0).await?;
    if added == 0 {
        bail!("no bench pod landed on {node}");
    }
    Ok(format!(
        "{:.0} KiB ({} KiB with {pods_before} pods, {} KiB with {} on {node})",
        after.saturating_sub(before) as f64 / added as f64,
        before,
        after,
        pods_before + added
    ))
}

/// Meshed pods on `node` (those the proxy registers).
async fn registered_pods(cluster: &Cluster, node: &str) -> Result<usize> {
    let out = cluster.kubectl(&[
        "-n",
        MESH_NS,
        "get",
        "pods",
        "--field-selector",
        &format!("spec.nodeName={node},status.phase=Running"),
        "-o",
        "name",
    ])?;
    Ok(out.lines().filter(|l| !l.is_empty()).count())
}

/// The pid of the aether proxy on `pod`'s node.
fn node_proxy(cluster: &Cluster, pod: &Pod) -> Result<u32> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("pod without node")?;
    proxy_pid(cluster, &node)
}

fn proxy_pid(cluster: &Cluster, node: &str) -> Result<u32> {
    let name = cluster.kubectl(&[
        "-n",
        "aether-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=aether-proxy",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    let pod: Pod = serde_json::from_str(&cluster.kubectl(&[
        "-n",
        "aether-system",
        "get",
        "pod",
        name.trim(),
        "-o",
        "json",
    ])?)?;
    cluster.container_pid(&pod, "proxy")
}

fn proxy_rss_kib(cluster: &Cluster, node: &str) -> Result<u64> {
    let pid = proxy_pid(cluster, node)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

/// Plain TCP relays in the pods' network namespaces: the client's on
/// 127.0.0.1:`RELAY_CLIENT_PORT` to the server's, the server's to the app on its loopback at
/// `app_port`. They run on threads of their own until the bench exits.
fn start_relays(
    client_netns: &Path,
    server_netns: &Path,
    server_ip: &str,
    app_port: u16,
) -> Result<()> {
    let server: SocketAddr = format!("{server_ip}:{RELAY_SERVER_PORT}").parse()?;
    relay_in(
        server_netns,
        SocketAddr::from(([0, 0, 0, 0], RELAY_SERVER_PORT)),
        SocketAddr::from(([127, 0, 0, 1], app_port)),
    )?;
    relay_in(
        client_netns,
        SocketAddr::from(([127, 0, 0, 1], RELAY_CLIENT_PORT)),
        server,
    )
}

/// Listens on `listen` inside `netns` and copies each accepted connection to and from a new
/// one to `to`; returns once listening.
fn relay_in(netns: &Path, listen: SocketAddr, to: SocketAddr) -> Result<()> {
    listen_in(netns, listen, move |mut inbound| async move {
        let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await else {
            return;
        };
        let _ = outbound.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    })
}

/// The bench's TCP echo server, on `TCP_PORT` of the pod whose network namespace is `netns`.
fn tcp_echo_in(netns: &Path) -> Result<()> {
    listen_in(
        netns,
        SocketAddr::from(([0, 0, 0, 0], TCP_PORT)),
        |stream| async move {
            let (mut from, mut to) = stream.into_split();
            let _ = tokio::io::copy(&mut from, &mut to).await;
        },
    )
}

/// Listens on `listen` inside `netns`, on a thread of its own with its own runtime, and serves
/// each accepted connection with `serve`; returns once listening.
fn listen_in<F, Served>(netns: &Path, listen: SocketAddr, serve: F) -> Result<()>
where
    F: Fn(tokio::net::TcpStream) -> Served + Send + 'static,
    Served: std::future::Future<Output = ()> + Send + 'static,
{
    let ns = std::fs::File::open(netns).with_context(|| format!("{}", netns.display()))?;
    let (ready, listening) = std::sync::mpsc::channel::<Result<()>>();
    std::thread::spawn(move || {
        let accept = || -> Result<()> {
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let listener = tokio::net::TcpListener::bind(listen).await?;
                let _ = ready.send(Ok(()));
                loop {
                    let (stream, _) = listener.accept().await?;
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve(stream));
                }
            })
        };
        if let Err(e) = accept() {
            let _ = ready.send(Err(e));
        }
    });
    listening
        .recv()
        .context("the listening thread ended before listening")?
        .with_context(|| format!("listening on {listen}"))
}

/// Two nginx processes in the pods' network namespaces, stopped on drop.
struct NginxPair {
    processes: Vec<Child>,
    dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for NginxPair {
    fn drop(&mut self) {
        for child in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl NginxPair {
    fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(Child::id).collect()
    }

    /// Both error logs, for a failure's message.
    fn logs(&self) -> String {
        ["client", "server"]
            .iter()
            .map(|name| {
                let path = self.dir.0.join(format!("{name}.err"));
                format!(
                    "{name} nginx: {}",
                    std::fs::read_to_string(path).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn start(
        client_netns: &Path,
        server_netns: &Path,
        server_ip: &str,
        proto: Proto,
    ) -> Result<NginxPair> {
        let dir = TempDir(
            std::env::temp_dir().join(format!("aether-bench-nginx-{}", std::process::id())),
        );
        std::fs::create_dir_all(&dir.0)?;
        let d = dir.0.display().to_string();
        write_certs(&dir.0)?;
        let module = match proto {
            Proto::Http => String::new(),
            Proto::Tcp => format!("load_module {NGINX_STREAM_MODULE};\n"),
        };
        let common = |name: &str| {
            format!(
                "{module}daemon off; master_process off; worker_processes 1; pid {d}/{name}.pid; error_log {d}/{name}.err warn;\nevents {{ worker_connections 4096; }}\n"
            )
        };
        let (client_conf, server_conf) = match proto {
            Proto::Http => http_confs(&d, server_ip),
            Proto::Tcp => stream_confs(&d, server_ip),
        };
        let client_conf = format!("{}{client_conf}", common("client"));
        let server_conf = format!("{}{server_conf}", common("server"));
        std::fs::write(dir.0.join("client.conf"), client_conf)?;
        std::fs::write(dir.0.join("server.conf"), server_conf)?;
        let mut processes = Vec::new();
        for (netns, conf) in [(server_netns, "server.conf"), (client_netns, "client.conf")] {
            let child = Command::new("nsenter")
                .arg(format!("--net={}", netns.display()))
                .args(["/usr/sbin/nginx", "-p", &d, "-c"])
                .arg(dir.0.join(conf))
                .stdout(Stdio::null())
                .spawn()?;
            processes.push(child);
        }
        std::thread::sleep(Duration::from_millis(500));
        for child in &mut processes {
            if let Some(status) = child.try_wait()? {
                bail!("nginx exited ({status}); see {d}/*.err");
            }
        }
        Ok(NginxPair { processes, dir })
    }
}

/// The HTTP pair's configurations (client, server): keep-alive pools on both hops.
fn http_confs(d: &str, server_ip: &str) -> (String, String) {
    let app = Proto::Http.app_port();
    let client_conf = format!(
        "http {{ access_log off; keepalive_requests 10000000; client_body_temp_path {d}/a-body; proxy_temp_path {d}/a-proxy;\n  upstream server {{ server {server_ip}:{NGINX_SERVER_PORT}; keepalive 512; keepalive_requests 10000000; }}\n  server {{ listen 127.0.0.1:{NGINX_CLIENT_PORT};\n    location / {{ proxy_pass https://server; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host;\n      proxy_ssl_certificate {d}/client.crt; proxy_ssl_certificate_key {d}/client.key;\n      proxy_ssl_trusted_certificate {d}/ca.crt; proxy_ssl_verify on; proxy_ssl_name server.mesh;\n      proxy_ssl_protocols TLSv1.3; proxy_ssl_session_reuse on; }} }} }}\n"
    );
    let server_conf = format!(
        "http {{ access_log off; keepalive_requests 10000000; client_body_temp_path {d}/b-body; proxy_temp_path {d}/b-proxy;\n  upstream app {{ server 127.0.0.1:{app}; keepalive 512; keepalive_requests 10000000; }}\n  server {{ listen {NGINX_SERVER_PORT} ssl; ssl_protocols TLSv1.3;\n    ssl_certificate {d}/server.crt; ssl_certificate_key {d}/server.key;\n    ssl_client_certificate {d}/ca.crt; ssl_verify_client on;\n    location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; }} }} }}\n"
    );
    (client_conf, server_conf)
}

/// The TCP pair's configurations (client, server): nginx's stream module, TLS 1.3 with client
/// certificates between the two, a TLS connection per client connection (stream has no pool).
fn stream_confs(d: &str, server_ip: &str) -> (String, String) {
    let client_conf = format!(
        "stream {{ server {{ listen 127.0.0.1:{NGINX_CLIENT_PORT}; proxy_pass {server_ip}:{NGINX_SERVER_PORT};\n    proxy_ssl on; proxy_ssl_certificate {d}/client.crt; proxy_ssl_certificate_key {d}/client.key;\n    proxy_ssl_trusted_certificate {d}/ca.crt; proxy_ssl_verify on; proxy_ssl_name server.mesh;\n    proxy_ssl_protocols TLSv1.3; proxy_ssl_session_reuse on; }} }}\n"
    );
    let server_conf = format!(
        "stream {{ server {{ listen {NGINX_SERVER_PORT} ssl; ssl_protocols TLSv1.3;\n    ssl_certificate {d}/server.crt; ssl_certificate_key {d}/server.key;\n    ssl_client_certificate {d}/ca.crt; ssl_verify_client on;\n    proxy_pass 127.0.0.1:{TCP_PORT}; }} }}\n"
    );
    (client_conf, server_conf)
}

/// A CA and two leaf certificates (client and server), as PEM files in `dir`.
fn write_certs(dir: &Path) -> Result<()> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    // Distinct subjects: a leaf named like its issuer looks self-signed to OpenSSL.
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "aether bench CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key)?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    let issuer = Issuer::new(ca, ca_key);
    for (name, usage) in [
        ("client", ExtendedKeyUsagePurpose::ClientAuth),
        ("server", ExtendedKeyUsagePurpose::ServerAuth),
    ] {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["server.mesh".to_string()])?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &issuer)?;
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem())?;
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem())?;
    }
    Ok(())
}
