//! aether as a user meets it, and the GAMMA mesh conformance tests end to end.
//!
//! `helm install` of `charts/aether` into the local cluster, both conformance namespaces opted
//! in with `aether.io/managed=true`, then every test of `shared/conformance/cases.yaml` (the 22
//! mesh tests of Gateway API v1.6.1): apply its manifests, wait until its routes are Accepted
//! and every node applied its config, send each request from the client pod (inside its
//! netns: through the CNI capture, both proxies and mTLS) and check the answer as the upstream
//! harness does, plus what it leaves unchecked (redirect `Location`, the path the backend saw)
//! and the client identity the backend saw. Twice: with the upstream manifests (every pod runs
//! as `default`) and with one ServiceAccount per version. In between, proof that capture
//! happened: with the proxies stopped, route-target requests fail closed, and they work again
//! once the restarted proxies reopen every pod's listeners. Last, `helm uninstall` must leave
//! no aether table in any pod and no aether entry in any node's CNI config.
//!
//! Writes the upstream-format ConformanceReport to `tests/conformance-report.yaml`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aether_e2e::cases::{Case, Cases, Test, deployment_of};
use aether_e2e::{Cluster, conformance_dir, is_ready};
use aether_echo::report::Exchange;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const MESH_NS: &str = "gateway-conformance-mesh";
const CONSUMER_NS: &str = "gateway-conformance-mesh-consumer";
const TRUST_DOMAIN: &str = "cluster.local";
/// As the upstream harness: a case passes after this many successes in a row...
const CONSECUTIVE_SUCCESSES: usize = 3;
/// ...within this time, pausing this long after each failure.
const CONSISTENCY_TIMEOUT: Duration = Duration::from_secs(30);
const FAILURE_DELAY: Duration = Duration::from_secs(1);
const WEIGHT_ATTEMPTS: usize = 10;
const PROXY_PODS: &str = "app.kubernetes.io/name=aether-proxy";

/// How the workloads run: the upstream manifests, or one ServiceAccount per version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Accounts {
    Upstream,
    PerVersion,
}

impl Accounts {
    fn of(self, pod: &str) -> String {
        match self {
            Accounts::Upstream => "default".into(),
            Accounts::PerVersion => deployment_of(pod).to_owned(),
        }
    }
}

#[derive(Debug, Default)]
struct Outcome {
    /// Failed tests with their failures.
    failed: BTreeMap<String, Vec<String>>,
    passed: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aether_passes_every_gamma_mesh_test_end_to_end() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster).await?;
    // Routes left by an earlier run would change what every test sees.
    for ns in [MESH_NS, CONSUMER_NS] {
        cluster.kubectl(&[
            "-n",
            ns,
            "delete",
            "httproutes,grpcroutes",
            "--all",
            "--wait",
        ])?;
    }
    mesh_workloads(&cluster, Accounts::Upstream).await?;
    let cases = Cases::load(&conformance_dir())?;

    let upstream = run_suite(&cluster, &cases, Accounts::Upstream).await?;
    fails_closed_without_proxies(&cluster).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let per_version = run_suite(&cluster, &cases, Accounts::PerVersion).await?;

    let report = conformance_report(&cases, &upstream, &per_version);
    let path = cluster.paths.repo.join("tests/conformance-report.yaml");
    std::fs::write(&path, report).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("conformance report written to {}", path.display());

    uninstall_leaves_nothing(&cluster).await?;
    unmesh_workloads(&cluster)?;

    for (mode, outcome) in [("upstream", &upstream), ("per-version", &per_version)] {
        eprintln!(
            "{mode} ServiceAccounts: {} of {} tests passed",
            outcome.passed.len(),
            cases.tests.len()
        );
    }
    let failures: Vec<String> = [("upstream", &upstream), ("per-version", &per_version)]
        .iter()
        .flat_map(|(mode, o)| {
            o.failed
                .iter()
                .map(move |(test, why)| format!("[{mode}] {test}:\n    {}", why.join("\n    ")))
        })
        .collect();
    if !failures.is_empty() {
        bail!("conformance failures:\n{}", failures.join("\n"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Installing aether and meshing the workloads
// ---------------------------------------------------------------------------------------

async fn install(cluster: &Cluster) -> Result<()> {
    let script = cluster.paths.repo.join("tests/cluster/install.sh");
    let status = std::process::Command::new(&script).status()?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "rollout",
        "status",
        "daemonset/aether-proxy",
        "--timeout=120s",
    ])?;
    Ok(())
}

/// Labels both namespaces managed and (re)starts their workloads under `accounts`, so every
/// pod goes through the CNI chain with aether in it.
async fn mesh_workloads(cluster: &Cluster, accounts: Accounts) -> Result<()> {
    for ns in [MESH_NS, CONSUMER_NS] {
        cluster.kubectl(&[
            "label",
            "namespace",
            ns,
            "aether.io/managed=true",
            "--overwrite",
        ])?;
    }
    let deployments = [
        (MESH_NS, "echo-v1"),
        (MESH_NS, "echo-v2"),
        (CONSUMER_NS, "echo-v1"),
    ];
    for (ns, deployment) in deployments {
        let account = match accounts {
            Accounts::Upstream => "default",
            Accounts::PerVersion => {
                cluster.apply_text(&format!(
                    "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {deployment}\n  namespace: {ns}\n"
                ))?;
                deployment
            }
        };
        let patch = json!({"spec": {"template": {
            // A new value every time, so the pods are recreated (and captured) in any case.
            "metadata": {"annotations": {"aether.io/test-restart": restart_stamp()}},
            "spec": {"serviceAccountName": account},
        }}});
        cluster.kubectl(&[
            "-n",
            ns,
            "patch",
            "deployment",
            deployment,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ])?;
    }
    for (ns, deployment) in deployments {
        cluster.kubectl(&[
            "-n",
            ns,
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            "--timeout=120s",
        ])?;
    }
    for (ns, count) in [(MESH_NS, 2), (CONSUMER_NS, 1)] {
        wait_settled(cluster, ns, count).await?;
    }
    Ok(())
}

fn restart_stamp() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Waits until `ns` has exactly `count` pods, all Ready (old ones of a rollout gone).
async fn wait_settled(cluster: &Cluster, ns: &str, count: usize) -> Result<Vec<Pod>> {
    wait_pods(cluster, ns, "", count).await
}

/// Waits until `ns` has exactly `count` pods matching `selector`, all Ready.
async fn wait_pods(cluster: &Cluster, ns: &str, selector: &str, count: usize) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = api
            .list(&ListParams::default().labels(selector))
            .await?
            .items;
        if pods.len() == count && pods.iter().all(is_ready) {
            return Ok(pods);
        }
        if Instant::now() > deadline {
            bail!("{ns}: expected {count} Ready pods, have {}", pods.len());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---------------------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------------------

async fn run_suite(cluster: &Cluster, cases: &Cases, accounts: Accounts) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    for test in &cases.tests {
        let started = Instant::now();
        let failures = run_test(cluster, test, accounts).await?;
        eprintln!(
            "[{accounts:?}] {} {} ({} ms)",
            test.short_name,
            if failures.is_empty() {
                "passed"
            } else {
                "FAILED"
            },
            started.elapsed().as_millis()
        );
        for failure in &failures {
            eprintln!("    {failure}");
        }
        if failures.is_empty() {
            outcome.passed.push(test.short_name.clone());
        } else {
            outcome.failed.insert(test.short_name.clone(), failures);
        }
    }
    Ok(outcome)
}

/// Runs one test; infrastructure errors are errors, wrong answers are failures.
async fn run_test(cluster: &Cluster, test: &Test, accounts: Accounts) -> Result<Vec<String>> {
    let dir = conformance_dir().join("manifests");
    for manifest in &test.manifests {
        cluster.apply(&dir.join(manifest))?;
    }
    let mut failures = Vec::new();
    if let Err(e) = wait_accepted(cluster, test).await {
        failures.push(format!("routes not accepted: {e:#}"));
    }
    wait_nodes_applied(cluster).await?;
    if failures.is_empty() {
        for case in &test.cases {
            if let Err(why) = run_case(cluster, test, case, accounts).await? {
                failures.push(format!("{}: {why}", case.go_subtest_name));
            }
        }
    }
    if failures.is_empty()
        && let Some(weighted) = &test.weighted
        && let Err(why) = run_weighted(cluster, test, weighted).await?
    {
        failures.push(format!("weighted: {why}"));
    }
    for manifest in test.manifests.iter().rev() {
        let file = dir.join(manifest);
        cluster.kubectl(&["delete", "--wait", "-f", &file.to_string_lossy()])?;
    }
    wait_nodes_applied(cluster).await?;
    Ok(failures)
}

/// Waits until every route of the test has `Accepted=True` from aether on each of its parents.
async fn wait_accepted(cluster: &Cluster, test: &Test) -> Result<()> {
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    for route in &test.routes {
        let resource = format!("{}.gateway.networking.k8s.io", route.kind.to_lowercase());
        loop {
            let text = cluster.kubectl(&[
                "-n",
                &route.namespace,
                "get",
                &resource,
                &route.name,
                "-o",
                "json",
            ])?;
            let object: Value = serde_json::from_str(&text)?;
            let parents = object["status"]["parents"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ours: Vec<&Value> = parents
                .iter()
                .filter(|p| p["controllerName"] == "aether.io/mesh")
                .collect();
            let accepted = !ours.is_empty()
                && ours.iter().all(|p| {
                    p["conditions"].as_array().into_iter().flatten().any(|c| {
                        c["type"] == "Accepted"
                            && c["status"] == "True"
                            && c["observedGeneration"] == object["metadata"]["generation"]
                    })
                });
            if accepted {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} {}/{}: {:?}",
                    route.kind,
                    route.namespace,
                    route.name,
                    ours
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Waits until the operator's per-node configs are stable and every proxy applied its own.
async fn wait_nodes_applied(cluster: &Cluster) -> Result<()> {
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    let mut previous = String::new();
    loop {
        let text = cluster.kubectl(&["get", "nodeconfigs", "-o", "json"])?;
        let list: Value = serde_json::from_str(&text)?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let state: Vec<(Value, Value)> = items
            .iter()
            .map(|i| {
                (
                    i["metadata"]["generation"].clone(),
                    i["status"]["appliedGeneration"].clone(),
                )
            })
            .collect();
        let applied = !items.is_empty() && state.iter().all(|(g, a)| g == a);
        let fingerprint = format!("{state:?}");
        // Applied twice in a row with nothing new: the operator has caught up too.
        if applied && fingerprint == previous {
            return Ok(());
        }
        previous = fingerprint;
        if Instant::now() > deadline {
            bail!("node configs not applied within {CONSISTENCY_TIMEOUT:?}: {state:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The client pod of a case: the first (by name) Ready pod matching its selector.
async fn client_pod(cluster: &Cluster, ns: &str, selector: &str) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let mut pods: Vec<Pod> = api
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods.into_iter()
        .next()
        .with_context(|| format!("no Ready pod {selector} in {ns}"))
}

/// Replaces `<echo-v2-pod-ip>`-style placeholders with the pod's IP.
async fn resolve_placeholders(cluster: &Cluster, text: &str) -> Result<String> {
    let mut out = text.to_owned();
    for version in ["v1", "v2"] {
        let placeholder = format!("<echo-{version}-pod-ip>");
        if out.contains(&placeholder) {
            let pod = client_pod(cluster, MESH_NS, &format!("app=echo,version={version}")).await?;
            let ip = pod
                .status
                .and_then(|s| s.pod_ip)
                .context("pod without IP")?;
            let ip = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip
            };
            out = out.replace(&placeholder, &ip);
        }
    }
    Ok(out)
}

/// Runs the echo client in the client pod's container namespaces.
async fn client(cluster: &Cluster, pod: &Pod, args: &[String]) -> Result<Vec<Exchange>> {
    let program = cluster.program("aether-echo");
    let mut argv = vec![program.to_string_lossy().into_owned(), "client".to_string()];
    argv.extend(args.iter().cloned());
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let output = cluster.exec(pod, "echo", &argv)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    aether_echo::report::parse(&stdout).map_err(|e| {
        anyhow::anyhow!(
            "unreadable client output ({e}): {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn request_args(case: &Case, url: &str) -> Vec<String> {
    let request = &case.request;
    let mut args = vec![url.to_owned()];
    if request.protocol == "http"
        && let Some(method) = &request.method
    {
        args.push(format!("--method={method}"));
    }
    for (name, value) in request.headers.iter().chain(&request.metadata) {
        args.push("-H".into());
        args.push(format!("{name}:{value}"));
    }
    args
}

/// One case with the upstream retry rule. `Err` is an infrastructure error; `Ok(Err)` a failure.
async fn run_case(
    cluster: &Cluster,
    test: &Test,
    case: &Case,
    accounts: Accounts,
) -> Result<Result<(), String>> {
    let who = test.client_of(case);
    let selector = who
        .pod_selector
        .clone()
        .unwrap_or_else(|| "app=echo,version=v1".into());
    let pod = client_pod(cluster, &who.namespace, &selector).await?;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let client_id = format!(
        "spiffe://{TRUST_DOMAIN}/ns/{}/sa/{}",
        who.namespace,
        accounts.of(&pod_name)
    );
    let url = resolve_placeholders(cluster, &case.request.url).await?;
    // A request to a route target goes through the mesh: the backend must see who called.
    let expect_identity = test.targets(&case.request.dial_host);
    let args = request_args(case, &url);
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    let mut streak = 0;
    loop {
        let verdict = match client(cluster, &pod, &args).await {
            Ok(exchanges) => check(case, &exchanges, expect_identity.then_some(&client_id)),
            Err(e) => Err(format!("{e:#}")),
        };
        match verdict {
            Ok(()) => {
                streak += 1;
                if streak == CONSECUTIVE_SUCCESSES {
                    return Ok(Ok(()));
                }
            }
            Err(why) => {
                streak = 0;
                if Instant::now() > deadline {
                    return Ok(Err(why));
                }
                tokio::time::sleep(FAILURE_DELAY).await;
            }
        }
    }
}

/// Checks one exchange as the upstream harness does, and more.
fn check(case: &Case, exchanges: &[Exchange], identity: Option<&String>) -> Result<(), String> {
    let [exchange] = exchanges else {
        return Err(format!("expected one exchange, got {}", exchanges.len()));
    };
    if let Some(error) = &exchange.error {
        return Err(format!("request failed: {error}"));
    }
    let expect = &case.expect;
    let status = exchange.status.unwrap_or_default();
    if !expect.status.contains(&status) {
        return Err(format!(
            "status {status}, expected one of {:?}",
            expect.status
        ));
    }
    let body = &exchange.body;
    if let Some(prefix) = expect
        .backend_pod_prefix
        .as_deref()
        .filter(|p| !p.is_empty())
        && !body.hostname.starts_with(prefix)
    {
        return Err(format!("served by {:?}, expected {prefix}*", body.hostname));
    }
    for (name, value) in &expect.backend_request_headers {
        let seen = body.request_header_values(name).join(",");
        if seen != *value {
            return Err(format!("backend saw {name}: {seen:?}, expected {value:?}"));
        }
    }
    for name in &expect.backend_absent_request_headers {
        if let Some(seen) = body.request_header(name) {
            return Err(format!("backend saw {name}: {seen:?}, expected none"));
        }
    }
    for (name, value) in &expect.response_headers {
        let seen = exchange.response_header(name);
        if seen != Some(value.as_str()) {
            return Err(format!("response {name}: {seen:?}, expected {value:?}"));
        }
    }
    for name in &expect.response_absent_headers {
        if let Some(seen) = exchange.response_header(name) {
            return Err(format!("response {name}: {seen:?}, expected none"));
        }
    }
    // Beyond the upstream harness: the redirect target and the path the backend saw.
    if let Some(redirect) = &expect.intended_redirect_not_asserted {
        let seen = exchange.response_header("location");
        if seen != Some(redirect.location.as_str()) {
            return Err(format!(
                "Location {seen:?}, expected {:?}",
                redirect.location
            ));
        }
    }
    if let Some(path) = &expect.intended_backend_path_not_asserted
        && body.url != *path
    {
        return Err(format!(
            "backend saw path {:?}, expected {path:?}",
            body.url
        ));
    }
    let from_backend = !body.hostname.is_empty();
    if let Some(expected) = identity
        && from_backend
        && body.identity.as_ref() != Some(expected)
    {
        return Err(format!(
            "backend saw client identity {:?}, expected {expected}",
            body.identity
        ));
    }
    Ok(())
}

/// The weighted split over `total_requests` requests, up to the upstream number of attempts.
async fn run_weighted(
    cluster: &Cluster,
    test: &Test,
    weighted: &aether_e2e::cases::Weighted,
) -> Result<Result<(), String>> {
    let who = test
        .client
        .clone()
        .context("weighted test without a client")?;
    let selector = who
        .pod_selector
        .unwrap_or_else(|| "app=echo,version=v1".into());
    let pod = client_pod(cluster, &who.namespace, &selector).await?;
    let mut args = vec![
        weighted.request.url.clone(),
        format!("--count={}", weighted.total_requests),
    ];
    if let Some(method) = &weighted.request.method {
        args.push(format!("--method={method}"));
    }
    let mut last = String::new();
    for _ in 0..WEIGHT_ATTEMPTS {
        let exchanges = match client(cluster, &pod, &args).await {
            Ok(exchanges) => exchanges,
            Err(e) => {
                last = format!("{e:#}");
                continue;
            }
        };
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for exchange in &exchanges {
            *counts
                .entry(deployment_of(&exchange.body.hostname).to_owned())
                .or_default() += 1;
        }
        let total = exchanges.len().max(1) as f64;
        let unexpected: Vec<&String> = counts
            .keys()
            .filter(|b| !weighted.expected_fractions.contains_key(*b))
            .collect();
        let off: Vec<String> = weighted
            .expected_fractions
            .iter()
            .filter_map(|(backend, expected)| {
                let seen = *counts.get(backend).unwrap_or(&0) as f64 / total;
                ((seen - expected).abs() > weighted.tolerance_abs)
                    .then(|| format!("{backend} {seen:.3} (expected {expected})"))
            })
            .collect();
        if exchanges.len() == weighted.total_requests && unexpected.is_empty() && off.is_empty() {
            return Ok(Ok(()));
        }
        last = format!(
            "{} responses, split {counts:?}, off: {off:?}",
            exchanges.len()
        );
    }
    Ok(Err(last))
}

// ---------------------------------------------------------------------------------------
// Capture proof, uninstall
// ---------------------------------------------------------------------------------------

/// With every proxy stopped (their DaemonSet scheduled nowhere), a request to a route target
/// fails: the pod's table still redirects it to a listener that is gone. Without capture it
/// would have reached the Service through kube-proxy. Restarted proxies reopen the listeners
/// of every registered pod, and requests work again.
async fn fails_closed_without_proxies(cluster: &Cluster) -> Result<()> {
    let split = conformance_dir().join("manifests/mesh-split.yaml");
    cluster.apply(&split)?;
    let test = Test {
        short_name: "capture proof".into(),
        description: String::new(),
        features: vec![],
        provisional: false,
        profile_membership: BTreeMap::new(),
        manifests: vec!["mesh-split.yaml".into()],
        routes: vec![aether_e2e::cases::RouteRef {
            kind: "HTTPRoute".into(),
            name: "mesh-split".into(),
            namespace: MESH_NS.into(),
            parent_ref: None,
        }],
        client: None,
        cases: vec![],
        weighted: None,
    };
    wait_accepted(cluster, &test).await?;
    wait_nodes_applied(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let v1 = vec!["http://echo/v1".to_string()];
    let served = client(cluster, &pod, &v1).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("before stopping the proxies, /v1 did not work: {served:?}");
    }

    let park = json!({"spec": {"template": {"spec": {"nodeSelector": {"aether.io/test-parked": "true"}}}}});
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "patch",
        "daemonset",
        "aether-proxy",
        "--type=merge",
        "-p",
        &park.to_string(),
    ])?;
    wait_pods(cluster, "aether-system", PROXY_PODS, 0).await?;
    let failed = client(cluster, &pod, &v1).await;
    let closed = match &failed {
        Err(_) => true,
        Ok(exchanges) => exchanges.first().is_some_and(|e| e.error.is_some()),
    };
    if !closed {
        bail!("with no proxy running, a route-target request still got an answer: {failed:?}");
    }
    eprintln!("with the proxies stopped, a route-target request fails closed");

    let unpark = json!([{"op": "remove", "path": "/spec/template/spec/nodeSelector/aether.io~1test-parked"}]);
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "patch",
        "daemonset",
        "aether-proxy",
        "--type=json",
        "-p",
        &unpark.to_string(),
    ])?;
    cluster.kubectl(&[
        "-n",
        "aether-system",
        "rollout",
        "status",
        "daemonset/aether-proxy",
        "--timeout=120s",
    ])?;
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let again = client(cluster, &pod, &v1).await;
        if let Ok(exchanges) = &again
            && exchanges.first().and_then(|e| e.status) == Some(200)
            && exchanges[0].body.hostname.starts_with("echo-v1")
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("restarted proxies did not serve the registered pod again: {again:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    eprintln!("restarted proxies reopened the listeners of the registered pods");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

async fn uninstall_leaves_nothing(cluster: &Cluster) -> Result<()> {
    let helm = cluster.paths.helm();
    let status = std::process::Command::new(&helm)
        .arg("--kubeconfig")
        .arg(&cluster.paths.kubeconfig)
        .args(["uninstall", "aether", "-n", "aether-system", "--wait"])
        .status()?;
    if !status.success() {
        bail!("helm uninstall failed ({status})");
    }
    wait_settled(cluster, "aether-system", 0).await?;
    let mut leftovers = Vec::new();
    for ns in [MESH_NS, CONSUMER_NS] {
        let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        for pod in api.list(&ListParams::default()).await?.items {
            let netns = Cluster::netns(&pod);
            let listed = std::process::Command::new("ip")
                .args(["netns", "exec"])
                .arg(netns.file_name().unwrap_or_default())
                .args(["nft", "list", "table", "inet", "aether"])
                .output()?;
            if listed.status.success() {
                leftovers.push(format!("table inet aether in pod {:?}", pod.metadata.name));
            }
        }
    }
    let nodes = cluster.paths.state.join("nodes");
    for node in std::fs::read_dir(&nodes)? {
        let conf_dir = node?.path().join("fs/etc/cni/net.d");
        for file in std::fs::read_dir(&conf_dir).into_iter().flatten() {
            let path = file?.path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains("aether-cni") && path.extension().is_some_and(|e| e == "conflist") {
                leftovers.push(format!("aether-cni in {}", path.display()));
            }
        }
    }
    if !leftovers.is_empty() {
        bail!("helm uninstall left aether behind: {leftovers:?}");
    }
    // Pods keep working unmeshed.
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let plain = client(cluster, &pod, &["http://echo/".to_string()]).await?;
    if plain.first().and_then(|e| e.status) != Some(200) {
        bail!("after uninstall, echo is not reachable: {plain:?}");
    }
    eprintln!("helm uninstall left no table in any pod and no entry in any CNI config");
    Ok(())
}

/// Leaves the workloads as `tests/cluster/up.sh` made them, for the tests that run next.
fn unmesh_workloads(cluster: &Cluster) -> Result<()> {
    for ns in [MESH_NS, CONSUMER_NS] {
        cluster.kubectl(&["label", "namespace", ns, "aether.io/managed-"])?;
    }
    for (ns, deployment) in [
        (MESH_NS, "echo-v1"),
        (MESH_NS, "echo-v2"),
        (CONSUMER_NS, "echo-v1"),
    ] {
        let patch = json!({"spec": {"template": {"spec": {"serviceAccountName": "default"}}}});
        cluster.kubectl(&[
            "-n",
            ns,
            "patch",
            "deployment",
            deployment,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ])?;
        cluster.kubectl(&[
            "-n",
            ns,
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            "--timeout=120s",
        ])?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------

/// The upstream `ConformanceReport` (gateway.networking.k8s.io/v1): a test counts as passed
/// only if it passed with both ServiceAccount layouts.
fn conformance_report(cases: &Cases, upstream: &Outcome, per_version: &Outcome) -> String {
    let passed = |name: &str| {
        upstream.passed.iter().any(|t| t == name) && per_version.passed.iter().any(|t| t == name)
    };
    let mut profiles = Vec::new();
    let mut provisional = Vec::new();
    for (profile, spec) in &cases.profiles() {
        let mut core = (0, 0, Vec::new());
        let mut extended = (0, 0, Vec::new());
        for test in &cases.tests {
            let bucket = match test.profile_membership.get(profile).map(String::as_str) {
                Some("core") => &mut core,
                Some("extended") => &mut extended,
                _ => continue,
            };
            if passed(&test.short_name) {
                bucket.0 += 1;
            } else {
                bucket.1 += 1;
                bucket.2.push(test.short_name.clone());
            }
        }
        let result = |b: &(usize, usize, Vec<String>)| {
            json!({
                "result": if b.1 == 0 { "success" } else { "failure" },
                "statistics": {"Passed": b.0, "Failed": b.1, "Skipped": 0},
                "failedTests": b.2,
            })
        };
        let mut extended_result = result(&extended);
        extended_result["supportedFeatures"] = json!(spec.extended_features);
        extended_result["unsupportedFeatures"] = json!([]);
        let summary = format!(
            "Core tests {}, {} of {} passed. Extended tests {}, {} of {} passed.",
            if core.1 == 0 { "succeeded" } else { "failed" },
            core.0,
            core.0 + core.1,
            if extended.1 == 0 {
                "succeeded"
            } else {
                "failed"
            },
            extended.0,
            extended.0 + extended.1
        );
        profiles.push(json!({
            "name": profile,
            "summary": summary,
            "core": result(&core),
            "extended": extended_result,
        }));
    }
    for test in &cases.tests {
        if test.provisional && passed(&test.short_name) {
            provisional.push(test.short_name.clone());
        }
    }
    let not_in_profiles: Vec<Value> = cases
        .tests
        .iter()
        .filter(|t| t.profile_membership.values().all(|m| m == "not-counted"))
        .map(|t| {
            json!({
                "name": t.short_name,
                "result": if passed(&t.short_name) { "success" } else { "failure" },
                "features": t.features,
                "note": "its features are outside the MESH-HTTP and MESH-GRPC sets, so upstream counts it in no profile",
            })
        })
        .collect();
    let report = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "ConformanceReport",
        "date": today(),
        "gatewayAPIVersion": "v1.6.1",
        "gatewayAPIChannel": "standard",
        "implementation": {
            "organization": "aether",
            "project": "aether",
            "url": "charts/aether in this repository",
            "version": env!("CARGO_PKG_VERSION"),
            "contact": [],
        },
        "mode": "default",
        "profiles": profiles,
        "succeededProvisionalTests": provisional,
        "testsOutsideProfiles": not_in_profiles,
        "skippedTests": [],
        "notes": "Run end to end on aether's local cluster (tests/e2e/tests/conformance.rs) twice: with the upstream manifests (every pod as ServiceAccount default) and with one ServiceAccount per version; a test counts as passed only if it passed both times, including the client identity the backend saw.",
    });
    serde_saphyr::to_string(&report).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

fn today() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d")
        .to_string()
}
