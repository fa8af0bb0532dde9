//! HTTPRoute timeouts, retries (with their budget), request mirrors and passive health on the
//! local cluster, with the Istio echo server's `delay` and `codes` controls. A meshed client on
//! node-1 calls Services of pods on node-2:
//!
//! - `healthy` (one echo pod): `timeouts.request` gives 504 in the stated time over HTTP/1.1
//!   and HTTP/2, `0s` disables it, and `backendRequest` limits each attempt, retried; an app
//!   answering 503 a quarter of the time is seen by the client without a retry, and never with
//!   `retry: {codes: [503]}`;
//! - `flaky` (the healthy pod and `broken-a`, whose app does not listen on the Service's port):
//!   a retried call that met `broken-a` is retried at the healthy pod;
//! - `down` (only `broken-a`): an outage; the retry budget holds retries to a fifth of the
//!   requests plus a small floor, where the route asks for three per request;
//! - `primary` mirrors to `mirror`: the mirror pod gets a copy, the client the primary's answer;
//! - `mixed` (`steady`, a healthy pod of its own, and `broken-b`), no route: `broken-b` is
//!   ejected after failing in a row, and then every call reaches `steady`;
//! - invalid retry values: `Accepted=False` naming the field, or the API server's refusal, and
//!   the other routes keep working.

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::echo::Exchange;
use aether_e2e::mesh::{ECHO_IMAGE, client, install, uninstall, wait_accepted, wait_nodes_applied};
use aether_e2e::process::admin_get;
use aether_test_support::cases::RouteRef;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::Value;

const NS: &str = "e2e-resilience";

fn pod(name: &str, node: &str, labels: &str, args: &str, probe_port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}, labels: {{{labels}}}}}\n\
         spec:\n  nodeName: {node}\n  containers:\n  - name: echo\n    image: \"{ECHO_IMAGE}\"\n\
         \x20   args: [{args}]\n    readinessProbe: {{tcpSocket: {{port: {probe_port}}}, periodSeconds: 2}}\n---\n"
    )
}

fn service(name: &str, selector: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  selector: {{{selector}}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n"
    )
}

fn route(name: &str, rules: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: {name}, port: 80}}]\n  rules:\n{rules}---\n"
    )
}

fn workloads() -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, labels: {{aether.io/managed: \"true\"}}}}\n---\n"
    );
    out += &pod("client", "node-1", "app: client", "--port=8080", 8080);
    out += &pod(
        "healthy",
        "node-2",
        "healthy: \"yes\", flaky: \"yes\"",
        "--port=8080",
        8080,
    );
    // Ready (their probe port answers) but nothing listens on the Services' target port.
    out += &pod(
        "broken-a",
        "node-2",
        "flaky: \"yes\", down: \"yes\"",
        "--port=8081",
        8081,
    );
    out += &pod("broken-b", "node-2", "mixed: \"yes\"", "--port=8081", 8081);
    out += &pod("mirror", "node-2", "mirror: \"yes\"", "--port=8080", 8080);
    // Its own healthy pod: the calls above that `healthy` answers 503 by design may eject it.
    out += &pod("steady", "node-2", "mixed: \"yes\"", "--port=8080", 8080);
    for (name, selector) in [
        ("healthy", "healthy: \"yes\""),
        ("flaky", "flaky: \"yes\""),
        ("down", "down: \"yes\""),
        ("mixed", "mixed: \"yes\""),
        ("primary", "healthy: \"yes\""),
        ("mirror", "mirror: \"yes\""),
    ] {
        out += &service(name, selector);
    }
    out += &route(
        "healthy",
        "  - matches: [{path: {type: PathPrefix, value: /limited}}]\n\
         \x20   timeouts: {request: 1s}\n    backendRefs: [{name: healthy, port: 80}]\n\
         \x20 - matches: [{path: {type: PathPrefix, value: /unlimited}}]\n\
         \x20   timeouts: {request: 0s}\n    backendRefs: [{name: healthy, port: 80}]\n\
         \x20 - matches: [{path: {type: PathPrefix, value: /attempts}}]\n\
         \x20   timeouts: {request: 10s, backendRequest: 500ms}\n    retry: {attempts: 2, backoff: 100ms}\n\
         \x20   backendRefs: [{name: healthy, port: 80}]\n\
         \x20 - matches: [{path: {type: PathPrefix, value: /retried}}]\n\
         \x20   retry: {codes: [503], attempts: 10, backoff: 10ms}\n    backendRefs: [{name: healthy, port: 80}]\n\
         \x20 - backendRefs: [{name: healthy, port: 80}]\n",
    );
    out += &route(
        "flaky",
        "  - matches: [{path: {type: PathPrefix, value: /retried}}]\n\
         \x20   retry: {codes: [503], attempts: 3, backoff: 10ms}\n    backendRefs: [{name: flaky, port: 80}]\n\
         \x20 - backendRefs: [{name: flaky, port: 80}]\n",
    );
    out += &route(
        "down",
        "  - retry: {codes: [503], attempts: 3, backoff: 10ms}\n    backendRefs: [{name: down, port: 80}]\n",
    );
    out += &route(
        "primary",
        "  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: mirror, port: 80}}}]\n\
         \x20   backendRefs: [{name: primary, port: 80}]\n",
    );
    out
}

fn route_ref(name: &str) -> RouteRef {
    RouteRef {
        kind: "HTTPRoute".into(),
        namespace: NS.into(),
        name: name.into(),
        parent_ref: None,
    }
}

async fn call(cluster: &Cluster, from: &Pod, url: &str, extra: &[&str]) -> Result<Vec<Exchange>> {
    let mut args = vec![url.to_owned(), "--timeout=30s".to_owned()];
    args.extend(extra.iter().map(|a| a.to_string()));
    client(cluster, from, &args).await
}

/// One call and how long the client waited for it (with `kubectl exec`'s own time).
async fn timed(
    cluster: &Cluster,
    from: &Pod,
    url: &str,
    extra: &[&str],
) -> Result<(u16, Duration)> {
    let started = Instant::now();
    let exchanges = call(cluster, from, url, extra).await?;
    let status = exchanges
        .first()
        .and_then(|e| e.status)
        .with_context(|| format!("{url}: no status in {exchanges:?}"))?;
    Ok((status, started.elapsed()))
}

fn statuses(exchanges: &[Exchange]) -> Vec<u16> {
    exchanges.iter().map(|e| e.status.unwrap_or(0)).collect()
}

/// The sum of a counter of node-1's proxy (the client's) over the series whose labels include
/// every one of `labels`.
fn counter(cluster: &Cluster, name: &str, labels: &[&str]) -> Result<f64> {
    let (_, text) = admin_get(&cluster.node_ip("node-1")?, "/metrics")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

fn retries(cluster: &Cluster, route: &str, outcome: &str) -> Result<f64> {
    counter(
        cluster,
        "aether_proxy_retries_total{",
        &[
            &format!("route=\"HTTPRoute/{NS}/{route}\""),
            &format!("outcome=\"{outcome}\""),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_retries_mirrors_and_ejection() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&workloads())?;
    cluster.wait_ready(NS, 6, Duration::from_secs(120)).await?;
    let routes: Vec<RouteRef> = ["healthy", "flaky", "down", "primary"]
        .into_iter()
        .map(route_ref)
        .collect();
    wait_accepted(&cluster, &routes).await?;
    wait_nodes_applied(&cluster).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let from = pods.get("client").await.context("the client pod")?;

    timeouts(&cluster, &from).await?;
    retry_reaches_a_healthy_endpoint(&cluster, &from).await?;
    budget_holds_during_an_outage(&cluster, &from).await?;
    mirror_gets_a_copy(&cluster, &from, &pods).await?;
    failing_endpoint_is_ejected(&cluster, &from).await?;
    invalid_retry_values(&cluster, &from).await?;

    cluster.delete_namespaces(&[NS])?;
    uninstall(&cluster).await?;
    Ok(())
}

async fn timeouts(cluster: &Cluster, from: &Pod) -> Result<()> {
    let (status, took) = timed(cluster, from, "http://healthy/fast", &[]).await?;
    if status != 200 {
        bail!("a call with no timeout got {status} in {took:?}");
    }
    for protocol in [&[][..], &["--http2"][..]] {
        let (status, took) =
            timed(cluster, from, "http://healthy/limited?delay=4s", protocol).await?;
        // 1 s of timeout, and kubectl exec's own overhead; the backend would take 4 s.
        if status != 504 || took < Duration::from_millis(950) || took > Duration::from_millis(3500)
        {
            bail!(
                "timeouts.request 1s ({protocol:?}): {status} after {took:?}, want 504 after about 1 s"
            );
        }
    }
    let (status, took) = timed(cluster, from, "http://healthy/unlimited?delay=2s", &[]).await?;
    if status != 200 || took < Duration::from_secs(2) {
        bail!("timeouts.request 0s disables the timeout: {status} after {took:?}");
    }
    // Each attempt stops at 500 ms and is retried twice; the request gets 504 after all three.
    let before = retries(cluster, "healthy", "retried")?;
    let (status, took) = timed(cluster, from, "http://healthy/attempts?delay=3s", &[]).await?;
    let retried = retries(cluster, "healthy", "retried")? - before;
    if status != 504
        || took < Duration::from_millis(1700)
        || took > Duration::from_secs(5)
        || retried != 2.0
    {
        bail!(
            "backendRequest 500ms with 2 retries: {status} after {took:?} with {retried} retries, want 504 after about 1.8 s with 2"
        );
    }
    Ok(())
}

async fn retry_reaches_a_healthy_endpoint(cluster: &Cluster, from: &Pod) -> Result<()> {
    // The app fails a quarter of the calls: 40 unretried calls all passing is a 1e-5 chance.
    let unretried = call(
        cluster,
        from,
        "http://healthy/?codes=503:1,200:3",
        &["--count=40"],
    )
    .await?;
    if !statuses(&unretried).contains(&503) {
        bail!(
            "without a retry some calls should get the app's 503: {:?}",
            statuses(&unretried)
        );
    }
    let before = retries(cluster, "healthy", "retried")?;
    let retried = call(
        cluster,
        from,
        "http://healthy/retried?codes=503:1,200:3",
        &["--count=40"],
    )
    .await?;
    if let Some(bad) = retried.iter().find(|e| e.status != Some(200)) {
        bail!("a call retried on 503 failed: {bad:?}");
    }
    if retries(cluster, "healthy", "retried")? == before {
        bail!("40 calls to an app failing a quarter of them were never retried");
    }
    // broken-a, not yet called, is the cheaper endpoint for the balancer at first: a call
    // that meets it is retried at the other endpoint.
    let before = retries(cluster, "flaky", "retried")?;
    let answers = call(cluster, from, "http://flaky/retried", &["--count=20"]).await?;
    if let Some(bad) = answers
        .iter()
        .find(|e| e.status != Some(200) || e.body.hostname != "healthy")
    {
        bail!("a retried call to flaky was not answered by healthy: {bad:?}");
    }
    if retries(cluster, "flaky", "retried")? == before {
        bail!("no call to flaky met broken-a and was retried");
    }
    Ok(())
}

async fn budget_holds_during_an_outage(cluster: &Cluster, from: &Pod) -> Result<()> {
    const REQUESTS: usize = 300;
    let (retried_before, refused_before) = (
        retries(cluster, "down", "retried")?,
        retries(cluster, "down", "budget_exhausted")?,
    );
    let started = Instant::now();
    let answers = call(
        cluster,
        from,
        "http://down/",
        &[&format!("--count={REQUESTS}"), "--qps=0"],
    )
    .await?;
    let took = started.elapsed();
    if answers.len() != REQUESTS || answers.iter().any(|e| e.status != Some(503)) {
        bail!(
            "every call to down should get 503: {:?}",
            statuses(&answers)
        );
    }
    let retried = retries(cluster, "down", "retried")? - retried_before;
    let refused = retries(cluster, "down", "budget_exhausted")? - refused_before;
    // Without a budget: 3 retries a call. With it: a fifth of the calls, plus 10 a second over
    // the 10 s window (once per window the run spans).
    let windows = 1.0 + (took.as_secs_f64() / 10.0).ceil();
    let bound = 0.2 * REQUESTS as f64 + 100.0 * windows;
    let ratio = retried / REQUESTS as f64;
    eprintln!(
        "outage: {REQUESTS} calls in {took:?}, {retried} retried ({ratio:.2} per call), {refused} refused by the budget"
    );
    if retried > bound || refused == 0.0 || retried == 0.0 {
        bail!(
            "retry budget: {retried} retries and {refused} refused for {REQUESTS} calls in {took:?}; want at most {bound} and some refused"
        );
    }
    Ok(())
}

async fn mirror_gets_a_copy(cluster: &Cluster, from: &Pod, pods: &Api<Pod>) -> Result<()> {
    let path = format!("/mirrored-{}", std::process::id());
    let answers = call(cluster, from, &format!("http://primary{path}"), &[]).await?;
    let answer = answers.first().context("no answer from primary")?;
    if answer.status != Some(200) || answer.body.hostname != "healthy" {
        bail!("the client should get the primary's answer: {answer:?}");
    }
    let mirror = pods.get("mirror").await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.logs(&mirror, "echo")?.contains(&path) {
        if Instant::now() > deadline {
            bail!("the mirror pod never saw {path}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn failing_endpoint_is_ejected(cluster: &Cluster, from: &Pod) -> Result<()> {
    let before = counter(cluster, "aether_proxy_endpoint_ejections_total", &[])?;
    let answers = call(cluster, from, "http://mixed/", &["--count=60"]).await?;
    let got = statuses(&answers);
    let ejections = counter(cluster, "aether_proxy_endpoint_ejections_total", &[])? - before;
    if !got.contains(&503) || ejections < 1.0 {
        bail!("broken-b should fail, then be ejected: {got:?}, {ejections} ejections");
    }
    // Ejected, broken-b gets nothing until its ejection ends (30 s).
    let after = call(cluster, from, "http://mixed/", &["--count=30"]).await?;
    if after.iter().any(|e| e.status != Some(200)) {
        bail!(
            "after the ejection every call should reach healthy: {:?}",
            statuses(&after)
        );
    }
    Ok(())
}

async fn invalid_retry_values(cluster: &Cluster, from: &Pod) -> Result<()> {
    cluster.apply_text(&route(
        "mixed",
        "  - retry: {codes: [503], attempts: 50}\n    backendRefs: [{name: mixed, port: 80}]\n",
    ))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = cluster.kubectl(&["-n", NS, "get", "httproute", "mixed", "-o", "json"])?;
        let object: Value = serde_json::from_str(&text)?;
        let refused = object["status"]["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["conditions"].as_array().cloned().unwrap_or_default())
            .any(|c| {
                c["type"] == "Accepted"
                    && c["status"] == "False"
                    && c["reason"] == "UnsupportedValue"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("retry.attempts 50 is outside 1-10"))
            });
        if refused {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "attempts 50 should be refused on the route's status: {}",
                object["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A negative backoff does not get past the API server's validation.
    let negative = cluster.apply_text(&route(
        "primary",
        "  - retry: {backoff: -1s}\n    backendRefs: [{name: primary, port: 80}]\n",
    ));
    match negative {
        Ok(()) => bail!("a negative retry.backoff was accepted by the API server"),
        Err(e) if format!("{e:#}").contains("backoff") => {}
        Err(e) => bail!("a negative backoff was refused without naming the field: {e:#}"),
    }
    // The other routes work as before.
    wait_accepted(cluster, &[route_ref("healthy"), route_ref("primary")]).await?;
    let (status, _) = timed(cluster, from, "http://healthy/fast", &[]).await?;
    if status != 200 {
        bail!("the healthy route stopped working after a bad route: {status}");
    }
    Ok(())
}
