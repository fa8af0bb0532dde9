//! The proxy with the real CNI chain (`loopback`, `bridge` + `host-local`, then the built
//! `aether-cni`) in real network namespaces, with real nftables: capture, original destination,
//! the proxy's exemption, the listener lifecycle, restarts and capture set updates.
//! Needs root, nftables and containernetworking-plugins.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use aether_cni::nft::{self, Families, Nft, TableSpec};
use aether_cni::protocol::{
    Client, ClientError, DEFAULT_TIMEOUT, ErrorKind, PodRef, Request, Response,
};
use aether_proxy::inpod::agent::LEAVE_LINGER;
use aether_proxy::inpod::listeners::ConnectionLimits;
use common::chain::{node, pod_ips};
use common::proxy::{CAPTURE_PORT, TestProxy, capture_set, refused_within};
use common::sockets::{TIMEOUT, accept_within, connect_from, listen_in};
use common::{Pod, TempDir, require_root};

/// The plugin's `register` of `pod` with `ips`, as if its table held capture generation 1.
fn registration(pod: &Pod, ips: Vec<IpAddr>) -> Request {
    Request::Register {
        pod: PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: None,
        },
        container_id: pod.container_id.clone(),
        ifname: "eth0".into(),
        netns: pod.netns.path().to_owned(),
        ips,
        generation: 1,
    }
}

/// One `ping` on a new connection to the CNI socket.
fn ping(socket: &Path, timeout: Duration) -> Result<Response, ClientError> {
    Client::new(socket, timeout)
        .connect()
        .and_then(|mut conn| conn.call(&Request::Ping))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// One connection from an app in the pod to `to`, served by `server`, with a line each way.
struct Dialled {
    /// The app's end of the connection.
    app: SocketAddr,
    /// Who the server saw connecting.
    seen_from: SocketAddr,
}

fn dial(pod: &Pod, to: SocketAddr, server: &TcpListener) -> Dialled {
    let (app, served) = held(pod, to, server);
    Dialled {
        app: app.local_addr().unwrap(),
        seen_from: served.peer_addr().unwrap(),
    }
}

/// A connection from an app in the pod to `to`, served by `server`: both ends, open, after a
/// line each way.
fn held(pod: &Pod, to: SocketAddr, server: &TcpListener) -> (TcpStream, TcpStream) {
    let mut app = connect_from(pod.netns.path(), to, None)
        .unwrap_or_else(|e| panic!("connecting to {to} from the pod: {e}"));
    app.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut served = accept_within(server)
        .unwrap_or_else(|| panic!("the connection to {to} did not reach its destination"));
    served.set_nonblocking(false).unwrap();
    served.set_read_timeout(Some(TIMEOUT)).unwrap();
    exchange(&mut app, &mut served);
    (app, served)
}

/// Asserts the connection went through the proxy: without a cluster the proxy passes it
/// through from the node (from the pod, the table would capture it again), so the destination
/// saw a connection from another address than the pod's.
fn assert_proxied(dialled: &Dialled, pod_ip: IpAddr) {
    assert_ne!(
        dialled.seen_from.ip(),
        pod_ip,
        "the destination saw a connection from the pod: it was not proxied"
    );
}

fn assert_direct(dialled: &Dialled) {
    assert_eq!(
        dialled.seen_from, dialled.app,
        "the destination saw another connection than the app's: it was proxied"
    );
}

fn ip_of(prev: &serde_json::Value, v6: bool) -> IpAddr {
    pod_ips(prev)
        .into_iter()
        .find(|ip| ip.is_ipv6() == v6)
        .unwrap()
}

#[test]
fn captured_connections_reach_their_original_destination_through_the_proxy() {
    require_root();
    let dir = TempDir::new();
    let node = node(true, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80", "[fd00:96::10]:80"]),
        Some(node.netns.path()),
    );
    node.add_service_ips(&["10.96.0.10", "10.96.0.11", "fd00:96::10"]);
    let captured4 = listen_in(node.netns.path(), "10.96.0.10:80");
    let captured6 = listen_in(node.netns.path(), "[fd00:96::10]:80");
    let other_ip = listen_in(node.netns.path(), "10.96.0.11:80");
    let other_port = listen_in(node.netns.path(), "10.96.0.10:8080");
    let pod = Pod::new("shop");

    let (run, prev) = node.add(&pod);
    run.ok();
    assert_eq!(
        proxy.registered_ids(),
        std::slice::from_ref(&pod.container_id)
    );
    let registered = &proxy.agent.registered()[0];
    assert_eq!(registered.netns, pod.netns.path());
    assert_eq!(registered.generation, 1);

    let v4 = dial(&pod, addr("10.96.0.10:80"), &captured4);
    assert_proxied(&v4, ip_of(&prev, false));
    let v6 = dial(&pod, addr("[fd00:96::10]:80"), &captured6);
    assert_proxied(&v6, ip_of(&prev, true));
    let counts = proxy.counts_reach(|c| c.forwarded == 2);
    assert_eq!(
        (counts.accepted, counts.forwarded, counts.failed),
        (2, 2, 0)
    );

    // Another ClusterIP, or another port of a captured one, is not captured.
    assert_direct(&dial(&pod, addr("10.96.0.11:80"), &other_ip));
    assert_direct(&dial(&pod, addr("10.96.0.10:8080"), &other_port));
    // Dialling the capture port itself is not forwarded (it would loop back into the listener).
    let app = connect_from(pod.netns.path(), addr("127.0.0.1:15001"), None).unwrap();
    let counts = proxy.counts_reach(|c| c.failed == 1);
    assert_eq!(
        (counts.accepted, counts.forwarded, counts.failed),
        (3, 2, 1)
    );
    drop(app);

    node.aether_command("CHECK", &pod, Some(&prev)).ok();

    // DEL: the table and the listeners go; the pod's connections flow as before.
    node.del_aether(&pod, &prev).ok();
    assert!(proxy.registered_ids().is_empty());
    let capture4 = SocketAddr::from(([127, 0, 0, 1], CAPTURE_PORT));
    let capture6 = addr("[::1]:15001");
    assert!(
        refused_within(pod.netns.path(), capture4),
        "IPv4 listener still open"
    );
    assert!(
        refused_within(pod.netns.path(), capture6),
        "IPv6 listener still open"
    );
    assert_direct(&dial(&pod, addr("10.96.0.10:80"), &captured4));
    // The refusal probes above may be accepted while the listener closes; none is forwarded.
    assert_eq!(proxy.agent.forward_counts().forwarded, 2);
}

#[test]
fn a_restarted_proxy_reopens_the_listeners_of_its_registered_pods() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
    );
    node.add_service_ips(&["10.96.0.10", "10.96.0.11"]);
    let server10 = listen_in(node.netns.path(), "10.96.0.10:80");
    let server11 = listen_in(node.netns.path(), "10.96.0.11:80");
    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();
    let gone = Pod::new("shop");
    node.add(&gone).0.ok();
    assert_proxied(
        &dial(&pod, addr("10.96.0.10:80"), &server10),
        ip_of(&prev, false),
    );

    drop(proxy);
    // The table stays while the proxy is down: a captured connection is refused, never
    // let through uncaptured.
    let down = connect_from(pod.netns.path(), addr("10.96.0.10:80"), None);
    assert_eq!(
        down.map(drop).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    // A pod deleted while the proxy is down (no DEL reached it) is forgotten at the restart.
    gone.netns.delete();

    // The new proxy starts with a newer capture set: the restored pod's table gets it too.
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(2, &["10.96.0.10:80", "10.96.0.11:80"]),
        Some(node.netns.path()),
    );
    assert_eq!(
        proxy.registered_ids(),
        std::slice::from_ref(&pod.container_id)
    );
    assert_eq!(proxy.agent.registered()[0].generation, 2);
    assert_proxied(
        &dial(&pod, addr("10.96.0.10:80"), &server10),
        ip_of(&prev, false),
    );
    assert_proxied(
        &dial(&pod, addr("10.96.0.11:80"), &server11),
        ip_of(&prev, false),
    );
    assert_eq!(proxy.counts_reach(|c| c.forwarded == 2).forwarded, 2);
    node.aether_command("CHECK", &pod, Some(&prev)).ok();

    // The aether-cni plugin talks to the new proxy as to the old one.
    node.del_aether(&pod, &prev).ok();
    assert!(proxy.registered_ids().is_empty());
}

#[test]
fn a_capture_set_update_changes_what_new_connections_hit() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
    );
    node.add_service_ips(&["10.96.0.10", "10.96.0.11"]);
    let server10 = listen_in(node.netns.path(), "10.96.0.10:80");
    let server11 = listen_in(node.netns.path(), "10.96.0.11:80");
    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();
    let pod_ip = ip_of(&prev, false);
    assert_proxied(&dial(&pod, addr("10.96.0.10:80"), &server10), pod_ip);
    assert_direct(&dial(&pod, addr("10.96.0.11:80"), &server11));

    let update = proxy
        .agent
        .update_capture_set(capture_set(2, &["10.96.0.11:80"]));
    assert_eq!(update.updated, std::slice::from_ref(&pod.container_id));
    assert!(update.failed.is_empty(), "{:?}", update.failed);
    assert_eq!(proxy.agent.registered()[0].generation, 2);

    assert_direct(&dial(&pod, addr("10.96.0.10:80"), &server10));
    assert_proxied(&dial(&pod, addr("10.96.0.11:80"), &server11), pod_ip);
    // The rules were not touched, only the set: CHECK compares the rules exactly.
    node.aether_command("CHECK", &pod, Some(&prev)).ok();
    // Nothing to do for a pod that is up to date.
    let again = proxy
        .agent
        .update_capture_set(capture_set(2, &["10.96.0.11:80"]));
    assert!(again.updated.is_empty() && again.failed.is_empty());
}

/// A line each way on an open connection.
fn exchange(app: &mut TcpStream, served: &mut TcpStream) {
    let mut line = [0; 5];
    app.write_all(b"ping\n").unwrap();
    served.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"ping\n");
    served.write_all(b"pong\n").unwrap();
    app.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"pong\n");
}

#[test]
fn a_pod_leaving_the_mesh_keeps_its_open_connections_and_captures_no_new_ones() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
    );
    node.add_service_ips(&["10.96.0.10"]);
    let server = listen_in(node.netns.path(), "10.96.0.10:80");
    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();
    let pod_ip = ip_of(&prev, false);

    // A connection through the proxy, open across the leave.
    let (mut app, mut served) = held(&pod, addr("10.96.0.10:80"), &server);
    assert_ne!(served.peer_addr().unwrap().ip(), pod_ip, "not proxied");

    let left = proxy
        .agent
        .leave(std::slice::from_ref(&pod.container_id), LEAVE_LINGER);
    assert!(left.iter().all(|(_, r)| r.is_ok()), "{left:?}");
    assert!(proxy.registered_ids().is_empty());
    // The open connection goes on (the kernel still translates it); a new one goes direct.
    exchange(&mut app, &mut served);
    assert_direct(&dial(&pod, addr("10.96.0.10:80"), &server));
    assert_eq!(proxy.agent.serving().len(), 1, "the listeners linger");

    // After the linger and the drain, the listeners are closed and the table is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(due) = proxy.agent.finish_leaving() {
        assert!(Instant::now() < deadline, "the pod is still leaving");
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    assert!(proxy.agent.serving().is_empty());
    let table = Nft::default().list_ours(pod.netns.path()).unwrap();
    assert!(
        table.objects.is_empty(),
        "the table is still there: {table:?}"
    );
    assert!(refused_within(pod.netns.path(), addr("127.0.0.1:15001")));
    assert_direct(&dial(&pod, addr("10.96.0.10:80"), &server));
}

/// A captured connection from `pod` that the proxy resets at once: no byte comes back.
fn assert_reset(pod: &Pod) {
    // The reset may come before the app's connect returns.
    let mut app = match connect_from(pod.netns.path(), addr("10.96.0.10:80"), None) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
        connected => connected.unwrap(),
    };
    app.set_read_timeout(Some(TIMEOUT)).unwrap();
    let _ = app.write_all(b"ping\n");
    let mut buf = [0; 1];
    match app.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a connection over the limit was not reset: {other:?}"),
    }
}

#[test]
fn connections_over_a_listeners_or_the_nodes_limit_are_reset_and_others_go_on() {
    require_root();
    let dir = TempDir::new();
    let limits = ConnectionLimits {
        per_listener: 3,
        per_node: 5,
    };
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start_with(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
        limits,
    );
    node.add_service_ips(&["10.96.0.10"]);
    let server = listen_in(node.netns.path(), "10.96.0.10:80");
    let (flood, quiet) = (Pod::new("shop"), Pod::new("shop"));
    node.add(&flood).0.ok();
    node.add(&quiet).0.ok();

    // One pod takes its listener's whole share; its next connection is reset.
    let mut flooding: Vec<_> = (0..3)
        .map(|_| held(&flood, addr("10.96.0.10:80"), &server))
        .collect();
    assert_reset(&flood);
    // Another pod's connections are served, up to what the node has left.
    let quiet_held: Vec<_> = (0..2)
        .map(|_| held(&quiet, addr("10.96.0.10:80"), &server))
        .collect();
    assert_reset(&quiet);
    let counts = proxy.counts_reach(|c| c.failed == 2);
    assert_eq!((counts.accepted, counts.failed), (7, 2));

    // A connection that ends gives its share back.
    drop(flooding.pop());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut app = connect_from(flood.netns.path(), addr("10.96.0.10:80"), None).unwrap();
        app.set_read_timeout(Some(TIMEOUT)).unwrap();
        if let Some(mut served) = accept_within_quickly(&server) {
            served.set_nonblocking(false).unwrap();
            served.set_read_timeout(Some(TIMEOUT)).unwrap();
            exchange(&mut app, &mut served);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed share was not given back"
        );
    }
    drop((flooding, quiet_held));
}

/// A connection accepted within a moment, or `None`.
fn accept_within_quickly(server: &TcpListener) -> Option<TcpStream> {
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        if let Ok((stream, _)) = server.accept() {
            return Some(stream);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn a_registration_behind_the_capture_set_is_brought_up_to_date() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(2, &["10.96.0.11:80"]),
        Some(node.netns.path()),
    );
    node.add_service_ips(&["10.96.0.10", "10.96.0.11"]);
    let server10 = listen_in(node.netns.path(), "10.96.0.10:80");
    let server11 = listen_in(node.netns.path(), "10.96.0.11:80");
    let pod = Pod::new("shop");
    let prev = node.add_primary(&pod);
    let ips = pod_ips(&prev);

    // As if the plugin had asked at generation 1, and the set changed before it registered.
    let spec = TableSpec {
        capture_port: CAPTURE_PORT,
        families: Families::for_pod(&ips),
        strict: None,
    };
    nft::install(
        &Nft::default(),
        pod.netns.path(),
        &spec,
        &[addr("10.96.0.10:80")],
    )
    .unwrap();
    let mut conn = Client::new(proxy.socket(), DEFAULT_TIMEOUT)
        .connect()
        .unwrap();
    let registered = conn.call(&registration(&pod, ips));
    assert_eq!(registered.unwrap(), Response::Registered);
    assert_eq!(proxy.agent.registered()[0].generation, 2);

    assert_direct(&dial(&pod, addr("10.96.0.10:80"), &server10));
    assert_proxied(
        &dial(&pod, addr("10.96.0.11:80"), &server11),
        ip_of(&prev, false),
    );
}

#[test]
fn gc_forgets_pods_the_runtime_no_longer_has_and_closes_their_listeners() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
    );
    let kept = Pod::new("shop");
    let dropped = Pod::new("shop");
    node.add(&kept).0.ok();
    node.add(&dropped).0.ok();
    let mut both = vec![kept.container_id.clone(), dropped.container_id.clone()];
    both.sort();
    assert_eq!(proxy.registered_ids(), both);

    node.gc(&[&kept]).ok();
    assert_eq!(
        proxy.registered_ids(),
        std::slice::from_ref(&kept.container_id)
    );
    let capture = SocketAddr::from(([127, 0, 0, 1], CAPTURE_PORT));
    assert!(refused_within(dropped.netns.path(), capture));
    assert!(connect_from(kept.netns.path(), capture, None).is_ok());

    // The registry on disk says the same: a restart brings back only the kept pod.
    drop(proxy);
    let proxy = TestProxy::start(dir.path(), capture_set(1, &["10.96.0.10:80"]), None);
    assert_eq!(
        proxy.registered_ids(),
        std::slice::from_ref(&kept.container_id)
    );
}

#[test]
fn unmeshed_pods_are_left_alone() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
    );
    node.add_service_ips(&["10.96.0.10"]);
    let server = listen_in(node.netns.path(), "10.96.0.10:80");
    let pod = Pod::new("elsewhere");

    let (run, prev) = node.add(&pod);
    assert_eq!(run.ok().json(), prev, "prevResult passes through unchanged");
    assert!(proxy.registered_ids().is_empty());
    assert_direct(&dial(&pod, addr("10.96.0.10:80"), &server));
    node.aether_command("CHECK", &pod, Some(&prev)).ok();
}

#[test]
fn a_registration_into_a_missing_netns_is_refused_clearly() {
    require_root();
    let dir = TempDir::new();
    let proxy = TestProxy::start(dir.path(), capture_set(1, &["10.96.0.10:80"]), None);
    let mut conn = Client::new(proxy.socket(), DEFAULT_TIMEOUT)
        .connect()
        .unwrap();
    let error = conn
        .call(&Request::Register {
            pod: PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: None,
            },
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: Path::new("/var/run/netns/aether-proxy-test-missing").to_owned(),
            ips: vec!["10.244.1.5".parse().unwrap()],
            generation: 1,
        })
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(
            "refusing to register pod shop/web-0: network namespace /var/run/netns/aether-proxy-test-missing does not exist"
        ),
        "{error}"
    );
    assert!(proxy.registered_ids().is_empty());
    assert_eq!(
        conn.call(&Request::Unregister {
            container_id: "c1".into(),
            ifname: "eth0".into()
        })
        .unwrap(),
        Response::Unregistered { known: false }
    );
}

/// A registration whose network namespace does not hold the addresses it names is refused: the
/// proxy would otherwise serve that namespace's connections as the named pod.
#[test]
fn a_registration_of_addresses_its_netns_does_not_hold_is_refused() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, &TestProxy::socket_in(dir.path()));
    let proxy = TestProxy::start(
        dir.path(),
        capture_set(1, &["10.96.0.10:80"]),
        Some(node.netns.path()),
    );
    let pod = Pod::new("shop");
    let prev = node.add_primary(&pod);
    let held = pod_ips(&prev);
    let mut conn = Client::new(proxy.socket(), DEFAULT_TIMEOUT)
        .connect()
        .unwrap();
    let mut register = |ips: Vec<IpAddr>| conn.call(&registration(&pod, ips));
    let other: IpAddr = "10.244.250.9".parse().unwrap();
    let error = register(vec![held[0], other]).unwrap_err().to_string();
    assert!(
        error.contains(&format!(
            "refusing to register pod {}/{}: network namespace {} does not hold [{other}]",
            pod.namespace,
            pod.name,
            pod.netns.path().display()
        )),
        "{error}"
    );
    assert!(proxy.registered_ids().is_empty());
    assert!(refused_within(
        pod.netns.path(),
        SocketAddr::from(([127, 0, 0, 1], CAPTURE_PORT))
    ));
    assert_eq!(register(held).unwrap(), Response::Registered);
}

/// Only root may talk to the CNI socket, whatever its file mode says: a thread of this test
/// drops to uid 65534 (the raw syscall changes that thread alone), connects to the socket made
/// world-writable, and is answered with an error and dropped; root is still served.
#[test]
fn a_peer_that_is_not_root_is_refused_on_the_cni_socket() {
    require_root();
    let dir = TempDir::new();
    let proxy = TestProxy::start(dir.path(), capture_set(1, &["10.96.0.10:80"]), None);
    let socket = proxy.socket().to_owned();
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let answer = std::thread::spawn(move || {
        // SAFETY: setresuid(2) with plain integers; only this thread's credentials change.
        let dropped = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
        assert_eq!(dropped, 0, "cannot drop to uid 65534");
        ping(&socket, DEFAULT_TIMEOUT).map_err(|e| e.to_string())
    })
    .join()
    .unwrap();
    let error = answer.unwrap_err();
    assert!(
        error.contains("only root may talk to the aether CNI socket; peer uid 65534"),
        "{error}"
    );
    assert_eq!(
        ping(proxy.socket(), DEFAULT_TIMEOUT).unwrap(),
        Response::Pong
    );
}

/// The CNI server serves a bounded number of connections at once, and connections that say
/// nothing hold its slots only until their read timeout: a plugin arriving behind them waits,
/// then is answered, not left waiting for ever.
#[test]
fn silent_connections_cannot_hold_the_cni_server() {
    require_root();
    let dir = TempDir::new();
    let proxy = TestProxy::start(dir.path(), capture_set(1, &["10.96.0.10:80"]), None);
    let silent: Vec<std::os::unix::net::UnixStream> = (0
        ..aether_proxy::inpod::cni_server::MAX_CONNECTIONS)
        .map(|_| std::os::unix::net::UnixStream::connect(proxy.socket()).unwrap())
        .collect();
    let hasty = ping(proxy.socket(), Duration::from_secs(1));
    assert!(
        hasty.is_err(),
        "a connection beyond the bound was served at once: {hasty:?}"
    );
    let patient = aether_proxy::inpod::cni_server::IO_TIMEOUT + Duration::from_secs(5);
    assert_eq!(ping(proxy.socket(), patient).unwrap(), Response::Pong);
    drop(silent);
}

#[test]
fn bad_frames_get_an_error_answer_and_the_server_keeps_serving() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;

    use aether_cni::protocol::{MAX_FRAME_BYTES, decode_response};

    let dir = TempDir::new();
    let proxy = TestProxy::start(dir.path(), capture_set(1, &[]), None);
    let mode = std::fs::metadata(proxy.socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let stream = UnixStream::connect(proxy.socket()).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut answer = |frame: &[u8]| {
        writer.write_all(frame).unwrap();
        let mut line = Vec::new();
        reader.read_until(b'\n', &mut line).unwrap();
        assert_eq!(line.pop(), Some(b'\n'), "no answer to {frame:?}");
        decode_response(&line).unwrap()
    };
    let error_kind = |response: Response| match response {
        Response::Error(reply) => reply.kind,
        other => panic!("not an error: {other:?}"),
    };
    assert_eq!(error_kind(answer(b"garbage\n")), ErrorKind::BadRequest);
    assert_eq!(error_kind(answer(b"\xff\xfe{\n")), ErrorKind::BadRequest);
    assert_eq!(
        error_kind(answer(b"{\"version\":1,\"request\":{\"add\":{}}}\n")),
        ErrorKind::BadRequest
    );
    assert_eq!(
        error_kind(answer(b"{\"version\":2,\"request\":{\"new\":{}}}\n")),
        ErrorKind::UnsupportedVersion
    );
    // The same connection still works.
    assert_eq!(
        answer(b"{\"version\":1,\"request\":\"ping\"}\n"),
        Response::Pong
    );

    // A frame over the limit is answered, then that connection is closed.
    let mut huge = UnixStream::connect(proxy.socket()).unwrap();
    huge.set_read_timeout(Some(TIMEOUT)).unwrap();
    let big = vec![b'x'; MAX_FRAME_BYTES + 2];
    // The server stops reading at the limit, so the rest of the write may fail.
    let _ = huge.write_all(&big);
    let mut line = Vec::new();
    BufReader::new(&huge).read_until(b'\n', &mut line).unwrap();
    line.pop();
    assert_eq!(
        error_kind(decode_response(&line).unwrap()),
        ErrorKind::BadRequest
    );

    // A plugin that connects and says nothing holds no one up.
    let _silent = UnixStream::connect(proxy.socket()).unwrap();
    assert_eq!(
        ping(proxy.socket(), DEFAULT_TIMEOUT).unwrap(),
        Response::Pong
    );
}

#[test]
fn the_socket_of_a_live_proxy_is_never_taken_over() {
    let dir = TempDir::new();
    let proxy = TestProxy::start(dir.path(), capture_set(1, &[]), None);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _runtime = runtime.enter();
    let error = aether_proxy::inpod::cni_server::bind(proxy.socket())
        .err()
        .expect("bound over a live proxy's socket")
        .to_string();
    assert!(error.contains("is another aether-proxy running"), "{error}");

    // A stopped proxy removes its socket; a stale one (a killed proxy's) is replaced.
    let socket = proxy.socket().to_owned();
    drop(proxy);
    assert!(!socket.exists());
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    aether_proxy::inpod::cni_server::bind(&socket).unwrap();

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    let error = aether_proxy::inpod::cni_server::bind(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.ends_with("exists and is not a socket; refusing to replace it"),
        "{error}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}
