//! The node's probes of a strict pod's ports that are probed with requests (`httpGet`, `grpc`):
//! the pod's table redirects the probe source's connections to them to the inbound listener.
//! Every host process gets the probe source (the node cannot tell the kubelet's sockets from
//! theirs), so the proxy passes on only what a probe of that port sends, to the pod's own
//! address, and never a caller identity: a forged [`CLIENT_IDENTITY_HEADER`] is removed, and
//! the app's other paths are answered 403. An HTTPS probe is the kubelet's TLS to the app,
//! which the proxy cannot read: it is carried as bytes.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ::http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::clients::{CONNECT_TIMEOUT, PodClients};
use super::http::{self as h, Body, answer};
use super::{CLIENT_IDENTITY_HEADER, DataPlane, Mesh};
use crate::inpod::listeners::PodInfo;
use crate::inpod::netns;
use crate::inpod::probes::Probe;
use crate::metrics::Metrics;
use aether_cni::nft::{PROBE_SOURCE_V4, PROBE_SOURCE_V6};

/// Whether `peer` is the probe source, which only the node's own connections to a strict pod
/// have (`aether_cni::nft::probes`).
pub fn from_probe_source(peer: IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer == PROBE_SOURCE_V4 || peer == PROBE_SOURCE_V6
}

/// Serves a connection of the probe source that the pod's table redirected to the inbound
/// listener.
pub async fn serve(plane: Arc<DataPlane>, mesh: &Mesh, stream: TcpStream, pod: Arc<PodInfo>) {
    // Where the node sent it: one of the pod's own addresses, and the probed port.
    let app = match netns::original_dst(&stream) {
        Ok(to) if pod.ips.contains(&to.ip().to_canonical()) => to,
        Ok(to) => {
            mesh.metrics.inbound_refused("probe_port");
            warn!(pod = %pod.pod, %to, "refused a probe connection to an address of another pod");
            return;
        }
        Err(e) => {
            mesh.metrics.inbound_refused("probe_port");
            warn!(pod = %pod.pod, error = %e, "refused a probe connection: no original destination");
            return;
        }
    };
    let port = app.port();
    let probes: Vec<Probe> = mesh.workloads.probes(&pod.pod).on(port).cloned().collect();
    if probes.iter().all(|probe| *probe == Probe::Connect) {
        // No probe of this port sends anything (or none names it: a connection made straight
        // to the inbound port from the node).
        mesh.metrics.inbound_refused("probe_port");
        warn!(pod = %pod.pod, port, "refused a connection of the node to a port no probe sends to");
        return;
    }
    if probes.contains(&Probe::Https) {
        return carry(stream, &pod, app).await;
    }
    let forward = Arc::new(Forward {
        clients: plane.clients(&pod.netns),
        metrics: mesh.metrics.clone(),
        pod,
        app,
        probes,
    });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let forward = forward.clone();
        async move { Ok::<_, std::convert::Infallible>(forward.handle(request).await) }
    });
    if let Err(e) = h::plaintext_server()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!(error = %e, "probe connection ended with an error");
    }
}

/// An HTTPS probe's bytes, both ways, to the app.
async fn carry(mut stream: TcpStream, pod: &PodInfo, app: SocketAddr) {
    let connected =
        tokio::time::timeout(CONNECT_TIMEOUT, netns::connect_from(&pod.netns, app)).await;
    let mut to_app = match connected {
        Ok(Ok(to_app)) => to_app,
        Ok(Err(e)) => return debug!(pod = %pod.pod, error = %e, "the app refused a probe"),
        Err(_) => return debug!(pod = %pod.pod, %app, "connecting a probe to the app timed out"),
    };
    if let Err(error) = super::copy::both_ways(&mut stream, &mut to_app).await {
        debug!(pod = %pod.pod, %app, %error, "probe connection ended with an error");
    }
}

struct Forward {
    clients: Arc<PodClients>,
    metrics: Arc<Metrics>,
    pod: Arc<PodInfo>,
    app: SocketAddr,
    /// The probes of the port.
    probes: Vec<Probe>,
}

impl Forward {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path();
        if !self.probes.iter().any(|p| p.sends(request.method(), path)) {
            self.metrics.inbound_refused("probe_request");
            warn!(pod = %self.pod.pod, method = %request.method(), path, port = self.app.port(),
                "refused a request of the node that no probe of the port sends");
            return answer(
                StatusCode::FORBIDDEN,
                format!(
                    "{} {path} is not a probe of port {} of pod {}",
                    request.method(),
                    self.app.port(),
                    self.pod.pod
                ),
            );
        }
        let (mut parts, body) = request.into_parts();
        // Nobody proved an identity here: the app must not believe one.
        parts.headers.remove(CLIENT_IDENTITY_HEADER);
        let http2 = parts.version == Version::HTTP_2;
        let request = Request::from_parts(parts, h::without_trailer(body, CLIENT_IDENTITY_HEADER));
        match self.clients.plain(self.app, request, http2).await {
            Ok(response) => response.map(h::incoming),
            Err(e) => {
                debug!(pod = %self.pod.pod, error = %e, "the app did not answer a probe");
                answer(e.status(), e.to_string())
            }
        }
    }
}
