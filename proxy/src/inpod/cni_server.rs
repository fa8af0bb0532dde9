//! Serves the CNI plugin's protocol (`aether_cni::protocol`) on the proxy's Unix socket.
//!
//! Each connection runs on tokio's blocking pool with the protocol's own blocking helpers,
//! `read_frame` and `handle_frame`: the agent answers synchronously anyway (nftables, setns
//! threads), a plugin's connection lasts milliseconds, and socket timeouts bound every read and
//! write. So framing, limits and the answer to a bad frame are exactly the protocol module's.
//!
//! Only root may register pods: the socket is mode 0600, and a peer whose credentials
//! (`SO_PEERCRED`) are not uid 0 (e.g. root of a user namespace, or a process let in by a
//! loosened mode) is answered with an error and dropped before it takes a thread. At most
//! [`MAX_CONNECTIONS`] are served at once, each for at most [`CONNECTION_DEADLINE`].

use std::future::Future;
use std::io::{self, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aether_cni::protocol::{
    ErrorKind, ErrorReply, FrameError, Response, encode_response, handle_frame, read_frame,
};
use tokio::net::UnixListener;
use tracing::{debug, info, warn};

use crate::inpod::agent::Agent;
use crate::inpod::protocol;

/// Bounds each read and write on a connection: a plugin that stops talking is dropped (the
/// plugin itself gives up on the proxy after 2 s).
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the socket's backlog. Pod setups on one node are
/// a handful at a time.
pub const MAX_CONNECTIONS: usize = 16;
/// How long one connection may last, however slowly it talks: the plugin's own calls take
/// milliseconds.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// How long a refused peer may take to send and to read.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);
/// Pause after a failed accept (e.g. out of file descriptors), so it does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The bound socket, and which file it is, so that shutting down removes only our own.
pub struct CniSocket {
    listener: UnixListener,
    path: PathBuf,
    inode: (u64, u64),
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot create the directory of the CNI socket {}: {source}", path.display())]
    Dir { path: PathBuf, source: io::Error },
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    #[error("another process is serving {}: is another aether-proxy running on this node?", .0.display())]
    InUse(PathBuf),
    #[error("cannot listen on {}: {source}", path.display())]
    Bind { path: PathBuf, source: io::Error },
}

/// Binds the socket at `path`, mode 0600 (only root may register pods): creates its directory,
/// and replaces a socket left by a proxy that is gone, but never one that still answers, nor a
/// file that is not a socket. Must be called within a tokio runtime.
pub fn bind(path: &Path) -> Result<CniSocket, ServerError> {
    let bind_error = |source| ServerError::Bind {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ServerError::Dir {
            path: dir.to_owned(),
            source,
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ServerError::NotASocket(path.to_owned()));
        }
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServerError::InUse(path.to_owned()));
            }
            info!(socket = %path.display(), "removing the stale CNI socket of an earlier proxy");
            std::fs::remove_file(path).map_err(bind_error)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_error(e)),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(bind_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_error)?;
    CniSocket::serving(listener, path)
}

impl CniSocket {
    /// The socket a predecessor process was serving at `path`, handed over.
    pub fn inherit(fd: OwnedFd, path: &Path) -> Result<CniSocket, ServerError> {
        let bind_error = |source| ServerError::Bind {
            path: path.to_owned(),
            source,
        };
        let listener = std::os::unix::net::UnixListener::from(fd);
        let bound = listener.local_addr().map_err(bind_error)?;
        if bound.as_pathname() != Some(path) {
            return Err(bind_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the handed-over CNI socket is bound to {bound:?}"),
            )));
        }
        CniSocket::serving(listener, path)
    }

    /// `listener`, bound at `path`, ready for the runtime; the file's identity is noted.
    fn serving(
        listener: std::os::unix::net::UnixListener,
        path: &Path,
    ) -> Result<CniSocket, ServerError> {
        let bind_error = |source| ServerError::Bind {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        Ok(CniSocket {
            listener: UnixListener::from_std(listener).map_err(bind_error)?,
            path: path.to_owned(),
            inode: (meta.dev(), meta.ino()),
        })
    }

    /// A copy of the listening socket, for a successor process.
    pub fn copy(&self) -> io::Result<OwnedFd> {
        self.listener.as_fd().try_clone_to_owned()
    }
}

/// What becomes of the socket when the server stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The proxy is going: the file goes, so the plugin sees at once that nobody serves.
    Remove,
    /// A successor serves the same socket: the file stays.
    HandOver,
}

/// Serves until `shutdown` completes, lets the connections being served finish (each has
/// [`CONNECTION_DEADLINE`]), then removes the socket file if `shutdown` says so and it is still
/// ours.
pub async fn serve(socket: CniSocket, agent: Arc<Agent>, shutdown: impl Future<Output = Stop>) {
    info!(socket = %socket.path.display(), "serving the CNI plugin");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    let stop = loop {
        let slot = tokio::select! {
            stop = &mut shutdown => break stop,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break Stop::Remove,
            },
        };
        let accepted = tokio::select! {
            stop = &mut shutdown => break stop,
            accepted = socket.listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                warn!(%error, "accepting a CNI plugin connection failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let peer = match stream.peer_cred() {
            Ok(cred) if cred.uid() == 0 => None,
            Ok(cred) => Some(format!(
                "only root may talk to the aether CNI socket; peer uid {} (pid {:?}) refused",
                cred.uid(),
                cred.pid()
            )),
            Err(error) => Some(format!("cannot read the peer's credentials: {error}")),
        };
        if let Some(refusal) = peer {
            warn!(reason = %refusal, "refused a CNI socket connection");
            tokio::spawn(async move {
                refuse(stream, &refusal).await;
                drop(slot);
            });
            continue;
        }
        match stream.into_std() {
            Ok(stream) => {
                let agent = agent.clone();
                tokio::task::spawn_blocking(move || {
                    serve_connection(stream, &agent);
                    drop(slot);
                });
            }
            Err(error) => warn!(%error, "cannot set up a CNI plugin connection"),
        }
    };
    // A registration under way finishes before the registry is handed on or left for the
    // next start.
    let all = MAX_CONNECTIONS as u32;
    if tokio::time::timeout(CONNECTION_DEADLINE, slots.acquire_many(all))
        .await
        .is_err()
    {
        warn!("a CNI plugin connection outlived its deadline at shutdown");
    }
    if stop == Stop::HandOver {
        return;
    }
    let ours =
        std::fs::metadata(&socket.path).is_ok_and(|meta| (meta.dev(), meta.ino()) == socket.inode);
    if ours && let Err(error) = std::fs::remove_file(&socket.path) {
        warn!(socket = %socket.path.display(), %error, "cannot remove the CNI socket");
    }
}

/// Answers a connection that may not talk to the proxy with an error, on no thread of its own.
/// What the peer sent first is read (and ignored), so that its request does not meet a closed
/// socket before it can read the answer; a peer that stalls gets nothing after a second.
async fn refuse(mut stream: tokio::net::UnixStream, why: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let reply = encode_response(&Response::Error(ErrorReply {
        kind: ErrorKind::BadRequest,
        message: why.to_owned(),
    }));
    let mut request = [0u8; 512];
    let _ = tokio::time::timeout(REFUSAL_WAIT, stream.read(&mut request)).await;
    let _ = tokio::time::timeout(REFUSAL_WAIT, stream.write_all(&reply)).await;
}

/// Request/response pairs until the plugin closes the connection. A frame that does not decode
/// gets the protocol's error answer and the connection goes on; one over the size limit gets it
/// too, then the connection is closed, since the rest of that frame cannot be skipped reliably.
fn serve_connection(stream: UnixStream, agent: &Agent) {
    let prepared = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(IO_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .and_then(|()| stream.try_clone());
    let mut writer = match prepared {
        Ok(writer) => writer,
        Err(error) => {
            warn!(%error, "cannot set up a CNI plugin connection");
            return;
        }
    };
    let deadline = std::time::Instant::now() + CONNECTION_DEADLINE;
    let mut reader = BufReader::new(stream);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero()
            || reader
                .get_ref()
                .set_read_timeout(Some(left.min(IO_TIMEOUT)))
                .is_err()
        {
            debug!("closing a CNI plugin connection at its deadline");
            return;
        }
        let reply = match read_frame(&mut reader) {
            Ok(Some(frame)) => handle_frame(&frame, |request| protocol::handle(agent, request)),
            Ok(None) => return,
            Err(error @ FrameError::TooLarge) => {
                let reply = encode_response(&Response::Error(ErrorReply {
                    kind: ErrorKind::BadRequest,
                    message: error.to_string(),
                }));
                let _ = writer.write_all(&reply);
                return;
            }
            Err(error) => {
                debug!(%error, "closing a CNI plugin connection");
                return;
            }
        };
        if let Err(error) = writer.write_all(&reply) {
            debug!(%error, "cannot answer the CNI plugin");
            return;
        }
    }
}
