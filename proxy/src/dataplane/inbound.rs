//! mTLS connections of other proxies to a local pod: the pod presents its ServiceAccount's
//! SVID, the caller must present one of the mesh; each request goes to the app on the pod's
//! loopback with the caller's verified identity in [`CLIENT_IDENTITY_HEADER`].

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::poll_fn;

use ::http::header::{self, HeaderValue};
use ::http::{Request, Response, StatusCode, Version};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use h2::RecvStream;
use h2::server::SendResponse;
use hyper::body::{Body as HttpBody, Bytes};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::clients::PodClients;
use super::http::{Body, FORWARD_HEADER, answer, authority, parse_forward, strip_hop_by_hop};
use super::mesh_h2::{self, RecvBody};
use super::{CLIENT_IDENTITY_HEADER, DataPlane};
use crate::identity::tls::peer_service_account;
use crate::listeners::PodInfo;
use crate::metrics::RequestLabels;

/// Bounds the TLS handshake of a connecting peer.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(plane: Arc<DataPlane>, stream: TcpStream, peer: SocketAddr, pod: Arc<PodInfo>) {
    let Some(mesh) = &plane.mesh else {
        return;
    };
    let Some(sa) = mesh.workloads.service_account(&pod.pod) else {
        warn!(pod = %pod.pod, %peer, "inbound connection refused: the pod's ServiceAccount is not known yet");
        return;
    };
    if !mesh.certs.has(&sa) {
        warn!(pod = %pod.pod, %peer, service_account = %sa, "inbound connection refused: no SVID yet");
        return;
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(mesh.certs.server_config(&sa));
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            mesh.metrics.handshake("server", false);
            warn!(pod = %pod.pod, %peer, error = %e, "inbound mTLS handshake failed");
            return;
        }
        Err(_) => {
            mesh.metrics.handshake("server", false);
            warn!(pod = %pod.pod, %peer, "inbound mTLS handshake timed out");
            return;
        }
    };
    mesh.metrics.handshake("server", true);
    let trust = mesh.certs.trust();
    let Some(client) = peer_service_account(trust, tls.get_ref().1.peer_certificates()) else {
        return;
    };
    let identity = match HeaderValue::from_str(&client.spiffe_id(trust.trust_domain())) {
        Ok(value) => value,
        Err(_) => return,
    };
    let app = App {
        clients: plane.clients(&pod.netns),
        backend: format!("{}/{}", pod.pod.namespace, pod.pod.name),
        plane: plane.clone(),
        pod,
        identity,
    };
    if let Err(e) = app.serve_streams(tls).await {
        debug!(%peer, error = %e, "inbound mesh connection ended with an error");
    }
}

struct App {
    plane: Arc<DataPlane>,
    pod: Arc<PodInfo>,
    /// The pod's connection pools (to its apps), looked up once for the connection.
    clients: Arc<PodClients>,
    /// The metrics' backend label, `namespace/pod`.
    backend: String,
    identity: HeaderValue,
}

impl App {
    /// Serves the connection's streams from its own task: each stream's future is polled
    /// when its I/O is ready, with no task spawned and no hand-off between tasks per request.
    async fn serve_streams<T>(&self, io: T) -> Result<(), h2::Error>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let mut connection = mesh_h2::server_builder().handshake(io).await?;
        let mut streams = FuturesUnordered::new();
        loop {
            tokio::select! {
                accepted = connection.accept() => match accepted {
                    Some(Ok((request, respond))) => streams.push(self.serve_stream(request, respond)),
                    Some(Err(e)) => return Err(e),
                    None => break,
                },
                Some(()) = streams.next(), if !streams.is_empty() => {}
            }
        }
        // The peer is done opening streams; the open ones still finish.
        let finish = async { while streams.next().await.is_some() {} };
        let (_, closed) = tokio::join!(finish, poll_fn(|cx| connection.poll_closed(cx)));
        closed
    }

    async fn serve_stream(&self, request: Request<RecvStream>, mut respond: SendResponse<Bytes>) {
        let started = Instant::now();
        let request = request.map(RecvBody::boxed);
        // A stream the caller resets (it gave up, or timed out) stops waiting for the app.
        let response = tokio::select! {
            response = self.forward(request) => response,
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
        };
        if let Some(mesh) = &self.plane.mesh {
            mesh.metrics.request(
                RequestLabels {
                    direction: "inbound",
                    target: String::new(),
                    route: String::new(),
                    backend: self.backend.clone(),
                    status: response.status().as_u16(),
                },
                started.elapsed(),
            );
        }
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let end = body.is_end_stream();
        match respond.send_response(Response::from_parts(parts, ()), end) {
            Ok(stream) if !end => {
                if let Err(e) = mesh_h2::pump(body, stream).await {
                    debug!(pod = %self.pod.pod, error = %e, "response body not sent whole");
                }
            }
            Ok(_) => {}
            Err(e) => debug!(pod = %self.pod.pod, error = %e, "response not sent"),
        }
    }

    async fn forward(&self, request: Request<Body>) -> Response<Body> {
        let (mut parts, body) = request.into_parts();
        let Some((port, http2)) = parts.headers.get(FORWARD_HEADER).and_then(parse_forward) else {
            return answer(
                StatusCode::BAD_REQUEST,
                format!("mesh request without a valid {FORWARD_HEADER} header"),
            );
        };
        parts.headers.remove(FORWARD_HEADER);
        // Whatever the caller claimed, the app sees only what mTLS proved.
        parts.headers.remove(CLIENT_IDENTITY_HEADER);
        parts
            .headers
            .insert(CLIENT_IDENTITY_HEADER, self.identity.clone());
        if let Some(host) = authority(&parts.uri, &parts.headers)
            && !parts.headers.contains_key(header::HOST)
            && let Ok(value) = HeaderValue::from_str(&host)
        {
            parts.headers.insert(header::HOST, value);
        }
        let app = if self.pod.families.ipv4 {
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        } else {
            SocketAddr::from((Ipv6Addr::LOCALHOST, port))
        };
        parts.version = if http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        match self.clients.plain(app, parts, body, http2).await {
            Ok(response) => response,
            Err(e) => {
                warn!(pod = %self.pod.pod, error = %e, "the app did not answer a mesh request");
                answer(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        }
    }
}
