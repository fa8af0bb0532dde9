//! Captured connections of local pods. A connection to a route target whose table this node
//! holds is served by what its Service port carries ([`PortProtocol`]): HTTP (1.1 or 2,
//! detected per connection) routed per request, or opaque bytes to the target's own endpoints
//! through a mesh tunnel; an undeclared port is sniffed. One to a
//! route target the proxy cannot route yet (no table, Service not watched yet) waits briefly,
//! then fails closed: its requests get 503, never a plaintext connection. Any other captured
//! connection (an address no longer in the capture set) passes through to its destination.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ::http::header::{self, HeaderValue};
use ::http::{Method, Request, Response, StatusCode, Version};
use aether_routing::retry::{backoff as retry_backoff, retries_status};
use aether_routing::table::ServiceRef;
use aether_routing::{Outcome, PortProtocol, RequestView, Sniffed, sniff};
use hyper::body::{Bytes, Incoming};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::balancer::EJECT_AFTER;
use super::clients::{CONNECT_TIMEOUT, MeshConn, PodClients, SendError};
use super::error::{Error, WrongPeer};
use super::http::{
    self as h, Body, Carried, FORWARD_HEADER, absolute_uri, answer, authority, forward_value,
    strip_hop_by_hop,
};
use super::{CLIENT_IDENTITY_HEADER, DataPlane, Mesh};
use crate::dataplane::snapshot::{Endpoint, ServiceKey, Snapshot};
use crate::identity::ServiceAccount;
use crate::inpod::listeners::{Drain, Opening, PodInfo};
use crate::inpod::netns;
use crate::metrics::{Direction, RequestLabels};

/// How long a connection to a target whose table or Service is not on the node waits for it.
const COLD_PATH_WAIT: Duration = Duration::from_secs(5);
/// Largest request body copied for mirrors; a larger one is sent on without its mirrors.
const MIRROR_BODY_LIMIT: usize = 1 << 20;
/// Largest request body held to send again on a retry; a larger one is sent once.
const RETRY_BODY_LIMIT: usize = 64 << 10;
/// How long a connection to an undeclared port may stay silent before it is taken for a
/// protocol whose server speaks first.
const SNIFF_WAIT: Duration = Duration::from_millis(300);

pub async fn serve(
    plane: Arc<DataPlane>,
    stream: TcpStream,
    peer: SocketAddr,
    pod: Arc<PodInfo>,
    drain: Drain,
    opening: Opening,
) {
    let listener = match stream.local_addr() {
        Ok(addr) => addr,
        Err(e) => return plane.refuse(&pod, peer, format!("no local address: {e}")),
    };
    let original = match netns::original_dst(&stream) {
        Ok(addr) => addr,
        Err(e) => {
            return plane.refuse(
                &pod,
                peer,
                format!("no original destination (SO_ORIGINAL_DST): {e}"),
            );
        }
    };
    if original == listener {
        // The app dialled the capture port itself; forwarding would loop into the listener.
        return plane.refuse(
            &pod,
            peer,
            format!("connection to the capture listener {listener} itself"),
        );
    }
    let Some(mesh) = plane.mesh.clone() else {
        opening.opened();
        return pass_through(&plane, stream, peer, &pod, original).await;
    };
    let (target, routed) = match routed_target(&mesh, &pod.pod.namespace, original).await {
        Captured::Routed(target) => (target, true),
        Captured::Released(target) => (target, false),
        Captured::Refused { reason, message } => {
            plane.stats.failed.fetch_add(1, Ordering::Relaxed);
            mesh.metrics.outbound_refused(reason);
            warn!(pod = %pod.pod, %peer, %original, reason, "{message}; refusing the connection rather than sending it in plaintext");
            opening.opened();
            return serve_refusal(stream, message).await;
        }
    };
    plane.stats.forwarded.fetch_add(1, Ordering::Relaxed);
    let snapshot = mesh.snapshot.load();
    // A headless Service's pod: the connection goes to it, on its Service port's terms.
    let (port, pinned) = match snapshot.pinned_endpoint(original) {
        Some((_, port, endpoint)) => (port, Some(endpoint)),
        None => (original.port(), None),
    };
    // Routes are HTTP, and a released Service has none: its bytes are not parsed.
    let protocol = match snapshot.protocol(&target, port) {
        _ if !routed => PortProtocol::Opaque,
        PortProtocol::Detect => detect(&stream).await,
        declared => declared,
    };
    let conn = Connection {
        clients: plane.clients(&pod.netns),
        plane: plane.clone(),
        mesh,
        pod,
        source: OnceLock::new(),
        target_label: target.to_string().into(),
        target,
        port,
        pinned,
    };
    if protocol == PortProtocol::Http {
        serve_http(conn, stream, drain, opening).await;
    } else {
        opening.opened();
        conn.serve_opaque(stream).await;
    }
}

/// What becomes of a captured connection.
enum Captured {
    Routed(ServiceKey),
    /// A Service no longer in the capture set, which the pod's table still held: carried as
    /// bytes to the Service's own endpoints, as kube-proxy would have (the proxy cannot
    /// connect to the ClusterIP itself: the table would capture it again).
    Released(ServiceKey),
    /// A route target the proxy cannot route: fails closed.
    Refused {
        reason: &'static str,
        message: String,
    },
}

/// The route target a captured connection is for, once its Service and table are here. A
/// captured target without its table takes the cold path: the demand is reported, and the
/// connection waits a little for the operator to add the table to this node's config.
async fn routed_target(mesh: &Mesh, namespace: &str, original: SocketAddr) -> Captured {
    let deadline = tokio::time::Instant::now() + COLD_PATH_WAIT;
    let mut wanted = false;
    loop {
        let snapshot = mesh.snapshot.load();
        match snapshot.captured.get(&original) {
            Some(key) if snapshot.targets.contains_key(key) => {
                return Captured::Routed(key.clone());
            }
            Some(key) if !wanted => {
                mesh.demand.want(key);
                wanted = true;
            }
            None if !snapshot.capture.captures(namespace, &original) => {
                let released = (snapshot.addresses.get(&original))
                    .or_else(|| snapshot.pinned_endpoint(original).map(|(key, ..)| key));
                return match released {
                    Some(key) => Captured::Released(key.clone()),
                    None => Captured::Refused {
                        reason: "not_captured",
                        message: format!("{original} is no longer captured, nor a known Service"),
                    },
                };
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return match snapshot.captured.get(&original) {
                Some(key) => Captured::Refused {
                    reason: "no_table",
                    message: format!("no route table for {key} on this node"),
                },
                None => Captured::Refused {
                    reason: "unknown_service",
                    message: format!("no Service for the route target address {original} yet"),
                },
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The protocol of a connection to an undeclared port, from its first bytes: HTTP, or opaque
/// when they are anything else or the client stays silent for [`SNIFF_WAIT`] (a protocol
/// whose server speaks first).
async fn detect(stream: &TcpStream) -> PortProtocol {
    let deadline = tokio::time::Instant::now() + SNIFF_WAIT;
    let mut first = [0u8; 16];
    loop {
        match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return PortProtocol::Opaque,
            Ok(Ok(n)) => match sniff(&first[..n]) {
                Sniffed::Http => return PortProtocol::Http,
                Sniffed::Opaque => return PortProtocol::Opaque,
                // A peek returns what is there at once: wait for the rest of the word.
                Sniffed::NeedMore => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
    }
}

/// Answers every request of a refused connection with 503 and why.
async fn serve_refusal(stream: TcpStream, message: String) {
    let message: Arc<str> = message.into();
    let service = hyper::service::service_fn(move |_: Request<Incoming>| {
        let message = message.clone();
        async move {
            Ok::<_, std::convert::Infallible>(answer(
                StatusCode::SERVICE_UNAVAILABLE,
                message.to_string(),
            ))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(h::HEADER_READ_TIMEOUT)
        .keep_alive(false);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!(error = %e, "refused captured connection ended with an error");
    }
}

impl DataPlane {
    fn refuse(&self, pod: &PodInfo, peer: SocketAddr, why: String) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        warn!(pod = %pod.pod, %peer, reason = %why, "refused a captured connection");
    }
}

/// Without a cluster (`--capture-set`): TCP to the original destination from the node, the
/// proxy's own network namespace. From the pod's, the table would capture it again.
async fn pass_through(
    plane: &DataPlane,
    mut inbound: TcpStream,
    peer: SocketAddr,
    pod: &PodInfo,
    to: SocketAddr,
) {
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(to)).await;
    let mut outbound = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return plane.refuse(pod, peer, e.to_string()),
        Err(_) => return plane.refuse(pod, peer, format!("connecting to {to} timed out")),
    };
    plane.stats.forwarded.fetch_add(1, Ordering::Relaxed);
    debug!(pod = %pod.pod, %peer, %to, "passing a captured connection through");
    if let Err(error) = super::copy::both_ways(&mut inbound, &mut outbound).await {
        debug!(pod = %pod.pod, %peer, %to, %error, "captured connection ended with an error");
    }
}

/// Either end of an opaque connection's backend: a tunnel or a TCP stream.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// One captured connection to `target`'s port `port`.
struct Connection {
    plane: Arc<DataPlane>,
    mesh: Arc<Mesh>,
    pod: Arc<PodInfo>,
    /// The pod's connection pools, looked up once for the connection's requests.
    clients: Arc<PodClients>,
    /// The pod's ServiceAccount, once known (it cannot change in a pod's life).
    source: OnceLock<ServiceAccount>,
    target: ServiceKey,
    /// `target` as the metrics label, formatted once for the connection's requests.
    target_label: Arc<str>,
    /// The Service port.
    port: u16,
    /// The pod the app dialled, for a headless Service: its traffic to `target` goes there.
    pinned: Option<Endpoint>,
}

async fn serve_http(conn: Connection, stream: TcpStream, mut drain: Drain, opening: Opening) {
    let conn = Arc::new(conn);
    let (first, mut first_seen) = tokio::sync::watch::channel(false);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let conn = conn.clone();
        if first.send_if_modified(|seen| !std::mem::replace(seen, true)) {
            opening.opened();
        }
        async move { Ok::<_, std::convert::Infallible>(conn.handle(request).await) }
    });
    let server = h::plaintext_server();
    let connection = server.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(connection);
    // A stopped listener: the request under way finishes with `Connection: close` (or
    // GOAWAY), an idle connection closes, and the app's next request opens a new one. A
    // connection that has not yet had its first request (accepted as the listener stopped)
    // gets it served first: its client sent it to this connection, and cannot send it again.
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = async {
            drain.started().await;
            let _ = first_seen.wait_for(|seen| *seen).await;
        } => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        debug!(error = %e, "captured HTTP connection ended with an error");
    }
}

/// One attempt at a backend: its answer, or why there is none, and the endpoint it went to.
struct Attempt {
    result: Result<Response<Body>, Error>,
    endpoint: Option<SocketAddr>,
}

/// What one request became, for the metrics.
struct Served {
    route: String,
    backend: Arc<str>,
    response: Response<Body>,
}

impl Connection {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        let served = self.route(request).await;
        self.mesh.metrics.request(
            RequestLabels {
                direction: Direction::Outbound,
                target: self.target_label.clone(),
                route: served.route,
                backend: served.backend,
                status: served.response.status().as_u16(),
            },
            started.elapsed(),
        );
        served.response
    }

    async fn route(&self, request: Request<Incoming>) -> Served {
        // Each request reads the latest snapshot, so a keep-alive connection follows changes.
        let snapshot = self.mesh.snapshot.load();
        let (mut parts, body) = request.into_parts();
        let Some(target) = snapshot.targets.get(&self.target) else {
            let backend = ServiceRef {
                namespace: self.target.namespace.clone(),
                name: self.target.name.clone(),
                port: self.port,
            };
            return self
                .forward(&snapshot, &backend, parts, h::incoming(body), None)
                .await;
        };
        let view = RequestView::from_parts(&parts);
        let outcome =
            target
                .router
                .route(self.port, &self.pod.pod.namespace, &view, fastrand::u64(..));
        let served = |route: String, response| Served {
            route,
            backend: Arc::from(""),
            response,
        };
        match outcome {
            Outcome::NoRoutes => {
                let backend = ServiceRef {
                    namespace: self.target.namespace.clone(),
                    name: self.target.name.clone(),
                    port: self.port,
                };
                self.forward(&snapshot, &backend, parts, h::incoming(body), None)
                    .await
            }
            Outcome::NotFound => served(
                String::new(),
                answer(
                    StatusCode::NOT_FOUND,
                    format!("no route of {} matches", self.target),
                ),
            ),
            Outcome::Redirect {
                rule,
                status,
                location,
            } => {
                let mut response = answer(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::FOUND),
                    "redirected",
                );
                match HeaderValue::from_str(&location) {
                    Ok(value) => {
                        response.headers_mut().insert(header::LOCATION, value);
                        served(route_name(rule), response)
                    }
                    Err(_) => served(
                        route_name(rule),
                        answer(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("redirect location {location:?} is not a valid header"),
                        ),
                    ),
                }
            }
            Outcome::NoBackend { rule } => served(
                route_name(rule),
                answer(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the matching rule has no usable backend",
                ),
            ),
            Outcome::Forward(forward) => {
                let route = route_name(forward.rule);
                h::rewrite_request(&mut parts, &forward);
                let timeouts = forward.timeouts();
                // A body is held in memory only for what needs it twice; a switch to another
                // protocol is never repeated.
                let hold = if !forward.mirrors.is_empty() {
                    Some(MIRROR_BODY_LIMIT)
                } else if forward.rule.retry.is_some() {
                    Some(RETRY_BODY_LIMIT)
                } else {
                    None
                }
                .filter(|_| {
                    h::Asked::of(&parts.method, parts.version, &parts.uri, &parts.headers).is_none()
                });
                let body = match hold {
                    Some(limit) => h::read_up_to(body, limit).await,
                    None => h::Replay::Streaming(h::incoming(body)),
                };
                if !forward.mirrors.is_empty() {
                    self.mirror(&snapshot, &forward.mirrors, &parts, &body);
                }
                let attempt_limit = timeouts.backend_request_ms.map(Duration::from_millis);
                let attempts =
                    self.attempts(&snapshot, &forward, &route, parts, body, attempt_limit);
                let mut served = match timeouts.request_ms.map(Duration::from_millis) {
                    Some(limit) => match tokio::time::timeout(limit, attempts).await {
                        Ok(served) => served,
                        Err(_) => {
                            let error = Error::Timeout {
                                backend: forward.backend.to_string(),
                                limit,
                            };
                            self.served(forward.backend, self.failed(forward.backend, None, error))
                        }
                    },
                    None => attempts.await,
                };
                forward.edit_response_headers(served.response.headers_mut());
                served.route = route;
                served
            }
        }
    }

    /// The attempts at the rule's backend: one, or under the rule's `retry` as many as it
    /// allows and its budget has left, when the body is held to send again. The answer is the
    /// last attempt's.
    async fn attempts(
        &self,
        snapshot: &Snapshot,
        forward: &aether_routing::Forward<'_>,
        route: &str,
        parts: ::http::request::Parts,
        body: h::Replay,
        limit: Option<Duration>,
    ) -> Served {
        let backend = forward.backend;
        let retry = forward.rule.retry.as_ref();
        let (Some(retry), h::Replay::Whole(bytes)) = (retry, &body) else {
            return self
                .forward(snapshot, backend, parts, body.into_body(), limit)
                .await;
        };
        let budgets = &self.plane.retry_budgets;
        budgets.request(forward.rule);
        let mut attempt = self
            .attempt(
                snapshot,
                backend,
                head_of(&parts),
                h::full(bytes.clone()),
                limit,
                None,
            )
            .await;
        for retry_number in 1..=retry.attempts {
            let again = match &attempt.result {
                Ok(response) => retries_status(retry, response.status().as_u16()),
                Err(error) => error.retriable(),
            };
            if !again {
                break;
            }
            let allowed = budgets.try_retry(forward.rule);
            self.mesh.metrics.retry(route.to_owned(), allowed);
            if !allowed {
                debug!(pod = %self.pod.pod, %backend, route, "retry budget exhausted; answering with the failed attempt");
                break;
            }
            tokio::time::sleep(retry_backoff(retry, retry_number, fastrand::u64(..))).await;
            // Another endpoint, when there is one, than the one that just failed.
            let failed = attempt.endpoint;
            attempt = self
                .attempt(
                    snapshot,
                    backend,
                    head_of(&parts),
                    h::full(bytes.clone()),
                    limit,
                    failed,
                )
                .await;
        }
        self.answer(backend, attempt)
    }

    /// Sends a copy of the request to each mirror, not waiting for them. A body too large to
    /// hold is not copied: the request goes on unmirrored.
    fn mirror(
        &self,
        snapshot: &Arc<Snapshot>,
        mirrors: &[&ServiceRef],
        parts: &::http::request::Parts,
        body: &h::Replay,
    ) {
        let h::Replay::Whole(bytes) = body else {
            debug!(target = %self.target, limit = MIRROR_BODY_LIMIT, "request body over the mirror limit; not mirrored");
            return;
        };
        for mirror in mirrors {
            let (conn, snapshot, mirror, copy, body) = (
                Connection {
                    plane: self.plane.clone(),
                    mesh: self.mesh.clone(),
                    pod: self.pod.clone(),
                    clients: self.clients.clone(),
                    source: self.source.clone(),
                    target: self.target.clone(),
                    target_label: self.target_label.clone(),
                    port: self.port,
                    pinned: self.pinned.clone(),
                },
                snapshot.clone(),
                (*mirror).clone(),
                head_of(parts),
                h::full(bytes.clone()),
            );
            tokio::spawn(async move {
                let served = conn.forward(&snapshot, &mirror, copy, body, None).await;
                debug!(mirror = %mirror, status = %served.response.status(), "mirrored a request");
            });
        }
    }

    /// Sends the request to an endpoint of `backend`, once.
    async fn forward(
        &self,
        snapshot: &Snapshot,
        backend: &ServiceRef,
        parts: ::http::request::Parts,
        body: Body,
        limit: Option<Duration>,
    ) -> Served {
        let attempt = self
            .attempt(snapshot, backend, parts, body, limit, None)
            .await;
        self.answer(backend, attempt)
    }

    /// Counts and logs an endpoint's ejection, when `ejected` says a failure caused one.
    fn note_ejection(
        &self,
        service: &dyn std::fmt::Display,
        endpoint: SocketAddr,
        ejected: Option<Duration>,
    ) {
        if let Some(duration) = ejected {
            self.mesh.metrics.endpoint_ejected();
            warn!(pod = %self.pod.pod, %service, %endpoint, ?duration, "endpoint failed {EJECT_AFTER} times in a row; leaving it out of load balancing for a while");
        }
    }

    /// What the client gets from an attempt: the backend's answer, or the proxy's in its place.
    fn answer(&self, backend: &ServiceRef, attempt: Attempt) -> Served {
        let response = match attempt.result {
            Ok(response) => response,
            Err(error) => self.failed(backend, attempt.endpoint, error),
        };
        self.served(backend, response)
    }

    fn served(&self, backend: &ServiceRef, response: Response<Body>) -> Served {
        Served {
            route: String::new(),
            backend: backend.to_string().into(),
            response,
        }
    }

    /// One attempt at an endpoint of `backend` other than `avoid` (when it has another), over
    /// mTLS when the endpoint is meshed, within `limit` when one is set.
    async fn attempt(
        &self,
        snapshot: &Snapshot,
        backend: &ServiceRef,
        mut parts: ::http::request::Parts,
        body: Body,
        limit: Option<Duration>,
        avoid: Option<SocketAddr>,
    ) -> Attempt {
        let service = ServiceKey::new(&backend.namespace, &backend.name);
        let balancer = &self.plane.balancer;
        let Some(endpoint) = self.endpoint(snapshot, &service, backend.port, avoid) else {
            return Attempt {
                result: Err(Error::NoEndpoint(backend.to_string())),
                endpoint: None,
            };
        };
        // The client asks to take its connection past HTTP (a WebSocket, a CONNECT): the
        // connection is taken over once the backend agreed.
        let switch = h::Asked::of(&parts.method, parts.version, &parts.uri, &parts.headers)
            .zip(parts.extensions.remove::<OnUpgrade>())
            .map(|(asked, client)| Switch { asked, client });
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(CLIENT_IDENTITY_HEADER);
        let host = authority(&parts.uri, &parts.headers)
            .unwrap_or_else(|| format!("{}.{}", backend.name, backend.namespace));
        if !parts.headers.contains_key(header::HOST)
            && let Ok(value) = HeaderValue::from_str(&host)
        {
            parts.headers.insert(header::HOST, value);
        }
        let in_flight = balancer.start(endpoint.addr);
        let exchange = async {
            match (switch, endpoint.meshed) {
                (Some(switch), true) => {
                    self.switch_mesh(snapshot, &service, endpoint.addr, parts, switch)
                        .await
                }
                (Some(switch), false) => self.switch_plain(endpoint.addr, parts, switch).await,
                (None, true) => self
                    .send_mesh(snapshot, &service, endpoint.addr, parts, body, &host)
                    .await
                    .map(without_hop_by_hop),
                (None, false) => self
                    .send_plain(endpoint.addr, parts, body)
                    .await
                    .map(without_hop_by_hop),
            }
        };
        let result = match limit {
            Some(limit) => tokio::time::timeout(limit, exchange)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout {
                        backend: backend.to_string(),
                        limit,
                    })
                }),
            None => exchange.await,
        };
        let ejected = match &result {
            Ok(response) if is_unavailable(response.status()) => in_flight.finish_unavailable(),
            Ok(_) => {
                in_flight.finish();
                None
            }
            Err(_) => in_flight.fail(),
        };
        self.note_ejection(backend, endpoint.addr, ejected);
        Attempt {
            result,
            endpoint: Some(endpoint.addr),
        }
    }

    /// The answer a client gets in place of the backend's, counted and logged (a backend's
    /// own state, no endpoint or too slow, only at debug: it is not the mesh failing).
    fn failed(
        &self,
        backend: &ServiceRef,
        endpoint: Option<SocketAddr>,
        error: Error,
    ) -> Response<Body> {
        self.mesh
            .metrics
            .failure(Direction::Outbound, error.reason());
        let pod = &self.pod.pod;
        match error {
            Error::NoEndpoint(_) | Error::Timeout { .. } => {
                debug!(%pod, %backend, reason = error.reason(), %error, "request failed")
            }
            _ => {
                warn!(%pod, %backend, ?endpoint, reason = error.reason(), %error, "request failed")
            }
        }
        answer(error.status(), error.to_string())
    }

    async fn send_plain(
        &self,
        to: SocketAddr,
        parts: ::http::request::Parts,
        body: Body,
    ) -> Result<Response<Incoming>, Error> {
        let http2 = parts.version == Version::HTTP_2;
        self.clients
            .plain(to, Request::from_parts(parts, body), http2)
            .await
    }

    async fn send_mesh(
        &self,
        snapshot: &Snapshot,
        service: &ServiceKey,
        endpoint: SocketAddr,
        mut parts: ::http::request::Parts,
        body: Body,
        host: &str,
    ) -> Result<Response<Incoming>, Error> {
        parts.headers.insert(
            FORWARD_HEADER,
            forward_value(endpoint.port(), Carried::of_version(parts.version)),
        );
        parts.uri = absolute_uri(host, std::mem::take(&mut parts.uri)).map_err(|e| {
            Error::InvalidRequest {
                what: "authority",
                value: host.to_owned(),
                reason: e.to_string(),
            }
        })?;
        parts.version = Version::HTTP_2;
        self.mesh_send(
            snapshot,
            service,
            endpoint,
            Request::from_parts(parts, body),
        )
        .await
    }

    /// The client's switch, to an unmeshed endpoint: the request as the client sent it, and
    /// once the endpoint agreed, both connections are joined.
    async fn switch_plain(
        &self,
        endpoint: SocketAddr,
        mut parts: ::http::request::Parts,
        switch: Switch,
    ) -> Result<Response<Body>, Error> {
        let mut response = match &switch.asked {
            h::Asked::Upgrade(protocol) => {
                h::set_upgrade(&mut parts.headers, protocol.clone());
                let request = Request::from_parts(parts, h::full(Bytes::new()));
                self.clients.plain(endpoint, request, false).await?
            }
            h::Asked::Connect(authority) => {
                parts.uri = ::http::Uri::from(authority.clone());
                let request = Request::from_parts(parts, h::full(Bytes::new()));
                h::send_connect(&self.pod.netns, endpoint, request).await?
            }
        };
        let agreed = switch.asked.agreed(response.status());
        if agreed {
            h::join(
                self.pod.pod.clone(),
                switch.client,
                hyper::upgrade::on(&mut response),
                std::future::pending(),
            );
        }
        // A switched protocol's answer keeps its `Upgrade` and `Connection`.
        if !agreed || switch.asked.carried() == Carried::Connect {
            strip_hop_by_hop(response.headers_mut());
        }
        Ok(response.map(h::incoming))
    }

    /// The client's switch, to a meshed endpoint: a CONNECT tunnel on the pooled mTLS
    /// connection ([`Carried::Upgrade`], [`Carried::Connect`]), whose proxy sends the app the
    /// request. Once the app agreed, the client gets its answer (`101 Switching Protocols`
    /// with the app's headers, or 200 to a CONNECT), and its connection is joined to the
    /// tunnel; any other answer is the app's, as it gave it.
    async fn switch_mesh(
        &self,
        snapshot: &Snapshot,
        service: &ServiceKey,
        endpoint: SocketAddr,
        parts: ::http::request::Parts,
        switch: Switch,
    ) -> Result<Response<Body>, Error> {
        let mut request = tunnel_request(endpoint);
        // The path of the switching request, or the authority the CONNECT names.
        let target = match &switch.asked {
            h::Asked::Upgrade(_) => parts
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_owned(),
            h::Asked::Connect(authority) => authority.to_string(),
        };
        let headers = request.headers_mut();
        *headers = parts.headers;
        headers.insert(
            FORWARD_HEADER,
            forward_value(endpoint.port(), switch.asked.carried()),
        );
        if let h::Asked::Upgrade(protocol) = &switch.asked {
            headers.insert(h::UPGRADE_HEADER, protocol.clone());
        }
        let path = HeaderValue::from_str(&target).map_err(|e| Error::InvalidRequest {
            what: "target",
            value: target.clone(),
            reason: e.to_string(),
        })?;
        headers.insert(h::PATH_HEADER, path);
        let mut response = self.mesh_send(snapshot, service, endpoint, request).await?;
        let switched = response.headers_mut().remove(h::UPGRADE_HEADER);
        let upgrade = match (&switch.asked, switched, response.status()) {
            (_, _, status) if status != StatusCode::OK => return Ok(response.map(h::incoming)),
            (h::Asked::Upgrade(_), Some(switched), _) => Some(switched),
            (h::Asked::Upgrade(_), None, _) => return Ok(response.map(h::incoming)),
            (h::Asked::Connect(_), _, _) => None,
        };
        h::join(
            self.pod.pod.clone(),
            switch.client,
            hyper::upgrade::on(&mut response),
            std::future::pending(),
        );
        let (mut head, _) = response.into_parts();
        head.version = Version::HTTP_11;
        match upgrade {
            Some(switched) => {
                head.status = StatusCode::SWITCHING_PROTOCOLS;
                h::set_upgrade(&mut head.headers, switched);
            }
            None => strip_hop_by_hop(&mut head.headers),
        }
        Ok(Response::from_parts(head, h::full(Bytes::new())))
    }

    /// Sends `request` to `endpoint`'s proxy on the pooled mTLS connection, or on a new one
    /// when the pooled one was closing before the request went out.
    async fn mesh_send(
        &self,
        snapshot: &Snapshot,
        service: &ServiceKey,
        endpoint: SocketAddr,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, Error> {
        let failed = |e: SendError| Error::Request {
            to: endpoint,
            reason: e.to_string(),
        };
        let mut conn = self.mesh_conn(snapshot, service, endpoint, true).await?;
        match conn.send(request).await {
            Ok(response) => Ok(response),
            Err(SendError::NotSent(request, error)) => {
                debug!(pod = %self.pod.pod, %endpoint, error = %aether_cni::error_chain(&error), "the pooled mesh connection was closing; sending on a new one");
                let mut conn = self.mesh_conn(snapshot, service, endpoint, false).await?;
                conn.send(*request).await.map_err(failed)
            }
            Err(e) => Err(failed(e)),
        }
    }

    /// A pooled mTLS connection to `endpoint`'s proxy (a new one unless `reuse`), whose peer
    /// proved one of `service`'s identities.
    async fn mesh_conn(
        &self,
        snapshot: &Snapshot,
        service: &ServiceKey,
        endpoint: SocketAddr,
        reuse: bool,
    ) -> Result<MeshConn, Error> {
        let mesh = &self.mesh;
        let source = self.source()?;
        let peer_addr = SocketAddr::new(endpoint.ip(), mesh.inbound_port);
        let conn = match self
            .clients
            .mesh(source, &mesh.certs, peer_addr, reuse)
            .await
        {
            Ok((conn, fresh)) => {
                // Only a new connection had a handshake; most requests reuse one.
                if fresh.0 {
                    mesh.metrics.handshake("client", true);
                }
                conn
            }
            Err(e) => {
                if !matches!(e, Error::NoSvid(_)) {
                    mesh.metrics.handshake("client", false);
                }
                return Err(e);
            }
        };
        check_peer(snapshot.identities.get(service), &conn.peer_id).map_err(|allowed| {
            Error::PeerNotAllowed(Box::new(WrongPeer {
                endpoint,
                service: service.clone(),
                peer: conn.peer_id.to_string(),
                allowed,
            }))
        })?;
        Ok(conn)
    }

    /// An opaque connection (not HTTP) to the target's own endpoints, over an HTTP/2 CONNECT
    /// tunnel on the pooled mTLS connection to a meshed endpoint, or plain TCP to another.
    /// Routes do not apply: they are HTTP. When no endpoint can be reached the app's
    /// connection is reset.
    async fn serve_opaque(self, mut app: TcpStream) {
        let snapshot = self.mesh.snapshot.load();
        let balancer = &self.plane.balancer;
        let Some(endpoint) = self.endpoint(&snapshot, &self.target, self.port, None) else {
            let error = Error::NoEndpoint(format!("{}:{}", self.target, self.port));
            return self.reset(app, None, error);
        };
        let in_flight = balancer.start(endpoint.addr);
        let opened = if endpoint.meshed {
            self.open_tunnel(&snapshot, endpoint.addr).await
        } else {
            tokio::time::timeout(
                CONNECT_TIMEOUT,
                netns::connect_from(&self.pod.netns, endpoint.addr),
            )
            .await
            .map_err(|_| Error::ConnectTimeout(endpoint.addr))
            .and_then(|c| c.map_err(Error::from))
            .map(|tcp| Box::new(tcp) as Box<dyn Io>)
        };
        let mut backend = match opened {
            Ok(backend) => {
                // The balancer weighs how fast a connection opens, not how long it lives.
                in_flight.finish();
                backend
            }
            Err(error) => {
                let ejected = in_flight.fail();
                self.note_ejection(&self.target, endpoint.addr, ejected);
                return self.reset(app, Some(endpoint.addr), error);
            }
        };
        if let Err(error) = super::copy::both_ways(&mut app, &mut backend).await {
            debug!(pod = %self.pod.pod, endpoint = %endpoint.addr, %error, "opaque connection ended with an error");
        }
    }

    /// Where a request or opaque connection to `service`'s port `port` goes: the pod the app
    /// dialled, for its headless Service, else the balancer's pick among the ready endpoints
    /// (other than `avoid`, when there are others).
    fn endpoint(
        &self,
        snapshot: &Snapshot,
        service: &ServiceKey,
        port: u16,
        avoid: Option<SocketAddr>,
    ) -> Option<Endpoint> {
        if let Some(pinned) = self.pinned.as_ref().filter(|_| *service == self.target) {
            return Some(pinned.clone());
        }
        let endpoints = snapshot.endpoints(service, port);
        if let Some(avoid) = avoid
            && endpoints.len() > 1
        {
            let others: Vec<&Endpoint> = endpoints.iter().filter(|e| e.addr != avoid).collect();
            let index = (self.plane.balancer).pick(&others, |e| e.addr, fastrand::u64(..))?;
            return Some(others[index].clone());
        }
        let index = (self.plane.balancer).pick(endpoints, |e| e.addr, fastrand::u64(..))?;
        Some(endpoints[index].clone())
    }

    /// An opaque connection that cannot be carried is reset (its app sees what a refused
    /// connection looks like), counted and logged.
    fn reset(&self, app: TcpStream, endpoint: Option<SocketAddr>, error: Error) {
        self.mesh
            .metrics
            .failure(Direction::Outbound, error.reason());
        warn!(pod = %self.pod.pod, target = %self.target, port = self.port, ?endpoint, reason = error.reason(), %error, "cannot open an opaque connection; resetting it");
        let _ = app.set_zero_linger();
    }

    async fn open_tunnel(
        &self,
        snapshot: &Snapshot,
        endpoint: SocketAddr,
    ) -> Result<Box<dyn Io>, Error> {
        let mut request = tunnel_request(endpoint);
        request
            .headers_mut()
            .insert(FORWARD_HEADER, forward_value(endpoint.port(), Carried::Tcp));
        let response = self
            .mesh_send(snapshot, &self.target, endpoint, request)
            .await?;
        if response.status() != StatusCode::OK {
            return Err(Error::TunnelRefused {
                endpoint,
                status: response.status(),
            });
        }
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| Error::Tunnel {
                endpoint,
                reason: aether_cni::error_chain(&e),
            })?;
        Ok(Box::new(TokioIo::new(upgraded)))
    }

    /// The client pod's ServiceAccount, looked up on the connection's first mesh request.
    fn source(&self) -> Result<&ServiceAccount, Error> {
        if let Some(source) = self.source.get() {
            return Ok(source);
        }
        let source = self
            .mesh
            .workloads
            .service_account(&self.pod.pod)
            .ok_or_else(|| Error::NoSourceIdentity(self.pod.pod.clone()))?;
        Ok(self.source.get_or_init(|| source))
    }
}

/// A protocol switch the client asked for: the protocol, and the client's connection once
/// hyper has answered it.
struct Switch {
    asked: h::Asked,
    client: OnUpgrade,
}

fn without_hop_by_hop(mut response: Response<Incoming>) -> Response<Body> {
    strip_hop_by_hop(response.headers_mut());
    response.map(h::incoming)
}

/// An HTTP/2 CONNECT to `endpoint`'s proxy, on the pooled connection: the tunnel of an opaque
/// connection or a protocol switch.
fn tunnel_request(endpoint: SocketAddr) -> Request<Body> {
    let mut request = Request::new(h::full(Bytes::new()));
    *request.method_mut() = Method::CONNECT;
    *request.uri_mut() = ::http::uri::Authority::from_maybe_shared(endpoint.to_string())
        .map(::http::Uri::from)
        .unwrap_or_default();
    *request.version_mut() = Version::HTTP_2;
    request
}

/// A backend's peer must prove one of the identities the backend Service may present (the
/// ServiceAccounts of its pods); an endpoint holding another workload's certificate, or a
/// Service whose identities are unknown, gets no request. Refused: the identities allowed.
fn check_peer(allowed: Option<&BTreeSet<String>>, peer: &str) -> Result<(), Vec<String>> {
    match allowed {
        Some(ids) if ids.contains(peer) => Ok(()),
        Some(ids) => Err(ids.iter().cloned().collect()),
        None => Err(Vec::new()),
    }
}

/// The head of a request again, for another attempt or a mirror (extensions are the
/// connection's and stay with the first).
fn head_of(parts: &::http::request::Parts) -> ::http::request::Parts {
    let mut copy = ::http::Request::new(());
    *copy.method_mut() = parts.method.clone();
    *copy.uri_mut() = parts.uri.clone();
    *copy.version_mut() = parts.version;
    *copy.headers_mut() = parts.headers.clone();
    copy.into_parts().0
}

/// The answers of a backend's proxy or app that count towards ejecting it.
fn is_unavailable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

fn route_name(rule: &aether_routing::table::Rule) -> String {
    format!(
        "{}/{}/{}",
        rule.route.kind.as_str(),
        rule.route.namespace,
        rule.route.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_allowed_identity_gets_the_request() {
        let v1 = "spiffe://cluster.local/ns/shop/sa/v1";
        let allowed: BTreeSet<String> = [v1.to_string()].into();
        assert_eq!(check_peer(Some(&allowed), v1), Ok(()));
        let other = check_peer(Some(&allowed), "spiffe://cluster.local/ns/shop/sa/intruder");
        assert_eq!(other, Err(vec![v1.to_string()]));
        assert_eq!(check_peer(None, v1), Err(Vec::new()));
        assert!(check_peer(Some(&BTreeSet::new()), v1).is_err());
    }

    #[test]
    fn a_tunnel_names_the_endpoint_as_its_authority() {
        for endpoint in ["10.0.0.7:8080", "[fd00::7]:8080"] {
            let request = tunnel_request(endpoint.parse().unwrap());
            assert_eq!(request.method(), Method::CONNECT);
            assert_eq!(request.uri().to_string(), endpoint);
        }
    }
}
