//! aether-proxy, the node proxy. `aether-proxy run` serves the aether-cni plugin and keeps the
//! capture listeners of this node's meshed pods.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aether_cni::nft::Nft;
use aether_cni::protocol::{DEFAULT_SOCKET, PodRef};
use aether_proxy::agent::{Agent, AgentConfig};
use aether_proxy::capture_set::CaptureSet;
use aether_proxy::cni_server;
use aether_proxy::pod_view::{Labels, PodView, ViewError};
use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

const RUN_HELP: &str = "\
Serves the aether-cni plugin on --cni-socket, opens the capture listeners of every registered \
pod inside its network namespace (again after a restart, from the registry in --state-dir), and \
forwards each captured connection as plain TCP to its original destination.

This build does not watch the cluster yet:
- the capture set comes from --capture-set (re-read on SIGHUP) or is empty; the operator's \
NodeConfig is not read;
- it has no view of namespaces and pods, so it answers the plugin's `add` and `check` with \
\"not ready\": aether-cni then decides from the API server itself, starts unmeshed pods and \
fails the ADD of meshed pods (fail closed).
Routing, mTLS and the inbound port are not built yet.

SIGTERM or SIGINT: stop serving the plugin, close every listener, give open captured connections \
--drain-seconds to finish. The registry stays for the next start.";

#[derive(Parser)]
#[command(name = "aether-proxy", version, about = "aether's node proxy")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CNI plugin and the capture listeners of this node's meshed pods.
    #[command(long_about = RUN_HELP)]
    Run(RunArgs),
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
    /// JSON capture set, `{"generation": 1, "targets": ["10.96.0.10:80", "[fd00::10]:80"]}`,
    /// re-read on SIGHUP. Without it the capture set is empty.
    #[arg(long)]
    capture_set: Option<PathBuf>,
    /// How long open captured connections may take to finish after SIGTERM.
    #[arg(long, default_value_t = 5)]
    drain_seconds: u64,
    /// Run this `nft` program instead of libnftables in-process.
    #[arg(long)]
    nft_path: Option<PathBuf>,
}

/// Until the proxy watches namespaces and pods, it cannot say whether a pod is meshed.
struct NoClusterView;

impl NoClusterView {
    fn error() -> ViewError {
        ViewError::NotReady("this aether-proxy does not watch namespaces and pods yet".into())
    }
}

impl PodView for NoClusterView {
    fn namespace_labels(&self, _: &str) -> Result<Labels, ViewError> {
        Err(NoClusterView::error())
    }

    fn pod_annotations(&self, _: &PodRef) -> Result<Labels, ViewError> {
        Err(NoClusterView::error())
    }
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
    let Cli {
        command: Command::Run(args),
    } = Cli::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run(args: RunArgs) -> anyhow::Result<()> {
    info!(node = %args.node, capture_port = args.capture_port, "starting aether-proxy");
    let capture = match &args.capture_set {
        Some(path) => CaptureSet::load(path)?,
        None => CaptureSet::default(),
    };
    let config = AgentConfig {
        state_dir: args.state_dir.clone(),
        capture_port: args.capture_port,
        nft: args
            .nft_path
            .clone()
            .map_or_else(Nft::default, Nft::program),
    };
    let runtime = tokio::runtime::Handle::current();
    // Restoring runs nftables and opens sockets in pods' namespaces: blocking work. It comes
    // before the socket is bound, so no registration can race it.
    let agent = tokio::task::spawn_blocking(move || {
        Agent::start(config, Arc::new(NoClusterView), capture, runtime)
    })
    .await
    .context("starting the agent")??;
    let agent = Arc::new(agent);
    let socket = cni_server::bind(&args.cni_socket)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cni_server::serve(socket, agent.clone(), async {
        let _ = stopped.await;
    }));

    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => reload(&agent, args.capture_set.as_deref()).await,
        }
    }
    info!("shutting down");
    let _ = stop.send(());
    server.await.context("the CNI server")?;
    agent
        .shutdown(Duration::from_secs(args.drain_seconds))
        .await;
    info!("stopped");
    Ok(())
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
