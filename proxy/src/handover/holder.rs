//! Copies of the proxy's sockets, kept by a process beside it (`aether-proxy hold`, the
//! `holder` container of the proxy's pod) so that they outlive a crash of the proxy (an OOM
//! kill, a SIGKILL): connections that arrive before the kubelet has started the proxy again
//! wait in the sockets' backlogs instead of being refused, and the restarted proxy takes the
//! copies ([`Successor::take_held`](super::Successor::take_held)).
//!
//! The proxy's [`Keeper`] sends the whole set whenever it changes (a pod's listeners opened or
//! closed), and the holder keeps exactly that set: a socket the proxy closed is closed here too,
//! so a pod that left the mesh refuses connections again and its network namespace is freed.

use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, sockopt};
use nix::sys::time::TimeVal;
use serde::Deserialize;
use tracing::{debug, info, warn};

use super::{
    Ask, Batch, HandoverError, Label, Socket, Successor, accept_root, bind_private, labelled,
    receive, send_labelled,
};

/// How long the proxy waits on a holder that does not read: it must never hold up the agent.
const SEND_WAIT: Duration = Duration::from_secs(1);

/// What the holder is told: a batch of the set to keep, or a successor's question.
#[derive(Deserialize)]
#[serde(untagged)]
enum ToHolder {
    Ask(Ask),
    Keep(Batch),
}

/// The holder's end: a bound socket and what it keeps.
pub struct Holder {
    listener: OwnedFd,
    path: PathBuf,
    held: Vec<Socket>,
    /// The proxy handed its sockets to a successor in another pod.
    superseded: bool,
}

impl Holder {
    pub fn bind(path: &Path) -> Result<Holder, HandoverError> {
        Ok(Holder {
            listener: bind_private(path)?,
            path: path.to_owned(),
            held: Vec::new(),
            superseded: false,
        })
    }

    /// Serves the proxy (and, after a crash, the proxy started again), on the calling thread,
    /// for ever.
    pub fn run(mut self) {
        info!(socket = %self.path.display(), "keeping copies of the proxy's sockets");
        loop {
            let conn = accept_root(&self.listener);
            match self.serve(&conn) {
                Ok(()) => info!(
                    sockets = self.held.len(),
                    "the proxy went away; keeping its sockets for the next one"
                ),
                Err(error) => warn!(%error, "a connection of the proxy failed"),
            }
        }
    }

    fn serve(&mut self, conn: &OwnedFd) -> Result<(), HandoverError> {
        let io_error = |source| super::io_error(&self.path, source);
        let mut pending = Vec::new();
        loop {
            let (bytes, fds) = receive(conn).map_err(io_error)?;
            if bytes.is_empty() {
                return Ok(());
            }
            let message = serde_json::from_slice(&bytes).map_err(|e| self.message_error(e))?;
            match message {
                ToHolder::Ask(Ask::Held) => {
                    let labels: Vec<_> = self.held.iter().map(Socket::label).collect();
                    send_labelled(conn, &labels, self.superseded).map_err(io_error)?;
                    info!(
                        sockets = labels.len(),
                        "gave the proxy the sockets kept for it"
                    );
                }
                ToHolder::Ask(ask) => {
                    return Err(
                        self.message_error(format!("{ask:?} is not a question for a holder"))
                    );
                }
                ToHolder::Keep(batch) => {
                    let sockets =
                        labelled(batch.sockets, fds).map_err(|e| self.message_error(e))?;
                    pending.extend(sockets);
                    if !batch.more {
                        self.held = std::mem::take(&mut pending);
                        self.superseded = batch.superseded;
                        debug!(sockets = self.held.len(), "keeping the proxy's sockets");
                    }
                }
            }
        }
    }

    fn message_error(&self, why: impl ToString) -> HandoverError {
        HandoverError::Message {
            path: self.path.clone(),
            why: why.to_string(),
        }
    }
}

/// The proxy's end: tells the holder what to keep.
pub struct Keeper {
    path: PathBuf,
    /// The admin and CNI sockets: kept with every set.
    fixed: Vec<Socket>,
    conn: Mutex<Option<OwnedFd>>,
}

impl Keeper {
    pub fn new(path: PathBuf, admin: OwnedFd, cni: OwnedFd) -> Keeper {
        Keeper {
            path,
            fixed: vec![Socket::Admin(admin), Socket::Cni(cni)],
            conn: Mutex::default(),
        }
    }

    /// Has the holder keep the admin and CNI sockets and `pods`' listeners, and nothing else.
    /// A holder that is not there or does not answer is said in the log, not waited for; the
    /// next change tries it again.
    pub fn keep<'a>(&self, pods: impl IntoIterator<Item = (&'a str, SocketAddr, BorrowedFd<'a>)>) {
        let mut labels: Vec<_> = self.fixed.iter().map(Socket::label).collect();
        labels.extend(pods.into_iter().map(|(key, addr, fd)| {
            let label = Label::Pod {
                key: key.to_owned(),
                addr,
            };
            (label, fd)
        }));
        self.send(&labels, false);
    }

    /// Has the holder keep nothing, and tell a proxy restarted in this pod that a successor
    /// in another pod owns the sockets now.
    pub fn release(&self) {
        self.send(&[], true);
    }

    fn send(&self, labels: &[(Label, BorrowedFd<'_>)], superseded: bool) {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_none() {
            *conn = match self.dial() {
                Ok(dialled) => dialled,
                Err(error) => {
                    warn!(%error, "cannot reach the socket holder; a crash of this proxy will refuse connections");
                    None
                }
            };
        }
        let Some(socket) = conn.as_ref() else {
            return;
        };
        if let Err(error) = send_labelled(socket, labels, superseded) {
            warn!(%error, socket = %self.path.display(), "the socket holder did not take the proxy's sockets");
            *conn = None;
        }
    }

    fn dial(&self) -> Result<Option<OwnedFd>, HandoverError> {
        let Some(successor) = Successor::dial(&self.path)? else {
            debug!(socket = %self.path.display(), "no socket holder");
            return Ok(None);
        };
        let timeout = TimeVal::new(SEND_WAIT.as_secs() as _, 0);
        socket::setsockopt(&successor.socket, sockopt::SendTimeout, &timeout)
            .map_err(|source: Errno| super::socket_error(&self.path, source))?;
        Ok(Some(successor.socket))
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").field("path", &self.path).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    /// The holder keeps what it was last told, closes what it no longer keeps, and gives the
    /// rest to the proxy started after a crash, backlog and all.
    #[test]
    fn a_restarted_proxy_takes_what_the_holder_kept() {
        let dir = std::env::temp_dir().join(format!("aether-holder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("holder.sock");
        assert!(
            Successor::take_held(&path).unwrap().is_none(),
            "no holder yet"
        );
        let holder = Holder::bind(&path).unwrap();
        std::thread::spawn(move || holder.run());

        let listen = || TcpListener::bind("127.0.0.1:0").unwrap();
        let (admin, cni, kept, dropped) = (listen(), listen(), listen(), listen());
        let (kept_addr, dropped_addr) = (kept.local_addr().unwrap(), dropped.local_addr().unwrap());
        let keeper = Keeper::new(
            path.clone(),
            admin.try_clone().unwrap().into(),
            cni.try_clone().unwrap().into(),
        );
        let (kept, dropped): (OwnedFd, OwnedFd) = (kept.into(), dropped.into());
        keeper.keep([
            ("c1", kept_addr, kept.as_fd()),
            ("c2", dropped_addr, dropped.as_fd()),
        ]);
        keeper.keep([("c1", kept_addr, kept.as_fd())]);
        // The proxy crashes: its own descriptors go, the holder's copies stay.
        drop((keeper, kept, dropped, admin, cni));
        let mut waiting = TcpStream::connect(kept_addr).unwrap();
        waiting.write_all(b"hello").unwrap();

        // Served after the keeper's connection ended: the holder has seen every change.
        let given = Successor::take_held(&path).unwrap().unwrap();
        assert!(
            TcpStream::connect(dropped_addr).is_err(),
            "a socket the proxy stopped keeping is closed"
        );
        assert!(given.admin.is_some() && given.cni.is_some());
        let [pod] = <[_; 1]>::try_from(given.pods).unwrap();
        assert_eq!((pod.key.as_str(), pod.addr), ("c1", kept_addr));
        let (mut accepted, _) = TcpListener::from(pod.fd).accept().unwrap();
        let mut hello = [0u8; 5];
        accepted.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello");

        // Once its proxy handed over to another pod's, the holder keeps nothing and says so.
        let keeper = Keeper::new(path.clone(), listen().into(), listen().into());
        keeper.release();
        drop(keeper);
        let given = Successor::take_held(&path).unwrap().unwrap();
        assert!(given.superseded && given.pods.is_empty() && given.admin.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
