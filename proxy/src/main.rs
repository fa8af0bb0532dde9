//! aether-proxy, the node proxy. `aether-proxy run` serves the aether-cni plugin and keeps the
//! capture listeners of this node's meshed pods.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aether_cni::nft::Nft;
use aether_cni::protocol::{DEFAULT_SOCKET, PodRef};
use aether_proxy::control::cni_kubeconfig;
use aether_proxy::control::drift::{self, CniEntry};
use aether_proxy::control::node_pods::{self, NodePods};
use aether_proxy::control::pod_view::{Labels, PodView, ViewError};
use aether_proxy::control::view::{ClusterView, Install};
use aether_proxy::control::{apply, node};
use aether_proxy::dataplane::snapshot::Snapshot;
use aether_proxy::dataplane::{DataPlane, Demand, Mesh, SnapshotCell};
use aether_proxy::handover::holder::{Holder, Keeper};
use aether_proxy::handover::{Event, Given, Offer, Socket, Successor};
use aether_proxy::identity::kept::KeptSvids;
use aether_proxy::identity::svid::{self, CaClient, Resolver};
use aether_proxy::identity::tls::{Certs, TrustStore};
use aether_proxy::inpod::agent::{Agent, AgentConfig};
use aether_proxy::inpod::capture_set::CaptureSet;
use aether_proxy::inpod::cni_server;
use aether_proxy::inpod::cni_server::CniSocket;
use aether_proxy::inpod::listeners::{ConnectionLimits, PodSocket};
use aether_proxy::metrics::Metrics;
use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

const RUN_HELP: &str = "\
Serves the aether-cni plugin on --cni-socket and opens, inside every registered pod's network \
namespace, the outbound capture listener and the inbound mTLS listener (again after a restart, \
from the registry in --state-dir).

With the cluster (the default: in-cluster config or KUBECONFIG): watches this node's NodeConfig, \
Services, EndpointSlices, Namespaces and this node's Pods; routes each captured request to a \
route target by its GAMMA route table, over mTLS with the client pod's ServiceAccount SVID \
(obtained from the operator's certificate authority with --token-file); terminates inbound mTLS \
and hands requests to the app with the caller's verified SPIFFE ID in x-aether-client-identity; \
keeps every pod's capture set current, repairs drift, reports the applied config generation, \
and removes the node's aether.io/agent-not-ready taint once it has applied the first config. \
A missing NodeConfig keeps the last one in force (the capture set is saved in --state-dir).

With --capture-set FILE (no cluster): the capture set comes from the file (re-read on SIGHUP) \
and captured connections pass through as TCP to their original destination.

A proxy started while another runs on the node (a rolling update) takes over the other's \
sockets through --handover-socket: the admin socket at once, the CNI socket and every pod's \
listeners once its caches are synced. The other then drains its connections and waits for \
SIGTERM. No socket closes, so no connection is refused. With --holder-socket, a holder process \
(`aether-proxy hold`) keeps copies of the sockets, which a proxy restarted after a crash takes; \
with --svid-dir (a memory-backed volume of the pod), the SVIDs outlive that crash too.

A proxy started while the API server does not answer serves from the watch caches the last run \
saved in --state-dir (Services, EndpointSlices, Namespaces, its NodeConfig, the trust bundle) \
until the API server is back.

SIGTERM or SIGINT: stop serving the plugin, close every listener, give open connections \
--drain-seconds to finish. The registry stays for the next start, unless aether is being \
uninstalled (`helm uninstall` created the --uninstall-marker ConfigMap after this pod started, \
and the --daemonset is gone): then every pod's table is removed and aether-cni is taken out of \
the node's CNI configuration.";

#[derive(Parser)]
#[command(name = "aether-proxy", version, about = "aether's node proxy")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CNI plugin and the listeners of this node's meshed pods.
    #[command(long_about = RUN_HELP)]
    Run(Box<RunArgs>),
    /// Keep copies of the proxy's sockets, so that they outlive a crash of the proxy (the
    /// `holder` container beside it).
    Hold {
        /// Where the proxy (`run --holder-socket`) reaches this process.
        #[arg(long)]
        socket: PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// The Unix socket aether-cni talks to (mode 0600).
    #[arg(long, default_value = DEFAULT_SOCKET)]
    cni_socket: PathBuf,
    /// Where the pod registry is kept across restarts.
    #[arg(long, default_value = "/var/lib/aether/proxy")]
    state_dir: PathBuf,
    /// The outbound capture port inside each pod's network namespace, which new pods' tables
    /// redirect to.
    #[arg(long, default_value_t = 15001, value_parser = clap::value_parser!(u16).range(1..))]
    capture_port: u16,
    /// The inbound mTLS port inside each meshed pod's network namespace.
    #[arg(long, default_value_t = 15008, value_parser = clap::value_parser!(u16).range(1..))]
    inbound_port: u16,
    /// Serves /healthz, /readyz and /metrics: `ADDRESS:PORT`, the address bare for IPv6 too
    /// (`fd00::1:15020`), as the downward API's `status.hostIP` gives it.
    #[arg(long, default_value = "0.0.0.0:15020", value_parser = parse_listen_addr)]
    admin_addr: SocketAddr,
    /// Run without the cluster: JSON capture set, `{"generation": 1, "targets":
    /// ["10.96.0.10:80", "[fd00::10]:80"]}`, re-read on SIGHUP.
    #[arg(long)]
    capture_set: Option<PathBuf>,
    /// aether's install namespace (trust bundle, certificate authority, DaemonSet).
    #[arg(long, env = "POD_NAMESPACE", default_value = "aether-system")]
    namespace: String,
    /// The proxy's DaemonSet: when it is gone at SIGTERM, aether may be being uninstalled.
    #[arg(long, default_value = "aether-proxy")]
    daemonset: String,
    /// The ConfigMap (in --namespace) that `helm uninstall` creates first (a pre-delete hook):
    /// an uninstall is only ever this explicit signal, never a missing DaemonSet alone.
    #[arg(long, default_value = "aether-uninstalling")]
    uninstall_marker: String,
    /// This proxy's pod (in --namespace): a marker older than it is a past uninstall's.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// The operator's certificate authority, `host:port`.
    #[arg(long, default_value = "aether-operator.aether-system.svc:8443")]
    ca_address: String,
    /// The proxy's projected ServiceAccount token (audience `aether`).
    #[arg(long, default_value = "/var/run/secrets/aether/token")]
    token_file: PathBuf,
    /// The ConfigMap (in --namespace) with the trust bundle.
    #[arg(long, default_value = "aether-trust-bundle")]
    trust_bundle: String,
    /// How often every captured pod's table and listeners are checked.
    #[arg(long, default_value_t = 10)]
    drift_check_seconds: u64,
    /// The node's CNI directories, cleaned at uninstall.
    #[arg(long, default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// The kubeconfig the CNI plugin falls back to (the installer names it in the node's CNI
    /// config); the proxy keeps a token of --cni-service-account in it.
    #[arg(long, default_value = "/etc/cni/net.d/aether-cni.kubeconfig")]
    cni_kubeconfig: PathBuf,
    /// The ServiceAccount (in --namespace) whose token the CNI plugin uses.
    #[arg(long, default_value = "aether-cni")]
    cni_service_account: String,
    /// The most connections one pod's capture listener (or its inbound one) holds open at once;
    /// more are reset on accept.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_listener: u32,
    /// The most connections all listeners of the node hold open at once (each takes two file
    /// descriptors; lowered to fit the open-file limit).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// How long open connections may take to finish after SIGTERM or a hand-over.
    #[arg(long, default_value_t = 5)]
    drain_seconds: u64,
    /// Where this proxy offers its sockets to a successor, and looks for a predecessor's.
    #[arg(long, default_value = "/var/run/aether/handover.sock")]
    handover_socket: PathBuf,
    /// The `aether-proxy hold` process that keeps copies of this proxy's sockets across a
    /// crash: a proxy that starts with no predecessor takes them from it.
    #[arg(long)]
    holder_socket: Option<PathBuf>,
    /// Where the SVIDs are kept for a restart of the proxy (a memory-backed volume of the
    /// pod, so that private keys never reach the node's disk); without it, none are kept.
    #[arg(long)]
    svid_dir: Option<PathBuf>,
    /// Run this `nft` program instead of libnftables in-process.
    #[arg(long)]
    nft_path: Option<PathBuf>,
    /// Threads that serve the pods' connections. One thread keeps each request's hops (accept,
    /// routing, the pooled mTLS connection, the app) on one core with no cross-thread wake-ups,
    /// which costs the least CPU and latency per request; more threads give a busy node more
    /// throughput. The cluster watches, the CNI server and the CA client have a thread of their
    /// own, so their work never delays a request.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    worker_threads: u16,
}

/// Without the cluster, the proxy cannot say whether a pod is meshed.
struct NoClusterView;

impl NoClusterView {
    fn error() -> ViewError {
        ViewError::NotReady("this aether-proxy runs without the cluster (--capture-set)".into())
    }
}

impl PodView for NoClusterView {
    fn namespace_labels(&self, _: &str) -> Result<Labels, ViewError> {
        Err(NoClusterView::error())
    }

    fn pod_annotations(&self, _: &PodRef) -> Result<Labels, ViewError> {
        Err(NoClusterView::error())
    }

    fn pod_ips(&self, _: &PodRef) -> Result<Vec<std::net::IpAddr>, ViewError> {
        Err(NoClusterView::error())
    }
}

/// `ADDRESS:PORT`, with an IPv6 address in brackets or bare (the port is after the last `:`).
fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let (ip, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not ADDRESS:PORT"))?;
    let ip: std::net::IpAddr = ip.parse().map_err(|e| format!("{ip:?}: {e}"))?;
    let port: u16 = port.parse().map_err(|e| format!("port {port:?}: {e}"))?;
    Ok(SocketAddr::new(ip, port))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // Colour codes would garble logs collected from a pipe (the container runtime's).
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = match Cli::parse().command {
        Command::Run(args) => args,
        Command::Hold { socket } => return hold(&socket),
    };
    let open_files = raise_open_file_limit();
    let result = runtimes(args.worker_threads)
        .and_then(|(control, data)| control.block_on(run(*args, data, open_files)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `aether-proxy hold`: keeps the proxy's sockets until SIGTERM or SIGINT.
fn hold(socket: &Path) -> ExitCode {
    let holder = match Holder::bind(socket) {
        Ok(holder) => holder,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let serving = std::thread::Builder::new()
        .name("aether-holder".into())
        .spawn(move || holder.run());
    let stopped = serving
        .context("cannot start the holder's thread")
        .and_then(|_| {
            // As a container's first process, without a handler of its own, SIGTERM would be
            // ignored until the grace period's SIGKILL.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start a runtime for the holder's signals")?;
            runtime
                .block_on(until_stopped())
                .context("the holder's signal handlers")
        });
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Completes at SIGTERM or SIGINT.
async fn until_stopped() -> std::io::Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}

/// Every captured connection holds two descriptors, and every pod's listeners a few more: the
/// usual soft limit of 1024 would refuse connections long before the node is busy. Raised to
/// the hard limit (the runtime's, typically over a million). Returns the limit in force, when
/// known.
fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                info!(from = soft, to = hard, "raised the open-file limit");
                Some(hard)
            }
            Err(e) => {
                warn!(error = %e, limit = soft, "cannot raise the open-file limit");
                Some(soft)
            }
        },
        Ok((soft, _)) => Some(soft),
        Err(e) => {
            warn!(error = %e, "cannot read the open-file limit");
            None
        }
    }
}

/// Descriptors kept for what is not a connection: listeners, netns handles, the API client.
const RESERVED_FILES: u64 = 1024;

/// The connection limits from the flags, the node's lowered so its connections' two descriptors
/// each fit in the open-file limit.
fn connection_limits(args: &RunArgs, open_files: Option<u64>) -> ConnectionLimits {
    let fits = open_files.map_or(u64::MAX, |n| n.saturating_sub(RESERVED_FILES) / 2);
    let per_node = u64::from(args.max_connections).min(fits).max(1);
    if per_node < u64::from(args.max_connections) {
        info!(
            max_connections = per_node,
            open_files, "lowered --max-connections to fit the open-file limit"
        );
    }
    ConnectionLimits {
        per_listener: args.max_connections_per_listener as usize,
        per_node: per_node as usize,
    }
}

/// The control runtime (cluster, CNI server, identity, admin) and a handle on the data
/// plane's. One data thread is tokio's current-thread scheduler (no work-stealing machinery on
/// the request path); more are a multi-thread runtime.
fn runtimes(
    data_threads: u16,
) -> anyhow::Result<(tokio::runtime::Runtime, tokio::runtime::Handle)> {
    let control = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("aether-control")
        .enable_all()
        .build()
        .context("cannot start the aether-control runtime")?;
    let mut builder = if data_threads > 1 {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(data_threads));
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let data = builder
        .thread_name("aether-data")
        .enable_all()
        .build()
        .context("cannot start the aether-data runtime")?;
    let handle = data.handle().clone();
    // A current-thread runtime runs its tasks only inside `block_on`: a thread of its own does
    // that for the process's life (and keeps either kind of runtime alive).
    std::thread::Builder::new()
        .name("aether-data".into())
        .spawn(move || data.block_on(std::future::pending::<()>()))
        .context("cannot start the aether-data thread")?;
    Ok((control, handle))
}

/// Runs the proxy on the control runtime; `data` serves the pods' connections.
async fn run(
    args: RunArgs,
    data: tokio::runtime::Handle,
    open_files: Option<u64>,
) -> anyhow::Result<()> {
    info!(node = %args.node, capture_port = args.capture_port, inbound_port = args.inbound_port, "starting aether-proxy");
    let limits = connection_limits(&args, open_files);
    let metrics = Arc::new(Metrics::new());
    // Its one receiver is the admin task's, absent while a successor holds the admin socket:
    // readiness changes go in with `send_replace`, which keeps them even then.
    let (ready, _) = watch::channel(Err("starting".to_string()));
    // A proxy of this pod that crashed left its sockets with the holder; only without them is
    // a predecessor in another pod asked for its own (a rolling update).
    let mut given = match &args.holder_socket {
        Some(path) => take_held(path).await,
        None => Given::default(),
    };
    if given.superseded {
        // Taking a successor's sockets back would leave them to a pod being deleted.
        info!("this pod's proxy handed its sockets to another pod's; waiting for SIGTERM");
        until_stopped().await.context("SIGTERM handler")?;
        return Ok(());
    }
    let (mut successor, admin) = match given.admin.take() {
        Some(admin) => (None, Some(admin)),
        None => find_predecessor(&args.handover_socket).await,
    };
    let admin = match admin {
        Some(fd) => inherit_admin(fd, args.admin_addr)?,
        None => std::net::TcpListener::bind(args.admin_addr)
            .with_context(|| format!("cannot listen on --admin-addr {}", args.admin_addr))?,
    };
    admin
        .set_nonblocking(true)
        .context("the admin socket: non-blocking mode")?;
    let serve_admin = |admin: &std::net::TcpListener| -> anyhow::Result<_> {
        let listener = tokio::net::TcpListener::from_std(admin.try_clone()?)?;
        let scraped = metrics.clone();
        Ok(tokio::spawn(aether_admin::serve(
            listener,
            move || scraped.text(),
            ready.subscribe(),
            aether_admin::Limits::default(),
        )))
    };
    let mut admin_task = Some(serve_admin(&admin).context("serving the admin endpoint")?);
    // Tasks that run for the process's life: one that ends (a panic) ends the process, so the
    // kubelet restarts a proxy that would otherwise serve half-working.
    let mut lifelong = Vec::new();
    let nft = args
        .nft_path
        .clone()
        .map_or_else(Nft::default, Nft::program);
    let mut cluster = None;
    let (stopping, _) = watch::channel(false);
    let (mut repair, mut apply) = (None, None);
    let (agent, capture_file) = match &args.capture_set {
        Some(path) => {
            let capture = CaptureSet::load(path)?;
            let config = AgentConfig {
                state_dir: args.state_dir.clone(),
                capture_port: args.capture_port,
                inbound_port: None,
                node_netns: None,
                nft,
                limits,
                inherited: take_pods(successor.take(), &mut given).await,
            };
            let plane = DataPlane::new(None);
            (
                start_agent(config, Arc::new(NoClusterView), capture, data, plane).await?,
                Some(path.clone()),
            )
        }
        None => {
            let client = kube::Client::try_default()
                .await
                .context("cannot reach the API server (in-cluster config or KUBECONFIG)")?;
            lifelong.push((
                "the CNI kubeconfig",
                tokio::spawn(cni_kubeconfig::maintain(
                    client.clone(),
                    args.namespace.clone(),
                    args.cni_service_account.clone(),
                    args.cni_kubeconfig.clone(),
                )),
            ));
            let (pods, pods_writer) = NodePods::load(&args.state_dir);
            let view = ClusterView::start(
                &client,
                &args.node,
                Install {
                    namespace: args.namespace.clone(),
                    bundle: args.trust_bundle.clone(),
                    daemonset: args.daemonset.clone(),
                    uninstall_marker: args.uninstall_marker.clone(),
                    pod: args.pod_name.clone(),
                },
                &args.state_dir,
                pods.clone(),
                &mut lifelong,
            );
            let resolver_view = view.clone();
            let resolve: Resolver = Arc::new(move |host: &str| {
                resolver_view.service_ip(host).or_else(|| {
                    std::net::ToSocketAddrs::to_socket_addrs(&(host, 0))
                        .ok()?
                        .next()
                        .map(|a| a.ip())
                })
            });
            let bundle_view = view.clone();
            lifelong.push((
                "the pod feed",
                tokio::spawn(node_pods::feed(
                    pods_writer,
                    pods,
                    node_pods::FeedConfig {
                        address: args.ca_address.clone(),
                        token_file: args.token_file.clone(),
                        node: args.node.clone(),
                        state_dir: args.state_dir.clone(),
                    },
                    move || bundle_view.trust_bundle(),
                    resolve.clone(),
                    view.changed.clone(),
                )),
            ));
            let _ = ready.send_replace(Err("waiting for the watch caches".into()));
            view.wait_synced().await.map_err(anyhow::Error::msg)?;
            let trust = TrustStore::new(&args.trust_domain);
            if let Some(pem) = view.trust_bundle()
                && let Err(e) = trust.set_bundle(&pem)
            {
                error!(error = %e, "the published trust bundle is unusable");
            }
            let certs = Certs::new(trust.clone());
            // Before any listener serves: a restart while the CA cannot issue keeps identities.
            let kept = KeptSvids::new(args.svid_dir.clone());
            let restored = kept.restore(&certs, std::time::SystemTime::now());
            let cell = Arc::new(SnapshotCell::default());
            // Until the node's NodeConfig is read, its pods keep what their tables hold.
            let saved = CaptureSet::load_saved(&args.state_dir).unwrap_or_else(|e| {
                warn!(error = %e, "ignoring the saved capture set");
                None
            });
            let last = Snapshot {
                capture: saved.unwrap_or_default(),
                ..Snapshot::default()
            };
            let snapshot = Arc::new(view.snapshot(&last));
            cell.store(snapshot.clone());
            let demand = Arc::new(Demand::default());
            lifelong.push((
                "the demand report",
                tokio::spawn(node::report_demand(
                    client.clone(),
                    args.node.clone(),
                    demand.clone(),
                )),
            ));
            let plane = DataPlane::new(Some(Mesh {
                snapshot: cell.clone(),
                certs: certs.clone(),
                workloads: view.clone(),
                metrics: metrics.clone(),
                inbound_port: args.inbound_port,
                demand,
            }));
            let config = AgentConfig {
                state_dir: args.state_dir.clone(),
                capture_port: args.capture_port,
                inbound_port: Some(args.inbound_port),
                // The proxy runs on the node's network; its main thread never leaves it.
                node_netns: Some("/proc/self/ns/net".into()),
                nft,
                limits,
                inherited: take_pods(successor.take(), &mut given).await,
            };
            let agent =
                start_agent(config, view.clone(), snapshot.capture.clone(), data, plane).await?;
            let (wanted, wanted_rx) = watch::channel(BTreeSet::new());
            let ca = CaClient {
                address: args.ca_address.clone(),
                token_file: args.token_file.clone(),
                trust: trust.clone(),
                resolve,
            };
            lifelong.push((
                "the SVID renewal",
                tokio::spawn(svid::maintain(
                    ca,
                    certs.clone(),
                    wanted_rx,
                    metrics.clone(),
                    kept,
                    restored,
                )),
            ));
            apply = Some(tokio::spawn(apply::apply_changes(
                client.clone(),
                view.clone(),
                agent.clone(),
                cell,
                certs.clone(),
                wanted,
                metrics.clone(),
                stopping.subscribe(),
            )));
            repair = Some(tokio::spawn(drift::repair_drift(
                client.clone(),
                view.clone(),
                agent.clone(),
                metrics.clone(),
                Duration::from_secs(args.drift_check_seconds.max(1)),
                CniEntry::current(&args.cni_conf_dir),
                stopping.subscribe(),
            )));
            cluster = Some(view);
            (agent, None)
        }
    };
    let socket = match given.cni.take() {
        Some(fd) => CniSocket::inherit(fd, &args.cni_socket)?,
        None => cni_server::bind(&args.cni_socket)?,
    };
    let cni_copy = socket.copy().context("the CNI socket")?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(cni_server::serve(socket, agent.clone(), async {
        stopped.await.unwrap_or(cni_server::Stop::Remove)
    }));
    let _ = ready.send_replace(Ok(()));
    let mut handover = offer_sockets(&args.handover_socket, &admin)?;
    let keeper = match &args.holder_socket {
        Some(path) => Some(keep_sockets(path, &admin, &cni_copy, &agent).await?),
        None => None,
    };

    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let mut crashed = None;
    let mut handing_over = None;
    loop {
        let supervised = lifelong
            .iter_mut()
            .map(|(name, task)| (*name, task))
            .chain(admin_task.as_mut().map(|task| ("the admin endpoint", task)))
            .chain(apply.as_mut().map(|task| ("the config loop", task)))
            .chain(repair.as_mut().map(|task| ("the drift repair", task)))
            .map(|(name, task)| Box::pin(async move { (name, task.await) }));
        let ended = futures::future::select_all(supervised);
        let event = tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => {
                reload(&agent, capture_file.as_deref()).await;
                continue;
            }
            Some(event) = handover.recv() => event,
            ((task, result), _, _) = ended => {
                let why = result.err().map_or_else(|| "it returned".to_string(), |e| e.to_string());
                error!(task, why, "a task of the proxy ended: stopping, to be restarted");
                crashed = Some(task);
                break;
            }
        };
        match event {
            Event::AdminTaken => {
                if let Some(task) = admin_task.take() {
                    task.abort();
                }
                info!("a successor serves the admin endpoint now");
            }
            Event::Abandoned => {
                if admin_task.is_none() {
                    admin_task = Some(serve_admin(&admin).context("serving the admin endpoint")?);
                }
                warn!("the successor went away before it took the pods; this proxy goes on");
            }
            Event::PodsWanted(reply) => {
                handing_over = Some(reply);
                break;
            }
        }
    }
    info!(handing_over = handing_over.is_some(), "shutting down");
    let _ = ready.send_replace(Err("shutting down".into()));
    let _ = stop.send(if handing_over.is_some() {
        cni_server::Stop::HandOver
    } else {
        cni_server::Stop::Remove
    });
    server.await.context("the CNI server")?;
    let _ = stopping.send(true);
    for task in [repair, apply].into_iter().flatten() {
        if !task.is_finished() {
            let _ = task.await;
        }
    }
    if let Some(reply) = handing_over {
        hand_over(reply, &agent, cni_copy);
        if let Some(keeper) = keeper {
            tokio::task::spawn_blocking(move || keeper.release()).await?;
        }
        agent
            .shutdown(Duration::from_secs(args.drain_seconds))
            .await;
        for task in lifelong.iter().map(|(_, task)| task).chain(&admin_task) {
            task.abort();
        }
        // Exiting would have the kubelet start this container again, and take the sockets
        // back: the pod waits for its deletion instead.
        info!("handed over to the successor and drained; waiting for SIGTERM");
        until_stopped().await.context("SIGTERM handler")?;
        info!("stopped");
        return Ok(());
    }
    if crashed.is_none()
        && let Some(view) = cluster
        && view.is_uninstalling().await
    {
        uninstall(&agent, &args).await;
    }
    agent
        .shutdown(Duration::from_secs(args.drain_seconds))
        .await;
    if let Some(task) = crashed {
        anyhow::bail!("{task} ended");
    }
    info!("stopped");
    Ok(())
}

/// A proxy already running on this node hands over its sockets: its admin socket now (the
/// rest is for [`take_pods`]). `None` when there is none, and also when the hand-over fails:
/// this proxy then opens sockets of its own.
async fn find_predecessor(path: &Path) -> (Option<Successor>, Option<OwnedFd>) {
    let path = path.to_owned();
    match tokio::task::spawn_blocking(move || Successor::connect(&path)).await {
        Ok(Ok(Some((successor, admin)))) => {
            info!("a proxy runs on this node: taking over its sockets");
            (Some(successor), Some(admin))
        }
        Ok(Ok(None)) => (None, None),
        Ok(Err(e)) => {
            warn!(error = %e, "cannot take over the running proxy's sockets; opening new ones");
            (None, None)
        }
        Err(e) => {
            warn!(error = %e, "taking over the running proxy's sockets failed");
            (None, None)
        }
    }
}

/// The admin socket a predecessor handed over, if it is bound where this proxy serves.
fn inherit_admin(fd: OwnedFd, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let admin = std::net::TcpListener::from(fd);
    let bound = admin.local_addr().context("the handed-over admin socket")?;
    anyhow::ensure!(
        bound == addr,
        "the running proxy's admin socket is bound to {bound}, not to --admin-addr {addr}"
    );
    Ok(admin)
}

/// The sockets the holder kept from a proxy of this pod that crashed; none when there is no
/// holder, or it fails to give them: this proxy then opens sockets of its own.
async fn take_held(path: &Path) -> Given {
    let path = path.to_owned();
    match tokio::task::spawn_blocking(move || Successor::take_held(&path)).await {
        Ok(Ok(Some(held))) => {
            info!(
                listeners = held.pods.len(),
                "took the sockets the holder kept from the proxy before"
            );
            held
        }
        Ok(Ok(None)) => Given::default(),
        Ok(Err(e)) => {
            warn!(error = %e, "the holder did not give its sockets; opening new ones");
            Given::default()
        }
        Err(e) => {
            warn!(error = %e, "taking the holder's sockets failed");
            Given::default()
        }
    }
}

/// The predecessor's CNI socket and pods' listeners (it stops changing the node now), into
/// `given`; returns the pods' listeners in `given`, for the agent. When the predecessor fails
/// to hand them over, the agent opens listeners of its own.
async fn take_pods(successor: Option<Successor>, given: &mut Given) -> Vec<PodSocket> {
    if let Some(successor) = successor {
        match tokio::task::spawn_blocking(move || successor.take_pods()).await {
            Ok(Ok(taken)) => {
                info!(
                    listeners = taken.pods.len(),
                    cni = taken.cni.is_some(),
                    "took over the running proxy's sockets"
                );
                *given = taken;
            }
            Ok(Err(e)) => {
                error!(error = %e, "the running proxy did not hand over its sockets; opening new ones")
            }
            Err(e) => error!(error = %e, "taking over the running proxy's sockets failed"),
        }
    }
    std::mem::take(&mut given.pods)
}

/// Offers this proxy's sockets to the next one, on a thread of its own (the offer blocks); its
/// events come on the returned channel. Without an offer (the socket cannot be bound), a
/// rolling update of the proxy closes the sockets: said, not fatal.
fn offer_sockets(
    path: &Path,
    admin: &std::net::TcpListener,
) -> anyhow::Result<tokio::sync::mpsc::UnboundedReceiver<Event>> {
    let (events, heard) = tokio::sync::mpsc::unbounded_channel();
    match Offer::bind(path) {
        Ok(offer) => {
            let admin = admin
                .as_fd()
                .try_clone_to_owned()
                .context("the admin socket")?;
            std::thread::Builder::new()
                .name("aether-handover".into())
                .spawn(move || offer.serve(admin, events))
                .context("cannot start the hand-over thread")?;
        }
        Err(e) => {
            warn!(error = %e, "cannot offer this proxy's sockets to a successor; its restart will refuse connections")
        }
    }
    Ok(heard)
}

/// Has the holder at `path` keep this proxy's sockets from now on.
async fn keep_sockets(
    path: &Path,
    admin: &std::net::TcpListener,
    cni: &OwnedFd,
    agent: &Arc<Agent>,
) -> anyhow::Result<Arc<Keeper>> {
    let admin = admin
        .as_fd()
        .try_clone_to_owned()
        .context("the admin socket")?;
    let keeper = Arc::new(Keeper::new(path.to_owned(), admin, cni.try_clone()?));
    let (kept, agent) = (keeper.clone(), agent.clone());
    tokio::task::spawn_blocking(move || agent.keep_sockets_in(kept)).await?;
    Ok(keeper)
}

/// Sends the successor the CNI socket and every registered pod's listeners.
fn hand_over(reply: tokio::sync::oneshot::Sender<Vec<Socket>>, agent: &Agent, cni: OwnedFd) {
    let mut sockets = vec![Socket::Cni(cni)];
    match agent.pod_sockets() {
        Ok(pods) => sockets.extend(pods.into_iter().map(Socket::Pod)),
        Err(e) => {
            error!(error = %e, "cannot copy the pods' listeners; the successor opens new ones")
        }
    }
    if reply.send(sockets).is_err() {
        error!("the hand-over thread is gone; the successor opens new sockets");
    }
}

/// Restoring runs nftables and opens sockets in pods' namespaces: blocking work. It comes
/// before the CNI socket is bound, so no registration can race it.
async fn start_agent(
    config: AgentConfig,
    view: Arc<dyn PodView>,
    capture: CaptureSet,
    runtime: tokio::runtime::Handle,
    plane: Arc<DataPlane>,
) -> anyhow::Result<Arc<Agent>> {
    let agent =
        tokio::task::spawn_blocking(move || Agent::start(config, view, capture, runtime, plane))
            .await
            .context("starting the agent")??;
    Ok(Arc::new(agent))
}

/// How long the listeners accept after an uninstall's SIGTERM: every proxy leaves at once, so
/// peers stop sending within moments, not after the news of a label travelled.
const UNINSTALL_LINGER: Duration = Duration::from_secs(3);

/// aether is going away: no pod may keep a table that redirects to a proxy that will not come
/// back, and no new pod may be handed to a plugin that is gone. Every pod leaves the mesh as
/// when its namespace is unlabelled, so no request is lost: new connections go direct at once,
/// peers that still send mTLS are served while the listeners linger, open connections finish,
/// then the tables go.
async fn uninstall(agent: &Arc<Agent>, args: &RunArgs) {
    info!("helm uninstall: removing aether from this node");
    let leaving = agent.clone();
    let left = tokio::task::spawn_blocking(move || {
        let ids: Vec<String> = leaving
            .registered()
            .into_iter()
            .map(|pod| pod.container_id)
            .collect();
        leaving.leave(&ids, UNINSTALL_LINGER)
    })
    .await;
    for (pod, result) in left.unwrap_or_default() {
        if let Err(error) = result {
            warn!(pod = %pod, error, "a pod could not leave the mesh gently; its table is deleted");
        }
    }
    loop {
        let sweeping = agent.clone();
        match tokio::task::spawn_blocking(move || sweeping.finish_leaving()).await {
            Ok(Some(due)) => tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await,
            Ok(None) => break,
            Err(e) => {
                error!(error = %e, "moving the leaving pods on failed");
                break;
            }
        }
    }
    let agent = agent.clone();
    let (bin, conf) = (args.cni_bin_dir.clone(), args.cni_conf_dir.clone());
    let done = tokio::task::spawn_blocking(move || {
        let failed = agent.remove_all();
        agent.remove_node_probes();
        (failed, aether_cni::install::uninstall(&bin, &conf))
    })
    .await;
    match done {
        Ok((failed, cni)) => {
            for (pod, error) in failed {
                error!(
                    container_id = pod,
                    error, "cannot remove a pod's capture table"
                );
            }
            match cni {
                Ok(edited) => {
                    info!(edited = ?edited, "removed aether-cni from the node's CNI configuration")
                }
                Err(e) => {
                    error!(error = %e, "cannot remove aether-cni from the node's CNI configuration")
                }
            }
        }
        Err(e) => error!(error = %e, "uninstalling failed"),
    }
}
/// SIGHUP: re-read the capture set file and update every registered pod's table.
async fn reload(agent: &Arc<Agent>, path: Option<&Path>) {
    let Some(path) = path else {
        info!("SIGHUP: no --capture-set file to re-read");
        return;
    };
    let capture = match CaptureSet::load(path) {
        Ok(capture) => capture,
        Err(e) => {
            error!(error = %e, "keeping the current capture set");
            return;
        }
    };
    let agent = agent.clone();
    match tokio::task::spawn_blocking(move || agent.update_capture_set(capture)).await {
        Ok(update) => info!(
            generation = update.generation,
            updated = update.updated.len(),
            failed = update.failed.len(),
            "applied the capture set"
        ),
        Err(e) => error!(error = %e, "updating the capture set failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_takes_a_bare_ipv6_address() {
        let parsed = |text| parse_listen_addr(text).map(|a| a.to_string());
        assert_eq!(parsed("10.0.0.1:15020").unwrap(), "10.0.0.1:15020");
        assert_eq!(parsed("[fd00::1]:15020").unwrap(), "[fd00::1]:15020");
        assert_eq!(parsed("fd00::1:15020").unwrap(), "[fd00::1]:15020");
        for bad in ["", "15020", "node:15020", "10.0.0.1:", "10.0.0.1:70000"] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }
}
