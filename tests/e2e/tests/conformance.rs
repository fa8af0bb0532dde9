//! The GAMMA mesh conformance cases end to end, for what the upstream suite leaves unchecked.
//!
//! The upstream suite runs unmodified first (`tests/gateway-conformance/run.sh`, in
//! `tests/run.sh`), with the upstream manifests: every pod runs as the `default`
//! ServiceAccount. Here, with aether installed by Helm and both conformance namespaces opted in,
//! every case of `tests/gateway-conformance/cases.yaml` runs again with one ServiceAccount per
//! version, and is checked as upstream checks it plus what upstream does not: the client
//! identity the backend saw, the redirect `Location`, the path the backend saw. Then a backend
//! endpoint whose pod holds another workload's identity must be refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aether_e2e::echo::{Exchange, deployment_of};
use aether_e2e::mesh::{
    Accounts, CONSISTENCY_TIMEOUT, MESH_NS, TRUST_DOMAIN, client, client_pod, install,
    mesh_workloads, run_client, uninstall, unmesh_workloads, wait_accepted, wait_nodes_applied,
};
use aether_e2e::process::admin_get;
use aether_e2e::{Cluster, node_of, pod_ip};
use aether_test_support::cases::{Case, Cases, RouteRef, Test, Weighted};
use aether_test_support::upstream;
use anyhow::{Context, Result, bail};

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
async fn every_case_with_one_service_account_per_version_and_the_identities_seen() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let cases = Cases::load()?;
    let outcome = run_suite(&cluster, &cases, Accounts::PerVersion).await?;
    refuses_an_identity_outside_the_allowed_set(&cluster).await?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;

    eprintln!(
        "one ServiceAccount per version: {} of {} tests passed",
        outcome.passed.len(),
        cases.tests.len()
    );
    if !outcome.failed.is_empty() {
        let failures: Vec<String> = outcome
            .failed
            .iter()
            .map(|(test, why)| format!("{test}:\n    {}", why.join("\n    ")))
            .collect();
        bail!("conformance failures:\n{}", failures.join("\n"));
    }
    Ok(())
}

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
    let release = upstream::release()?;
    for manifest in &test.manifests {
        cluster.apply(&release.manifest(manifest))?;
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
        let file = release.manifest(manifest);
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
        && body.identity().as_ref() != Some(expected)
    {
        return Err(format!(
            "backend saw client identity {:?}, expected {expected}",
            body.identity()
        ));
    }
    Ok(())
}

/// The weighted split over `total_requests` requests, up to the upstream number of attempts.
async fn run_weighted(
    cluster: &Cluster,
    test: &Test,
    weighted: &Weighted,
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
    let route = RouteRef {
        kind: "HTTPRoute".into(),
        name: "impostor".into(),
        namespace: MESH_NS.into(),
        parent_ref: None,
    };
    wait_accepted(cluster, std::slice::from_ref(&route)).await?;
    wait_nodes_applied(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let deadline = Instant::now() + CONSISTENCY_TIMEOUT;
    let (mut served, mut refused) = (0, 0);
    let args = ["http://impostor/".to_string(), "--count=10".to_string()];
    while served == 0 || refused == 0 {
        // Concurrent clients, so the balancer (which prefers the cheaper endpoint) tries both.
        let runs: Vec<Result<Vec<Exchange>>> = std::thread::scope(|scope| {
            let clients: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| run_client(cluster, &pod, &args)))
                .collect();
            clients
                .into_iter()
                .map(|c| {
                    c.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
                })
                .collect()
        });
        for run in runs {
            for e in &run? {
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
    // The caller's proxy counts each refusal under its reason.
    let (_, metrics) = admin_get(&cluster.node_ip(&node_of(&pod)?)?, "/metrics")?;
    let counted: u64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("aether_proxy_failures_total{")
                && l.contains(r#"direction="outbound""#)
                && l.contains(r#"reason="peer_identity""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    if counted < refused {
        bail!(
            "{refused} requests were refused for the peer's identity, but the proxy counted {counted}"
        );
    }
    eprintln!(
        "an endpoint with an identity outside the allowed set was refused ({refused} refused and counted, {served} served by echo-v1)"
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
