//! The binary's CNI error replies and VERSION, as a runtime sees them. No root needed.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const AETHER_CNI: &str = env!("CARGO_BIN_EXE_aether-cni");

fn run(env: &[(&str, &str)], stdin: &str) -> (bool, Value) {
    let mut child = Command::new(AETHER_CNI)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The plugin rejects a bad environment before reading stdin, so the pipe may be closed.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {out:?}"));
    (out.status.success(), json)
}

fn error_code(env: &[(&str, &str)], stdin: &str) -> (u64, Value) {
    let (success, reply) = run(env, stdin);
    assert!(!success, "{reply}");
    assert!(
        reply["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "{reply}"
    );
    assert!(reply["details"].is_string(), "{reply}");
    (reply["code"].as_u64().unwrap(), reply)
}

const ADD_ENV: [(&str, &str); 5] = [
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "Container1"),
    ("CNI_NETNS", "/var/run/netns/none"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/usr/lib/cni"),
];

fn config(version: &str) -> String {
    json!({"cniVersion": version, "name": "k8s", "type": "aether-cni",
           "prevResult": {"cniVersion": version, "ips": []}})
    .to_string()
}

#[test]
fn version_lists_exactly_what_is_supported() {
    let (success, reply) = run(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.1.0"}"#);
    assert!(success);
    assert_eq!(
        reply,
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn malformed_stdin_is_a_decoding_failure() {
    for stdin in ["", "{", "not json", "{\"cniVersion\": \"1.0.0\",}"] {
        assert_eq!(error_code(&ADD_ENV, stdin).0, 6, "{stdin:?}");
    }
}

#[test]
fn missing_env_vars_are_invalid_env() {
    for missing in ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        let env: Vec<_> = ADD_ENV
            .iter()
            .copied()
            .filter(|(k, _)| *k != missing)
            .collect();
        let (code, reply) = error_code(&env, &config("1.0.0"));
        assert_eq!(code, 4, "{missing}: {reply}");
        assert!(reply["msg"].as_str().unwrap().contains(missing), "{reply}");
    }
    let mut env = ADD_ENV.to_vec();
    env[0] = ("CNI_COMMAND", "UPDATE");
    assert_eq!(error_code(&env, &config("1.0.0")).0, 4);
}

#[test]
fn a_wrong_cni_version_is_incompatible() {
    let (code, reply) = error_code(&ADD_ENV, &config("0.3.1"));
    assert_eq!(code, 1);
    assert_eq!(reply["cniVersion"], "0.3.1");
    let (code, _) = error_code(&[("CNI_COMMAND", "STATUS")], &config("1.0.0"));
    assert_eq!(code, 1, "STATUS needs a 1.1.0 config");
}

#[test]
fn a_config_of_the_wrong_shape_is_invalid_config() {
    let stdin =
        json!({"cniVersion": "1.0.0", "name": "k8s", "type": "aether-cni", "kubeconfig": 5});
    assert_eq!(error_code(&ADD_ENV, &stdin.to_string()).0, 7);
}
