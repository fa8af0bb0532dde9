//! Connections made from inside a local pod's network namespace (with the proxy's socket
//! mark, so the pod's table lets them through), pooled per pod:
//! - plain HTTP/1.1 and HTTP/2 (h2c) to unmeshed endpoints, and to the pod's own apps on the
//!   inbound side;
//! - HTTP/2 over mTLS to other pods' inbound ports, one multiplexed connection per peer
//!   endpoint and local ServiceAccount.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tracing::debug;

use super::http::{Body, BoxError, absolute_uri, incoming};
use super::mesh_h2::{self, RecvBody};
use crate::identity::ServiceAccount;
use crate::identity::tls::{Certs, TrustStore, peer_service_account};
use crate::netns::{self, NetnsError};

/// Bounds connecting to a peer; past it the request fails with 503.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle pooled connections to apps and unmeshed endpoints close after this.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle HTTP/1.1 connections kept per address; more are closed once their response is read.
const MAX_IDLE_PER_ADDR: usize = 64;
/// An idle mesh connection pings its peer this often, and is closed when no answer comes
/// within the same time (a peer node gone without closing its connections).
const MESH_KEEPALIVE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {to}: {reason}")]
    Connect { to: SocketAddr, reason: String },
    #[error("mTLS handshake with {to} failed: {reason}")]
    Handshake { to: SocketAddr, reason: String },
    #[error("{to} presented no identity of the mesh")]
    NoPeerIdentity { to: SocketAddr },
    #[error("no SVID for {0} yet")]
    NoSvid(ServiceAccount),
    #[error("request to {to} failed: {reason}")]
    Request { to: String, reason: String },
}

/// Creates TCP connections inside one network namespace, for hyper's pooled HTTP/2 client.
#[derive(Clone)]
pub struct NetnsConnector {
    netns: Arc<Path>,
}

impl tower_service::Service<Uri> for NetnsConnector {
    type Response = TokioIo<TcpStream>;
    type Error = NetnsError;
    type Future = BoxFuture<'static, Result<Self::Response, NetnsError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let netns = self.netns.clone();
        Box::pin(async move {
            let to = uri_addr(&uri).ok_or_else(|| NetnsError::Connect {
                path: netns.to_path_buf(),
                to: SocketAddr::from(([0, 0, 0, 0], 0)),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{uri} does not name an IP address and port"),
                ),
            })?;
            connect(&netns, to).await.map(TokioIo::new)
        })
    }
}

/// The socket address of an `http://<ip>:<port>` URI.
fn uri_addr(uri: &Uri) -> Option<SocketAddr> {
    let authority = uri.authority()?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    Some(SocketAddr::new(host.parse().ok()?, authority.port_u16()?))
}

async fn connect(netns: &Path, to: SocketAddr) -> Result<TcpStream, NetnsError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, netns::connect_from(netns, to))
        .await
        .map_err(|_| NetnsError::Connect {
            path: netns.to_owned(),
            to,
            source: std::io::ErrorKind::TimedOut.into(),
        })??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Whether a connection was made for this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fresh(pub bool);

/// A pooled HTTP/2 connection over mTLS to another proxy, and who it proved to be.
#[derive(Clone)]
pub struct MeshConn {
    send: h2::client::SendRequest<Bytes>,
    /// Cleared when the connection's task ends.
    open: Arc<AtomicBool>,
    /// The SPIFFE ID the peer proved, computed once for the connection's requests.
    pub peer_id: Arc<str>,
}

impl MeshConn {
    /// Sends `request` (HTTP/2, absolute URI, no connection-specific headers) and waits for
    /// the response head. A request body is sent by a task of its own, so that it keeps
    /// flowing while the response streams back (gRPC bidirectional streams).
    pub async fn send(&self, request: Request<Body>) -> Result<Response<Body>, h2::Error> {
        let (parts, body) = request.into_parts();
        let end = body.is_end_stream();
        let mut send = self.send.clone().ready().await?;
        let (response, stream) = send.send_request(Request::from_parts(parts, ()), end)?;
        if !end {
            tokio::spawn(async move {
                if let Err(e) = mesh_h2::pump(body, stream).await {
                    debug!(error = %e, "request body not sent whole");
                }
            });
        }
        Ok(response.await?.map(RecvBody::boxed))
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }
}

pub struct PodClients {
    netns: Arc<Path>,
    h1: Arc<H1Pool>,
    h2c: Client<NetnsConnector, Body>,
    /// By local ServiceAccount, then peer: looked up without building a key per request.
    mesh: Mutex<HashMap<ServiceAccount, HashMap<SocketAddr, MeshConn>>>,
}

impl PodClients {
    pub fn new(netns: Arc<Path>) -> Self {
        let connector = NetnsConnector {
            netns: netns.clone(),
        };
        let h2c = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .http2_only(true)
            .build(connector);
        PodClients {
            h1: Arc::new(H1Pool {
                netns: netns.clone(),
                idle: Mutex::default(),
            }),
            netns,
            h2c,
            mesh: Mutex::default(),
        }
    }

    /// Sends a plain HTTP request to `to`, HTTP/1.1 or HTTP/2 (h2c) as `http2` says.
    pub async fn plain(
        &self,
        to: SocketAddr,
        mut parts: ::http::request::Parts,
        body: Body,
        http2: bool,
    ) -> Result<Response<Body>, ClientError> {
        let path_and_query = parts.uri.path_and_query().map(|p| p.as_str());
        let failed = |reason: String| ClientError::Request {
            to: to.to_string(),
            reason,
        };
        if http2 {
            parts.uri =
                absolute_uri(&to.to_string(), path_and_query).map_err(|e| failed(e.to_string()))?;
            let response = self
                .h2c
                .request(Request::from_parts(parts, body))
                .await
                .map_err(|e| failed(aether_cni::error_chain(&e)))?;
            return Ok(response.map(incoming));
        }
        // HTTP/1.1 goes in origin form; the Host header names the authority.
        parts.uri =
            Uri::try_from(path_and_query.unwrap_or("/")).map_err(|e| failed(e.to_string()))?;
        self.h1
            .send(to, Request::from_parts(parts, body))
            .await
            .map_err(|e| failed(aether_cni::error_chain(&*e)))
    }

    /// The pooled connection for `source`'s pods to `to`, or a new one presenting `source`'s
    /// SVID; `Fresh` tells a new connection (a TLS handshake happened) from a reused one.
    pub async fn mesh(
        &self,
        source: &ServiceAccount,
        certs: &Certs,
        to: SocketAddr,
    ) -> Result<(MeshConn, Fresh), ClientError> {
        if let Some(conn) = self.pooled(source, to) {
            return Ok((conn, Fresh(false)));
        }
        if !certs.has(source) {
            return Err(ClientError::NoSvid(source.clone()));
        }
        // Boxed: the handshake's large state would otherwise be part of every request's future.
        let conn =
            Box::pin(self.connect_mesh(certs.client_config(source), certs.trust(), to)).await?;
        self.lock_mesh()
            .entry(source.clone())
            .or_default()
            .insert(to, conn.clone());
        Ok((conn, Fresh(true)))
    }

    fn pooled(&self, source: &ServiceAccount, to: SocketAddr) -> Option<MeshConn> {
        let pool = self.lock_mesh();
        let conn = pool.get(source)?.get(&to)?;
        conn.is_open().then(|| conn.clone())
    }

    fn lock_mesh(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ServiceAccount, HashMap<SocketAddr, MeshConn>>> {
        self.mesh.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn connect_mesh(
        &self,
        config: Arc<ClientConfig>,
        trust: &TrustStore,
        to: SocketAddr,
    ) -> Result<MeshConn, ClientError> {
        let tcp = connect(&self.netns, to)
            .await
            .map_err(|e| ClientError::Connect {
                to,
                reason: e.to_string(),
            })?;
        let handshake = tokio_rustls::TlsConnector::from(config)
            .connect(ServerName::IpAddress(to.ip().into()), tcp);
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| ClientError::Handshake {
                to,
                reason: format!("no answer within {CONNECT_TIMEOUT:?}"),
            })?
            .map_err(|e| ClientError::Handshake {
                to,
                reason: e.to_string(),
            })?;
        let peer_id = peer_service_account(trust, tls.get_ref().1.peer_certificates())
            .ok_or(ClientError::NoPeerIdentity { to })?
            .spiffe_id(trust.trust_domain())
            .into();
        let (send, connection) = mesh_h2::client_builder()
            .handshake::<_, Bytes>(tls)
            .await
            .map_err(|e| ClientError::Handshake {
                to,
                reason: e.to_string(),
            })?;
        let open = Arc::new(AtomicBool::new(true));
        tokio::spawn(drive_mesh(connection, to, open.clone()));
        Ok(MeshConn {
            send,
            open,
            peer_id,
        })
    }
}

/// Runs a mesh connection until it ends, pinging the peer when it has been quiet.
async fn drive_mesh<T>(
    mut connection: h2::client::Connection<T, Bytes>,
    to: SocketAddr,
    open: Arc<AtomicBool>,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let ping = connection.ping_pong();
    let keepalive = async move {
        let Some(mut ping) = ping else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(MESH_KEEPALIVE).await;
            match tokio::time::timeout(MESH_KEEPALIVE, ping.ping(h2::Ping::opaque())).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return e.to_string(),
                Err(_) => return format!("no answer to a ping within {MESH_KEEPALIVE:?}"),
            }
        }
    };
    tokio::select! {
        ended = &mut connection => if let Err(e) = ended {
            debug!(%to, error = %e, "mesh connection ended");
        },
        why = keepalive => debug!(%to, reason = %why, "mesh connection closed"),
    }
    open.store(false, Ordering::Relaxed);
}

/// Idle HTTP/1.1 connections from one pod, by address, newest last. A connection goes back
/// once its response has been read to the end; one whose response was dropped half-read is
/// closed instead.
struct H1Pool {
    netns: Arc<Path>,
    idle: Mutex<HashMap<SocketAddr, Vec<IdleConn>>>,
}

struct IdleConn {
    send: http1::SendRequest<Body>,
    since: Instant,
}

impl H1Pool {
    async fn send(
        self: &Arc<Self>,
        to: SocketAddr,
        mut request: Request<Body>,
    ) -> Result<Response<Body>, BoxError> {
        while let Some(mut send) = self.checkout(to) {
            if send.ready().await.is_err() {
                continue;
            }
            match send.try_send_request(request).await {
                Ok(response) => return Ok(self.returning(to, send, response)),
                // The connection closed before the request went out: another one takes it.
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(e.into_error().into()),
                },
            }
        }
        let tcp = connect(&self.netns, to).await?;
        let (mut send, connection) = http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(%to, error = %e, "HTTP/1.1 connection ended");
            }
        });
        let response = send.send_request(request).await?;
        Ok(self.returning(to, send, response))
    }

    /// The newest idle connection to `to` that is still open; expired ones are closed.
    fn checkout(&self, to: SocketAddr) -> Option<http1::SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.get_mut(&to)?;
        conns.retain(|c| c.since.elapsed() < IDLE_TIMEOUT && !c.send.is_closed());
        conns.pop().map(|c| c.send)
    }

    fn give_back(&self, to: SocketAddr, send: http1::SendRequest<Body>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.entry(to).or_default();
        if conns.len() < MAX_IDLE_PER_ADDR && !send.is_closed() {
            conns.push(IdleConn {
                send,
                since: Instant::now(),
            });
        }
    }

    fn returning(
        self: &Arc<Self>,
        to: SocketAddr,
        send: http1::SendRequest<Body>,
        response: Response<Incoming>,
    ) -> Response<Body> {
        let (parts, body) = response.into_parts();
        let mut body = Returning {
            body,
            home: Some((self.clone(), to, send)),
        };
        // A body with nothing to read (a 204, a HEAD) may never be polled.
        if body.body.is_end_stream() {
            body.give_back();
        }
        Response::from_parts(parts, body.map_err(BoxError::from).boxed())
    }
}

/// A response body that puts its connection back in the pool once read to the end.
struct Returning {
    body: Incoming,
    home: Option<(Arc<H1Pool>, SocketAddr, http1::SendRequest<Body>)>,
}

impl Returning {
    fn give_back(&mut self) {
        if let Some((pool, to, send)) = self.home.take() {
            pool.give_back(to, send);
        }
    }
}

impl HttpBody for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        let ended = self.body.is_end_stream();
        match &frame {
            None => self.give_back(),
            Some(Ok(_)) if ended => self.give_back(),
            Some(Err(_)) => self.home = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_socket_addresses() {
        assert_eq!(
            uri_addr(&Uri::from_static("http://10.0.0.1:8080/x")),
            Some("10.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            uri_addr(&Uri::from_static("http://[fd00::1]:80/")),
            Some("[fd00::1]:80".parse().unwrap())
        );
        assert_eq!(uri_addr(&Uri::from_static("http://echo:80/")), None);
        assert_eq!(uri_addr(&Uri::from_static("/x")), None);
    }
}
