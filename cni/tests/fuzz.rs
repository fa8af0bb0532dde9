//! The fuzz targets' checks (`aether_cni::fuzzing`) on stable Rust in every test run: valid
//! seeds, then seeded random mutations of them (bit flips, byte edits, cuts, splices, JSON
//! tokens). Deterministic, so a failure reproduces; `cargo fuzz` (cni/fuzz) goes further with
//! coverage guidance.

use aether_cni::fuzzing;
use aether_cni::protocol::{
    CapturePlan, Decision, PodRef, Request, Response, encode_request, encode_response,
};

const ROUNDS: usize = 400_000;

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"\n",
    b"=",
    b";",
    b"\xff",
    b"0.4.0",
    b"1.1.0",
    b"\"cniVersion\"",
    b"\"plugins\"",
    b"\"prevResult\"",
    b"\"version\"",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = rng.next() as u8;
            }
            2 => out.insert(at, rng.next() as u8),
            3 if at < out.len() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at..end);
            }
            4 => out.truncate(at),
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                let end = (from + rng.below(64)).min(other.len());
                out.splice(at..at, other[from..end].iter().copied());
            }
            _ => {
                let token = TOKENS[rng.below(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
        }
    }
    out
}

/// Runs `check` on every seed, then on `ROUNDS` mutations; returns the number of executions.
fn fuzz(seeds: &[Vec<u8>], seed: u64, check: fn(&[u8])) -> usize {
    let mut rng = Rng(seed);
    for input in seeds {
        check(input);
    }
    let mut current = seeds[0].clone();
    for round in 0..ROUNDS {
        // Mostly keep mutating, sometimes start again from a seed.
        if round % 8 == 0 {
            current = seeds[rng.below(seeds.len())].clone();
        }
        current = mutate(&mut rng, seeds, &current);
        if current.len() > 4096 {
            current.truncate(4096);
        }
        check(&current);
    }
    seeds.len() + ROUNDS
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
    let runs = fuzz(&seeds, 0x5eed_c0f1, fuzzing::config);
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
        }))),
        encode_response(&Response::Pong),
    ];
    // Two frames back to back exercise the framing.
    let both = [seeds[0].clone(), seeds[1].clone()].concat();
    seeds.push(both);
    let runs = fuzz(&seeds, 0x5eed_0b07, fuzzing::protocol);
    eprintln!("protocol decoder: {runs} executions, no crash");
}
