//! The real chain (`loopback`, `bridge` + `host-local`, then aether-cni) in real network
//! namespaces, with real nftables. Needs root, nftables and containernetworking-plugins.

mod common;

use std::net::SocketAddr;

use aether_cni::nft::{self, Families, Nft, TableSpec};
use aether_cni::protocol::StrictPlan;
use common::proxy::{ProxyState, TestProxy};
use common::sockets::{accept_within, connect_from, listen_in, original_dst};
use common::{Pod, TempDir, aether_entry, node, require_root, ruleset};
use serde_json::json;

const CAPTURE_PORT: u16 = 15001;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A proxy that meshes namespace `shop` and captures `targets`.
fn proxy(targets: &[&str]) -> TestProxy {
    TestProxy::start(ProxyState {
        managed_namespaces: vec!["shop".into()],
        capture_port: CAPTURE_PORT,
        targets: targets.iter().map(|t| addr(t)).collect(),
        generation: 1,
        ..ProxyState::default()
    })
}

fn hand_nft(pod: &Pod, args: &[&str]) {
    let status = std::process::Command::new("nsenter")
        .arg(format!("--net={}", pod.netns.path().display()))
        .arg("nft")
        .args(args)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn meshed_pod_route_target_connections_land_on_the_capture_listener() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    let node = node(false, aether_entry(proxy.socket()));
    node.add_service_ips(&["10.96.0.10", "10.96.0.11"]);
    let pod = Pod::new("shop");

    let (run, prev) = node.add(&pod);
    assert_eq!(
        run.ok().json(),
        prev,
        "prevResult must pass through unchanged"
    );
    {
        let state = proxy.state();
        let (registered, netns) = &state.registered[&pod.container_id];
        assert_eq!(registered.name, pod.name);
        assert_eq!(netns, pod.netns.path());
    }
    let rules = ruleset(&pod.netns);
    assert!(
        !rules.contains("mark"),
        "no socket is exempt from capture: {rules}"
    );
    assert!(
        rules.contains("ip daddr . tcp dport @capture4 redirect to :15001"),
        "{rules}"
    );
    assert!(
        !rules.contains("capture6"),
        "an IPv4-only pod gets no IPv6 set: {rules}"
    );

    let capture = listen_in(pod.netns.path(), "127.0.0.1:15001");
    let node_80 = listen_in(node.netns.path(), "0.0.0.0:80");
    let node_8080 = listen_in(node.netns.path(), "0.0.0.0:8080");

    let _app = connect_from(pod.netns.path(), addr("10.96.0.10:80"), None).unwrap();
    let captured = accept_within(&capture).expect("the route-target connection was not captured");
    assert_eq!(original_dst(&captured), addr("10.96.0.10:80"));

    let _app = connect_from(pod.netns.path(), addr("10.96.0.11:80"), None).unwrap();
    let other_ip = accept_within(&node_80).expect("another ClusterIP must reach the node");
    assert_eq!(other_ip.local_addr().unwrap(), addr("10.96.0.11:80"));

    let _app = connect_from(pod.netns.path(), addr("10.96.0.10:8080"), None).unwrap();
    let other_port = accept_within(&node_8080).expect("another port must reach the node");
    assert_eq!(other_port.local_addr().unwrap(), addr("10.96.0.10:8080"));

    // No socket mark exempts a connection: an app with CAP_NET_RAW can set any (here the mark
    // that exempted the proxy's sockets in earlier versions, and all bits).
    for mark in [0x0ae7_0000, u32::MAX] {
        let _app = connect_from(pod.netns.path(), addr("10.96.0.10:80"), Some(mark)).unwrap();
        let captured = accept_within(&capture)
            .unwrap_or_else(|| panic!("a connection marked {mark:#x} was not captured"));
        assert_eq!(original_dst(&captured), addr("10.96.0.10:80"));
    }

    node.del(&pod, &prev).ok();
}

#[test]
fn unmeshed_pod_is_untouched() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    let node = node(false, aether_entry(proxy.socket()));
    let pod = Pod::new("elsewhere");

    let (run, prev) = node.add(&pod);
    assert_eq!(run.ok().json(), prev);
    assert!(!ruleset(&pod.netns).contains("aether"));
    let state = proxy.state();
    assert!(state.registered.is_empty());
    assert!(matches!(
        state.requests[..],
        [aether_cni::protocol::Request::Add { .. }]
    ));
}

#[test]
fn add_with_the_proxy_down_fails_closed_and_leaves_no_table() {
    require_root();
    let dir = TempDir::new();
    let socket = dir.path().join("cni.sock");
    let node = node(false, aether_entry(&socket));
    let pod = Pod::new("shop");

    let (run, _) = node.add(&pod);
    assert_eq!(run.error_code(), 11, "{run:?}");
    assert_eq!(
        run.json()["msg"],
        format!(
            "aether node proxy not reachable at {}: is the aether DaemonSet running on this node?",
            socket.display()
        )
    );
    assert!(!ruleset(&pod.netns).contains("aether"));
}

#[test]
fn add_with_the_proxy_and_the_api_server_down_fails_closed() {
    require_root();
    let dir = TempDir::new();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let socket = dir.path().join("cni.sock");
    let node = node(
        false,
        json!({"type": "aether-cni", "proxySocket": socket, "kubeconfig": kubeconfig}),
    );
    let pod = Pod::new("shop");

    let (run, _) = node.add(&pod);
    assert_eq!(run.error_code(), 11, "{run:?}");
    let details = run.json()["details"].as_str().unwrap().to_owned();
    assert!(
        details.contains("API server lookup failed too"),
        "{details}"
    );
    assert!(!ruleset(&pod.netns).contains("aether"));
}

#[test]
fn a_refused_registration_fails_add_and_removes_the_table() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    proxy.state().refuse_register = true;
    let node = node(false, aether_entry(proxy.socket()));
    let pod = Pod::new("shop");

    let (run, _) = node.add(&pod);
    assert_eq!(run.error_code(), 102, "{run:?}");
    let details = run.json()["details"].as_str().unwrap().to_owned();
    assert!(details.contains("nothing was left installed"), "{details}");
    assert!(!ruleset(&pod.netns).contains("aether"));
}

#[test]
fn del_is_idempotent_and_survives_a_missing_netns() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    let node = node(false, aether_entry(proxy.socket()));

    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();
    node.aether_command("DEL", &pod, Some(&prev)).ok();
    assert!(!ruleset(&pod.netns).contains("aether"));
    assert!(!proxy.state().registered.contains_key(&pod.container_id));
    node.aether_command("DEL", &pod, Some(&prev)).ok();

    // DEL without ADD.
    let never_added = Pod::new("shop");
    node.aether_command("DEL", &never_added, None).ok();

    // DEL after the runtime already deleted the netns.
    let gone = Pod::new("shop");
    let (run, prev) = node.add(&gone);
    run.ok();
    gone.netns.delete();
    node.aether_command("DEL", &gone, Some(&prev)).ok();
    assert!(!proxy.state().registered.contains_key(&gone.container_id));

    // DEL without CNI_NETNS at all, which the spec allows.
    let stdin = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "aether-cni",
                       "proxySocket": proxy.socket()});
    node.invoke_with(
        "aether-cni",
        &[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "x1"),
            ("CNI_IFNAME", "eth0"),
        ],
        stdin.to_string().as_bytes(),
    )
    .ok();
}

#[test]
fn del_succeeds_while_the_proxy_is_down() {
    require_root();
    let dir = TempDir::new();
    let node = node(false, aether_entry(&dir.path().join("cni.sock")));
    let pod = Pod::new("shop");
    let prev = node.add_primary(&pod);
    let run = node.aether_command("DEL", &pod, Some(&prev)).ok();
    assert!(run.stderr.contains("next GC"), "{run:?}");
}

#[test]
fn check_passes_on_an_intact_pod_and_reports_a_table_deleted_by_hand() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    let node = node(false, aether_entry(proxy.socket()));
    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();

    node.aether_command("CHECK", &pod, Some(&prev)).ok();

    hand_nft(&pod, &["delete", "table", "inet", "aether"]);
    let run = node.aether_command("CHECK", &pod, Some(&prev));
    assert_eq!(run.error_code(), 101, "{run:?}");
    let details = run.json()["details"].as_str().unwrap().to_owned();
    assert!(
        details.starts_with("table inet aether is missing"),
        "{details}"
    );

    // A rule deleted by hand is named in nft syntax; a lost registration is reported too.
    node.aether_command("ADD", &pod, Some(&prev)).ok();
    hand_nft(&pod, &["flush", "chain", "inet", "aether", "output"]);
    proxy.state().registered.clear();
    let run = node.aether_command("CHECK", &pod, Some(&prev));
    let details = run.json()["details"].as_str().unwrap().to_owned();
    assert!(
        details.contains("rule `ip daddr . tcp dport @capture4 redirect to :15001` is missing"),
        "{details}"
    );
    assert!(details.contains("no registration"), "{details}");
}

#[test]
fn a_strict_plan_installs_strict_mode_and_check_verifies_it() {
    require_root();
    let proxy = TestProxy::start(ProxyState {
        managed_namespaces: vec!["shop".into()],
        capture_port: CAPTURE_PORT,
        targets: vec![addr("10.96.0.10:80")],
        generation: 1,
        strict: Some(StrictPlan {
            inbound_port: 15008,
            probe_ports: vec![8080],
            proxied_probe_ports: vec![8081],
        }),
        ..ProxyState::default()
    });
    let node = node(false, aether_entry(proxy.socket()));
    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();
    let text = ruleset(&pod.netns);
    assert!(text.contains("chain input"), "{text}");
    assert!(text.contains("tcp dport 15008 accept"), "{text}");
    assert!(
        text.contains("ip saddr 169.254.7.127 tcp dport @proxied_probes redirect to :15008"),
        "{text}"
    );
    assert!(
        text.contains("ip saddr 169.254.7.127 tcp dport @probes reject with tcp reset"),
        "{text}"
    );
    assert!(text.contains("elements = { 8080 }"), "{text}");
    assert!(text.contains("elements = { 8081 }"), "{text}");
    node.aether_command("CHECK", &pod, Some(&prev)).ok();

    // Strict mode's refusal deleted by hand is drift.
    hand_nft(&pod, &["flush", "chain", "inet", "aether", "input"]);
    let run = node.aether_command("CHECK", &pod, Some(&prev));
    let details = run.json()["details"].as_str().unwrap().to_owned();
    assert!(
        details.contains("rule `meta l4proto tcp reject with tcp reset` is missing"),
        "{details}"
    );
}

#[test]
fn set_updates_take_effect_for_new_connections() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    let node = node(false, aether_entry(proxy.socket()));
    node.add_service_ips(&["10.96.0.10", "10.96.0.11"]);
    let pod = Pod::new("shop");
    let (run, _) = node.add(&pod);
    run.ok();
    let capture = listen_in(pod.netns.path(), "127.0.0.1:15001");
    let node_80 = listen_in(node.netns.path(), "0.0.0.0:80");

    let _before = connect_from(pod.netns.path(), addr("10.96.0.11:80"), None).unwrap();
    accept_within(&node_80).expect("10.96.0.11:80 is not a route target yet");

    // What the proxy does when route targets change.
    let families = Families {
        ipv4: true,
        ipv6: false,
    };
    nft::replace_elements(
        &Nft::default(),
        pod.netns.path(),
        families,
        &[addr("10.96.0.11:80")],
    )
    .unwrap();

    let _after = connect_from(pod.netns.path(), addr("10.96.0.11:80"), None).unwrap();
    let captured = accept_within(&capture).expect("the new route target was not captured");
    assert_eq!(original_dst(&captured), addr("10.96.0.11:80"));

    let _old = connect_from(pod.netns.path(), addr("10.96.0.10:80"), None).unwrap();
    let released = accept_within(&node_80).expect("the removed route target is still captured");
    assert_eq!(released.local_addr().unwrap(), addr("10.96.0.10:80"));

    let spec = TableSpec {
        capture_port: CAPTURE_PORT,
        families,
        strict: None,
    };
    assert_eq!(
        nft::verify(&Nft::default(), pod.netns.path(), &spec).unwrap(),
        []
    );
}

#[test]
fn ipv6_is_captured_in_a_dual_stack_pod() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80", "[fd00:96::10]:80"]);
    let node = node(true, aether_entry(proxy.socket()));
    node.add_service_ips(&["10.96.0.10", "fd00:96::10", "fd00:96::11"]);
    let pod = Pod::new("shop");
    let (run, prev) = node.add(&pod);
    run.ok();
    assert_eq!(prev["ips"].as_array().unwrap().len(), 2, "{prev}");
    let rules = ruleset(&pod.netns);
    assert!(
        rules.contains("ip6 daddr . tcp dport @capture6 redirect to :15001"),
        "{rules}"
    );

    let capture6 = listen_in(pod.netns.path(), "[::1]:15001");
    let capture4 = listen_in(pod.netns.path(), "127.0.0.1:15001");
    let node_80 = listen_in(node.netns.path(), "[::]:80");

    let _app = connect_from(pod.netns.path(), addr("[fd00:96::10]:80"), None).unwrap();
    let captured = accept_within(&capture6).expect("the IPv6 route target was not captured");
    assert_eq!(original_dst(&captured), addr("[fd00:96::10]:80"));

    let _app = connect_from(pod.netns.path(), addr("10.96.0.10:80"), None).unwrap();
    let captured = accept_within(&capture4).expect("the IPv4 route target was not captured");
    assert_eq!(original_dst(&captured), addr("10.96.0.10:80"));

    let _app = connect_from(pod.netns.path(), addr("[fd00:96::11]:80"), None).unwrap();
    let passed = accept_within(&node_80).expect("another IPv6 ClusterIP must reach the node");
    assert_eq!(passed.local_addr().unwrap(), addr("[fd00:96::11]:80"));

    node.aether_command("CHECK", &pod, Some(&prev)).ok();
}

#[test]
fn gc_and_status_talk_to_the_proxy() {
    require_root();
    let proxy = proxy(&["10.96.0.10:80"]);
    let node = node(false, aether_entry(proxy.socket()));
    let kept = Pod::new("shop");
    let dropped = Pod::new("shop");
    node.add(&kept).0.ok();
    node.add(&dropped).0.ok();

    let conf = |socket: &std::path::Path, extra: serde_json::Value| {
        let mut conf = json!({"cniVersion": "1.1.0", "name": "k8s-pod-network",
                              "type": "aether-cni", "proxySocket": socket});
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        conf.to_string()
    };
    let gc = conf(
        proxy.socket(),
        json!({"cni.dev/valid-attachments": [{"containerID": kept.container_id, "ifname": "eth0"}]}),
    );
    node.invoke_with("aether-cni", &[("CNI_COMMAND", "GC")], gc.as_bytes())
        .ok();
    let registered: Vec<String> = proxy.state().registered.keys().cloned().collect();
    assert_eq!(registered, std::slice::from_ref(&kept.container_id));

    node.invoke_with(
        "aether-cni",
        &[("CNI_COMMAND", "STATUS")],
        conf(proxy.socket(), json!({})).as_bytes(),
    )
    .ok();

    let dir = TempDir::new();
    let absent = dir.path().join("cni.sock");
    let run = node.invoke_with(
        "aether-cni",
        &[("CNI_COMMAND", "STATUS")],
        conf(&absent, json!({})).as_bytes(),
    );
    assert_eq!(run.error_code(), 50, "{run:?}");
    let with_kubeconfig = conf(
        &absent,
        json!({"kubeconfig": "/etc/kubernetes/aether-cni.kubeconfig"}),
    );
    node.invoke_with(
        "aether-cni",
        &[("CNI_COMMAND", "STATUS")],
        with_kubeconfig.as_bytes(),
    )
    .ok();
    let gc = conf(&absent, json!({"cni.dev/valid-attachments": []}));
    let run = node.invoke_with("aether-cni", &[("CNI_COMMAND", "GC")], gc.as_bytes());
    assert_eq!(run.error_code(), 11, "{run:?}");
}
