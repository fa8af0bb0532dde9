//! The HTTPS listener: TLS with a serving certificate that follows root rotation, HTTP/1.1
//! and HTTP/2, and a graceful stop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::authority::Authority;
use super::handler::Handler;

/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle HTTP/1 clients must send their headers within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish their requests at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Hands each handshake the serving certificate of the current authority, so a reload
/// (root rotation, renewal) takes effect without restarting the listener.
struct CurrentServingCert(watch::Receiver<Arc<Authority>>);

impl std::fmt::Debug for CurrentServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CurrentServingCert")
    }
}

impl ResolvesServerCert for CurrentServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.borrow().serving_key())
    }
}

/// TLS settings of the endpoint: ring only (see STACK.md), ALPN h2 then http/1.1.
pub fn tls_acceptor(
    authority: watch::Receiver<Arc<Authority>>,
) -> Result<TlsAcceptor, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(CurrentServingCert(authority)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections until `shutdown` turns true, then lets open ones finish (bounded).
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    handler: Handler,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(serve_connection(
                        stream,
                        peer,
                        acceptor.clone(),
                        handler.clone(),
                        shutdown.clone(),
                    ));
                }
                Err(e) => {
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reap finished connection tasks so the set does not grow forever.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = super::until_stopped(&mut shutdown) => break,
        }
    }
    drop(listener);
    let open = connections.len();
    info!(open, "CA endpoint stopping");
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            left = connections.len(),
            "closing connections still open after the grace period"
        );
        connections.shutdown().await;
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    handler: Handler,
    mut shutdown: watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler.handle(request, peer).await) }
    });
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = super::until_stopped(&mut shutdown) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = %e, "connection ended with an error");
    }
}
