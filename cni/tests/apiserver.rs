//! The API server fallback: with the proxy down, pods the API server says are unmeshed start,
//! meshed ones fail closed. Needs a real API server, so it is ignored by default; run it with
//! `AETHER_KUBECONFIG=… cargo test -p aether-cni --test apiserver -- --ignored` (the local
//! cluster's admin kubeconfig, after `tests/cluster/control-plane.sh up`).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{Node, Pod, TempDir, require_root, ruleset, unique};
use serde_json::json;

fn kubeconfig() -> String {
    std::env::var("AETHER_KUBECONFIG")
        .expect("set AETHER_KUBECONFIG to the kubeconfig of a running API server")
}

fn kubectl(args: &[&str], stdin: Option<&str>) {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kubectl must be on PATH");
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
#[ignore = "needs a running API server; set AETHER_KUBECONFIG and pass --ignored"]
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
    let node = Node::new(
        false,
        json!({"type": "aether-cni", "proxySocket": dir.path().join("cni.sock"),
               "kubeconfig": kubeconfig()}),
    );
    let pod = |namespace: &str, name: &str| {
        let mut pod = Pod::new(namespace);
        pod.name = name.to_owned();
        pod
    };

    for (namespace, name) in [(&plain, "plain"), (&managed, "opted-out")] {
        let pod = pod(namespace, name);
        let (run, prev) = node.add(&pod);
        assert_eq!(run.ok().json(), prev);
        assert!(!ruleset(&pod.netns).contains("aether"));
    }

    let meshed = pod(&managed, "meshed");
    let (run, _) = node.add(&meshed);
    assert_eq!(run.error_code(), 11, "{run:?}");
    let reply = run.json();
    assert!(
        reply["msg"].as_str().unwrap().contains("not reachable"),
        "{reply}"
    );
    assert!(
        reply["details"].as_str().unwrap().contains("is meshed"),
        "{reply}"
    );
    assert!(!ruleset(&meshed.netns).contains("aether"));
}
