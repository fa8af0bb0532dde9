//! mTLS connections of other proxies to a local pod: the pod presents its ServiceAccount's
//! SVID, the caller must present one of the mesh; each request goes to the pod's own address,
//! on a port the pod serves, with the caller's verified identity in [`CLIENT_IDENTITY_HEADER`].
//! Never to its loopback: what a pod keeps to itself stays out of the mesh's reach. An opaque
//! connection arrives as an HTTP/2 CONNECT tunnel and goes to the app's port as TCP. The pod's
//! AuthorizationPolicies decide each request, and each tunnel at its setup and at every change.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::http::header::{self, HeaderValue};
use ::http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use super::authz::{self, Callee, Caller};
use super::clients::{CONNECT_TIMEOUT, PodClients};
use super::error::Error;
use super::http::{self as h, Body, Carried, FORWARD_HEADER, answer, authority, parse_forward};
use super::{CLIENT_IDENTITY_HEADER, DataPlane, Mesh, probe};
use crate::dataplane::snapshot::Snapshot;
use crate::identity::tls::{FIRST_SVID_WAIT, peer_service_account};
use crate::inpod::listeners::{Drain, Opening, PodInfo};
use crate::inpod::netns;
use crate::metrics::{Direction, RequestLabels};
use aether_cni::protocol::PodRef;

/// Bounds the TLS handshake of a connecting peer.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(
    plane: Arc<DataPlane>,
    stream: TcpStream,
    peer: SocketAddr,
    pod: Arc<PodInfo>,
    mut drain: Drain,
    opening: Opening,
) {
    let Some(mesh) = plane.mesh.clone() else {
        return;
    };
    if probe::from_probe_source(peer.ip()) {
        opening.opened();
        return probe::serve(plane, &mesh, stream, pod).await;
    }
    let Some(sa) = mesh.workloads.service_account(&pod.pod) else {
        mesh.metrics.inbound_refused("unknown_pod");
        warn!(pod = %pod.pod, %peer, "inbound connection refused: the pod's ServiceAccount is not known yet");
        return;
    };
    if !mesh.certs.wait_for(&sa, FIRST_SVID_WAIT).await {
        mesh.metrics.inbound_refused("no_svid");
        warn!(pod = %pod.pod, %peer, service_account = %sa, "inbound connection refused: no SVID yet");
        return;
    }
    let Some(&address) = pod
        .ips
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| pod.ips.first())
    else {
        mesh.metrics.inbound_refused("no_address");
        warn!(pod = %pod.pod, %peer, "inbound connection refused: the pod has no address");
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(mesh.certs.server_config(&sa));
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(h::mesh_socket(stream)))
        .await
    {
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
    opening.opened();
    let trust = mesh.certs.trust();
    let Some(client) = peer_service_account(trust, tls.get_ref().1.peer_certificates()) else {
        return;
    };
    let spiffe_id = client.spiffe_id(trust.trust_domain());
    let identity = match HeaderValue::from_str(&spiffe_id) {
        Ok(value) => value,
        Err(_) => return,
    };
    let app = Arc::new(App {
        callee: Arc::new(Callee::new(
            pod.pod.clone(),
            sa.spiffe_id(trust.trust_domain()),
            mesh.workloads.labels(&pod.pod),
        )),
        caller: Arc::new(Caller {
            service_account: client,
            spiffe_id,
        }),
        clients: plane.clients(&pod.netns),
        mesh: mesh.clone(),
        label: format!("{}/{}", pod.pod.namespace, pod.pod.name).into(),
        no_target: "".into(),
        declared: mesh.workloads.declared_ports(&pod.pod),
        address,
        pod,
        identity,
    });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let app = app.clone();
        async move { Ok::<_, std::convert::Infallible>(app.handle(request).await) }
    });
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .max_header_list_size(h::MESH_HEADER_LIST)
        .max_frame_size(h::MESH_FRAME)
        .serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    // A stopped listener (the proxy hands over, the pod leaves) sends GOAWAY: the peer's
    // streams finish here and its next requests open a connection to whoever listens now.
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = drain.started() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        debug!(%peer, error = %e, "inbound mesh connection ended with an error");
    }
}

struct App {
    mesh: Arc<Mesh>,
    pod: Arc<PodInfo>,
    /// The pod's address requests are delivered to.
    address: IpAddr,
    /// The ports the pod's containers declare, looked up once for the connection.
    declared: Vec<u16>,
    /// The pod's connection pools (to its apps), looked up once for the connection.
    clients: Arc<PodClients>,
    identity: HeaderValue,
    /// The pod called and who calls, for its AuthorizationPolicies.
    callee: Arc<Callee>,
    caller: Arc<Caller>,
    /// The pod as the metrics label, formatted once for the connection's requests.
    label: Arc<str>,
    /// The empty route target label of inbound requests, allocated once.
    no_target: Arc<str>,
}

impl App {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        let response = if request.method() == Method::CONNECT {
            self.tunnel(request).await
        } else {
            self.forward(request).await
        };
        self.mesh.metrics.request(
            RequestLabels {
                direction: Direction::Inbound,
                target: self.no_target.clone(),
                route: String::new(),
                backend: self.label.clone(),
                status: response.status().as_u16(),
            },
            started.elapsed(),
        );
        response
    }

    async fn forward(&self, request: Request<Incoming>) -> Response<Body> {
        let (mut parts, body) = request.into_parts();
        let (port, http2) = match parts.headers.get(FORWARD_HEADER).and_then(parse_forward) {
            Some((port, Carried::Http1)) => (port, false),
            Some((port, Carried::Http2)) => (port, true),
            _ => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    format!("mesh request without a valid {FORWARD_HEADER} header"),
                );
            }
        };
        parts.headers.remove(FORWARD_HEADER);
        if let Some(refused) = self.refusal(port) {
            return refused;
        }
        if let Some(refused) = self.authorize(port, Some(&authz::Head(&parts))) {
            return refused;
        }
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
        let app = SocketAddr::new(self.address, port);
        parts.version = if http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        match self
            .clients
            .plain(
                app,
                Request::from_parts(parts, h::without_trailer(body, CLIENT_IDENTITY_HEADER)),
                http2,
            )
            .await
        {
            Ok(response) => response.map(h::incoming),
            Err(error) => self.failed(error, "the app did not answer a mesh request"),
        }
    }

    /// The answer the peer gets in place of the app's, counted and logged.
    fn failed(&self, error: Error, what: &str) -> Response<Body> {
        self.mesh
            .metrics
            .failure(Direction::Inbound, error.reason());
        warn!(pod = %self.pod.pod, reason = error.reason(), %error, "{what}");
        answer(error.status(), error.to_string())
    }
}

impl App {
    /// The 403 naming the policy for a caller the pod's AuthorizationPolicies refuse; `None`
    /// when they admit it (or none selects the pod).
    fn authorize(&self, port: u16, head: Option<&authz::Head<'_>>) -> Option<Response<Body>> {
        let snapshot = self.mesh.snapshot.load();
        let verdict = authz::decide(
            &self.mesh,
            &snapshot,
            &self.callee,
            &self.caller,
            port,
            head,
        )?;
        verdict.refused.as_ref().map(authz::forbidden)
    }

    /// The 403 (counted) for a port the pod does not serve; `None` for one it serves.
    fn refusal(&self, port: u16) -> Option<Response<Body>> {
        let snapshot = self.mesh.snapshot.load();
        if serves(&self.declared, &snapshot, &self.pod.pod, self.address, port) {
            return None;
        }
        self.mesh.metrics.inbound_refused("port");
        warn!(pod = %self.pod.pod, port, "refused a mesh request for a port the pod does not serve");
        Some(answer(
            StatusCode::FORBIDDEN,
            format!("pod {} serves no port {port}", self.pod.pod),
        ))
    }

    /// A CONNECT tunnel to one of the pod's ports: of an opaque connection, or of a protocol
    /// switch ([`App::switch`]).
    async fn tunnel(&self, request: Request<Incoming>) -> Response<Body> {
        let forward = request
            .headers()
            .get(FORWARD_HEADER)
            .and_then(parse_forward);
        let (port, carried) = match forward {
            Some((port, carried @ (Carried::Tcp | Carried::Upgrade | Carried::Connect))) => {
                (port, carried)
            }
            _ => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    format!("mesh CONNECT without a valid {FORWARD_HEADER} header"),
                );
            }
        };
        if let Some(refused) = self.refusal(port) {
            return refused;
        }
        // A tunnel's bytes are not HTTP the policies can read: it is decided at setup, on its port.
        if let Some(refused) = self.authorize(port, None) {
            return refused;
        }
        if carried == Carried::Tcp {
            return self.opaque(request, port).await;
        }
        self.switch(request, port, carried).await
    }

    /// An opaque connection: answered 200 once the app accepted, then bytes both ways until
    /// each side has closed its half.
    async fn opaque(&self, mut request: Request<Incoming>, port: u16) -> Response<Body> {
        let to = SocketAddr::new(self.address, port);
        let connected =
            tokio::time::timeout(CONNECT_TIMEOUT, netns::connect_from(&self.pod.netns, to))
                .await
                .map_err(|_| Error::ConnectTimeout(to))
                .and_then(|app| app.map_err(Error::from));
        let app = match connected {
            Ok(app) => app,
            Err(error) => return self.failed(error, "the app refused a mesh tunnel"),
        };
        let upgrade = hyper::upgrade::on(&mut request);
        let pod = self.pod.pod.clone();
        let (mesh, callee, caller) = (self.mesh.clone(), self.callee.clone(), self.caller.clone());
        let snapshots = mesh.snapshot.watch();
        tokio::spawn(async move {
            match upgrade.await {
                Ok(upgraded) => {
                    let mut app = app;
                    let mut upgraded = TokioIo::new(upgraded);
                    tokio::select! {
                        copied = super::copy::both_ways(&mut upgraded, &mut app) => {
                            if let Err(error) = copied {
                                debug!(%pod, %to, %error, "mesh tunnel ended with an error");
                            }
                        }
                        refusal = authz::revoked(&mesh, snapshots, &callee, &caller, port) => {
                            info!(%pod, %to, caller = %caller.spiffe_id, %refusal, "closed a mesh tunnel its authorization no longer admits");
                        }
                    }
                }
                Err(error) => debug!(%pod, %to, %error, "mesh tunnel was never opened"),
            }
        });
        Response::new(h::full(hyper::body::Bytes::new()))
    }
}

impl App {
    /// A switch the client asked for ([`Carried::Upgrade`]: a WebSocket's `GET`;
    /// [`Carried::Connect`]: a CONNECT): the app gets the request as the client sent it, with
    /// the caller's verified identity; once it agreed (`101 Switching Protocols`, or a 2xx to
    /// the CONNECT), the tunnel is answered 200 with the app's headers and joined to the app's
    /// connection. Any other answer goes back as it is, but a success without a switch, which
    /// would read as an open tunnel.
    async fn switch(
        &self,
        mut request: Request<Incoming>,
        port: u16,
        carried: Carried,
    ) -> Response<Body> {
        let headers = request.headers();
        let target = headers
            .get(h::PATH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.parse::<::http::Uri>().ok());
        let asked = match (carried, headers.get(h::UPGRADE_HEADER), &target) {
            (Carried::Upgrade, Some(protocol), Some(_)) => {
                Some(h::Asked::Upgrade(protocol.clone()))
            }
            (Carried::Connect, _, Some(uri)) => uri.authority().cloned().map(h::Asked::Connect),
            _ => None,
        };
        let (Some(asked), Some(target)) = (asked, target) else {
            return answer(
                StatusCode::BAD_REQUEST,
                format!(
                    "mesh switch without valid {} and {} headers",
                    h::UPGRADE_HEADER,
                    h::PATH_HEADER
                ),
            );
        };
        let tunnel = hyper::upgrade::on(&mut request);
        let mut headers = std::mem::take(request.headers_mut());
        for internal in [FORWARD_HEADER, h::UPGRADE_HEADER, h::PATH_HEADER] {
            headers.remove(internal);
        }
        headers.insert(CLIENT_IDENTITY_HEADER, self.identity.clone());
        let mut to_app = Request::new(h::full(hyper::body::Bytes::new()));
        *to_app.uri_mut() = target;
        let app = SocketAddr::new(self.address, port);
        let answered = match &asked {
            h::Asked::Upgrade(protocol) => {
                h::set_upgrade(&mut headers, protocol.clone());
                *to_app.headers_mut() = headers;
                self.clients.plain(app, to_app, false).await
            }
            h::Asked::Connect(_) => {
                *to_app.method_mut() = Method::CONNECT;
                *to_app.headers_mut() = headers;
                h::send_connect(&self.pod.netns, app, to_app).await
            }
        };
        let mut response = match answered {
            Ok(response) => response,
            Err(error) => return self.failed(error, "the app did not answer a switch"),
        };
        let status = response.status();
        if !asked.agreed(status) {
            if status.is_success() {
                return answer(
                    StatusCode::BAD_GATEWAY,
                    format!("the app answered {status} to a protocol switch without switching"),
                );
            }
            h::strip_hop_by_hop(response.headers_mut());
            return response.map(h::incoming);
        }
        let (mesh, callee, caller) = (self.mesh.clone(), self.callee.clone(), self.caller.clone());
        let snapshots = mesh.snapshot.watch();
        let pod = self.pod.pod.clone();
        h::join(
            self.pod.pod.clone(),
            tunnel,
            hyper::upgrade::on(&mut response),
            async move {
                let refusal = authz::revoked(&mesh, snapshots, &callee, &caller, port).await;
                info!(%pod, caller = %caller.spiffe_id, %refusal, "closed a switched connection its authorization no longer admits");
            },
        );
        let (mut head, _) = response.into_parts();
        let switched = match &asked {
            h::Asked::Upgrade(protocol) => Some(
                head.headers
                    .get(header::UPGRADE)
                    .cloned()
                    .unwrap_or_else(|| protocol.clone()),
            ),
            h::Asked::Connect(_) => None,
        };
        h::strip_hop_by_hop(&mut head.headers);
        if let Some(switched) = switched {
            head.headers.insert(h::UPGRADE_HEADER, switched);
        }
        head.status = StatusCode::OK;
        head.version = Version::HTTP_2;
        Response::from_parts(head, h::full(hyper::body::Bytes::new()))
    }
}

/// Whether the pod serves `port` to the mesh: one of its containers declares it, or a Service of
/// its own namespace sends to it.
fn serves(declared: &[u16], snapshot: &Snapshot, pod: &PodRef, address: IpAddr, port: u16) -> bool {
    declared.contains(&port) || snapshot.serves(&pod.namespace, address, port)
}
