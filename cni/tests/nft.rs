//! The capture table through both ways of running nftables, in real network namespaces.
//! Needs root and nftables.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use aether_cni::nft::{self, Deleted, Drift, Families, Nft, NftError, Strict, TableSpec};
use common::netns::in_netns;
use common::{Netns, require_root, ruleset};

fn backends() -> [Nft; 2] {
    [Nft::default(), Nft::program("nft")]
}

fn spec(capture_port: u16) -> TableSpec {
    TableSpec {
        capture_port,
        families: Families {
            ipv4: true,
            ipv6: true,
        },
        strict: None,
    }
}

fn targets(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|t| t.parse().unwrap()).collect()
}

#[test]
fn libnftables_is_used_when_it_loads() {
    require_root();
    assert!(format!("{:?}", Nft::default()).contains("libnftables"));
}

/// libnftables waits on its netlink socket with select(2), which glibc aborts on for a
/// descriptor of 1024 or more. In a process that holds more (the node proxy with thousands of
/// connections) the library must still work, not take the process down.
#[test]
fn libnftables_works_in_a_process_holding_thousands_of_descriptors() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    require_root();
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let held: Vec<std::fs::File> = (0..1500)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let netns = Netns::new("aetfd");
    let nft = Nft::default();
    let set = targets(&["10.96.0.10:80"]);
    nft::install(&nft, netns.path(), &spec(15001), &set).unwrap();
    assert_eq!(nft::verify(&nft, netns.path(), &spec(15001)).unwrap(), []);
    drop(held);
}

#[test]
fn install_verify_update_and_delete_with_both_backends() {
    require_root();
    for nft in backends() {
        let netns = Netns::new("aet");
        let path = netns.path();
        let first = targets(&["10.96.0.10:80", "[fd00::10]:443"]);

        nft::install(&nft, path, &spec(15001), &first).unwrap();
        nft::install(&nft, path, &spec(15001), &first).unwrap();
        assert_eq!(
            nft::verify(&nft, path, &spec(15001)).unwrap(),
            [],
            "{nft:?}"
        );
        let text = ruleset(&netns);
        assert_eq!(text.matches("table inet aether").count(), 1, "{text}");
        assert!(
            text.contains("10.96.0.10 . 80") && text.contains("fd00::10 . 443"),
            "{text}"
        );

        // A second ADD with another port replaces the table.
        nft::install(&nft, path, &spec(15006), &first).unwrap();
        assert_eq!(
            nft::verify(&nft, path, &spec(15006)).unwrap(),
            [],
            "{nft:?}"
        );

        nft::replace_elements(
            &nft,
            path,
            spec(15006).families,
            &targets(&["10.96.0.20:8080"]),
        )
        .unwrap();
        let text = ruleset(&netns);
        assert!(text.contains("10.96.0.20 . 8080"), "{text}");
        assert!(
            !text.contains("10.96.0.10") && !text.contains("fd00::10"),
            "{text}"
        );
        assert_eq!(nft::verify(&nft, path, &spec(15006)).unwrap(), []);

        assert_eq!(nft::delete(&nft, path).unwrap(), Deleted::Table);
        assert_eq!(nft::delete(&nft, path).unwrap(), Deleted::Table);
        assert_eq!(
            nft::verify(&nft, path, &spec(15006)).unwrap(),
            [Drift::TableMissing]
        );
        let err = nft::replace_elements(&nft, path, spec(15006).families, &[]).unwrap_err();
        assert!(matches!(err, NftError::Failed { .. }), "{err}");

        netns.delete();
        assert_eq!(nft::delete(&nft, path).unwrap(), Deleted::Netns);
        assert!(matches!(
            nft::verify(&nft, path, &spec(15006)),
            Err(NftError::NetnsGone(_))
        ));
    }
}

#[test]
fn a_missing_nft_program_says_what_to_install() {
    require_root();
    let netns = Netns::new("aet");
    let err = nft::install(
        &Nft::program("/nonexistent/nft"),
        netns.path(),
        &spec(15001),
        &[],
    )
    .unwrap_err();
    assert!(matches!(err, NftError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("install nftables"), "{err}");
}

/// `pod` joined to `other` by a veth pair: `pod` has 10.77.N.1, `other` 10.77.N.2.
fn link(pod: &Netns, other: &Netns, n: u8) {
    let peer = other
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let (pod_if, other_if) = (format!("p{n}"), format!("o{n}"));
    pod.ip(&[
        "link", "add", &pod_if, "type", "veth", "peer", "name", &other_if, "netns", &peer,
    ]);
    pod.ip(&["addr", "add", &format!("10.77.{n}.1/24"), "dev", &pod_if]);
    pod.ip(&["link", "set", &pod_if, "up"]);
    other.ip(&["addr", "add", &format!("10.77.{n}.2/24"), "dev", &other_if]);
    other.ip(&["link", "set", &other_if, "up"]);
}

/// A UDP socket bound to `addr` inside `netns`, with a short read timeout.
fn udp(netns: &Netns, addr: &'static str) -> UdpSocket {
    let socket = in_netns(netns.path(), move || UdpSocket::bind(addr).unwrap());
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    socket
}

/// Whether a datagram from `from` (bound inside its netns) to `to` reaches `server`.
fn delivers(from: &UdpSocket, to: &str, server: &UdpSocket) -> bool {
    from.send_to(b"ping", to).unwrap();
    let mut buf = [0; 4];
    server.recv_from(&mut buf).is_ok()
}

/// Whether a TCP connection from inside `netns` to `to` is accepted.
fn connects(netns: &Netns, to: &str) -> bool {
    let to: SocketAddr = to.parse().unwrap();
    in_netns(netns.path(), move || {
        TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok()
    })
}

/// The next connection `listener` accepts within 2 s.
fn accepted(listener: &TcpListener) -> Option<TcpStream> {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok((stream, _)) = listener.accept() {
            stream.set_nonblocking(false).unwrap();
            return Some(stream);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Whether a request with a forged caller identity, sent from `netns` to `to`, reaches the
/// server listening on `server`.
fn request_arrives(netns: &Netns, to: &str, server: &TcpListener) -> bool {
    let to: SocketAddr = to.parse().unwrap();
    let client = in_netns(netns.path(), move || {
        let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok()?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nx-aether-client-identity: spiffe://forged\r\n\r\n")
            .ok()?;
        Some(stream)
    });
    let (Some(_client), Some(mut conn)) = (client, accepted(server)) else {
        return false;
    };
    conn.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    matches!(conn.read(&mut [0; 64]), Ok(n) if n > 0)
}

#[test]
fn strict_mode_refuses_plaintext_but_the_nodes_probes_on_probe_ports() {
    require_root();
    for nft in backends() {
        let pod = Netns::new("aet");
        let other_host = Netns::new("aet");
        let node = Netns::new("aet");
        link(&pod, &other_host, 1);
        link(&pod, &node, 2);
        // The app, the inbound mTLS port, and a server elsewhere the pod dials.
        let listen = |netns: &Netns, addr: &'static str| {
            in_netns(netns.path(), move || TcpListener::bind(addr).unwrap())
        };
        // 8080 is probed by connecting, 8081 with requests.
        let app = listen(&pod, "0.0.0.0:8080");
        let http_app = listen(&pod, "0.0.0.0:8081");
        let _admin = listen(&pod, "0.0.0.0:9000");
        let inbound = listen(&pod, "0.0.0.0:15008");
        // Replies to the probe source go to the pod's gateway, the node.
        pod.ip(&["route", "add", "default", "via", "10.77.2.2"]);
        let _elsewhere = listen(&other_host, "10.77.1.2:9000");

        let strict = TableSpec {
            strict: Some(Strict {
                inbound_port: 15008,
                probe_ports: vec![8080],
                proxied_probe_ports: vec![8081],
            }),
            ..spec(15001)
        };
        nft::install(&nft, pod.path(), &strict, &[]).unwrap();
        assert_eq!(
            nft::verify(&nft, pod.path(), &strict).unwrap(),
            [],
            "{nft:?}"
        );
        assert!(
            !connects(&other_host, "10.77.1.1:8080"),
            "plaintext from another host"
        );
        assert!(
            connects(&other_host, "10.77.1.1:15008"),
            "the inbound mTLS port"
        );
        accepted(&inbound).unwrap();
        // Without the node's table the node's connections keep its own address: refused.
        assert!(!connects(&node, "10.77.2.1:8080"), "the node, untranslated");
        let strict_pods = ["10.77.2.1".parse().unwrap()];
        nft::apply_node_probes(&nft, node.path(), &strict_pods).unwrap();
        assert_eq!(
            nft::verify_node_probes(&nft, node.path(), &strict_pods).unwrap(),
            None
        );
        assert!(
            nft::verify_node_probes(&nft, node.path(), &[])
                .unwrap()
                .is_some(),
            "another set of strict pods is drift"
        );
        assert!(
            connects(&node, "10.77.2.1:8080"),
            "the node's probe of a probe port"
        );
        accepted(&app).unwrap();
        assert!(
            !request_arrives(&node, "10.77.2.1:8080", &app),
            "the node's data, to a port its probes only connect to"
        );
        assert!(
            !connects(&node, "10.77.2.1:9000"),
            "the node, to a port no probe names"
        );
        assert!(
            request_arrives(&node, "10.77.2.1:8081", &inbound),
            "the node's request to a probed port, at the inbound proxy"
        );
        assert!(
            accepted(&http_app).is_none(),
            "the node's request to a probed port, straight to the app"
        );
        assert!(
            !connects(&other_host, "10.77.1.1:8081"),
            "another host, to a port probed with requests"
        );
        assert!(
            !connects(&other_host, "10.77.1.1:8080"),
            "another host, to a probe port"
        );
        // Applying again replaces the table; with no strict pod the node is untranslated.
        nft::apply_node_probes(&nft, node.path(), &[]).unwrap();
        assert!(
            !connects(&node, "10.77.2.1:8080"),
            "the node, with the pod out of its table"
        );
        nft::delete_node_probes(&nft, node.path()).unwrap();
        nft::delete_node_probes(&nft, node.path()).unwrap();
        assert_eq!(
            nft::verify_node_probes(&nft, node.path(), &[])
                .unwrap()
                .as_deref(),
            Some("table inet aether-node is missing")
        );
        assert!(
            connects(&pod, "127.0.0.1:8080"),
            "loopback (the inbound proxy)"
        );
        assert!(
            connects(&pod, "10.77.1.2:9000"),
            "the pod's own connections"
        );
        // UDP is refused from everyone, the node included; the pod's own queries get replies.
        let pod_udp = udp(&pod, "0.0.0.0:5353");
        let (other_udp, node_udp) = (udp(&other_host, "10.77.1.2:0"), udp(&node, "10.77.2.2:0"));
        assert!(
            !delivers(&other_udp, "10.77.1.1:5353", &pod_udp),
            "UDP from another host"
        );
        assert!(
            !delivers(&node_udp, "10.77.2.1:5353", &pod_udp),
            "UDP from the node"
        );
        let resolver = udp(&other_host, "10.77.1.2:53");
        let query = udp(&pod, "10.77.1.1:0");
        assert!(
            delivers(&query, "10.77.1.2:53", &resolver),
            "the pod's query"
        );
        assert!(
            delivers(&resolver, &query.local_addr().unwrap().to_string(), &query),
            "the reply to the pod's own query"
        );

        // Strict mode's chain is drift for a table that should not have it, and back.
        let plain = spec(15001);
        assert!(
            nft::verify(&nft, pod.path(), &plain)
                .unwrap()
                .contains(&Drift::UnexpectedChain("input".into()))
        );
        nft::install(&nft, pod.path(), &plain, &[]).unwrap();
        assert!(
            connects(&other_host, "10.77.1.1:8080"),
            "not strict any more"
        );
        assert!(
            delivers(&other_udp, "10.77.1.1:5353", &pod_udp),
            "UDP, not strict any more"
        );
        assert!(
            nft::verify(&nft, pod.path(), &strict)
                .unwrap()
                .contains(&Drift::ChainMissing("input"))
        );
    }
}
