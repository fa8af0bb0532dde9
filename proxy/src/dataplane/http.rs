//! HTTP plumbing shared by both directions: the body type, answers the proxy makes itself,
//! hop-by-hop headers, a route's edits of the request head, and the internal header between
//! the two proxies of a mesh hop.

use ::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ::http::uri::{Authority, PathAndQuery, Scheme};
use ::http::{Response, StatusCode, Uri, Version};
use aether_cni::protocol::PodRef;
use aether_routing::Forward;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tracing::debug;

use super::clients::CONNECT_TIMEOUT;
use super::error::Error;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// From the outbound proxy to the inbound one: the app port and HTTP version the request is
/// for, `<port> <h1|h2>`. Removed before the request reaches the app.
pub const FORWARD_HEADER: HeaderName = HeaderName::from_static("x-aether-forward");

/// With [`Carried::Upgrade`]: the protocol the client asked to switch to (its `Upgrade`
/// header, which HTTP/2 cannot carry), and in the answer the one the app switched to.
pub const UPGRADE_HEADER: HeaderName = HeaderName::from_static("x-aether-upgrade");
/// With [`Carried::Upgrade`]: the request's `path?query` (an HTTP/2 CONNECT has no path); with
/// [`Carried::Connect`], the authority the client's CONNECT named.
pub const PATH_HEADER: HeaderName = HeaderName::from_static("x-aether-path");

/// The largest request head aether takes from an app (HTTP/1 bytes, or an HTTP/2 header
/// list), answered 431 at the edge when larger. One limit end to end: the hop between the
/// proxies admits [`MESH_HEADER_LIST`], enough for any head the edge let through, so a
/// request is never refused further on for its size.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// How long a plaintext HTTP/1 client may take to send a request head.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// HTTP/2 counts 32 bytes more per header than its name and value; the mesh hop adds a few
/// headers of its own.
pub const MESH_HEADER_LIST: u32 = 2 * MAX_HEADER_BYTES as u32;
/// The largest HTTP/2 frame either proxy of a mesh hop takes. At the default 16 KiB a tunnel's
/// largest write would go as eight frames, each a write of its own to the TLS socket.
pub const MESH_FRAME: u32 = super::copy::LARGEST_BUFFER as u32;

/// A mesh connection's socket, read ahead: rustls asks for 4 KiB at a time, several reads of
/// the socket for one full TLS record, where this makes one read for several records.
pub fn mesh_socket(stream: tokio::net::TcpStream) -> tokio::io::BufReader<tokio::net::TcpStream> {
    tokio::io::BufReader::with_capacity(64 * 1024, stream)
}

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

pub fn incoming(body: Incoming) -> Body {
    body.map_err(BoxError::from).boxed()
}

/// `body` without the header `name` in its trailers (where HTTP/2 and chunked HTTP/1 may
/// carry it), for a header only the proxy may set.
pub fn without_trailer(body: Incoming, name: HeaderName) -> Body {
    body.map_frame(move |frame| match frame.into_trailers() {
        Ok(mut trailers) => {
            trailers.remove(&name);
            hyper::body::Frame::trailers(trailers)
        }
        Err(frame) => frame,
    })
    .map_err(BoxError::from)
    .boxed()
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A request body either held whole in memory, so it can be sent more than once (to
/// mirrors, to a retry), or on its way as it came.
pub enum Replay {
    Whole(Bytes),
    Streaming(Body),
}

impl Replay {
    pub fn into_body(self) -> Body {
        match self {
            Replay::Whole(bytes) => full(bytes),
            Replay::Streaming(body) => body,
        }
    }
}

/// Reads `body` into memory when it ends within `limit` bytes. A longer body, one with
/// trailers, or one whose read fails comes back streaming, what was read so far first, so
/// nothing of it is lost.
pub async fn read_up_to(mut body: Incoming, limit: usize) -> Replay {
    use hyper::body::Body as _;
    if body.is_end_stream() {
        return Replay::Whole(Bytes::new());
    }
    let mut read: Vec<Result<hyper::body::Frame<Bytes>, BoxError>> = Vec::new();
    let mut total = 0;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let whole = frame.data_ref().is_some_and(|data| {
                    total += data.len();
                    total <= limit
                });
                read.push(Ok(frame));
                if !whole {
                    return streaming(read, body);
                }
            }
            Some(Err(e)) => {
                read.push(Err(e.into()));
                return streaming(read, body);
            }
        }
    }
    let mut bytes = Vec::with_capacity(total);
    for frame in read.into_iter().flatten() {
        if let Ok(data) = frame.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Replay::Whole(bytes.into())
}

fn streaming(read: Vec<Result<hyper::body::Frame<Bytes>, BoxError>>, rest: Incoming) -> Replay {
    use futures::StreamExt;
    let rest = http_body_util::BodyStream::new(rest.map_err(BoxError::from));
    let stream = futures::stream::iter(read).chain(rest);
    Replay::Streaming(BodyExt::boxed(http_body_util::StreamBody::new(stream)))
}

/// An answer of the proxy itself (no backend involved), with the reason in the body.
pub fn answer(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut text = message.into();
    text.push('\n');
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Removes hop-by-hop headers, including those the `Connection` header names. `te: trailers`
/// stays: gRPC needs it end to end.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names costs less than a lookup per name.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    let keep_te = headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_te {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// The protocol an HTTP/1.1 request asks to switch to: its `Upgrade` header, when `Connection`
/// names it (RFC 9110 §7.8) and the method is `GET` (as WebSocket's handshake is). Not `h2c`:
/// the proxies already speak HTTP/2 between them, and the app gets what the client sent.
pub fn upgrade_of(
    method: &::http::Method,
    version: Version,
    headers: &HeaderMap,
) -> Option<HeaderValue> {
    let asked = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let protocol = headers.get(header::UPGRADE)?;
    let h2c = protocol.as_bytes().eq_ignore_ascii_case(b"h2c");
    (asked && !h2c && *method == ::http::Method::GET && version == Version::HTTP_11)
        .then(|| protocol.clone())
}

/// How an HTTP/1.1 client asks to take its connection past HTTP. Once the server agrees, the
/// mesh carries the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// `Upgrade: <protocol>` on a `GET` (WebSocket, see [`upgrade_of`]), agreed to with `101
    /// Switching Protocols`.
    Upgrade(HeaderValue),
    /// `CONNECT <authority>`, a forward proxy's tunnel, agreed to with any 2xx.
    Connect(Authority),
}

impl Asked {
    /// What the client of an HTTP/1.1 request asks for, if anything beyond HTTP.
    pub fn of(
        method: &::http::Method,
        version: Version,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Option<Asked> {
        if *method == ::http::Method::CONNECT && version == Version::HTTP_11 {
            return uri.authority().cloned().map(Asked::Connect);
        }
        upgrade_of(method, version, headers).map(Asked::Upgrade)
    }

    /// Whether the server's answer agrees.
    pub fn agreed(&self, status: StatusCode) -> bool {
        match self {
            Asked::Upgrade(_) => status == StatusCode::SWITCHING_PROTOCOLS,
            Asked::Connect(_) => status.is_success(),
        }
    }

    /// How a mesh tunnel carries it.
    pub fn carried(&self) -> Carried {
        match self {
            Asked::Upgrade(_) => Carried::Upgrade,
            Asked::Connect(_) => Carried::Connect,
        }
    }
}

/// Sends a CONNECT (its URI the authority it names) to `to` from the network namespace
/// `netns`, on a connection of its own: a pooled client would name the address it dials.
pub async fn send_connect(
    netns: &crate::inpod::netns::Netns,
    to: std::net::SocketAddr,
    request: ::http::Request<Body>,
) -> Result<Response<Incoming>, Error> {
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        crate::inpod::netns::connect_from(netns, to),
    )
    .await
    .map_err(|_| Error::ConnectTimeout(to))??;
    let failed = |e: hyper::Error| Error::Request {
        to,
        reason: aether_cni::error_chain(&e),
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(failed)?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            debug!(%error, "a CONNECT's connection ended with an error");
        }
    });
    sender.send_request(request).await.map_err(failed)
}

/// Marks `headers` as those of a protocol switch to `protocol`: `Connection: upgrade` and
/// `Upgrade`, which [`strip_hop_by_hop`] removed.
pub fn set_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol);
}

/// The server of plaintext HTTP from a pod or the node (HTTP/1.1 and h2c): request heads up to
/// [`MAX_HEADER_BYTES`], an HTTP/1 head within [`HEADER_READ_TIMEOUT`]. Without a timer hyper
/// enforces no header timeout: a client sending its head byte by byte would hold the
/// connection (and its memory) for ever.
pub fn plaintext_server() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // A client that shuts its side down once its request is sent (`nc`, some scripts)
        // still gets the answer, as it does from the app itself.
        .half_close(true)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    builder
}

/// Joins two connections that switched protocols (the client's and the backend's, each handed
/// over by hyper once its side of the switch is done): bytes both ways until both close, or
/// until `cut` resolves (its authorization was revoked).
pub fn join(
    pod: PodRef,
    client: OnUpgrade,
    backend: OnUpgrade,
    cut: impl std::future::Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        let (client, backend) = match tokio::try_join!(client, backend) {
            Ok(both) => both,
            Err(error) => return debug!(%pod, %error, "a protocol switch was never completed"),
        };
        let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
        tokio::select! {
            copied = super::copy::both_ways(&mut client, &mut backend) => {
                if let Err(error) = copied {
                    debug!(%pod, %error, "a switched connection ended with an error");
                }
            }
            () = cut => {}
        }
    });
}

/// The request's authority: the URI's (HTTP/2, absolute form) or the Host header's.
pub fn authority(uri: &Uri, headers: &HeaderMap) -> Option<String> {
    uri.authority().map(|a| a.as_str().to_owned()).or_else(|| {
        headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    })
}

/// `uri` as `http://<authority><path?query>`: the form hyper's clients send from. The path
/// and query are moved, not parsed again.
pub fn absolute_uri(authority: &str, uri: Uri) -> Result<Uri, ::http::Error> {
    let mut parts = uri.into_parts();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(Authority::try_from(authority)?);
    parts
        .path_and_query
        .get_or_insert(PathAndQuery::from_static("/"));
    Ok(Uri::from_parts(parts)?)
}

/// What a mesh request carries to the app's port, named in [`FORWARD_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    Http1,
    Http2,
    /// A CONNECT tunnel of opaque bytes.
    Tcp,
    /// A CONNECT tunnel of an HTTP/1.1 `GET` asking to switch protocols (WebSocket): the
    /// inbound side sends the app the request, and once it switched, carries the bytes.
    Upgrade,
    /// A CONNECT tunnel of the client's own HTTP/1.1 CONNECT (the app is a forward proxy): the
    /// inbound side sends the app the CONNECT, and once it agreed, carries the bytes.
    Connect,
}

impl Carried {
    pub fn of_version(version: Version) -> Carried {
        if version == Version::HTTP_2 {
            Carried::Http2
        } else {
            Carried::Http1
        }
    }
}

/// The value of [`FORWARD_HEADER`].
pub fn forward_value(port: u16, carried: Carried) -> HeaderValue {
    let proto = match carried {
        Carried::Http1 => "h1",
        Carried::Http2 => "h2",
        Carried::Tcp => "tcp",
        Carried::Upgrade => "upgrade",
        Carried::Connect => "connect",
    };
    HeaderValue::from_str(&format!("{port} {proto}")).expect("digits and letters")
}

/// Parses [`FORWARD_HEADER`]: the app port and what goes to it.
pub fn parse_forward(value: &HeaderValue) -> Option<(u16, Carried)> {
    let (port, proto) = value.to_str().ok()?.split_once(' ')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    match proto {
        "h1" => Some((port, Carried::Http1)),
        "h2" => Some((port, Carried::Http2)),
        "tcp" => Some((port, Carried::Tcp)),
        "upgrade" => Some((port, Carried::Upgrade)),
        "connect" => Some((port, Carried::Connect)),
        _ => None,
    }
}

/// Applies what a route decided to the request head: header edits, the rewritten
/// `path?query`, the rewritten Host (and the URI's authority, when it has one).
pub fn rewrite_request(parts: &mut ::http::request::Parts, forward: &Forward<'_>) {
    forward.edit_request_headers(&mut parts.headers);
    if let Some(pq) = &forward.path_and_query {
        let mut uri = parts.uri.clone().into_parts();
        uri.path_and_query = pq.parse().ok();
        if let Ok(uri) = ::http::Uri::from_parts(uri) {
            parts.uri = uri;
        }
    }
    if let Some(host) = forward.authority
        && let Ok(value) = HeaderValue::from_str(host)
    {
        parts.headers.insert(header::HOST, value);
        if parts.uri.authority().is_some() {
            let mut uri = parts.uri.clone().into_parts();
            uri.authority = host.parse().ok();
            if let Ok(uri) = ::http::Uri::from_parts(uri) {
                parts.uri = uri;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_te_trailers_stays() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        let mut names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["te", "x-kept"]);

        let mut headers = HeaderMap::new();
        headers.insert("te", HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut headers);
        assert!(headers.is_empty());
    }

    #[test]
    fn the_forward_header_round_trips_and_refuses_nonsense() {
        for carried in [
            Carried::Http1,
            Carried::Http2,
            Carried::Tcp,
            Carried::Upgrade,
            Carried::Connect,
        ] {
            let v = forward_value(8080, carried);
            assert_eq!(parse_forward(&v), Some((8080, carried)));
        }
        assert_eq!(
            Carried::of_version(Version::HTTP_2),
            Carried::Http2,
            "an h2c app gets h2"
        );
        for bad in ["", "8080", "0 h1", "70000 h1", "8080 h3", "x h1"] {
            assert_eq!(parse_forward(&HeaderValue::from_static(bad)), None, "{bad}");
        }
    }

    #[test]
    fn a_connect_asks_for_its_authority_and_is_agreed_to_with_a_success() {
        let uri: Uri = "db.example:5432".parse().unwrap();
        let asked = Asked::of(
            &::http::Method::CONNECT,
            Version::HTTP_11,
            &uri,
            &HeaderMap::new(),
        );
        let Some(connect @ Asked::Connect(_)) = asked else {
            panic!("a CONNECT asks for a tunnel: {asked:?}")
        };
        assert_eq!(connect, Asked::Connect("db.example:5432".parse().unwrap()));
        assert!(connect.agreed(StatusCode::OK) && !connect.agreed(StatusCode::FORBIDDEN));
        assert_eq!(connect.carried(), Carried::Connect);
        assert_eq!(
            Asked::of(
                &::http::Method::CONNECT,
                Version::HTTP_2,
                &uri,
                &HeaderMap::new()
            ),
            None,
            "an HTTP/2 CONNECT is a stream of its own, not a switch of the connection"
        );
        let upgrade = Asked::Upgrade(HeaderValue::from_static("websocket"));
        assert!(upgrade.agreed(StatusCode::SWITCHING_PROTOCOLS) && !upgrade.agreed(StatusCode::OK));
    }

    #[test]
    fn an_upgrade_is_a_get_naming_it_in_connection_and_never_h2c() {
        let get = ::http::Method::GET;
        let mut headers = HeaderMap::new();
        headers.insert(
            "connection",
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        headers.insert("upgrade", HeaderValue::from_static("websocket"));
        assert_eq!(
            upgrade_of(&get, Version::HTTP_11, &headers),
            Some(HeaderValue::from_static("websocket"))
        );
        assert_eq!(
            upgrade_of(&::http::Method::POST, Version::HTTP_11, &headers),
            None
        );
        assert_eq!(upgrade_of(&get, Version::HTTP_2, &headers), None);
        headers.insert("upgrade", HeaderValue::from_static("h2c"));
        assert_eq!(upgrade_of(&get, Version::HTTP_11, &headers), None);
        headers.insert("upgrade", HeaderValue::from_static("websocket"));
        headers.insert("connection", HeaderValue::from_static("keep-alive"));
        assert_eq!(
            upgrade_of(&get, Version::HTTP_11, &headers),
            None,
            "not asked"
        );
        let mut switched = HeaderMap::new();
        set_upgrade(&mut switched, HeaderValue::from_static("websocket"));
        assert_eq!(switched["connection"], "upgrade");
        assert_eq!(switched["upgrade"], "websocket");
    }

    #[test]
    fn authority_prefers_the_uri() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("echo"));
        assert_eq!(
            authority(&Uri::from_static("/x"), &headers).as_deref(),
            Some("echo")
        );
        let uri = Uri::from_static("http://echo.shop:80/x");
        assert_eq!(authority(&uri, &headers).as_deref(), Some("echo.shop:80"));
        assert_eq!(
            absolute_uri("echo", Uri::from_static("/a?b=1")).unwrap(),
            Uri::from_static("http://echo/a?b=1")
        );
        assert_eq!(
            absolute_uri("10.0.0.1:80", Uri::from_static("http://echo.shop/x")).unwrap(),
            Uri::from_static("http://10.0.0.1:80/x")
        );
        assert_eq!(
            absolute_uri("echo", Uri::default()).unwrap(),
            Uri::from_static("http://echo/")
        );
        assert!(absolute_uri("bad host", Uri::default()).is_err());
    }
}
