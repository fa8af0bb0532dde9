//! aether-node: plays the kubelet and container runtime of one node of the local test
//! cluster. It registers the Node, keeps its Lease, and runs every pod bound to it as
//! processes in a network namespace set up by the node's real CNI chain.

mod cni;
mod container;
mod images;
mod mounts;
mod node;
mod pods;
mod probes;
mod volumes;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Parser, Debug)]
#[command(
    name = "aether-node",
    about = "The node simulator of aether's local test cluster"
)]
struct Args {
    /// Node name.
    #[arg(long)]
    name: String,
    /// Kubeconfig with this node's credentials (user system:node:<name>).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node's address on the underlay network.
    #[arg(long)]
    node_ip: String,
    #[arg(long)]
    pod_cidr: String,
    /// The node's network namespace (a name under /var/run/netns).
    #[arg(long)]
    netns: String,
    /// The node's own directory: its private filesystem and its pods' files.
    #[arg(long)]
    root: PathBuf,
    /// Directories with the programs that play container images.
    #[arg(long = "image-bin-dir", required = true)]
    image_bin_dirs: Vec<PathBuf>,
    /// CNI plugin directories, as seen on the node.
    #[arg(long = "cni-bin-dir", default_values = ["/opt/cni/bin", "/usr/lib/cni"])]
    cni_bin_dirs: Vec<PathBuf>,
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    #[arg(long, default_value = "10.96.0.10")]
    cluster_dns: String,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
}

async fn client(path: &PathBuf) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// The variables the kubelet gives every container so that in-cluster clients find the
/// API server.
async fn base_env(client: &kube::Client) -> Result<Vec<(String, String)>> {
    let service = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .context("Service default/kubernetes")?;
    let spec = service.spec.unwrap_or_default();
    let ip = spec.cluster_ip.unwrap_or_default();
    let port = spec
        .ports
        .unwrap_or_default()
        .first()
        .map_or(443, |p| p.port);
    Ok(vec![
        ("KUBERNETES_SERVICE_HOST".into(), ip.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ("KUBERNETES_PORT".into(), format!("tcp://{ip}:{port}")),
    ])
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = client(&args.kubeconfig).await?;
    let info = node::NodeInfo {
        name: args.name.clone(),
        ip: args.node_ip.clone(),
        pod_cidr: args.pod_cidr.clone(),
    };
    let view = mounts::NodeView {
        root: args.root.join("fs"),
    };
    view.prepare()
        .context("preparing the node's private directories")?;

    node::register(&client, &info).await?;
    tokio::spawn(node::heartbeat(client.clone(), info.clone()));
    tracing::info!(node = info.name, ip = info.ip, "node registered");

    let runtime = Arc::new(pods::Runtime {
        base_env: base_env(&client).await?,
        client,
        node: info,
        cni: cni::Cni {
            view: view.clone(),
            node_netns: PathBuf::from("/var/run/netns").join(&args.netns),
            conf_dir: args.cni_conf_dir,
            bin_dirs: args.cni_bin_dirs,
            cache_dir: args.root.join("cni-cache"),
        },
        view,
        bin_dirs: args.image_bin_dirs,
        pods_dir: args.root.join("pods"),
        node_netns: PathBuf::from("/var/run/netns").join(&args.netns),
        cluster_dns: args.cluster_dns,
        cluster_domain: args.cluster_domain,
    });
    tokio::select! {
        result = pods::run(runtime) => result,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; pods keep running until the cluster is taken down");
            Ok(())
        }
    }
}
