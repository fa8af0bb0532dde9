use std::io::{self, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, UnixAddr, connect, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::PROTOCOL_VERSION;
use super::frame::{DecodeError, FrameError, decode_response, encode_request, read_frame};
use super::messages::{ErrorReply, Request, Response};

/// The plugin's side: connects to the proxy's socket with a bounded wait.
#[derive(Clone, Debug)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("aether node proxy not reachable at {}: {source}", socket.display())]
    Unreachable { socket: PathBuf, source: io::Error },
    #[error("aether node proxy at {} did not answer within {timeout:?}", socket.display())]
    Timeout { socket: PathBuf, timeout: Duration },
    #[error("talking to the aether node proxy at {} failed: {source}", socket.display())]
    Io { socket: PathBuf, source: FrameError },
    #[error("aether node proxy at {} closed the connection without answering", socket.display())]
    Closed { socket: PathBuf },
    #[error("aether node proxy at {} sent an invalid answer: {source}", socket.display())]
    Invalid {
        socket: PathBuf,
        source: DecodeError,
    },
    #[error(
        "aether node proxy at {} speaks another protocol version than this plugin (version {PROTOCOL_VERSION}): install the plugin from the same aether release as the proxy",
        socket.display()
    )]
    VersionMismatch { socket: PathBuf },
    #[error("aether node proxy at {} answered an error ({:?}): {}", socket.display(), reply.kind, reply.message)]
    Server { socket: PathBuf, reply: ErrorReply },
    #[error("aether node proxy at {} answered {got:?} to a {asked} request", socket.display())]
    Unexpected {
        socket: PathBuf,
        asked: &'static str,
        got: Box<Response>,
    },
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Client {
            socket: socket.into(),
            timeout,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn connect(&self) -> Result<Connection, ClientError> {
        let stream = connect_with_timeout(&self.socket, self.timeout).map_err(|source| {
            ClientError::Unreachable {
                socket: self.socket.clone(),
                source,
            }
        })?;
        Ok(Connection {
            socket: self.socket.clone(),
            timeout: self.timeout,
            reader: BufReader::new(DeadlineStream {
                stream,
                deadline: Instant::now() + self.timeout,
            }),
        })
    }
}

/// std's `UnixStream::connect` can block for as long as the proxy's accept backlog is full;
/// SO_SNDTIMEO bounds a Unix-socket connect.
fn connect_with_timeout(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::SendTimeout, &timeval(timeout))?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(UnixStream::from(fd))
}

fn timeval(d: Duration) -> TimeVal {
    // A zero SO_SNDTIMEO means "wait forever", so round up to at least 1µs.
    let micros = d.as_micros().clamp(1, i64::MAX as u128) as i64;
    TimeVal::new(micros / 1_000_000, micros % 1_000_000)
}

/// One connection; any number of calls, one at a time, each within the client's timeout.
pub struct Connection {
    socket: PathBuf,
    timeout: Duration,
    reader: BufReader<DeadlineStream>,
}

impl Connection {
    pub fn call(&mut self, request: &Request) -> Result<Response, ClientError> {
        self.reader.get_mut().deadline = Instant::now() + self.timeout;
        let frame = encode_request(request);
        self.reader
            .get_mut()
            .write_all(&frame)
            .map_err(|e| self.io_error(FrameError::Io(e)))?;
        let reply = match read_frame(&mut self.reader) {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                return Err(ClientError::Closed {
                    socket: self.socket.clone(),
                });
            }
            Err(e) => return Err(self.io_error(e)),
        };
        match decode_response(&reply) {
            Ok(Response::Error(reply)) => Err(ClientError::Server {
                socket: self.socket.clone(),
                reply,
            }),
            Ok(response) => Ok(response),
            Err(DecodeError::UnsupportedVersion { .. }) => Err(ClientError::VersionMismatch {
                socket: self.socket.clone(),
            }),
            Err(source) => Err(ClientError::Invalid {
                socket: self.socket.clone(),
                source,
            }),
        }
    }

    /// The error for an answer of the wrong kind, for callers matching on [`Response`].
    pub fn unexpected(&self, asked: &'static str, got: Response) -> ClientError {
        ClientError::Unexpected {
            socket: self.socket.clone(),
            asked,
            got: Box::new(got),
        }
    }

    fn io_error(&self, source: FrameError) -> ClientError {
        match &source {
            FrameError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                ClientError::Timeout {
                    socket: self.socket.clone(),
                    timeout: self.timeout,
                }
            }
            _ => ClientError::Io {
                socket: self.socket.clone(),
                source,
            },
        }
    }
}

/// Applies what is left of the call's deadline to each read and write, so a peer that sends a
/// byte at a time cannot stretch a call past the timeout.
struct DeadlineStream {
    stream: UnixStream,
    deadline: Instant,
}

impl DeadlineStream {
    fn remaining(&self) -> io::Result<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let remaining = self.remaining()?;
        self.stream.set_read_timeout(Some(remaining))?;
        self.stream.read(buf)
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let remaining = self.remaining()?;
        self.stream.set_write_timeout(Some(remaining))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;
    use std::thread;

    use super::super::frame::handle_frame;
    use super::*;

    fn socket_path(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("aether-cni-client-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("cni.sock")
    }

    #[test]
    fn a_missing_socket_is_unreachable() {
        let client = Client::new("/nonexistent/aether/cni.sock", Duration::from_millis(200));
        let err = client.connect().err().unwrap();
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("aether node proxy not reachable at /nonexistent/aether/cni.sock")
        );
    }

    #[test]
    fn calls_round_trip_over_one_connection() {
        let path = socket_path("roundtrip");
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            while let Some(frame) = crate::protocol::read_frame(&mut reader).unwrap() {
                writer
                    .write_all(&handle_frame(&frame, |_| Response::Pong))
                    .unwrap();
            }
        });
        let mut conn = Client::new(&path, Duration::from_secs(2))
            .connect()
            .unwrap();
        for _ in 0..3 {
            assert_eq!(conn.call(&Request::Ping).unwrap(), Response::Pong);
        }
        drop(conn);
        server.join().unwrap();
    }

    #[test]
    fn a_silent_proxy_times_out() {
        let path = socket_path("silent");
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            // Read the request, never answer, wait for the client to give up.
            let mut reader = std::io::BufReader::new(stream);
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let _ = reader.read_line(&mut line);
        });
        let started = Instant::now();
        let mut conn = Client::new(&path, Duration::from_millis(300))
            .connect()
            .unwrap();
        let err = conn.call(&Request::Ping).unwrap_err();
        assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(conn);
        server.join().unwrap();
    }

    #[test]
    fn server_errors_and_other_versions_are_reported() {
        let path = socket_path("errors");
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            let replies: [&[u8]; 3] = [
                b"{\"version\":1,\"response\":{\"error\":{\"kind\":\"notReady\",\"message\":\"syncing\"}}}\n",
                b"{\"version\":2,\"response\":\"pong\"}\n",
                b"garbage\n",
            ];
            for reply in replies {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                writer.write_all(reply).unwrap();
            }
        });
        let mut conn = Client::new(&path, Duration::from_secs(2))
            .connect()
            .unwrap();
        let err = conn.call(&Request::Ping).unwrap_err();
        assert!(
            matches!(err, ClientError::Server { ref reply, .. } if reply.message == "syncing"),
            "{err}"
        );
        let err = conn.call(&Request::Ping).unwrap_err();
        assert!(matches!(err, ClientError::VersionMismatch { .. }), "{err}");
        let err = conn.call(&Request::Ping).unwrap_err();
        assert!(matches!(err, ClientError::Invalid { .. }), "{err}");
        let err = conn.call(&Request::Ping).unwrap_err();
        assert!(
            matches!(err, ClientError::Closed { .. } | ClientError::Io { .. }),
            "{err}"
        );
        server.join().unwrap();
    }
}
