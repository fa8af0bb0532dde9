//! The `aether-proxy run` binary: serving the plugin's socket, signals, and clear start-up errors.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aether_cni::protocol::{Client, DEFAULT_TIMEOUT, PodRef, Request, Response};
use common::TempDir;

const PROXY: &str = env!("CARGO_BIN_EXE_aether-proxy");

fn start(dir: &Path, extra: &[&str]) -> Child {
    Command::new(PROXY)
        .args(["run", "--node", "node-1", "--cni-socket"])
        .arg(dir.join("cni.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--admin-addr", "127.0.0.1:0"])
        .arg("--handover-socket")
        .arg(dir.join("handover.sock"))
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn serves_the_plugin_reloads_the_capture_set_and_stops_on_sigterm() {
    let dir = TempDir::new();
    let capture = dir.path().join("capture.json");
    std::fs::write(
        &capture,
        r#"{"generation": 1, "targets": ["10.96.0.10:80"]}"#,
    )
    .unwrap();
    let mut proxy = start(dir.path(), &["--capture-set", capture.to_str().unwrap()]);
    let socket = dir.path().join("cni.sock");
    wait_for(&socket);

    let mut conn = Client::new(&socket, DEFAULT_TIMEOUT).connect().unwrap();
    assert_eq!(conn.call(&Request::Ping).unwrap(), Response::Pong);
    // Without a view of the cluster it cannot say whether a pod is meshed, and says so.
    let add = conn.call(&Request::Add {
        pod: PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: None,
        },
        container_id: "c1".into(),
        netns: "/var/run/netns/x".into(),
        ips: vec![],
    });
    let error = add.unwrap_err().to_string();
    assert!(
        error.contains("NotReady") && error.contains("runs without the cluster"),
        "{error}"
    );
    drop(conn);

    // SIGHUP re-reads the file; a bad file keeps the current set and the proxy running.
    std::fs::write(
        &capture,
        r#"{"generation": 2, "targets": ["10.96.0.11:80"]}"#,
    )
    .unwrap();
    signal(&proxy, "HUP");
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&capture, "not json").unwrap();
    signal(&proxy, "HUP");
    std::thread::sleep(Duration::from_millis(300));
    let mut conn = Client::new(&socket, DEFAULT_TIMEOUT).connect().unwrap();
    assert_eq!(conn.call(&Request::Ping).unwrap(), Response::Pong);
    drop(conn);

    signal(&proxy, "TERM");
    let status = proxy.wait().unwrap();
    let log = stderr_of(&mut proxy);
    assert!(status.success(), "{status}: {log}");
    assert!(!socket.exists(), "the socket is removed at shutdown");
    assert!(
        log.contains("applied the capture set generation=2"),
        "{log}"
    );
    assert!(log.contains("keeping the current capture set"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}

#[test]
fn bad_settings_fail_at_start_with_a_clear_error() {
    let dir = TempDir::new();
    let missing = dir.path().join("missing.json");
    let mut proxy = start(dir.path(), &["--capture-set", missing.to_str().unwrap()]);
    let status = proxy.wait().unwrap();
    let log = stderr_of(&mut proxy);
    assert!(!status.success());
    assert!(
        log.contains(&format!("cannot read capture set {}", missing.display())),
        "{log}"
    );

    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/registry.json"), "{").unwrap();
    let capture = dir.path().join("capture.json");
    std::fs::write(&capture, r#"{"generation": 1, "targets": []}"#).unwrap();
    let mut proxy = start(dir.path(), &["--capture-set", capture.to_str().unwrap()]);
    let status = proxy.wait().unwrap();
    let log = stderr_of(&mut proxy);
    assert!(!status.success());
    assert!(log.contains("is unreadable"), "{log}");

    let out = Command::new(PROXY)
        .args(["run", "--node", "n", "--capture-port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--capture-port"),
        "{out:?}"
    );
}
