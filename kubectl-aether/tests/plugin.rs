//! `kubectl aether` on the local cluster, run by kubectl itself (found on the PATH as a
//! plugin): `check` passes on a healthy installation and fails with one line naming the
//! problem when a node loses its proxy or a CRD is deleted; `status` shows every node's proxy.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{get_proxy_pods, install, uninstall, wait_nodes_applied};
use anyhow::{Result, bail};
use serde_json::Value;

const NS: &str = "aether-system";

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

    // node-2 loses its proxy: the DaemonSet no longer schedules one there.
    cluster.kubectl(&[
        "-n",
        NS,
        "patch",
        "daemonset",
        "aether-proxy",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"nodeSelector":{"kubernetes.io/hostname":"node-1"}}}}}"#,
    ])?;
    let broken = check_until(
        &cluster,
        1,
        "FAIL node node-2: no aether proxy pod on the node",
    )?;
    if broken.contains("FAIL node node-1") {
        bail!("node-1 kept its proxy, yet check says:\n{broken}");
    }
    cluster.kubectl(&[
        "-n",
        NS,
        "patch",
        "daemonset",
        "aether-proxy",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"nodeSelector":null}}}}"#,
    ])?;
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

    let pods = get_proxy_pods(&cluster, &["-o", "name"])?;
    if pods.lines().count() != 2 {
        bail!("the proxies did not all come back: {pods}");
    }
    uninstall(&cluster).await?;
    Ok(())
}
