//! A fresh connection per request, so each request is routed and balanced on its own (the
//! weighted-route tests count where each one landed), over HTTP/1.1 or HTTP/2 prior knowledge.

use std::io;

use anyhow::Context;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// Resolves with the system resolver (getaddrinfo: /etc/hosts, resolv.conf search domains)
/// and tries each address in turn.
pub async fn connect(host: &str, port: u16) -> anyhow::Result<TcpStream> {
    let addresses: Vec<_> = tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("resolving {host}"))?
        .collect();
    let mut last_error = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{host} resolved to no address"),
    );
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(error) => {
                last_error =
                    io::Error::new(error.kind(), format!("connecting to {address}: {error}"))
            }
        }
    }
    Err(last_error.into())
}

/// HTTP/1.1, header names in Canonical-Case as Go's client (the Istio echo client) sends them.
pub async fn send_http1(
    stream: TcpStream,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<Response<Incoming>> {
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
        .context("HTTP/1.1 handshake")?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "HTTP/1.1 connection ended");
        }
    });
    sender
        .send_request(request)
        .await
        .context("sending the request")
}

/// HTTP/2 with prior knowledge (h2c), as gRPC uses it.
pub async fn send_http2(
    stream: TcpStream,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<Response<Incoming>> {
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .context("HTTP/2 handshake")?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "HTTP/2 connection ended");
        }
    });
    sender
        .send_request(request)
        .await
        .context("sending the request")
}
