//! Sockets inside a pod's network namespace, opened from the proxy's own process. All of the
//! proxy's `setns(2)` code is here.
//!
//! A pod's namespace is a [`Netns`]: a descriptor opened once, when the pod is registered and
//! its addresses are checked, and held while the pod is served. Its sockets are made in the
//! namespace that was checked, whatever is mounted at the path later, with no path looked up
//! per socket.
//!
//! A socket belongs, for its whole life, to the network namespace of the thread that created it;
//! binding, connecting, accepting and polling use the socket's namespace, whichever thread does
//! them. So only the creation needs the pod's namespace. `setns` moves only the calling thread:
//! the thread that creates a socket joins the pod's namespace, creates it and returns to its own
//! namespace before it does anything else, with no await in between. A thread that cannot
//! return would carry the pod's namespace into unrelated work, so the process aborts instead.
//!
//! Every socket is created non-blocking, ready to be registered with tokio.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, getsockopt, listen,
    setsockopt, socket, sockopt,
};
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {} does not exist", .0.display())]
    Gone(PathBuf),
    #[error("{} is not a network namespace (or no longer: unmounted)", .0.display())]
    NotANamespace(PathBuf),
    #[error("cannot enter network namespace {}: {source}", path.display())]
    Enter { path: PathBuf, source: io::Error },
    #[error("cannot listen on {addr} in network namespace {}: {source}", path.display())]
    Listen {
        path: PathBuf,
        addr: SocketAddr,
        source: io::Error,
    },
    #[error("cannot connect to {to} from network namespace {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        to: SocketAddr,
        source: io::Error,
    },
}

/// A network namespace held open. Clones share the descriptor; two handles are equal when they
/// hold the same namespace.
#[derive(Clone)]
pub struct Netns(Arc<Held>);

struct Held {
    path: PathBuf,
    file: File,
    /// The namespace's identity: the device and inode of its nsfs file.
    id: (u64, u64),
}

impl Netns {
    /// Opens the namespace at `path` (a runtime's bind mount, or a `/proc/<pid>/ns/net`).
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        let enter_error = |source: io::Error| NetnsError::Enter {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => NetnsError::Gone(path.to_owned()),
            _ => enter_error(e),
        })?;
        // Any file opens; only one of nsfs is a namespace (a runtime's path that was unmounted
        // is left as a plain empty file).
        let fs = fstatfs(&file).map_err(|e| enter_error(e.into()))?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(NetnsError::NotANamespace(path.to_owned()));
        }
        let meta = file.metadata().map_err(enter_error)?;
        Ok(Netns(Arc::new(Held {
            path: path.to_owned(),
            file,
            id: (meta.dev(), meta.ino()),
        })))
    }

    /// Where the namespace was opened from, for messages.
    pub fn path(&self) -> &Path {
        &self.0.path
    }
}

impl PartialEq for Netns {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Netns {}

impl Hash for Netns {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.id.hash(state);
    }
}

impl std::fmt::Debug for Netns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Netns({})", self.0.path.display())
    }
}

/// A TCP listener on `addr` inside `netns`, non-blocking.
///
/// For the capture listener `addr` is `127.0.0.1:<port>` or `[::1]:<port>`: the table's rule
/// `redirect to :<port>` in the nat output hook rewrites a locally generated connection's
/// destination to the primary address of `lo`, 127.0.0.1 or ::1, keeping the original in
/// conntrack for [`original_dst`].
pub fn listen_in(netns: &Netns, addr: SocketAddr) -> Result<TcpListener, NetnsError> {
    let listen_error = |source: io::Error| NetnsError::Listen {
        path: netns.path().to_owned(),
        addr,
        source,
    };
    let fd = in_netns(netns, || new_socket(addr))?.map_err(listen_error)?;
    // A restarted proxy binds the port again while connections it had accepted may still be in
    // TIME_WAIT; without SO_REUSEADDR that bind fails.
    setsockopt(&fd, sockopt::ReuseAddr, &true)
        .and_then(|()| bind(fd.as_raw_fd(), &SockaddrStorage::from(addr)))
        .and_then(|()| listen(&fd, Backlog::MAXCONN))
        .map_err(|e| listen_error(e.into()))?;
    Ok(TcpListener::from(fd))
}

/// A TCP connection to `to` from inside `netns`. The pod's capture table applies to it as to
/// the app's own: `to` must not be a captured address. Must be called within a tokio runtime.
pub async fn connect_from(
    netns: &Netns,
    to: SocketAddr,
) -> Result<tokio::net::TcpStream, NetnsError> {
    let connect_error = |source: io::Error| NetnsError::Connect {
        path: netns.path().to_owned(),
        to,
        source,
    };
    let fd = in_netns(netns, || new_socket(to))?.map_err(connect_error)?;
    let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    socket.connect(to).await.map_err(connect_error)
}

/// The addresses of `netns`, loopback excluded.
pub fn addresses_in(netns: &Netns) -> Result<Vec<std::net::IpAddr>, NetnsError> {
    in_netns(netns, interface_addresses)?.map_err(|source| NetnsError::Enter {
        path: netns.path().to_owned(),
        source,
    })
}

/// The network namespace under `dir` (the runtime's, `/var/run/netns`) that holds each of
/// `wanted`'s addresses: how the proxy finds the namespace of a pod that started before it
/// could register it (the pod's IP is in its status; the runtime named the namespace).
/// Namespaces that cannot be entered are skipped.
pub fn holding(
    dir: &Path,
    wanted: &[std::net::IpAddr],
) -> io::Result<std::collections::HashMap<std::net::IpAddr, PathBuf>> {
    let mut found = std::collections::HashMap::new();
    for entry in std::fs::read_dir(dir)? {
        if found.len() == wanted.len() {
            break;
        }
        let path = entry?.path();
        let Ok(addresses) = Netns::open(&path).and_then(|netns| addresses_in(&netns)) else {
            continue;
        };
        for ip in addresses.into_iter().filter(|ip| wanted.contains(ip)) {
            found.insert(ip, path.clone());
        }
    }
    Ok(found)
}

/// The calling thread's network namespace's addresses, loopback excluded.
fn interface_addresses() -> io::Result<Vec<std::net::IpAddr>> {
    let mut out = Vec::new();
    for interface in nix::ifaddrs::getifaddrs()? {
        let Some(address) = interface.address else {
            continue;
        };
        let ip = if let Some(v4) = address.as_sockaddr_in() {
            std::net::IpAddr::V4(v4.ip())
        } else if let Some(v6) = address.as_sockaddr_in6() {
            std::net::IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !ip.is_loopback() {
            out.push(ip);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The destination an app dialled before the pod's table redirected its connection to the
/// capture listener (`SO_ORIGINAL_DST`, or `IP6T_SO_ORIGINAL_DST` for IPv6).
pub fn original_dst(stream: &tokio::net::TcpStream) -> io::Result<SocketAddr> {
    Ok(match stream.local_addr()? {
        SocketAddr::V4(_) => {
            let sa = getsockopt(stream, sockopt::OriginalDst)?;
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                u16::from_be(sa.sin_port),
            ))
        }
        SocketAddr::V6(_) => {
            let sa = getsockopt(stream, sockopt::Ip6tOriginalDst)?;
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sa.sin6_addr.s6_addr),
                u16::from_be(sa.sin6_port),
                0,
                0,
            ))
        }
    })
}

/// A non-blocking, close-on-exec TCP socket of `addr`'s family, in the calling thread's netns.
fn new_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    Ok(socket(family, SockType::Stream, flags, None)?)
}

/// Runs `f` with the calling thread in `netns`, and brings the thread back before returning.
fn in_netns<T>(netns: &Netns, f: impl FnOnce() -> T) -> Result<T, NetnsError> {
    let enter_error = |source: io::Error| NetnsError::Enter {
        path: netns.path().to_owned(),
        source,
    };
    HOME.with(|home| {
        let home = home.as_ref().map_err(|e| NetnsError::Enter {
            path: PathBuf::from("/proc/thread-self/ns/net"),
            source: io::Error::new(e.kind(), e.to_string()),
        })?;
        setns(netns.0.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| enter_error(e.into()))?;
        let _back = Return(home);
        Ok(f())
    })
}

thread_local! {
    /// The namespace this thread was started in, taken before it first enters a pod's.
    static HOME: io::Result<File> = File::open("/proc/thread-self/ns/net");
}

/// Takes the thread back to its own namespace when dropped, also when the work panicked.
struct Return<'a>(&'a File);

impl Drop for Return<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(self.0.as_fd(), CloneFlags::CLONE_NEWNET) {
            tracing::error!(error = %e, "cannot return a thread to its network namespace; aborting rather than serve from a pod's");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_runs_in_the_held_namespace_and_the_thread_comes_back() {
        let own = || std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        // A namespace of its own, held by a thread that waits: the pod's.
        let (held, holding) = std::sync::mpsc::channel();
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let entered = nix::sched::unshare(CloneFlags::CLONE_NEWNET);
            let _ = held
                .send(entered.map(|()| (File::open("/proc/thread-self/ns/net").unwrap(), own())));
            let _ = finish.recv();
        });
        let Ok((file, pods)) = holding.recv().unwrap() else {
            // Not root (CAP_SYS_ADMIN): a network namespace cannot be made here.
            return;
        };
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let netns = Netns::open(&path).unwrap();
        assert_eq!(netns, Netns::open(&path).unwrap(), "the same namespace");
        assert_ne!(netns, Netns::open(Path::new("/proc/self/ns/net")).unwrap());
        // The handle holds the namespace: the path and every other holder may go.
        drop(file);
        drop(done);
        holder.join().unwrap();
        let before = own();
        assert_ne!(before, pods);
        assert_eq!(in_netns(&netns, own).unwrap(), pods);
        assert_eq!(own(), before);
        let panicked = std::panic::catch_unwind(|| in_netns(&netns, || panic!("in the pod")));
        assert!(panicked.is_err());
        assert_eq!(own(), before, "back also after a panic");
    }

    #[test]
    fn only_a_namespace_opens() {
        let missing = Path::new("/var/run/netns/aether-proxy-no-such-netns");
        assert!(matches!(Netns::open(missing), Err(NetnsError::Gone(path)) if path == missing));
        let file = Path::new("/proc/self/status");
        assert!(matches!(Netns::open(file), Err(NetnsError::NotANamespace(path)) if path == file));
    }
}
