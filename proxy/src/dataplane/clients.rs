//! Connections made from inside a local pod's network namespace (with the proxy's socket
//! mark, so the pod's table lets them through), pooled per pod:
//! - plain HTTP/1.1 and HTTP/2 (h2c) to unmeshed endpoints, and to the pod's own apps on the
//!   inbound side;
//! - HTTP/2 over mTLS to other pods' inbound ports, one multiplexed connection per peer
//!   endpoint and local ServiceAccount.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tracing::debug;

use super::error::Error;
use super::http::{Body, absolute_uri};
use crate::identity::ServiceAccount;
use crate::identity::tls::{Certs, FIRST_SVID_WAIT, TrustStore, peer_service_account};
use crate::inpod::netns::{self, Netns, NetnsError};

/// Bounds connecting to a peer; past it the request fails with 503.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle pooled connections to apps and unmeshed endpoints close after this.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates TCP connections inside one network namespace, for hyper's pooled client.
#[derive(Clone)]
pub struct NetnsConnector {
    netns: Netns,
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
                path: netns.path().to_path_buf(),
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

/// The pauses before trying a refused connection to a peer's inbound port again: a pod that
/// has just joined the mesh opens its listener a moment after the news reaches this proxy, or
/// a few seconds after it when its node's proxy is itself starting (an install).
const REFUSED_PAUSES: [Duration; 6] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
];

async fn connect(netns: &Netns, to: SocketAddr) -> Result<TcpStream, NetnsError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, netns::connect_from(netns, to))
        .await
        .map_err(|_| NetnsError::Connect {
            path: netns.path().to_owned(),
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
    send: http2::SendRequest<Body>,
    /// The SPIFFE ID the peer proved, computed once for the connection's requests.
    pub peer_id: Arc<str>,
}

/// Why a request on a pooled mesh connection failed.
pub enum SendError {
    /// The connection was closing (its peer sent GOAWAY: a proxy handing over, a pod leaving)
    /// before the request went out: it may be sent again on a new connection.
    NotSent(Box<Request<Body>>, hyper::Error),
    Failed(hyper::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (SendError::NotSent(_, e) | SendError::Failed(e)) = self;
        f.write_str(&aether_cni::error_chain(e))
    }
}

impl MeshConn {
    pub async fn send(&mut self, request: Request<Body>) -> Result<Response<Incoming>, SendError> {
        if let Err(e) = self.send.ready().await {
            return Err(SendError::NotSent(Box::new(request), e));
        }
        self.send
            .try_send_request(request)
            .await
            .map_err(|mut e| match e.take_message() {
                Some(request) => SendError::NotSent(Box::new(request), e.into_error()),
                None => SendError::Failed(e.into_error()),
            })
    }
}

pub struct PodClients {
    netns: Netns,
    h1: Client<NetnsConnector, Body>,
    h2c: Client<NetnsConnector, Body>,
    /// By local ServiceAccount, then peer: looked up without building a key per request.
    mesh: Mutex<HashMap<ServiceAccount, HashMap<SocketAddr, MeshConn>>>,
}

impl PodClients {
    pub fn new(netns: Netns) -> Self {
        let connector = NetnsConnector {
            netns: netns.clone(),
        };
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new());
        let h1 = builder.build(connector.clone());
        let h2c = builder.http2_only(true).build(connector);
        PodClients {
            netns,
            h1,
            h2c,
            mesh: Mutex::default(),
        }
    }

    /// Sends a plain HTTP request to `to` (its URI's path and query are kept).
    pub async fn plain(
        &self,
        to: SocketAddr,
        mut request: Request<Body>,
        http2: bool,
    ) -> Result<Response<Incoming>, Error> {
        let uri = std::mem::take(request.uri_mut());
        *request.uri_mut() = absolute_uri(&to.to_string(), uri).map_err(|e| Error::Request {
            to,
            reason: e.to_string(),
        })?;
        let client = if http2 { &self.h2c } else { &self.h1 };
        client.request(request).await.map_err(|e| Error::Request {
            to,
            reason: aether_cni::error_chain(&e),
        })
    }

    /// The pooled connection for `source`'s pods to `to`, or a new one presenting `source`'s
    /// SVID; `Fresh` tells a new connection (a TLS handshake happened) from a reused one.
    /// With `reuse` false, a new connection replaces the pooled one (which is closing).
    pub async fn mesh(
        &self,
        source: &ServiceAccount,
        certs: &Certs,
        to: SocketAddr,
        reuse: bool,
    ) -> Result<(MeshConn, Fresh), Error> {
        if reuse && let Some(conn) = self.pooled(source, to) {
            return Ok((conn, Fresh(false)));
        }
        if !certs.wait_for(source, FIRST_SVID_WAIT).await {
            return Err(Error::NoSvid(source.clone()));
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
        (!conn.send.is_closed()).then(|| conn.clone())
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
    ) -> Result<MeshConn, Error> {
        let mut pauses = REFUSED_PAUSES.iter();
        let tcp = loop {
            match connect(&self.netns, to).await {
                Ok(tcp) => break tcp,
                Err(NetnsError::Connect { source, .. })
                    if source.kind() == std::io::ErrorKind::ConnectionRefused
                        && let Some(pause) = pauses.next() =>
                {
                    tokio::time::sleep(*pause).await;
                }
                Err(e) => {
                    return Err(Error::Connect {
                        to,
                        reason: e.to_string(),
                    });
                }
            }
        };
        let handshake = tokio_rustls::TlsConnector::from(config).connect(
            ServerName::IpAddress(to.ip().into()),
            super::http::mesh_socket(tcp),
        );
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| Error::Handshake {
                to,
                reason: format!("no answer within {CONNECT_TIMEOUT:?}"),
            })?
            .map_err(|e| Error::Handshake {
                to,
                reason: e.to_string(),
            })?;
        let peer_id = peer_service_account(trust, tls.get_ref().1.peer_certificates())
            .ok_or(Error::NoPeerIdentity { to })?
            .spiffe_id(trust.trust_domain())
            .into();
        let (send, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(30))
            .max_header_list_size(super::http::MESH_HEADER_LIST)
            .max_frame_size(super::http::MESH_FRAME)
            .handshake(TokioIo::new(tls))
            .await
            .map_err(|e| Error::Handshake {
                to,
                reason: e.to_string(),
            })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(%to, error = %e, "mesh connection ended");
            }
        });
        Ok(MeshConn { send, peer_id })
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
