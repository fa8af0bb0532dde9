//! The fuzz targets' checks (`aether_cni::fuzzing`) on stable Rust in every test run: valid
//! seeds, then seeded random mutations of them (`aether_test_support::fuzz`: bit flips, byte
//! edits, cuts, splices, JSON tokens and the plugin's own). Deterministic, so a failure reproduces; `cargo fuzz` (cni/fuzz) goes further with
//! coverage guidance.

use aether_cni::fuzzing;
use aether_cni::protocol::{
    CapturePlan, Decision, PodRef, Request, Response, StrictPlan, encode_request, encode_response,
};
use aether_test_support::fuzz::{self, JSON_TOKENS};

const ROUNDS: usize = 400_000;

/// JSON tokens, and the names and versions the plugin and the protocol read.
fn tokens() -> Vec<&'static [u8]> {
    let mut tokens = JSON_TOKENS.to_vec();
    tokens.extend([
        b"0.4.0".as_slice(),
        b"1.1.0",
        b"\"cniVersion\"",
        b"\"plugins\"",
        b"\"prevResult\"",
        b"\"version\"",
    ]);
    tokens
}

#[test]
fn the_config_parser_survives_mutated_input() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"cniVersion":"1.1.0","name":"k8s","type":"aether-cni","proxySocket":"/var/run/aether/cni.sock","kubeconfig":"/etc/cni/net.d/aether-cni.kubeconfig","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.244.1.5/24","interface":0}]}}"#,
        r#"{"cniVersion":"0.4.0","name":"k8s","type":"aether-cni"}"#,
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=1234",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let runs = fuzz::run(&seeds, &tokens(), 0x5eed_c0f1, ROUNDS, fuzzing::config);
    eprintln!("config parser: {runs} executions, no crash");
}

#[test]
fn the_protocol_decoder_survives_mutated_input() {
    let pod = PodRef {
        namespace: "shop".into(),
        name: "web-0".into(),
        uid: Some("1234".into()),
    };
    let mut seeds = vec![
        encode_request(&Request::Ping),
        encode_request(&Request::Add {
            pod: pod.clone(),
            container_id: "c1".into(),
            netns: "/var/run/netns/x".into(),
            ips: vec!["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()],
        }),
        encode_request(&Request::Gc {
            valid_container_ids: vec!["a".into(), "b".into()],
        }),
        encode_response(&Response::Decision(Decision::Meshed(CapturePlan {
            capture_port: 15001,
            targets: vec!["10.96.0.10:80".parse().unwrap()],
            generation: 3,
            strict: Some(StrictPlan {
                inbound_port: 15008,
                probe_ports: vec![8080, 9090],
                proxied_probe_ports: vec![8081],
            }),
        }))),
        encode_response(&Response::Pong),
    ];
    // Two frames back to back exercise the framing.
    let both = [seeds[0].clone(), seeds[1].clone()].concat();
    seeds.push(both);
    let runs = fuzz::run(&seeds, &tokens(), 0x5eed_0b07, ROUNDS, fuzzing::protocol);
    eprintln!("protocol decoder: {runs} executions, no crash");
}
