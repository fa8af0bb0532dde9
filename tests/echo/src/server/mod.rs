//! Server mode: open the declared ports, answer until SIGTERM, then let in-flight HTTP and gRPC
//! requests finish (up to `--grace`) before exiting.

mod describe;
mod directives;
mod grpc_service;
mod http_service;
mod listeners;
mod tcp;
mod tls;

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http_body_util::combinators::BoxBody;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::cli::ServerArgs;
use crate::identity::PodIdentity;
use listeners::{Listener, Protocol};

/// Bodies are read to their end but not echoed; this bounds the memory a request can take.
const MAX_REQUEST_BODY: usize = 1 << 20;

type ResponseBody = BoxBody<Bytes, Infallible>;

/// Who this server is, shared by every connection.
pub struct Pod {
    pub identity: PodIdentity,
    /// Reported as ServiceVersion (`--version`).
    pub version: String,
}

/// One accepted connection, as the handlers describe it.
pub struct Conn {
    pub pod: Arc<Pod>,
    /// The local port the connection came in on.
    pub port: u16,
    pub peer: IpAddr,
    /// ALPN protocol negotiated on TLS ports; empty otherwise.
    pub alpn: String,
}

pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let identity = PodIdentity::load(&args.service_account_dir);
    tracing::info!(
        hostname = %identity.hostname,
        namespace = %identity.namespace,
        service_account = %identity.service_account,
        "starting"
    );
    let pod = Arc::new(Pod {
        identity,
        version: args.version.clone(),
    });
    let planned = listeners::plan(&args.http, &args.grpc, &args.tcp, &args.tls)?;
    let acceptor = tls_acceptor_if_needed(&planned, &args);

    let (stop, stopped) = watch::channel(false);
    let mut loops = JoinSet::new();
    for listener in planned {
        let tls = match (listener.tls, &acceptor) {
            (false, _) => None,
            (true, Some(acceptor)) => Some(acceptor.clone()),
            // Never serve plain text on a port declared TLS; already warned about.
            (true, None) => continue,
        };
        let socket = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, listener.port)))
            .await
            .with_context(|| format!("binding {} port {}", listener.protocol, listener.port))?;
        tracing::info!(port = listener.port, protocol = %listener.protocol, tls = listener.tls, "listening");
        loops.spawn(accept_loop(
            socket,
            listener,
            tls,
            pod.clone(),
            stopped.clone(),
            args.grace,
        ));
    }

    wait_for_termination().await?;
    tracing::info!("terminating: no new connections, finishing in-flight requests");
    // Receivers only go away when the loops have already ended, so a failed send is fine.
    let _ = stop.send(true);
    while loops.join_next().await.is_some() {}
    tracing::info!("stopped");
    Ok(())
}

/// The acceptor for the TLS ports, or `None` (with a warning) when the certificate cannot be
/// loaded, in which case those ports stay closed.
fn tls_acceptor_if_needed(planned: &[Listener], args: &ServerArgs) -> Option<TlsAcceptor> {
    let tls_ports: Vec<u16> = planned.iter().filter(|l| l.tls).map(|l| l.port).collect();
    if tls_ports.is_empty() {
        return None;
    }
    match tls::acceptor(args.crt.as_deref(), args.key.as_deref()) {
        Ok(acceptor) => Some(acceptor),
        Err(error) => {
            tracing::warn!(ports = ?tls_ports, %error, "TLS ports not opened");
            None
        }
    }
}

async fn wait_for_termination() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        interrupted = tokio::signal::ctrl_c() => interrupted.context("waiting for Ctrl-C")?,
    }
    Ok(())
}

async fn accept_loop(
    socket: TcpListener,
    listener: Listener,
    tls: Option<TlsAcceptor>,
    pod: Arc<Pod>,
    mut stopped: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => break,
            accepted = socket.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let conn = ConnSetup {
                    listener,
                    tls: tls.clone(),
                    pod: pod.clone(),
                    watcher: graceful.watcher(),
                };
                tokio::spawn(conn.serve(stream, peer));
            }
            Err(error) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(port = listener.port, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    drop(socket);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(port = listener.port, "in-flight requests cut off after the grace period");
        }
    }
}

/// Everything needed to serve one accepted connection.
struct ConnSetup {
    listener: Listener,
    tls: Option<TlsAcceptor>,
    pod: Arc<Pod>,
    watcher: Watcher,
}

impl ConnSetup {
    async fn serve(self, stream: TcpStream, peer: SocketAddr) {
        let port = self.listener.port;
        // Answers go out in several small writes (HTTP/2 headers, data, trailers); Nagle would
        // hold the last one for the client's delayed ACK, ~40 ms per request.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(port, %error, "could not set TCP_NODELAY");
        }
        let peer_ip = peer.ip().to_canonical();
        let Some(tls) = self.tls.clone() else {
            self.serve_io(stream, peer_ip, String::new()).await;
            return;
        };
        match tls.accept(stream).await {
            Ok(stream) => {
                let alpn = stream
                    .get_ref()
                    .1
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .unwrap_or_default();
                self.serve_io(stream, peer_ip, alpn).await;
            }
            Err(error) => tracing::debug!(port, %peer, %error, "TLS handshake failed"),
        }
    }

    async fn serve_io<IO>(self, io: IO, peer: IpAddr, alpn: String)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let conn = Arc::new(Conn {
            pod: self.pod,
            port: self.listener.port,
            peer,
            alpn,
        });
        let result = match self.listener.protocol {
            Protocol::Tcp => tcp::serve(io, conn).await.map_err(anyhow::Error::from),
            Protocol::Http => {
                let service = service_fn(move |req| http_service::handle(req, conn.clone()));
                serve_hyper(io, service, self.watcher, false).await
            }
            Protocol::Grpc => {
                let service = service_fn(move |req| grpc_service::handle(req, conn.clone()));
                serve_hyper(io, service, self.watcher, true).await
            }
        };
        if let Err(error) = result {
            tracing::debug!(port = self.listener.port, %peer, error = %format!("{error:#}"), "connection ended with an error");
        }
    }
}

/// HTTP/1.1 and h2c (prior knowledge) on one port, told apart by the connection preface;
/// gRPC ports take HTTP/2 only.
async fn serve_hyper<IO, S>(
    io: IO,
    service: S,
    watcher: Watcher,
    http2_only: bool,
) -> anyhow::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<ResponseBody>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if http2_only {
        builder = builder.http2_only();
    }
    let connection = builder.serve_connection(TokioIo::new(io), service);
    watcher
        .watch(connection)
        .await
        .map_err(|error| anyhow::anyhow!(error))
}
