//! The listeners of the registered pods, one set per pod, inside its network namespace: the
//! outbound capture listener (where the pod's table redirects route-target connections) and the
//! inbound mTLS listener. What happens to an accepted connection is the [`Handler`]'s business
//! (the data plane); this module owns the listeners' lifecycle, and hands the listening sockets
//! to a successor process ([`Listeners::sockets`], [`Listeners::inherit`]) so that a restart
//! of the proxy never closes them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aether_cni::nft::{Families, Family};
use aether_cni::protocol::PodRef;
use futures::future::BoxFuture;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use crate::handover::holder::Keeper;
use crate::inpod::netns::{self, Netns, NetnsError};

/// Pause after a failed accept (e.g. out of file descriptors), so it does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The capture listener addresses of a pod: where the table's `redirect to :<port>` delivers a
/// connection in each of the pod's families (the primary address of `lo`).
pub fn capture_addrs(families: Families, port: u16) -> Vec<SocketAddr> {
    families
        .iter()
        .map(|family| match family {
            Family::V4 => SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Family::V6 => SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
        })
        .collect()
}

/// The inbound listener address of a pod: every address of the pod, in one dual-stack socket
/// when it has IPv6.
pub fn inbound_addr(families: Families, port: u16) -> SocketAddr {
    if families.ipv6 {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

/// What a listener is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connections of the pod's apps, redirected by its capture table.
    Capture,
    /// mTLS connections of other proxies to the pod.
    Inbound,
}

/// A registered pod, as its connections' handler sees it.
#[derive(Debug)]
pub struct PodInfo {
    /// The container id the pod was registered with.
    pub key: String,
    pub pod: PodRef,
    pub netns: Netns,
    pub families: Families,
    /// The pod's addresses: where the inbound side delivers mesh requests.
    pub ips: Vec<IpAddr>,
}

/// Bounds on the connections the listeners hold open at once, so that one pod's flood cannot
/// take the descriptors and memory every other pod's connections need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Per listener: a pod's capture listener, its inbound one.
    pub per_listener: usize,
    /// Every listener of the node together.
    pub per_node: usize,
}

/// The most connections of a pod's capture listener that have not yet shown what they are (a
/// request head, an opaque stream). A listener with that many accepts no more until one of
/// them does or ends: a pod that opens connections and stays silent, or sends its head a byte
/// at a time, makes only its own connections wait, in its own backlog, and costs the node's
/// other pods nothing.
const OPENING_PER_LISTENER: usize = 256;
/// The most connections one peer address may have opening (in the TLS handshake) at a pod's
/// inbound listener; more are reset. Counted by peer, not for the whole listener as on the
/// capture side, because inbound connections come from anywhere: a listener-wide bound would
/// let one peer shut the others out.
const OPENING_PER_PEER: usize = 64;
/// Peers whose connections all opened are forgotten once this many are remembered.
const PEERS_REMEMBERED: usize = 1024;

/// A connection still opening holds a share of its listener's [`OPENING_PER_LISTENER`] until
/// [`Opening::opened`] (or its end).
#[derive(Clone)]
pub struct Opening(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl Opening {
    fn new(permit: OwnedSemaphorePermit) -> Opening {
        Opening(Arc::new(std::sync::Mutex::new(Some(permit))))
    }

    /// The connection has shown what it is.
    pub fn opened(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Which limit refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Listener,
    Node,
    /// [`OPENING_PER_PEER`].
    Opening,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Listener => "listener",
            Limit::Node => "node",
            Limit::Opening => "opening",
        }
    }
}

/// A share of `peer`'s [`OPENING_PER_PEER`], or `None` when it has them all. Forgets the peers
/// with nothing opening when too many are remembered.
fn peer_share(
    peers: &mut HashMap<IpAddr, Arc<Semaphore>>,
    peer: IpAddr,
) -> Option<OwnedSemaphorePermit> {
    if peers.len() >= PEERS_REMEMBERED {
        peers.retain(|_, shares| shares.available_permits() < OPENING_PER_PEER);
    }
    peers
        .entry(peer)
        .or_insert_with(|| Arc::new(Semaphore::new(OPENING_PER_PEER)))
        .clone()
        .try_acquire_owned()
        .ok()
}

/// Serves the connections the listeners accept.
pub trait Handler: Send + Sync + 'static {
    /// `drain` says when the listener stopped: a connection that can end gently (HTTP) should
    /// then finish what it is doing and close. `opening` is to be told once the connection
    /// has shown what it is.
    fn serve(
        self: Arc<Self>,
        role: Role,
        stream: TcpStream,
        peer: SocketAddr,
        pod: Arc<PodInfo>,
        drain: Drain,
        opening: Opening,
    ) -> BoxFuture<'static, ()>;

    /// The pod's listeners closed for good: forget what is kept for it.
    fn forget(&self, pod: &PodInfo);

    /// A connection was accepted and closed at once: `limit` was reached.
    fn over_limit(&self, role: Role, pod: &PodInfo, limit: Limit);
}

/// How a pod's listeners stop: `None` while they run, then how long their open connections may
/// take to finish before they are cut.
type Stop = Option<Duration>;

/// Tells an open connection that its listener stopped.
#[derive(Clone)]
pub struct Drain(watch::Receiver<Stop>);

impl Drain {
    /// Completes once the listener has stopped (at once if it already has). A listener
    /// dropped without a word counts as stopped.
    pub async fn started(&mut self) {
        let _ = self.0.wait_for(Option::is_some).await;
    }
}

/// A pod's listening socket, as handed from one proxy process to the next.
#[derive(Debug)]
pub struct PodSocket {
    /// The pod's container id.
    pub key: String,
    pub addr: SocketAddr,
    pub fd: OwnedFd,
}

/// The listener tasks of every registered pod, by container id, and of the pods leaving.
pub struct Listeners {
    runtime: Handle,
    handler: Arc<dyn Handler>,
    limits: ConnectionLimits,
    /// The node's share of connections, held by every open one.
    node: Arc<Semaphore>,
    pods: HashMap<String, PodListeners>,
    retiring: HashMap<String, Retiring>,
    /// Sockets a predecessor process handed over, by pod and address, until [`Listeners::open`]
    /// takes them.
    inherited: HashMap<(String, SocketAddr), OwnedFd>,
    /// Told the registered pods' sockets whenever they change, so a holder keeps them across
    /// a crash of this process.
    keeper: Option<Arc<Keeper>>,
}

struct PodListeners {
    info: Arc<PodInfo>,
    addrs: Vec<(SocketAddr, Role)>,
    /// The listening sockets (a descriptor of each beside its accept loop's), to hand over.
    sockets: Vec<OwnedFd>,
    stop: watch::Sender<Stop>,
    tasks: Vec<JoinHandle<()>>,
}

impl PodListeners {
    fn is_open(&self) -> bool {
        self.tasks.iter().all(|task| !task.is_finished())
    }
}

/// A leaving pod's listeners: accepting until `until`, then closed with `drain` for the
/// connections open then.
struct Retiring {
    listeners: PodListeners,
    until: Instant,
    drain: Duration,
    stopped: bool,
}

impl Retiring {
    /// When [`Listeners::sweep`] has something to do for it next.
    fn due(&self) -> Instant {
        if self.stopped {
            self.until + self.drain + SWEEP_MARGIN
        } else {
            self.until
        }
    }
}

/// Past a retiring pod's drain, its tasks have ended; the sweep looks a moment later.
const SWEEP_MARGIN: Duration = Duration::from_millis(100);

impl Listeners {
    /// Tasks are spawned on `runtime`, so the methods may be called from any thread.
    pub fn new(runtime: Handle, handler: Arc<dyn Handler>, limits: ConnectionLimits) -> Self {
        Listeners {
            runtime,
            handler,
            limits,
            node: Arc::new(Semaphore::new(limits.per_node)),
            pods: HashMap::new(),
            retiring: HashMap::new(),
            inherited: HashMap::new(),
            keeper: None,
        }
    }

    /// Has `keeper` keep the registered pods' sockets from now on.
    pub fn keep_in(&mut self, keeper: Arc<Keeper>) {
        self.keeper = Some(keeper);
        self.sync_keeper();
    }

    fn sync_keeper(&self) {
        if let Some(keeper) = &self.keeper {
            keeper.keep(
                self.registered_sockets()
                    .map(|(key, addr, fd)| (key, addr, fd.as_fd())),
            );
        }
    }

    /// The registered pods' listening sockets: container id, address, socket.
    fn registered_sockets(&self) -> impl Iterator<Item = (&str, SocketAddr, &OwnedFd)> {
        self.pods.iter().flat_map(|(key, pod)| {
            pod.addrs
                .iter()
                .zip(&pod.sockets)
                .map(|((addr, _), fd)| (key.as_str(), *addr, fd))
        })
    }

    /// Keeps the sockets a predecessor handed over, for [`Listeners::open`] to take instead of
    /// opening new ones: connections waiting in their backlog are accepted, not refused.
    pub fn inherit(&mut self, sockets: Vec<PodSocket>) {
        self.inherited.extend(
            sockets
                .into_iter()
                .map(|socket| ((socket.key, socket.addr), socket.fd)),
        );
    }

    /// Closes the inherited sockets no pod took (their pods are gone); returns how many.
    pub fn drop_inherited(&mut self) -> usize {
        let left = self.inherited.len();
        self.inherited.clear();
        left
    }

    /// A copy of every registered pod's listening sockets, for a successor process.
    pub fn sockets(&self) -> std::io::Result<Vec<PodSocket>> {
        self.registered_sockets()
            .map(|(key, addr, fd)| {
                Ok(PodSocket {
                    key: key.to_owned(),
                    addr,
                    fd: fd.try_clone()?,
                })
            })
            .collect()
    }

    /// The listening socket for `addr` in the pod `key`'s netns: the inherited one if there
    /// is one bound there, else a new one.
    fn listen(
        &mut self,
        key: &str,
        netns: &Netns,
        addr: SocketAddr,
    ) -> Result<std::net::TcpListener, NetnsError> {
        if let Some(fd) = self.inherited.remove(&(key.to_owned(), addr)) {
            let listener = std::net::TcpListener::from(fd);
            match listener.local_addr() {
                Ok(bound) if bound == addr => return Ok(listener),
                bound => {
                    warn!(container_id = key, %addr, ?bound, "an inherited socket is not bound where it should be; opening a new one")
                }
            }
        }
        netns::listen_in(netns, addr)
    }

    /// Makes sure the pod `info.key` has listeners on exactly `addrs` inside its netns, all
    /// accepting.
    /// Returns whether it opened new ones (`false`: they were already there, left untouched, so
    /// a repeated registration does not drop the pod's connections). A pod that left and comes
    /// back while its listeners still accept gets them back. Different listeners the pod had
    /// are closed first. All or nothing: if one cannot be opened, the pod has none.
    pub fn open(
        &mut self,
        info: PodInfo,
        addrs: &[(SocketAddr, Role)],
    ) -> Result<bool, NetnsError> {
        let key = info.key.clone();
        let same = |pod: &PodListeners| pod.info.netns == info.netns && pod.addrs == addrs;
        if self.pods.get(&key).is_some_and(same) && self.is_open(&key) {
            return Ok(false);
        }
        if let Some(retiring) = self.retiring.remove(&key) {
            if !retiring.stopped && same(&retiring.listeners) && retiring.listeners.is_open() {
                self.pods.insert(key, retiring.listeners);
                self.sync_keeper();
                return Ok(false);
            }
            retiring.listeners.stop.send_replace(Some(Duration::ZERO));
        }
        self.close(&key);
        let mut opened = Vec::with_capacity(addrs.len());
        for &(addr, role) in addrs {
            opened.push((addr, role, self.listen(&key, &info.netns, addr)?));
        }
        let _runtime = self.runtime.enter();
        let mut listeners = Vec::with_capacity(addrs.len());
        let mut sockets = Vec::with_capacity(addrs.len());
        for (addr, role, listener) in opened {
            let listen_error = |source| NetnsError::Listen {
                path: info.netns.path().to_path_buf(),
                addr,
                source,
            };
            listener.set_nonblocking(true).map_err(listen_error)?;
            sockets.push(
                listener
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(listen_error)?,
            );
            listeners.push((TcpListener::from_std(listener).map_err(listen_error)?, role));
        }
        let (stop, stopped) = watch::channel(None);
        let info = Arc::new(info);
        let tasks = listeners
            .into_iter()
            .map(|(listener, role)| {
                let pod = PodListener {
                    role,
                    info: info.clone(),
                    handler: self.handler.clone(),
                    own: Arc::new(Semaphore::new(self.limits.per_listener)),
                    node: self.node.clone(),
                    opening: Arc::new(Semaphore::new(OPENING_PER_LISTENER)),
                };
                self.runtime.spawn(pod.run(listener, stopped.clone()))
            })
            .collect();
        let pod = PodListeners {
            info,
            addrs: addrs.to_vec(),
            sockets,
            stop,
            tasks,
        };
        self.pods.insert(key, pod);
        self.sync_keeper();
        Ok(true)
    }

    /// Closes the pod's listeners (a leaving pod's too) and cuts its open connections: the
    /// pod is gone.
    pub fn close(&mut self, key: &str) {
        let retiring = self.retiring.remove(key).map(|r| r.listeners);
        let registered = self.pods.remove(key);
        let known = registered.is_some();
        for pod in registered.into_iter().chain(retiring) {
            pod.stop.send_replace(Some(Duration::ZERO));
            self.handler.forget(&pod.info);
        }
        if known {
            self.sync_keeper();
        }
    }

    /// The pod leaves the mesh: its listeners keep accepting for `linger` (peers that still
    /// see it meshed keep reaching its inbound port while that news travels), then stop; the
    /// connections open then get `drain` to finish. [`Listeners::sweep`] carries it out.
    pub fn retire(&mut self, key: &str, linger: Duration, drain: Duration) {
        if let Some(listeners) = self.pods.remove(key) {
            self.sync_keeper();
            self.retiring.insert(
                key.to_owned(),
                Retiring {
                    listeners,
                    until: Instant::now() + linger,
                    drain,
                    stopped: false,
                },
            );
        }
    }

    /// Moves leaving pods on at `now`: stops the listeners whose linger is over, and returns
    /// the pods whose listeners and connections have all ended (forgotten by the handler now),
    /// with when to sweep again (`None`: no pod is leaving).
    pub fn sweep(&mut self, now: Instant) -> (Vec<Arc<PodInfo>>, Option<Instant>) {
        let mut ended = Vec::new();
        self.retiring.retain(|_, retiring| {
            if !retiring.stopped && now >= retiring.until {
                retiring.listeners.stop.send_replace(Some(retiring.drain));
                retiring.stopped = true;
            }
            let done =
                retiring.stopped && retiring.listeners.tasks.iter().all(JoinHandle::is_finished);
            if done {
                self.handler.forget(&retiring.listeners.info);
                ended.push(retiring.listeners.info.clone());
            }
            !done
        });
        (ended, self.next_due())
    }

    /// When [`Listeners::sweep`] has something to do next; `None` when no pod is leaving.
    pub fn next_due(&self) -> Option<Instant> {
        self.retiring.values().map(Retiring::due).min()
    }

    /// Closes the listeners of every leaving pod at once, cutting their connections; returns
    /// those pods.
    pub fn close_leaving(&mut self) -> Vec<Arc<PodInfo>> {
        self.retiring
            .drain()
            .map(|(_, retiring)| {
                retiring.listeners.stop.send_replace(Some(Duration::ZERO));
                self.handler.forget(&retiring.listeners.info);
                retiring.listeners.info
            })
            .collect()
    }

    /// The pods whose listeners accept connections: the registered ones and those leaving.
    pub fn serving(&self) -> impl Iterator<Item = &PodInfo> {
        self.pods.values().map(|p| &*p.info).chain(
            self.retiring
                .values()
                .filter(|r| !r.stopped)
                .map(|r| &*r.listeners.info),
        )
    }

    /// Whether the pod's listeners are all open and accepting.
    pub fn is_open(&self, key: &str) -> bool {
        self.pods.get(key).is_some_and(PodListeners::is_open)
    }

    /// Closes every listener at once; open connections get up to `drain` to finish. Returns the
    /// tasks to wait for.
    pub fn stop_all(&mut self, drain: Duration) -> Vec<JoinHandle<()>> {
        let retiring = self.retiring.drain().map(|(key, r)| (key, r.listeners));
        self.pods
            .drain()
            .chain(retiring)
            .flat_map(|(_, pod)| {
                pod.stop.send_replace(Some(drain));
                pod.tasks
            })
            .collect()
    }
}

/// One listener's accept loop and the connections it accepted.
struct PodListener {
    role: Role,
    info: Arc<PodInfo>,
    handler: Arc<dyn Handler>,
    /// This listener's share of connections, and the node's.
    own: Arc<Semaphore>,
    node: Arc<Semaphore>,
    /// Its connections still opening (a capture listener's).
    opening: Arc<Semaphore>,
}

impl PodListener {
    /// The permits a newly accepted connection holds while it is open; `None` when a limit is
    /// reached, and the connection is then reset at once (a client sees a refusal, not a hang).
    fn admit(&self, stream: &TcpStream) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let refused = |limit| {
            let _ = stream.set_zero_linger();
            self.handler.over_limit(self.role, &self.info, limit);
            None
        };
        let Ok(own) = self.own.clone().try_acquire_owned() else {
            return refused(Limit::Listener);
        };
        let Ok(node) = self.node.clone().try_acquire_owned() else {
            return refused(Limit::Node);
        };
        Some((own, node))
    }

    async fn run(self, listener: TcpListener, mut stop: watch::Receiver<Stop>) {
        let mut connections = JoinSet::new();
        // The capture listener's connections are all its pod's: it accepts only with a share
        // of its opening connections in hand, the next connection's.
        let gated = self.role == Role::Capture;
        let mut slot = None;
        let mut peers = HashMap::new();
        loop {
            tokio::select! {
                // Also ends the loop when the sender is dropped without a word.
                _ = stop.changed() => break,
                permit = self.opening.clone().acquire_owned(), if gated && slot.is_none() => {
                    slot = permit.ok();
                }
                accepted = listener.accept(), if !gated || slot.is_some() => match accepted {
                    Ok((stream, peer)) => {
                        let share = if gated { slot.take() } else { peer_share(&mut peers, peer.ip()) };
                        let Some(opening) = share.map(Opening::new) else {
                            let _ = stream.set_zero_linger();
                            self.handler.over_limit(self.role, &self.info, Limit::Opening);
                            continue;
                        };
                        let Some(permits) = self.admit(&stream) else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let drain = Drain(stop.clone());
                        let served = self.handler.clone().serve(self.role, stream, peer, self.info.clone(), drain, opening);
                        connections.spawn(async move {
                            let _permits = permits;
                            served.await
                        });
                    }
                    Err(error) => {
                        warn!(pod = %self.info.pod, role = ?self.role, %error, "accepting a connection failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        let drain = stop.borrow().unwrap_or_default();
        let drained = tokio::time::timeout(drain, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            debug!(pod = %self.info.pod, open = connections.len(), "cutting connections still open");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_has_its_own_share_of_opening_connections() {
        let mut peers = HashMap::new();
        let (a, b) = (addr("10.0.0.1:1").ip(), addr("10.0.0.2:1").ip());
        let held: Vec<_> = (0..OPENING_PER_PEER)
            .map(|_| peer_share(&mut peers, a).unwrap())
            .collect();
        assert!(peer_share(&mut peers, a).is_none(), "a peer past its share");
        assert!(
            peer_share(&mut peers, b).is_some(),
            "another peer is not held up"
        );
        drop(held);
        assert!(peer_share(&mut peers, a).is_some(), "shares come back");
        for n in 0..PEERS_REMEMBERED {
            let ip = IpAddr::from([10, 1, (n >> 8) as u8, n as u8]);
            drop(peer_share(&mut peers, ip));
        }
        peer_share(&mut peers, a);
        assert!(peers.len() < PEERS_REMEMBERED, "idle peers are forgotten");
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn capture_addrs_are_loopback_per_family() {
        let both = Families {
            ipv4: true,
            ipv6: true,
        };
        assert_eq!(
            capture_addrs(both, 15001),
            [addr("127.0.0.1:15001"), addr("[::1]:15001")]
        );
        let v6 = Families {
            ipv4: false,
            ipv6: true,
        };
        assert_eq!(capture_addrs(v6, 15006), [addr("[::1]:15006")]);
    }

    #[test]
    fn the_inbound_listener_is_dual_stack_when_the_pod_has_ipv6() {
        let v4 = Families {
            ipv4: true,
            ipv6: false,
        };
        assert_eq!(inbound_addr(v4, 15008), addr("0.0.0.0:15008"));
        let both = Families {
            ipv4: true,
            ipv6: true,
        };
        assert_eq!(inbound_addr(both, 15008), addr("[::]:15008"));
    }
}
