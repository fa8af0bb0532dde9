//! `kubectl aether` on the local cluster, run by kubectl itself (found on the PATH as a
//! plugin): `check` passes on a healthy installation and fails with one line naming the
//! problem when a node loses its proxy or a CRD is deleted; `status` shows every node's proxy;
//! `analyze` finds each problem planted in a namespace of its own.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{get_proxy_pods, install, uninstall, wait_nodes_applied};
use anyhow::{Result, bail};
use serde_json::Value;

const NS: &str = "aether-system";
const PLANTED: &str = "e2e-plugin";

/// A meshed namespace with three mistakes: a second RouteTarget for a Service that has one,
/// a backend served by a pod kept out of the mesh, and a route to a Service that does not
/// exist.
fn planted() -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {PLANTED}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: {PLANTED}, labels: {{app: web}}, annotations: {{aether.io/capture: disabled}}}}\n\
         spec:\n  containers:\n  - {{name: shell, image: \"{image}\", command: [sleep, \"86400\"]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {PLANTED}}}\n\
         spec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: aether.io/v1alpha1\nkind: RouteTarget\nmetadata: {{name: first, namespace: {PLANTED}}}\n\
         spec:\n  service: web\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n",
        image = aether_e2e::node::NODE_SHELL_IMAGE,
    )
}

fn second_target() -> String {
    format!(
        "apiVersion: aether.io/v1alpha1\nkind: RouteTarget\nmetadata: {{name: second, namespace: {PLANTED}}}\n\
         spec:\n  service: web\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: lost, namespace: {PLANTED}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: missing, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"
    )
}

/// `kubectl aether ARGS...`, with the plugin's directory first on the PATH.
fn plugin(cluster: &Cluster, args: &[&str]) -> Result<Output> {
    let binary = Path::new(env!("CARGO_BIN_EXE_kubectl-aether"));
    let path = format!(
        "{}:{}",
        binary.parent().expect("a directory").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Ok(Command::new(&cluster.paths.kubectl)
        .arg("aether")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", &cluster.paths.kubeconfig)
        .output()?)
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `check` until its exit code is `code` and its output holds `line`, for up to 90 s.
fn check_until(cluster: &Cluster, code: i32, line: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let output = plugin(cluster, &["check"])?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.code() == Some(code) && stdout.contains(line) {
            return Ok(stdout);
        }
        if Instant::now() > deadline {
            bail!(
                "kubectl aether check never gave exit {code} with {line:?}; last:\n{}",
                text(&output)
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_status_see_what_is_wrong() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    wait_nodes_applied(&cluster).await?;

    let healthy = check_until(&cluster, 0, "every check passed")?;
    for line in [
        "ok   crd authorizationpolicies.aether.io: installed",
        "ok   node proxies: daemonset aether-system/aether-proxy: 2/2 ready",
        "ok   node node-1: proxy 0.1.0 applied generation",
        "ok   node node-2: proxy 0.1.0 applied generation",
    ] {
        if !healthy.contains(line) {
            bail!("a healthy check lacks {line:?}:\n{healthy}");
        }
    }
    let json = plugin(&cluster, &["check", "-o", "json"])?;
    let parsed: Value = serde_json::from_slice(&json.stdout)?;
    if parsed["ok"] != true || parsed["checks"].as_array().is_none_or(Vec::is_empty) {
        bail!("check -o json: {}", text(&json));
    }

    let status = plugin(&cluster, &["status"])?;
    let shown = String::from_utf8_lossy(&status.stdout).into_owned();
    let first = shown.lines().next().unwrap_or_default();
    if !first.starts_with("NODE") || !first.contains("CONFIG (APPLIED/CURRENT)") {
        bail!("status has no header: {}", text(&status));
    }
    for node in ["node-1", "node-2"] {
        let row = shown
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_default();
        if !row.contains("(Ready)") || !row.contains("0.1.0") {
            bail!("status row of {node}: {row:?}\n{}", text(&status));
        }
    }
    let json = plugin(&cluster, &["status", "-o", "json"])?;
    let parsed: Value = serde_json::from_slice(&json.stdout)?;
    if parsed["nodes"].as_array().map(Vec::len) != Some(2) {
        bail!("status -o json: {}", text(&json));
    }
    eprintln!("a healthy installation: check passes, status shows both nodes' proxies");

    // node-2 loses its proxy: the DaemonSet no longer schedules one there. Put back whatever
    // the check found, or helm's next upgrade would keep the selector.
    select_proxy_nodes(&cluster, r#"{"kubernetes.io/hostname":"node-1"}"#)?;
    let broken = node_without_proxy(&cluster);
    select_proxy_nodes(&cluster, "null")?;
    let broken = broken?;
    if broken.contains("FAIL node node-1") {
        bail!("node-1 kept its proxy, yet check says:\n{broken}");
    }
    cluster.rollout_status(NS, "daemonset/aether-proxy")?;
    check_until(&cluster, 0, "every check passed")?;
    eprintln!("a node without its proxy: check fails naming the node, and passes once it is back");

    // A CRD goes missing.
    let crd = "authorizationpolicies.aether.io";
    cluster.kubectl(&["delete", "crd", crd, "--wait"])?;
    check_until(&cluster, 1, &format!("FAIL crd {crd}: missing"))?;
    let manifest = cluster.paths.chart().join(format!("crds/{crd}.yaml"));
    cluster.kubectl(&[
        "apply",
        "--server-side",
        "-f",
        &manifest.display().to_string(),
    ])?;
    check_until(&cluster, 0, "every check passed")?;
    eprintln!("a missing CRD: check fails naming it, and passes once it is back");

    analyze_finds_what_was_planted(&cluster).await?;

    let pods = get_proxy_pods(&cluster, &["-o", "name"])?;
    if pods.lines().count() != 2 {
        bail!("the proxies did not all come back: {pods}");
    }
    uninstall(&cluster).await?;
    Ok(())
}

fn select_proxy_nodes(cluster: &Cluster, selector: &str) -> Result<()> {
    let patch = format!(r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{selector}}}}}}}}}"#);
    cluster.kubectl(&[
        "-n",
        NS,
        "patch",
        "daemonset",
        "aether-proxy",
        "--type",
        "merge",
        "-p",
        &patch,
    ])?;
    Ok(())
}

/// `check` once node-2 has no proxy: fails naming node-2.
fn node_without_proxy(cluster: &Cluster) -> Result<String> {
    // node-1's proxy is replaced too (the template changed): that one must be Ready again.
    cluster.rollout_status(NS, "daemonset/aether-proxy")?;
    check_until(
        cluster,
        1,
        "FAIL node node-2: no aether proxy pod on the node",
    )
}

async fn analyze_finds_what_was_planted(cluster: &Cluster) -> Result<()> {
    cluster.delete_namespaces(&[PLANTED])?;
    cluster.apply_text(&planted())?;
    cluster
        .wait_ready(PLANTED, 1, Duration::from_secs(120))
        .await?;
    // The second RouteTarget comes later, so the first is the older and stays in force.
    std::thread::sleep(Duration::from_secs(2));
    cluster.apply_text(&second_target())?;
    let expected = [
        format!("RouteTarget {PLANTED}/second: conflicts with another RouteTarget"),
        format!(
            "RouteTarget {PLANTED}/first: backend {PLANTED}/web:80 has 1 ready endpoints and none is meshed"
        ),
        format!("HTTPRoute {PLANTED}/lost: attaches nowhere on Service {PLANTED}/missing"),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = plugin(cluster, &["analyze"])?;
        let found = String::from_utf8_lossy(&output.stdout).into_owned();
        let missing: Vec<&String> = expected
            .iter()
            .filter(|e| !found.contains(e.as_str()))
            .collect();
        if missing.is_empty() && output.status.code() == Some(1) {
            break;
        }
        if Instant::now() > deadline {
            bail!("analyze does not find {missing:?}:\n{}", text(&output));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let json = plugin(cluster, &["analyze", "-o", "json"])?;
    let parsed: Value = serde_json::from_slice(&json.stdout)?;
    let ours = parsed["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["object"].as_str().is_some_and(|o| o.contains(PLANTED)))
        .count();
    if ours < expected.len() {
        bail!("analyze -o json: {}", text(&json));
    }
    eprintln!(
        "analyze: the conflicting RouteTarget, the unmeshed backend and the lost route are found"
    );
    cluster.delete_namespaces(&[PLANTED])?;
    Ok(())
}
