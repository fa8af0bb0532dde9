//! Handing the node's listening sockets from one proxy process to the next, so that a rolling
//! update never closes them: connections that arrive while the new process starts wait in the
//! sockets' backlogs and the new process accepts them; none is refused.
//!
//! The running proxy (the predecessor) offers its sockets on a Unix seqpacket socket in the
//! node's `/var/run/aether`; a starting proxy (the successor) connects to it and asks, in two
//! steps:
//! 1. [`Ask::Admin`], first thing: the admin socket. The kubelet's probes of both pods reach the
//!    successor from then on, so the new pod is not Ready before it serves the pods.
//! 2. [`Ask::Pods`], once its caches are synced: the predecessor stops changing the node (the
//!    CNI server, the config loops), hands over the CNI socket and every pod's listeners, and
//!    drains its open connections.
//!
//! If the successor goes away between the two, the predecessor takes its admin socket back.
//! A proxy that crashed has no predecessor: its [`holder`] kept copies of its sockets.
//! Descriptors travel as `SCM_RIGHTS`, at most [`BATCH`] a message, each described in the
//! message's JSON. Only root may connect: the socket is mode 0600 and the peer's credentials are
//! checked.

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr, sockopt,
};
use nix::sys::time::TimeVal;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::inpod::listeners::PodSocket;

pub mod holder;

/// Descriptors per message: under the kernel's limit of 253 for one `SCM_RIGHTS`.
pub const BATCH: usize = 64;
/// Largest message: a batch's JSON, with room to spare.
const MAX_MESSAGE: usize = 64 * 1024;
/// How long the successor waits for the admin socket.
const ADMIN_WAIT: Duration = Duration::from_secs(10);
/// How long it waits for the pods' sockets: the predecessor first lets the CNI requests under
/// way finish (each has 30 s at most).
const PODS_WAIT: Duration = Duration::from_secs(60);

/// What the successor asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    Admin,
    Pods,
    /// Everything a [`holder`] keeps, at once.
    Held,
}

/// What a handed-over descriptor is, as the message describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Label {
    Admin,
    Cni,
    Pod { key: String, addr: SocketAddr },
}

/// One message of sockets; `more` until the last.
#[derive(Debug, Serialize, Deserialize)]
struct Batch {
    sockets: Vec<Label>,
    more: bool,
    /// From a holder: its proxy handed the sockets to a successor in another pod, so a proxy
    /// restarted in this pod must not take them back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    superseded: bool,
}

/// A socket to hand over.
#[derive(Debug)]
pub enum Socket {
    Admin(OwnedFd),
    Cni(OwnedFd),
    Pod(PodSocket),
}

impl Socket {
    fn label(&self) -> (Label, BorrowedFd<'_>) {
        match self {
            Socket::Admin(fd) => (Label::Admin, fd.as_fd()),
            Socket::Cni(fd) => (Label::Cni, fd.as_fd()),
            Socket::Pod(pod) => (
                Label::Pod {
                    key: pod.key.clone(),
                    addr: pod.addr,
                },
                pod.fd.as_fd(),
            ),
        }
    }

    fn labelled(label: Label, fd: OwnedFd) -> Socket {
        match label {
            Label::Admin => Socket::Admin(fd),
            Label::Cni => Socket::Cni(fd),
            Label::Pod { key, addr } => Socket::Pod(PodSocket { key, addr, fd }),
        }
    }
}

/// The sockets the successor took.
#[derive(Debug, Default)]
pub struct Given {
    pub admin: Option<OwnedFd>,
    pub cni: Option<OwnedFd>,
    pub pods: Vec<PodSocket>,
    /// The holder's proxy handed its sockets to a successor (see [`holder`]).
    pub superseded: bool,
}

impl Given {
    fn add(&mut self, socket: Socket) {
        match socket {
            Socket::Admin(fd) => self.admin = Some(fd),
            Socket::Cni(fd) => self.cni = Some(fd),
            Socket::Pod(pod) => self.pods.push(pod),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("hand-over socket {}: {source}", path.display())]
    Socket { path: PathBuf, source: Errno },
    #[error("talking to the other proxy over {}: {source}", path.display())]
    Io { path: PathBuf, source: Errno },
    #[error("the other proxy closed the hand-over socket {} midway", path.display())]
    Closed { path: PathBuf },
    #[error("a hand-over message over {}: {why}", path.display())]
    Message { path: PathBuf, why: String },
}

/// The successor's end: connected to the predecessor, holding what it has taken so far.
pub struct Successor {
    socket: OwnedFd,
    path: PathBuf,
}

impl Successor {
    /// Connects to the proxy offering its sockets at `path` and takes its admin socket; `None`
    /// when no proxy offers there (the first start on the node, or the last proxy crashed).
    pub fn connect(path: &Path) -> Result<Option<(Successor, OwnedFd)>, HandoverError> {
        let Some(successor) = Successor::dial(path)? else {
            return Ok(None);
        };
        successor.ask(Ask::Admin, ADMIN_WAIT)?;
        let (sockets, _) = successor.receive()?;
        match <[Socket; 1]>::try_from(sockets) {
            Ok([Socket::Admin(admin)]) => Ok(Some((successor, admin))),
            _ => Err(successor.message_error("the answer to `admin` is not one admin socket")),
        }
    }

    /// Takes the CNI socket and every pod's listeners; the predecessor drains from then on.
    pub fn take_pods(self) -> Result<Given, HandoverError> {
        self.ask(Ask::Pods, PODS_WAIT)?;
        let given = self.receive_all()?;
        if given.admin.is_some() {
            return Err(self.message_error("an admin socket among the pods'"));
        }
        Ok(given)
    }

    /// Takes copies of what the holder at `path` keeps; `None` when no holder listens there.
    pub fn take_held(path: &Path) -> Result<Option<Given>, HandoverError> {
        let Some(successor) = Successor::dial(path)? else {
            return Ok(None);
        };
        successor.ask(Ask::Held, ADMIN_WAIT)?;
        successor.receive_all().map(Some)
    }

    fn dial(path: &Path) -> Result<Option<Successor>, HandoverError> {
        let socket = seqpacket(path)?;
        let addr = UnixAddr::new(path).map_err(|source| socket_error(path, source))?;
        match socket::connect(socket.as_raw_fd(), &addr) {
            Ok(()) => Ok(Some(Successor {
                socket,
                path: path.to_owned(),
            })),
            Err(Errno::ENOENT | Errno::ECONNREFUSED) => Ok(None),
            Err(source) => Err(socket_error(path, source)),
        }
    }

    fn receive_all(&self) -> Result<Given, HandoverError> {
        let mut given = Given::default();
        loop {
            let (sockets, batch) = self.receive()?;
            sockets.into_iter().for_each(|socket| given.add(socket));
            given.superseded |= batch.superseded;
            if !batch.more {
                return Ok(given);
            }
        }
    }

    fn ask(&self, ask: Ask, wait: Duration) -> Result<(), HandoverError> {
        let timeout = TimeVal::new(wait.as_secs() as _, 0);
        socket::setsockopt(&self.socket, sockopt::ReceiveTimeout, &timeout)
            .map_err(|source| socket_error(&self.path, source))?;
        let json = serde_json::to_vec(&ask).map_err(|e| self.message_error(e.to_string()))?;
        send(&self.socket, &json, &[]).map_err(|source| io_error(&self.path, source))
    }

    /// A batch's sockets, and the batch with its labels taken.
    fn receive(&self) -> Result<(Vec<Socket>, Batch), HandoverError> {
        let (bytes, fds) = receive(&self.socket).map_err(|source| io_error(&self.path, source))?;
        if bytes.is_empty() {
            return Err(HandoverError::Closed {
                path: self.path.clone(),
            });
        }
        let mut batch: Batch =
            serde_json::from_slice(&bytes).map_err(|e| self.message_error(e.to_string()))?;
        let labels = std::mem::take(&mut batch.sockets);
        let sockets = labelled(labels, fds).map_err(|why| self.message_error(why))?;
        Ok((sockets, batch))
    }

    fn message_error(&self, why: impl Into<String>) -> HandoverError {
        HandoverError::Message {
            path: self.path.clone(),
            why: why.into(),
        }
    }
}

/// What the predecessor's offer tells the process it belongs to.
#[derive(Debug)]
pub enum Event {
    /// A successor took the admin socket: stop serving it.
    AdminTaken,
    /// The successor went away before it took the pods: serve the admin socket again.
    Abandoned,
    /// The successor wants the pods: stop changing the node, and send the CNI socket and the
    /// pods' listeners back on the channel. Then drain.
    PodsWanted(tokio::sync::oneshot::Sender<Vec<Socket>>),
}

/// The predecessor's end: a bound socket, waiting for a successor.
pub struct Offer {
    listener: OwnedFd,
    path: PathBuf,
}

impl Offer {
    /// Binds `path` (mode 0600), replacing the socket of an earlier proxy: a successor binds it
    /// once it serves, so the next one finds it.
    pub fn bind(path: &Path) -> Result<Offer, HandoverError> {
        Ok(Offer {
            listener: bind_private(path)?,
            path: path.to_owned(),
        })
    }

    /// Serves successors until one has taken the pods, on the calling thread (it blocks): run
    /// it on a thread of its own. `admin` is a copy of the admin socket. Returns when the pods
    /// are handed over, or the process that would answer for them is gone; closing the offer
    /// then refuses any later successor, which starts afresh.
    pub fn serve(self, admin: OwnedFd, events: tokio::sync::mpsc::UnboundedSender<Event>) {
        info!(socket = %self.path.display(), "offering this proxy's sockets to a successor");
        loop {
            let conn = accept_root(&self.listener);
            match self.serve_one(&conn, &admin, &events) {
                Ok(Served::Pods | Served::Gone) => return,
                Ok(Served::Abandoned) => {}
                Err(error) => warn!(%error, "a successor's hand-over failed"),
            }
            if events.send(Event::Abandoned).is_err() {
                return;
            }
        }
    }

    fn serve_one(
        &self,
        conn: &OwnedFd,
        admin: &OwnedFd,
        events: &tokio::sync::mpsc::UnboundedSender<Event>,
    ) -> Result<Served, HandoverError> {
        loop {
            let (bytes, _) = receive(conn).map_err(|e| io_error(&self.path, e))?;
            if bytes.is_empty() {
                return Ok(Served::Abandoned);
            }
            let ask: Ask = serde_json::from_slice(&bytes).map_err(|e| HandoverError::Message {
                path: self.path.clone(),
                why: e.to_string(),
            })?;
            match ask {
                Ask::Held => {
                    return Err(HandoverError::Message {
                        path: self.path.clone(),
                        why: "`held` is a question for a holder, not a running proxy".into(),
                    });
                }
                Ask::Admin => {
                    let copy = admin
                        .try_clone()
                        .map_err(|e| io_error(&self.path, errno_of(&e)))?;
                    send_sockets(conn, &[Socket::Admin(copy)])
                        .map_err(|e| io_error(&self.path, e))?;
                    info!("a successor took the admin socket");
                    if events.send(Event::AdminTaken).is_err() {
                        return Ok(Served::Gone);
                    }
                }
                Ask::Pods => {
                    let (reply, sockets) = tokio::sync::oneshot::channel();
                    if events.send(Event::PodsWanted(reply)).is_err() {
                        return Ok(Served::Gone);
                    }
                    let Ok(sockets) = sockets.blocking_recv() else {
                        return Ok(Served::Gone);
                    };
                    // This process has stopped serving the pods either way: a successor that
                    // is gone now opens new listeners when it starts again.
                    match send_sockets(conn, &sockets) {
                        Ok(()) => info!(
                            sockets = sockets.len(),
                            "handed this proxy's sockets to its successor"
                        ),
                        Err(error) => warn!(%error, "the successor did not take the pods' sockets"),
                    }
                    return Ok(Served::Pods);
                }
            }
        }
    }
}

/// How one successor's connection ended.
enum Served {
    Pods,
    Abandoned,
    /// The process stopped listening for events.
    Gone,
}

/// The messages carrying `sockets`, [`BATCH`] at a time; an empty list is one empty message.
fn batches<'a>(
    sockets: &'a [(Label, BorrowedFd<'a>)],
    superseded: bool,
) -> impl Iterator<Item = (Batch, Vec<BorrowedFd<'a>>)> {
    let chunks = sockets.len().div_ceil(BATCH).max(1);
    (0..chunks).map(move |i| {
        let chunk = sockets.chunks(BATCH).nth(i).unwrap_or_default();
        let (labels, fds) = chunk.iter().cloned().unzip();
        let batch = Batch {
            sockets: labels,
            more: i + 1 < chunks,
            superseded,
        };
        (batch, fds)
    })
}

/// A received batch's sockets: as many descriptors as labels, each one labelled.
fn labelled(labels: Vec<Label>, fds: Vec<OwnedFd>) -> Result<Vec<Socket>, String> {
    if labels.len() != fds.len() {
        return Err(format!(
            "{} sockets described, {} received",
            labels.len(),
            fds.len()
        ));
    }
    Ok(labels
        .into_iter()
        .zip(fds)
        .map(|(label, fd)| Socket::labelled(label, fd))
        .collect())
}

fn send_sockets(conn: &OwnedFd, sockets: &[Socket]) -> Result<(), Errno> {
    let labels: Vec<_> = sockets.iter().map(Socket::label).collect();
    send_labelled(conn, &labels, false)
}

fn send_labelled(
    conn: &OwnedFd,
    sockets: &[(Label, BorrowedFd<'_>)],
    superseded: bool,
) -> Result<(), Errno> {
    for (batch, fds) in batches(sockets, superseded) {
        let json = serde_json::to_vec(&batch).map_err(|_| Errno::EINVAL)?;
        send(conn, &json, &fds)?;
    }
    Ok(())
}

fn send(socket: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Errno> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    loop {
        match socket::sendmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => continue,
            sent => return sent.map(drop),
        }
    }
}

/// One message and its descriptors; no bytes when the peer closed the connection.
fn receive(socket: &OwnedFd) -> Result<(Vec<u8>, Vec<OwnedFd>), Errno> {
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let mut space = nix::cmsg_space!([RawFd; BATCH]);
    let (bytes, flags, raw) = loop {
        let mut iov = [IoSliceMut::new(&mut buffer)];
        match socket::recvmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(message) => {
                let mut raw = Vec::new();
                for cmsg in message.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(fds) = cmsg {
                        raw.extend(fds);
                    }
                }
                break (message.bytes, message.flags, raw);
            }
        }
    };
    // SAFETY: the kernel installed these descriptors in this process for this message
    // (SCM_RIGHTS); nothing else refers to them, so each is owned here exactly once.
    let fds: Vec<OwnedFd> = raw
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(Errno::EMSGSIZE);
    }
    buffer.truncate(bytes);
    Ok((buffer, fds))
}

/// A seqpacket socket listening at `path`, mode 0600, in place of any socket an earlier
/// process left there.
fn bind_private(path: &Path) -> Result<OwnedFd, HandoverError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| socket_error(path, errno_of(&e)))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(socket_error(path, errno_of(&e))),
    }
    let listener = seqpacket(path)?;
    let addr = UnixAddr::new(path).map_err(|source| socket_error(path, source))?;
    socket::bind(listener.as_raw_fd(), &addr).map_err(|source| socket_error(path, source))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| socket_error(path, errno_of(&e)))?;
    let backlog = Backlog::new(4).map_err(|source| socket_error(path, source))?;
    socket::listen(&listener, backlog).map_err(|source| socket_error(path, source))?;
    Ok(listener)
}

/// The next connection of a root process (others are dropped, said in the log).
fn accept_root(listener: &OwnedFd) -> OwnedFd {
    loop {
        let conn = match socket::accept(listener) {
            Ok(conn) => conn,
            Err(Errno::EINTR) => continue,
            Err(error) => {
                warn!(%error, "accepting a hand-over connection failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match socket::getsockopt(&conn, sockopt::PeerCredentials) {
            Ok(cred) if cred.uid() == 0 => return conn,
            peer => warn!(?peer, "refused a hand-over connection that is not root's"),
        }
    }
}

fn seqpacket(path: &Path) -> Result<OwnedFd, HandoverError> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|source| socket_error(path, source))
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

fn socket_error(path: &Path, source: Errno) -> HandoverError {
    HandoverError::Socket {
        path: path.to_owned(),
        source,
    }
}

fn io_error(path: &Path, source: Errno) -> HandoverError {
    HandoverError::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pod_socket(key: &str) -> Socket {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Socket::Pod(PodSocket {
            key: key.into(),
            addr: listener.local_addr().unwrap(),
            fd: listener.into(),
        })
    }

    #[test]
    fn sockets_go_in_batches_and_the_last_says_so() {
        let sockets: Vec<Socket> = (0..BATCH + 1).map(|i| pod_socket(&i.to_string())).collect();
        let labels: Vec<_> = sockets.iter().map(Socket::label).collect();
        let sent: Vec<_> = batches(&labels, false).collect();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].0.sockets.len(), BATCH);
        assert!(sent[0].0.more);
        assert_eq!(sent[1].1.len(), 1);
        assert!(!sent[1].0.more);
        let none: Vec<_> = batches(&[], false).collect();
        assert_eq!(none.len(), 1, "nothing to hand over is still an answer");
        assert!(none[0].0.sockets.is_empty() && !none[0].0.more);
    }

    #[test]
    fn a_message_must_describe_every_descriptor() {
        let fd: OwnedFd = TcpListener::bind("127.0.0.1:0").unwrap().into();
        let batch = |json: &str| serde_json::from_str::<Batch>(json).unwrap();
        let two = batch(r#"{"sockets":["cni","admin"],"more":false}"#);
        assert!(!two.superseded, "not said, not superseded");
        assert!(
            labelled(two.sockets, vec![fd])
                .unwrap_err()
                .contains("2 sockets described, 1")
        );
        let pod =
            batch(r#"{"sockets":[{"pod":{"key":"c1","addr":"127.0.0.1:15001"}}],"more":true}"#);
        let fd: OwnedFd = TcpListener::bind("127.0.0.1:0").unwrap().into();
        let sockets = labelled(pod.sockets, vec![fd]).unwrap();
        assert!(matches!(&sockets[..], [Socket::Pod(p)] if p.key == "c1"));
    }

    /// A listening socket goes through the offer, real descriptors and all, and the successor
    /// accepts the connection that was waiting in its backlog.
    #[test]
    fn a_successor_takes_the_listeners_and_accepts_what_waited() {
        let dir = std::env::temp_dir().join(format!("aether-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("handover.sock");
        assert!(
            Successor::connect(&path).unwrap().is_none(),
            "nobody offers yet"
        );

        let admin = TcpListener::bind("127.0.0.1:0").unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let pods: Vec<Socket> = (0..BATCH + 2)
            .map(|i| pod_socket(&format!("c{i}")))
            .collect();
        let Socket::Pod(first) = &pods[0] else {
            unreachable!()
        };
        let first_addr = first.addr;
        let (events, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let offer = Offer::bind(&path).unwrap();
        let predecessor = std::thread::spawn(move || offer.serve(admin.into(), events));

        // A successor that goes away after the admin socket is one the offer outlives.
        let (gone, _) = Successor::connect(&path).unwrap().unwrap();
        assert!(matches!(heard.blocking_recv(), Some(Event::AdminTaken)));
        drop(gone);
        assert!(matches!(heard.blocking_recv(), Some(Event::Abandoned)));

        let (successor, admin) = Successor::connect(&path).unwrap().unwrap();
        assert_eq!(TcpListener::from(admin).local_addr().unwrap(), admin_addr);
        assert!(matches!(heard.blocking_recv(), Some(Event::AdminTaken)));
        let mut waiting = TcpStream::connect(first_addr).unwrap();
        waiting.write_all(b"hello").unwrap();
        let taking = std::thread::spawn(move || successor.take_pods());
        let Some(Event::PodsWanted(reply)) = heard.blocking_recv() else {
            panic!("the offer did not ask for the pods");
        };
        let cni: OwnedFd = TcpListener::bind("127.0.0.1:0").unwrap().into();
        let mut sockets = pods;
        sockets.push(Socket::Cni(cni));
        reply.send(sockets).unwrap();
        let given = taking.join().unwrap().unwrap();
        predecessor.join().unwrap();
        assert!(given.cni.is_some());
        assert_eq!(given.pods.len(), BATCH + 2);
        let taken = given.pods.into_iter().find(|p| p.key == "c0").unwrap();
        assert_eq!(taken.addr, first_addr);
        let (mut accepted, _) = TcpListener::from(taken.fd).accept().unwrap();
        let mut hello = [0u8; 5];
        accepted.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello");
        assert!(
            Successor::connect(&path).unwrap().is_none(),
            "an offer that handed over refuses the next successor"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
