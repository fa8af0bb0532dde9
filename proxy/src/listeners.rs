//! The capture listeners of the registered pods, one set per pod, inside its network namespace.
//!
//! In this slice a captured connection is forwarded as plain TCP to its original destination,
//! from inside the pod's namespace with the proxy's socket mark (so the pod's table does not
//! capture it again). Routing and mTLS replace that forwarding in later slices; the listener
//! lifecycle and the original-destination recovery stay.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aether_cni::nft::{Families, Family};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use crate::netns::{self, NetnsError};

/// Bounds the connection to the original destination; the app's own connect timeout is
/// usually longer, and a captured connection must not hang forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
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

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not redirected: the app dialled the capture port itself. Forwarding it would connect the
    /// listener to itself, again and again.
    #[error("connection to the capture listener {0} itself, not redirected by the capture table")]
    NotRedirected(SocketAddr),
}

/// Where a captured connection goes, from the listener's address and the connection's original
/// destination.
pub fn upstream(listener: SocketAddr, original_dst: SocketAddr) -> Result<SocketAddr, Refused> {
    if original_dst == listener {
        Err(Refused::NotRedirected(listener))
    } else {
        Ok(original_dst)
    }
}

/// Counters over all pods, for tests and logs now and for metrics later.
#[derive(Debug, Default)]
pub struct ForwardStats {
    accepted: AtomicU64,
    forwarded: AtomicU64,
    failed: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardCounts {
    /// Connections accepted on a capture listener.
    pub accepted: u64,
    /// Of those, connected to their original destination.
    pub forwarded: u64,
    /// Of those, refused or not connected.
    pub failed: u64,
}

impl ForwardStats {
    pub fn counts(&self) -> ForwardCounts {
        ForwardCounts {
            accepted: self.accepted.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

/// How a pod's listeners stop: `None` while they run, then how long their open connections may
/// take to finish before they are cut.
type Stop = Option<Duration>;

/// The listener tasks of every registered pod, by container id.
pub struct Listeners {
    runtime: Handle,
    stats: Arc<ForwardStats>,
    pods: HashMap<String, PodListeners>,
}

struct PodListeners {
    netns: Arc<Path>,
    addrs: Vec<SocketAddr>,
    stop: watch::Sender<Stop>,
    tasks: Vec<JoinHandle<()>>,
}

impl Listeners {
    /// Tasks are spawned on `runtime`, so the methods may be called from any thread.
    pub fn new(runtime: Handle) -> Self {
        Listeners {
            runtime,
            stats: Arc::default(),
            pods: HashMap::new(),
        }
    }

    pub fn stats(&self) -> Arc<ForwardStats> {
        self.stats.clone()
    }

    /// Makes sure the pod `key` has listeners on exactly `addrs` inside `netns`, all accepting.
    /// Returns whether it opened new ones (`false`: they were already there, left untouched, so
    /// a repeated registration does not drop the pod's connections). Different listeners the pod
    /// had are closed first. All or nothing: if one cannot be opened, the pod has none.
    pub fn open(
        &mut self,
        key: &str,
        netns: &Path,
        addrs: &[SocketAddr],
    ) -> Result<bool, NetnsError> {
        let same = |pod: &PodListeners| *pod.netns == *netns && pod.addrs == addrs;
        if self.pods.get(key).is_some_and(same) && self.is_open(key) {
            return Ok(false);
        }
        self.close(key);
        let _runtime = self.runtime.enter();
        let mut listeners = Vec::with_capacity(addrs.len());
        for &addr in addrs {
            let listener = netns::listen_in(netns, addr)?;
            let listener =
                TcpListener::from_std(listener).map_err(|source| NetnsError::Listen {
                    path: netns.to_owned(),
                    addr,
                    source,
                })?;
            listeners.push(listener);
        }
        let (stop, stopped) = watch::channel(None);
        let netns: Arc<Path> = Arc::from(netns);
        let tasks = listeners
            .into_iter()
            .map(|listener| {
                let pod = PodListener {
                    pod: key.to_owned(),
                    netns: netns.clone(),
                    stats: self.stats.clone(),
                };
                self.runtime.spawn(pod.run(listener, stopped.clone()))
            })
            .collect();
        let pod = PodListeners {
            netns,
            addrs: addrs.to_vec(),
            stop,
            tasks,
        };
        self.pods.insert(key.to_owned(), pod);
        Ok(true)
    }

    /// Closes the pod's listeners and cuts its open connections: the pod is gone.
    pub fn close(&mut self, key: &str) {
        if let Some(pod) = self.pods.remove(key) {
            pod.stop.send_replace(Some(Duration::ZERO));
        }
    }

    /// Whether the pod's listeners are all open and accepting.
    pub fn is_open(&self, key: &str) -> bool {
        self.pods
            .get(key)
            .is_some_and(|pod| pod.tasks.iter().all(|task| !task.is_finished()))
    }

    /// Closes every listener at once; open connections get up to `drain` to finish. Returns the
    /// tasks to wait for.
    pub fn stop_all(&mut self, drain: Duration) -> Vec<JoinHandle<()>> {
        self.pods
            .drain()
            .flat_map(|(_, pod)| {
                pod.stop.send_replace(Some(drain));
                pod.tasks
            })
            .collect()
    }
}

/// One listener's accept loop and the connections it accepted.
struct PodListener {
    pod: String,
    netns: Arc<Path>,
    stats: Arc<ForwardStats>,
}

impl PodListener {
    async fn run(self, listener: TcpListener, mut stop: watch::Receiver<Stop>) {
        let this = Arc::new(self);
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                // Also ends the loop when the sender is dropped without a word.
                _ = stop.changed() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        this.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        connections.spawn(this.clone().forward(stream, peer));
                    }
                    Err(error) => {
                        warn!(pod = %this.pod, %error, "accepting a captured connection failed");
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
            debug!(pod = %this.pod, open = connections.len(), "cutting connections still open");
        }
    }

    async fn forward(self: Arc<Self>, mut inbound: TcpStream, peer: SocketAddr) {
        match self.connect_upstream(&inbound).await {
            Ok((to, mut outbound)) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                debug!(pod = %self.pod, %peer, %to, "forwarding a captured connection");
                if let Err(error) = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await
                {
                    debug!(pod = %self.pod, %peer, %to, %error, "captured connection ended with an error");
                }
            }
            Err(error) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                warn!(pod = %self.pod, %peer, error = %error, "cannot forward a captured connection");
            }
        }
    }

    async fn connect_upstream(
        &self,
        inbound: &TcpStream,
    ) -> Result<(SocketAddr, TcpStream), String> {
        let listener = inbound.local_addr().map_err(|e| e.to_string())?;
        let original = netns::original_dst(inbound)
            .map_err(|e| format!("no original destination (SO_ORIGINAL_DST): {e}"))?;
        let to = upstream(listener, original).map_err(|e| e.to_string())?;
        match tokio::time::timeout(CONNECT_TIMEOUT, netns::connect_from(&self.netns, to)).await {
            Ok(Ok(outbound)) => Ok((to, outbound)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "connecting to {to} timed out after {CONNECT_TIMEOUT:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn redirected_connections_go_to_their_original_destination() {
        assert_eq!(
            upstream(addr("127.0.0.1:15001"), addr("10.96.0.10:80")),
            Ok(addr("10.96.0.10:80"))
        );
        assert_eq!(
            upstream(addr("[::1]:15001"), addr("[fd00::10]:80")),
            Ok(addr("[fd00::10]:80"))
        );
    }

    #[test]
    fn a_connection_to_the_capture_port_itself_is_refused() {
        assert_eq!(
            upstream(addr("127.0.0.1:15001"), addr("127.0.0.1:15001")),
            Err(Refused::NotRedirected(addr("127.0.0.1:15001")))
        );
    }
}
