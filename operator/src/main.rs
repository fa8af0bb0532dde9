//! aether-operator: derives RouteTargets from GAMMA routes, writes their status, the routes'
//! status and the per-node configs (as the elected leader), and runs the mesh certificate
//! authority (every replica serves it).

use std::net::SocketAddr;
use std::sync::Arc;

use aether_core::identity::ServiceAccount;
use aether_operator::ca::{self, CaConfig};
use aether_operator::controller::{self, Config};
use aether_operator::leader;
use aether_operator::metrics::Metrics;
use anyhow::{Context, Result};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(name = "aether-operator", version, about)]
struct Args {
    /// The install namespace: leader Lease, CA Secret, trust bundle.
    #[arg(long, env = "POD_NAMESPACE", default_value = "aether-system")]
    namespace: String,
    /// This replica's name in the leader election.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The node proxy's ServiceAccount, `namespace/name`: the only caller the CA signs for.
    #[arg(long, default_value = "aether-system/aether-proxy")]
    proxy_service_account: String,
    /// The certificate authority's HTTPS endpoint.
    #[arg(long, default_value = "0.0.0.0:8443")]
    ca_addr: SocketAddr,
    /// /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
    /// The Secret (in --namespace) with the signing root: generated at first start unless it
    /// exists (a user-supplied root).
    #[arg(long, default_value = "aether-ca")]
    ca_secret: String,
    /// Lifetime of the SVIDs the CA issues; proxies renew them at half-life.
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(60..))]
    svid_ttl_seconds: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("aether-operator-{}", std::process::id()));

    let proxy: ServiceAccount = args
        .proxy_service_account
        .parse()
        .with_context(|| format!("--proxy-service-account {:?}", args.proxy_service_account))?;
    let ca_config = CaConfig {
        namespace: args.namespace.clone(),
        trust_domain: args.trust_domain.clone(),
        cluster_domain: args.cluster_domain.clone(),
        proxy_service_account: proxy,
        bind: args.ca_addr,
        secret_name: args.ca_secret.clone(),
        svid_ttl: std::time::Duration::from_secs(args.svid_ttl_seconds),
        ..CaConfig::default()
    };
    let (leading_tx, leading) = watch::channel(false);
    let ca = ca::start(client.clone(), ca_config, leading.clone())
        .await
        .context("starting the certificate authority")?;

    let metrics = Arc::new(Metrics::new());
    let (ready_tx, ready) = watch::channel(Err("watch caches not ready".to_string()));
    let admin = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-addr {}", args.metrics_addr))?;
    tracing::info!(addr = %args.metrics_addr, "serving /healthz, /readyz and /metrics");
    let scraped = metrics.clone();
    let admin = tokio::spawn(aether_admin::serve(
        admin,
        move || scraped.text(),
        ready,
        aether_admin::Limits::default(),
    ));
    let election = tokio::spawn(leader::elect(
        client.clone(),
        args.namespace.clone(),
        "aether-operator".into(),
        identity,
        leading_tx,
    ));
    let controller = tokio::spawn(controller::run(
        client,
        Config {
            trust_domain: args.trust_domain,
        },
        leading,
        metrics,
        ready_tx,
    ));

    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    // Each task runs for the life of the process; one that ends (or panics) ends it with an
    // error, so that the kubelet restarts a replica that would otherwise run half-working.
    let ended = tokio::select! {
        _ = terminate.recv() => { tracing::info!("SIGTERM: shutting down"); None }
        _ = tokio::signal::ctrl_c() => { tracing::info!("interrupted: shutting down"); None }
        result = admin => Some(("the admin endpoint", result)),
        result = election => Some(("the leader election", result)),
        result = controller => Some(("the controller", result)),
    };
    ca.shutdown().await;
    match ended {
        None => Ok(()),
        Some((task, Ok(()))) => anyhow::bail!("{task} stopped"),
        Some((task, Err(e))) => anyhow::bail!("{task} failed: {e}"),
    }
}
