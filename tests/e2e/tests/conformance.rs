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

use aether_crds::well_known::{AGENT_NOT_READY_TAINT, MTLS_LABEL, MTLS_STRICT};
use aether_e2e::cases::{Case, Cases, Test, deployment_of};
use aether_e2e::mesh::{
    Accounts, CONSISTENCY_TIMEOUT, CONSUMER_NS, MESH_NS, PROXY_PODS, TRUST_DOMAIN, client,
    client_pod, install, mesh_workloads, uninstall, unmesh_workloads, wait_accepted,
    wait_nodes_applied, wait_pods,
};
use aether_e2e::stream::apply_split;
use aether_e2e::{Cluster, conformance_dir};
use aether_echo::report::Exchange;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// As the upstream harness: a case passes after this many successes in a row...
const CONSECUTIVE_SUCCESSES: usize = 3;
/// ...within `CONSISTENCY_TIMEOUT`, pausing this long after each failure.
const FAILURE_DELAY: Duration = Duration::from_secs(1);
const WEIGHT_ATTEMPTS: usize = 10;

#[derive(Debug, Default)]
struct Outcome {
    /// Failed tests with their failures.
    failed: BTreeMap<String, Vec<String>>,
    passed: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aether_passes_every_gamma_mesh_test_end_to_end() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
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
    repairs_drift(&cluster).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let per_version = run_suite(&cluster, &cases, Accounts::PerVersion).await?;
    refuses_an_identity_outside_the_allowed_set(&cluster).await?;
    strict_mode_refuses_plaintext(&cluster).await?;

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
    if let Err(e) = wait_accepted(cluster, &test.routes).await {
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

/// Replaces `<echo-v2-pod-ip>`-style placeholders with the pod's IP.
async fn resolve_placeholders(cluster: &Cluster, text: &str) -> Result<String> {
    let mut out = text.to_owned();
    for version in ["v1", "v2"] {
        let placeholder = format!("<echo-{version}-pod-ip>");
        if out.contains(&placeholder) {
            let pod = client_pod(cluster, MESH_NS, &format!("app=echo,version={version}")).await?;
            let ip = pod_ip(&pod)?;
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
    let split = apply_split(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let v1 = vec!["http://echo/v1".to_string()];
    let served = client(cluster, &pod, &v1).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("before stopping the proxies, /v1 did not work: {served:?}");
    }

    let park = json!({"spec": {"template": {"spec": {"nodeSelector": {"aether.io/test-parked": "true"}}}}});
    cluster.patch("aether-system", "daemonset/aether-proxy", "merge", &park)?;
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
    // Nodes come up tainted until their proxy can capture pods; the restarted proxies
    // remove the taint.
    let taint = format!("{AGENT_NOT_READY_TAINT}=true:NoSchedule");
    let nodes = cluster.kubectl(&["get", "nodes", "-o", "name"])?;
    for node in nodes.lines().filter_map(|n| n.strip_prefix("node/")) {
        if node.starts_with("node-") {
            cluster.kubectl(&["taint", "nodes", node, &taint, "--overwrite"])?;
        }
    }

    let unpark = json!([{"op": "remove", "path": "/spec/template/spec/nodeSelector/aether.io~1test-parked"}]);
    cluster.patch("aether-system", "daemonset/aether-proxy", "json", &unpark)?;
    cluster.rollout_status("aether-system", "daemonset/aether-proxy")?;
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
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let taints = cluster.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}: {.spec.taints[*].key}{'\\n'}{end}",
        ])?;
        let tainted: Vec<&str> = taints
            .lines()
            .filter(|l| l.contains(AGENT_NOT_READY_TAINT))
            .collect();
        if tainted.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("restarted proxies left the {AGENT_NOT_READY_TAINT} taint: {tainted:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
    eprintln!("restarted proxies removed the {AGENT_NOT_READY_TAINT} taint from their nodes");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

/// A pod's nft table deleted by hand, and aether-cni's entry dropped from a node's CNI
/// config (as another network plugin rewriting its config would), are both put back by the
/// node's proxy, and the pod gets a `CaptureRepaired` Event.
async fn repairs_drift(cluster: &Cluster) -> Result<()> {
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("pod without node")?;
    let netns = Cluster::netns(&pod);
    let netns_name = netns
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let nft = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &netns_name, "nft"])
            .args(args)
            .output()
    };
    if !nft(&["delete", "table", "inet", "aether"])?
        .status
        .success()
    {
        bail!("pod {:?} had no aether table to delete", pod.metadata.name);
    }
    let conflist = cluster
        .paths
        .state
        .join("nodes")
        .join(&node)
        .join("fs/etc/cni/net.d/10-aether-node.conflist");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&conflist)?)?;
    if let Some(plugins) = config["plugins"].as_array_mut() {
        plugins.retain(|p| p["type"] != "aether-cni");
    }
    std::fs::write(&conflist, serde_json::to_vec_pretty(&config)?)?;

    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let table = nft(&["list", "table", "inet", "aether"])?.status.success();
        let chained = std::fs::read_to_string(&conflist)?.contains("aether-cni");
        if table && chained {
            break;
        }
        if Instant::now() > deadline {
            bail!("drift not repaired within 40 s: table {table}, CNI entry {chained}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let events = cluster.kubectl(&[
        "-n",
        MESH_NS,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name},reason=CaptureRepaired"),
        "-o",
        "name",
    ])?;
    if events.trim().is_empty() {
        bail!("no CaptureRepaired Event on pod {name}");
    }
    // And the repaired pod is served through the mesh again.
    let served = client(cluster, &pod, &["http://echo-v2/".to_string()]).await?;
    if served.first().and_then(|e| e.status) != Some(200) {
        bail!("after the repair, echo-v2 is not reachable: {served:?}");
    }
    eprintln!("a deleted pod table and a dropped CNI entry were repaired, with an Event");
    Ok(())
}

/// The status a request to `url` from `from` was answered with; `None` when it got no answer
/// (a refused connection is reported as a failed exchange, or as no output at all).
async fn answered(cluster: &Cluster, from: &Pod, url: &str) -> Option<u16> {
    let exchanges = client(cluster, from, &[url.to_string()]).await;
    exchanges
        .ok()
        .and_then(|e| e.first().and_then(|x| x.status))
}

/// Waits until a request to `url` is answered (`Some(status)`) or refused (`None`).
async fn wait_answer(cluster: &Cluster, from: &Pod, url: &str, want: Option<u16>) -> Result<()> {
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    loop {
        let got = answered(cluster, from, url).await;
        if got == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{url}: expected {want:?}, still {got:?}");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
    }
}

fn pod_ip(pod: &Pod) -> Result<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .with_context(|| format!("pod {:?} has no IP", pod.metadata.name))
}

/// Strict mTLS mode: with the namespace labelled `aether.io/mtls=strict`, plaintext to a
/// meshed pod's IP is refused, for the pods running then (the proxies change their tables)
/// and for a pod created then (the CNI plugin installs it strict), while requests through a
/// route target still arrive over mTLS; removing the label lets plaintext in again.
async fn strict_mode_refuses_plaintext(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    let from = client_pod(cluster, MESH_NS, "app=echo,version=v2").await?;
    let server = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let plaintext = format!("http://{}:8080/", pod_ip(&server)?);
    wait_answer(cluster, &from, &plaintext, Some(200)).await?;

    let label = format!("{MTLS_LABEL}={MTLS_STRICT}");
    cluster.kubectl(&["label", "namespace", MESH_NS, &label, "--overwrite"])?;
    wait_answer(cluster, &from, &plaintext, None).await?;
    wait_answer(cluster, &from, "http://echo/v1", Some(200)).await?;
    eprintln!("strict mode: plaintext into a running meshed pod is refused, mTLS gets through");

    cluster.kubectl(&["-n", MESH_NS, "rollout", "restart", "deployment/echo-v1"])?;
    cluster.rollout_status(MESH_NS, "deployment/echo-v1")?;
    let new = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let new_plaintext = format!("http://{}:8080/", pod_ip(&new)?);
    if let Some(status) = answered(cluster, &from, &new_plaintext).await {
        bail!("a pod created in strict mode answered plaintext with {status}");
    }
    wait_answer(cluster, &from, "http://echo/v1", Some(200)).await?;
    eprintln!("strict mode: a pod created in it refuses plaintext from its first packet");

    cluster.kubectl(&["label", "namespace", MESH_NS, &format!("{MTLS_LABEL}-")])?;
    wait_answer(cluster, &from, &new_plaintext, Some(200)).await?;
    eprintln!("strict mode off: plaintext is let in again");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

/// A backend endpoint whose pod holds another workload's SVID gets no request: the Service
/// `impostor` selects echo-v1 (so only echo-v1's ServiceAccount is allowed), and a hand-made
/// EndpointSlice adds echo-v2's pod to it. Requests the balancer gives to that pod are refused
/// with a 503 naming the identity; the others reach echo-v1; none reaches echo-v2.
async fn refuses_an_identity_outside_the_allowed_set(cluster: &Cluster) -> Result<()> {
    let v2 = client_pod(cluster, MESH_NS, "app=echo,version=v2").await?;
    let v2_ip = pod_ip(&v2)?;
    let manifests = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: impostor, namespace: {MESH_NS}}}\n\
         spec:\n  selector: {{app: echo, version: v1}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata:\n  name: impostor-extra\n  namespace: {MESH_NS}\n\
         \x20 labels: {{kubernetes.io/service-name: impostor, endpointslice.kubernetes.io/managed-by: aether-e2e}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
         endpoints: [{{addresses: [\"{v2_ip}\"], conditions: {{ready: true}}}}]\n\
         ---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata: {{name: impostor, namespace: {MESH_NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: impostor, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: impostor, port: 80}}]}}]\n"
    );
    cluster.apply_text(&manifests)?;
    let route = aether_e2e::cases::RouteRef {
        kind: "HTTPRoute".into(),
        name: "impostor".into(),
        namespace: MESH_NS.into(),
        parent_ref: None,
    };
    wait_accepted(cluster, std::slice::from_ref(&route)).await?;
    wait_nodes_applied(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let pid = cluster.container_pid(&pod, "echo")?.to_string();
    let program = cluster.program("aether-echo");
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    let (mut served, mut refused) = (0, 0);
    while served == 0 || refused == 0 {
        // Concurrent clients, so the balancer (which prefers the cheaper endpoint) tries both.
        let children = (0..4)
            .map(|_| {
                std::process::Command::new("nsenter")
                    .args(["-t", &pid, "-n", "-m", "-u", "--"])
                    .arg(&program)
                    .args(["client", "http://impostor/", "--count=10"])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        for child in children {
            let output = child.wait_with_output()?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            let exchanges = aether_echo::report::parse(&stdout)
                .map_err(|e| anyhow::anyhow!("unreadable client output: {e}"))?;
            for e in &exchanges {
                if e.status == Some(200) && e.body.hostname.starts_with("echo-v1") {
                    served += 1;
                } else if e.status == Some(503)
                    && e.body_lines
                        .iter()
                        .any(|l| l.contains("not one of the allowed identities"))
                {
                    refused += 1;
                } else {
                    bail!(
                        "impostor answered neither from echo-v1 nor with an identity refusal: {e:?}"
                    );
                }
            }
        }
        if Instant::now() > deadline {
            bail!(
                "expected answers from echo-v1 and refusals of echo-v2: {served} served, {refused} refused"
            );
        }
    }
    eprintln!(
        "an endpoint with an identity outside the allowed set was refused ({refused} refused, {served} served by echo-v1)"
    );
    cluster.kubectl(&[
        "-n",
        MESH_NS,
        "delete",
        "httproute/impostor",
        "endpointslice/impostor-extra",
        "service/impostor",
        "--wait",
    ])?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

async fn uninstall_leaves_nothing(cluster: &Cluster) -> Result<()> {
    uninstall(cluster).await?;
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
