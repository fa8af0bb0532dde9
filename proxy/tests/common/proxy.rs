//! The proxy's CNI server and agent, in-process on their own tokio runtime, with a fixed view
//! of the cluster: namespace `shop` is managed, every other namespace is not.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aether_cni::nft::Nft;
use aether_cni::protocol::PodRef;
use aether_core::names::MANAGED_LABEL;
use aether_proxy::control::pod_view::{Labels, PodView, ViewError};
use aether_proxy::dataplane::DataPlane;
use aether_proxy::dataplane::ForwardCounts;
use aether_proxy::inpod::agent::{Agent, AgentConfig};
use aether_proxy::inpod::capture_set::CaptureSet;
use aether_proxy::inpod::cni_server;
use aether_proxy::inpod::listeners::ConnectionLimits;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const CAPTURE_PORT: u16 = 15001;
pub const MANAGED_NAMESPACE: &str = "shop";

struct FixedView;

impl PodView for FixedView {
    fn namespace_labels(&self, namespace: &str) -> Result<Labels, ViewError> {
        Ok(if namespace == MANAGED_NAMESPACE {
            Labels::from([(MANAGED_LABEL.into(), "true".into())])
        } else {
            Labels::new()
        })
    }

    fn pod_annotations(&self, _: &PodRef) -> Result<Labels, ViewError> {
        Ok(Labels::new())
    }

    /// Pods of these tests are not in any API server: only their network namespaces say
    /// which addresses they hold.
    fn pod_ips(&self, pod: &PodRef) -> Result<Vec<std::net::IpAddr>, ViewError> {
        Err(ViewError::UnknownPod(pod.clone()))
    }
}

pub fn capture_set(generation: u64, targets: &[&str]) -> CaptureSet {
    let text = serde_json::json!({"generation": generation, "targets": targets}).to_string();
    CaptureSet::parse(&text).unwrap()
}

/// A running proxy. Dropping it is a proxy shutdown: the CNI server stops, every listener
/// closes, the registry stays in the state directory.
pub struct TestProxy {
    pub agent: Arc<Agent>,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    runtime: Option<Runtime>,
}

impl TestProxy {
    /// Starts a proxy whose socket and state live in `dir`, on the node whose network
    /// namespace is `node` (the test's own when `None`), as a node proxy runs in its node's.
    pub fn start(dir: &Path, capture: CaptureSet, node: Option<&Path>) -> Self {
        Self::start_with(
            dir,
            capture,
            node,
            ConnectionLimits {
                per_listener: 4096,
                per_node: 65536,
            },
        )
    }

    /// [`TestProxy::start`] with these connection limits.
    pub fn start_with(
        dir: &Path,
        capture: CaptureSet,
        node: Option<&Path>,
        limits: ConnectionLimits,
    ) -> Self {
        // Threads start in their creator's network namespace: the runtime's workers are
        // created in the node's by a thread that joined it.
        let build = || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        };
        let runtime = match node {
            Some(netns) => super::in_netns(netns, build),
            None => build(),
        };
        let config = AgentConfig {
            state_dir: dir.join("state"),
            capture_port: CAPTURE_PORT,
            inbound_port: None,
            node_netns: None,
            nft: Nft::default(),
            limits,
            inherited: Vec::new(),
        };
        let agent = Arc::new(
            Agent::start(
                config,
                Arc::new(FixedView),
                capture,
                runtime.handle().clone(),
                DataPlane::new(None),
            )
            .unwrap(),
        );
        let socket = Self::socket_in(dir);
        let bound = {
            let _runtime = runtime.enter();
            cni_server::bind(&socket).unwrap()
        };
        let (stop, stopped) = oneshot::channel();
        let server = runtime.spawn(cni_server::serve(bound, agent.clone(), async {
            let _ = stopped.await;
            cni_server::Stop::Remove
        }));
        TestProxy {
            agent,
            socket,
            stop: Some(stop),
            server: Some(server),
            runtime: Some(runtime),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The CNI socket of a proxy started with `dir`.
    pub fn socket_in(dir: &Path) -> PathBuf {
        dir.join("run/cni.sock")
    }

    /// Waits up to 3 s for the forward counters to satisfy `done` (the proxy counts a
    /// connection just after the destination has accepted it).
    pub fn counts_reach(&self, done: impl Fn(ForwardCounts) -> bool) -> ForwardCounts {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let counts = self.agent.forward_counts();
            if done(counts) || Instant::now() > deadline {
                return counts;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn registered_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .agent
            .registered()
            .into_iter()
            .map(|p| p.container_id)
            .collect();
        ids.sort();
        ids
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let _ = self.stop.take().map(|stop| stop.send(()));
        if let Some(server) = self.server.take() {
            let _ = runtime.block_on(server);
        }
        runtime.block_on(self.agent.shutdown(Duration::ZERO));
        runtime.shutdown_timeout(Duration::from_secs(5));
    }
}

/// Whether a plain connection to `addr` inside `netns` is refused within 3 s (listeners close
/// asynchronously).
pub fn refused_within(netns: &Path, addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match super::sockets::connect_from(netns, addr, None) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ if Instant::now() > deadline => return false,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
