//! ADD latency of the CNI chain with and without aether-cni, over 100 pods each, with the
//! real plugins in real network namespaces (root needed). Prints median and p99.
//!
//! `cargo bench -p aether-cni --bench add_latency`

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use aether_cni::nft::{self, Families, Nft, TableSpec};
use common::proxy::{ProxyState, TestProxy};
use common::{AETHER_CNI, Netns, Pod, aether_entry, node, require_root, run_here};

const PODS: usize = 100;
/// A mesh of 100 route targets with two ports each.
const TARGETS: usize = 200;

fn main() {
    // `cargo test --benches` runs this with --test-like flags; the figures need `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    require_root();
    // 100 ClusterIPs, each with ports 80 and 8080.
    let targets: Vec<SocketAddr> = (0..TARGETS)
        .map(|i| SocketAddr::from(([10, 96, 0, (i / 2) as u8 + 1], [80, 8080][i % 2])))
        .collect();
    let proxy = TestProxy::start(ProxyState {
        managed_namespaces: vec!["shop".into()],
        capture_port: 15001,
        targets: targets.clone(),
        generation: 1,
        ..ProxyState::default()
    });
    let mut node = node(false, aether_entry(proxy.socket()));
    node.ipv4_subnet = "10.244.0.0/16".into();

    let mut primary = Vec::new();
    for _ in 0..PODS {
        let pod = Pod::new("shop");
        let started = Instant::now();
        node.add_primary(&pod);
        primary.push(started.elapsed());
    }

    let (mut full, mut aether_meshed) = (Vec::new(), Vec::new());
    for _ in 0..PODS {
        let pod = Pod::new("shop");
        let started = Instant::now();
        let prev = node.add_primary(&pod);
        let aether_started = Instant::now();
        node.add_aether(&pod, &prev).ok();
        aether_meshed.push(aether_started.elapsed());
        full.push(started.elapsed());
    }

    let mut aether_unmeshed = Vec::new();
    for _ in 0..PODS {
        let pod = Pod::new("elsewhere");
        let prev = node.add_primary(&pod);
        let started = Instant::now();
        node.add_aether(&pod, &prev).ok();
        aether_unmeshed.push(started.elapsed());
    }

    // The parts of a meshed ADD: starting a process at all, starting the plugin, one table
    // install each way.
    let start_time = |program: &str| {
        (0..PODS)
            .map(|_| {
                let started = Instant::now();
                run_here(Path::new(program), &[("CNI_COMMAND", "VERSION")], b"{}").ok();
                started.elapsed()
            })
            .collect::<Vec<_>>()
    };
    let true_start = start_time("/bin/true");
    let plugin_start = start_time(AETHER_CNI);
    let spec = TableSpec {
        capture_port: 15001,
        families: Families {
            ipv4: true,
            ipv6: false,
        },
        strict: None,
    };
    let install_time = |nft: &Nft| {
        (0..PODS)
            .map(|_| {
                let netns = Netns::new("aeb");
                let started = Instant::now();
                nft::install(nft, netns.path(), &spec, &targets).unwrap();
                started.elapsed()
            })
            .collect::<Vec<_>>()
    };
    let via_library = install_time(&Nft::default());
    let via_program = install_time(&Nft::program("nft"));

    println!("ADD latency over {PODS} pods each (capture set: {TARGETS} ClusterIP:ports)");
    println!("{:<48} {:>9} {:>9}", "", "median", "p99");
    report("chain without aether (loopback, bridge)", primary);
    report("chain with aether, meshed pod", full);
    report("aether-cni ADD alone, meshed pod", aether_meshed);
    report("aether-cni ADD alone, unmeshed pod", aether_unmeshed);
    report("process start baseline (/bin/true)", true_start);
    report("aether-cni process start (VERSION)", plugin_start);
    report("table install, libnftables in-process", via_library);
    report("table install, `nft` program (fork+exec)", via_program);
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!("{what:<48} {:>7.2}ms {:>7.2}ms", ms(at(0.5)), ms(at(0.99)));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
