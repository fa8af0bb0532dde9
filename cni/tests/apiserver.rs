//! The API server fallback: with the proxy down, pods of namespaces the API server says are
//! unmanaged start; the others fail closed, opted-out ones too (the plugin reads no pod). Runs against the local cluster's real API server (started by
//! `tests/run.sh`, or here through the e2e test API when it is not running).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{Pod, TempDir, node, require_root, ruleset, unique};
use serde_json::json;

/// The local cluster, started once for this test binary if it is not running.
fn cluster() -> &'static aether_e2e::Paths {
    static PATHS: std::sync::OnceLock<aether_e2e::Paths> = std::sync::OnceLock::new();
    PATHS.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
        runtime
            .block_on(aether_e2e::Cluster::get())
            .expect("the local cluster runs")
            .paths
    })
}

fn kubeconfig() -> String {
    cluster().kubeconfig.to_string_lossy().into_owned()
}

fn kubectl(args: &[&str], stdin: Option<&str>) {
    let mut child = Command::new(&cluster().kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("the local cluster's kubectl runs");
    if let Some(stdin) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "kubectl {args:?}");
}

/// Namespaces created for the test, deleted on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(kubeconfig())
                .args(["delete", "namespace", ns, "--wait=false"])
                .stdout(Stdio::null())
                .status();
        }
    }
}

/// A pod object bound to a node that does not exist, so nothing ever runs it.
fn create_pod(namespace: &str, name: &str, annotations: serde_json::Value) {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "annotations": annotations},
        "spec": {"nodeName": "aether-cni-test-no-such-node",
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    });
    kubectl(&["create", "-f", "-"], Some(&pod.to_string()));
}

#[test]
fn with_the_proxy_down_the_api_server_decides() {
    require_root();
    let managed = unique("aether-cni-managed-");
    let plain = unique("aether-cni-plain-");
    let _cleanup = Namespaces(vec![managed.clone(), plain.clone()]);
    for ns in [&managed, &plain] {
        kubectl(&["create", "namespace", ns], None);
    }
    kubectl(
        &["label", "namespace", &managed, "aether.io/managed=true"],
        None,
    );
    create_pod(&managed, "meshed", json!({}));
    create_pod(
        &managed,
        "opted-out",
        json!({"aether.io/capture": "disabled"}),
    );
    create_pod(&plain, "plain", json!({}));

    let dir = TempDir::new();
    let node = node(
        false,
        json!({"type": "aether-cni", "proxySocket": dir.path().join("cni.sock"),
               "kubeconfig": kubeconfig()}),
    );
    let pod = |namespace: &str, name: &str| {
        let mut pod = Pod::new(namespace);
        pod.name = name.to_owned();
        pod
    };

    let plain = pod(&plain, "plain");
    let (run, prev) = node.add(&plain);
    assert_eq!(run.ok().json(), prev);
    assert!(!ruleset(&plain.netns).contains("aether"));

    for name in ["meshed", "opted-out"] {
        let held = pod(&managed, name);
        let (run, _) = node.add(&held);
        assert_eq!(run.error_code(), 11, "{run:?}");
        let reply = run.json();
        assert!(
            reply["msg"].as_str().unwrap().contains("not reachable"),
            "{reply}"
        );
        assert!(
            reply["details"]
                .as_str()
                .unwrap()
                .contains("is in a managed namespace"),
            "{reply}"
        );
        assert!(!ruleset(&held.netns).contains("aether"));
    }
}
