//! AuthorizationPolicy on the local cluster, as a user and as an attacker. A server pod on
//! node-2 (HTTP on 8080, an opaque TCP echo on 9000), meshed callers `web` and `batch` of its
//! namespace on node-1, an `intruder` of another meshed namespace holding a consumer route to
//! the server, an unmeshed pod and a host process. Each case first shows the call passing
//! without the policy, then what the policy changes:
//!
//! - ALLOW by ServiceAccount: `web` passes, `batch` gets a 403 naming the policy, also with a
//!   forged `x-aether-client-identity` of `web`; the intruder is refused despite its route; the
//!   unmeshed pod and a host process of node-1 no longer reach the pod at all (the pod refuses
//!   plaintext from other hosts while a policy closes it).
//! - ALLOW by namespace, and by path and method.
//! - DENY wins over ALLOW.
//! - Audit mode refuses nothing, and counts and logs what it would have refused.
//! - A namespace labelled `aether.io/authorization=deny` refuses what no ALLOW admits, while the
//!   kubelet's probes keep the pod Ready.
//! - An opaque connection (a CONNECT tunnel between the proxies) to a port the policy does not
//!   allow is refused at setup, and an open one is closed when a new policy denies it.
//! - Invalid fields get `Accepted=False` with a reason each (and a Warning Event), and leave a
//!   valid policy in force; a valid policy edited into an invalid one fails closed.

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{ECHO_IMAGE, install, uninstall, wait_nodes_applied};
use aether_e2e::node::NODE_SHELL_IMAGE;
use aether_e2e::process::admin_get;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::Value;

const NS: &str = "e2e-authz";
const OTHER: &str = "e2e-authz-other";
const PLAIN: &str = "e2e-authz-plain";
const SERVER: &str = "server.e2e-authz.svc.cluster.local";

fn shell(name: &str, namespace: &str, account: Option<&str>) -> String {
    let account = account
        .map(|a| format!("  serviceAccountName: {a}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  nodeName: node-1\n{account}  containers:\n  - name: shell\n    image: \"{NODE_SHELL_IMAGE}\"\n\
         \x20   command: [sleep, \"86400\"]\n---\n"
    )
}

fn workloads() -> String {
    let account = |name: &str, namespace: &str| {
        format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: {namespace}}}\n---\n"
        )
    };
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OTHER}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {{name: {PLAIN}}}\n---\n\
         {server_sa}{web_sa}{batch_sa}\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: server, namespace: {NS}, labels: {{app: server}}}}\n\
         spec:\n  nodeName: node-2\n  serviceAccountName: server\n  containers:\n\
         \x20 - name: echo\n    image: \"{ECHO_IMAGE}\"\n    ports: [{{containerPort: 8080}}]\n\
         \x20   readinessProbe: {{httpGet: {{path: /, port: 8080}}, periodSeconds: 2, failureThreshold: 1}}\n\
         \x20 - name: tcp\n    image: \"{NODE_SHELL_IMAGE}\"\n    command: [nc, -ll, -p, \"9000\", -e, /bin/cat]\n\
         \x20   ports: [{{containerPort: 9000}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: server, namespace: {NS}}}\n\
         spec:\n  selector: {{app: server}}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n\
         \x20 - {{name: echo, port: 9000, targetPort: 9000, appProtocol: tcp}}\n---\n\
         {web}{batch}{intruder}{plain}\
         apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{name: other-routes, namespace: {NS}}}\n\
         spec:\n  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {OTHER}}}]\n\
         \x20 to: [{{group: \"\", kind: Service}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: to-server, namespace: {OTHER}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: server, namespace: {NS}, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: server, namespace: {NS}, port: 80}}]}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: server, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: server, port: 80}}]\n\
         \x20 rules:\n  - name: reads\n    matches: [{{path: {{type: PathPrefix, value: /public}}, method: GET}}]\n\
         \x20   backendRefs: [{{name: server, port: 80}}]\n\
         \x20 - backendRefs: [{{name: server, port: 80}}]\n",
        server_sa = account("server", NS),
        web_sa = account("web", NS),
        batch_sa = account("batch", NS),
        web = shell("web", NS, Some("web")),
        batch = shell("batch", NS, Some("batch")),
        intruder = shell("intruder", OTHER, None),
        plain = shell("plain", PLAIN, None),
    )
}

/// A policy of `NS` on the server's Service.
fn policy(name: &str, action: &str, mode: &str, rules: &str) -> String {
    format!(
        "apiVersion: aether.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  targetRefs: [{{group: \"\", kind: Service, name: server}}]\n  action: {action}\n  mode: {mode}\n  rules: {rules}\n"
    )
}

/// What a caller got: the status code (0: no answer at all) and the whole response.
#[derive(Debug)]
struct Answer {
    status: u16,
    text: String,
}

fn answer_of(text: String) -> Answer {
    let status = text
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Answer { status, text }
}

fn request_text(method: &str, path: &str, header: Option<&str>) -> String {
    let header = header.map(|h| format!("{h}\\r\\n")).unwrap_or_default();
    format!("{method} {path} HTTP/1.1\\r\\nHost: server\\r\\n{header}Connection: close\\r\\n\\r\\n")
}

/// One HTTP request from a shell pod to the server's Service, as raw bytes with busybox nc.
fn call(
    cluster: &Cluster,
    pod: &Pod,
    method: &str,
    path: &str,
    header: Option<&str>,
) -> Result<Answer> {
    let script = format!(
        "printf '{}' | nc -w 5 {SERVER} 80",
        request_text(method, path, header)
    );
    let output = cluster.exec(pod, "shell", &["sh", "-c", &script])?;
    Ok(answer_of(
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

/// The same request from a process of node-1's host network, to the server pod's address.
fn call_from_host(cluster: &Cluster, server_ip: &str) -> Result<Answer> {
    let script = format!(
        "exec 3<>/dev/tcp/{server_ip}/8080 && printf '{}' >&3 && cat <&3",
        request_text("GET", "/private", None)
    );
    let output = cluster.on_node("node-1", &["timeout", "6", "bash", "-c", &script])?;
    Ok(answer_of(
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

/// Lines sent over the opaque port, one every `gap`, and what came back.
fn echo_lines(cluster: &Cluster, pod: &Pod, lines: &[&str], gap: u64) -> Result<String> {
    let sends: Vec<String> = lines
        .iter()
        .map(|l| format!("echo {l}; sleep {gap}"))
        .collect();
    let script = format!("({}) | nc -w 3 {SERVER} 9000", sends.join("; "));
    let output = cluster.exec(pod, "shell", &["sh", "-c", &script])?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Retries `check` until it holds, for up to 30 s: a policy reaches the node proxies a moment
/// after its status says so.
fn eventually(what: &str, mut check: impl FnMut() -> Result<Option<String>>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match check()? {
            None => return Ok(()),
            Some(last) if Instant::now() > deadline => bail!("{what}: still {last}"),
            Some(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Expects `status` from `pod` for `method path` (with a 403, a body naming `policy`).
fn expect(
    cluster: &Cluster,
    pod: &Pod,
    method: &str,
    path: &str,
    status: u16,
    policy: Option<&str>,
) -> Result<()> {
    let who = pod.metadata.name.clone().unwrap_or_default();
    eventually(&format!("{who}: {method} {path} -> {status}"), || {
        let answer = call(cluster, pod, method, path, None)?;
        let named = policy.is_none_or(|p| answer.text.contains(p));
        Ok((answer.status != status || !named).then(|| format!("{answer:?}")))
    })
}

async fn apply_and_wait(cluster: &Cluster, manifest: &str, name: &str) -> Result<Value> {
    cluster.apply_text(manifest)?;
    wait_condition(cluster, name, "Programmed", "True").await
}

/// Waits for a policy's condition; returns its status.
async fn wait_condition(cluster: &Cluster, name: &str, kind: &str, want: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text =
            cluster.kubectl(&["-n", NS, "get", "authorizationpolicy", name, "-o", "json"])?;
        let object: Value = serde_json::from_str(&text)?;
        let status = object["status"].clone();
        let found = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == kind && c["status"] == want);
        let current = status["observedGeneration"] == object["metadata"]["generation"];
        if found && current {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!("AuthorizationPolicy {name}: {kind} is not {want}: {status}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn delete_policies(cluster: &Cluster) -> Result<()> {
    cluster.kubectl(&[
        "-n",
        NS,
        "delete",
        "authorizationpolicies",
        "--all",
        "--wait",
    ])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_decide_who_may_call() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS, OTHER, PLAIN])?;
    cluster.apply_text(&workloads())?;
    for (ns, count) in [(NS, 3), (OTHER, 1), (PLAIN, 1)] {
        cluster
            .wait_ready(ns, count, Duration::from_secs(120))
            .await?;
    }
    wait_nodes_applied(&cluster).await?;
    let pod = |ns: &str, name: &str| {
        let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
        let name = name.to_owned();
        async move { api.get(&name).await.with_context(|| format!("pod {name}")) }
    };
    let web = pod(NS, "web").await?;
    let batch = pod(NS, "batch").await?;
    let intruder = pod(OTHER, "intruder").await?;
    let plain = pod(PLAIN, "plain").await?;
    let server = pod(NS, "server").await?;
    let server_ip = aether_e2e::pod_ip(&server)?;

    // Without a policy every caller passes, plaintext ones too.
    for caller in [&web, &batch, &intruder, &plain] {
        expect(&cluster, caller, "GET", "/", 200, None)?;
    }
    let host = call_from_host(&cluster, &server_ip)?;
    if host.status != 200 {
        bail!("a host process cannot reach the pod even without a policy: {host:?}");
    }
    let echoed = echo_lines(&cluster, &web, &["ping"], 1)?;
    if !echoed.contains("ping") {
        bail!("the opaque port does not echo without a policy: {echoed:?}");
    }

    let node_ip = cluster.node_ip("node-2")?;
    let repairs_before = drift_repairs(&node_ip)?;
    allow_by_service_account(&cluster, &web, &batch, &intruder, &plain, &server_ip).await?;
    allow_by_namespace_and_request(&cluster, &web, &batch, &intruder).await?;
    deny_wins(&cluster, &web, &batch).await?;
    audit_mode(&cluster, &batch, &server).await?;
    opaque_connections(&cluster, &web).await?;
    namespace_default_deny(&cluster, &web, &server).await?;
    invalid_fields(&cluster, &web, &batch).await?;
    // The policies made the server's table strict and back many times over, minutes apart:
    // each table stayed as installed, none was taken for drift.
    let repairs_after = drift_repairs(&node_ip)?;
    if repairs_after != repairs_before {
        bail!(
            "node-2's proxy repaired tables it had installed itself: {repairs_before} then {repairs_after}"
        );
    }

    cluster.delete_namespaces(&[NS, OTHER, PLAIN])?;
    uninstall(&cluster).await?;
    Ok(())
}

/// Every drift repair the node's proxy counted, by what it repaired.
fn drift_repairs(node_ip: &str) -> Result<String> {
    let (_, metrics) = admin_get(node_ip, "/metrics")?;
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("aether_proxy_drift_repairs_total"))
        .collect::<Vec<_>>()
        .join("; "))
}

async fn allow_by_service_account(
    cluster: &Cluster,
    web: &Pod,
    batch: &Pod,
    intruder: &Pod,
    plain: &Pod,
    server_ip: &str,
) -> Result<()> {
    let rules = format!("[{{sources: [{{serviceAccount: {NS}/web}}]}}]");
    let status = apply_and_wait(
        cluster,
        &policy("only-web", "ALLOW", "Enforce", &rules),
        "only-web",
    )
    .await?;
    if status["nodes"] != serde_json::json!(["node-2"]) {
        bail!("only-web is enforced on node-2, its status says {status}");
    }
    expect(cluster, web, "GET", "/", 200, None)?;
    expect(cluster, batch, "GET", "/", 403, Some("e2e-authz/only-web"))?;
    // A forged identity header changes nothing: the decision is the certificate's.
    let forged = format!("x-aether-client-identity: spiffe://cluster.local/ns/{NS}/sa/web");
    let answer = call(cluster, batch, "GET", "/", Some(&forged))?;
    if answer.status != 403 {
        bail!("batch with a forged identity header: {answer:?}");
    }
    // Its own consumer route to the server does not make the intruder someone else.
    expect(cluster, intruder, "GET", "/", 403, Some("only-web"))?;
    eventually("the unmeshed pod is refused", || {
        let answer = call(cluster, plain, "GET", "/", None)?;
        Ok((answer.status == 200).then(|| format!("{answer:?}")))
    })?;
    eventually("a host process of node-1 is refused", || {
        let answer = call_from_host(cluster, server_ip)?;
        Ok((answer.status == 200).then(|| format!("{answer:?}")))
    })?;
    eprintln!(
        "ALLOW by ServiceAccount: web passes; batch (forged header too), the intruder, the unmeshed pod and a host process are refused"
    );
    delete_policies(cluster)?;
    wait_nodes_applied(cluster).await?;
    // The pod takes plaintext again once no policy closes it.
    eventually("the unmeshed pod passes again", || {
        let answer = call(cluster, plain, "GET", "/", None)?;
        Ok((answer.status != 200).then(|| format!("{answer:?}")))
    })
}

async fn allow_by_namespace_and_request(
    cluster: &Cluster,
    web: &Pod,
    batch: &Pod,
    intruder: &Pod,
) -> Result<()> {
    let rules = format!("[{{sources: [{{namespace: {OTHER}}}]}}]");
    apply_and_wait(
        cluster,
        &policy("other-ns", "ALLOW", "Enforce", &rules),
        "other-ns",
    )
    .await?;
    expect(cluster, intruder, "GET", "/", 200, None)?;
    expect(cluster, web, "GET", "/", 403, Some("other-ns"))?;
    delete_policies(cluster)?;

    let rules = format!(
        "[{{sources: [{{serviceAccount: {NS}/web}}], http: [{{method: GET, path: {{type: PathPrefix, value: /public}}}}]}}, \
         {{sources: [{{serviceAccount: {NS}/batch}}], routeRule: {{route: server, rule: reads}}}}]"
    );
    apply_and_wait(
        cluster,
        &policy("reads", "ALLOW", "Enforce", &rules),
        "reads",
    )
    .await?;
    expect(cluster, web, "GET", "/public/a", 200, None)?;
    expect(cluster, web, "POST", "/public/a", 403, Some("reads"))?;
    expect(cluster, web, "GET", "/private", 403, Some("reads"))?;
    // The HTTPRoute rule `reads` is GET /public.
    expect(cluster, batch, "GET", "/public", 200, None)?;
    expect(cluster, batch, "GET", "/publicity", 403, Some("reads"))?;
    eprintln!("ALLOW by namespace, by method and path, and by a named HTTPRoute rule");
    delete_policies(cluster)?;
    Ok(())
}

async fn deny_wins(cluster: &Cluster, web: &Pod, batch: &Pod) -> Result<()> {
    let all = format!("[{{sources: [{{namespace: {NS}}}]}}]");
    apply_and_wait(
        cluster,
        &policy("all-of-ns", "ALLOW", "Enforce", &all),
        "all-of-ns",
    )
    .await?;
    let deny = format!("[{{sources: [{{serviceAccount: {NS}/web}}]}}]");
    apply_and_wait(
        cluster,
        &policy("no-web", "DENY", "Enforce", &deny),
        "no-web",
    )
    .await?;
    expect(cluster, batch, "GET", "/", 200, None)?;
    expect(
        cluster,
        web,
        "GET",
        "/",
        403,
        Some("denied by AuthorizationPolicy e2e-authz/no-web"),
    )?;
    eprintln!("DENY wins over ALLOW");
    delete_policies(cluster)?;
    Ok(())
}

async fn audit_mode(cluster: &Cluster, batch: &Pod, server: &Pod) -> Result<()> {
    let rules = format!("[{{sources: [{{serviceAccount: {NS}/web}}]}}]");
    apply_and_wait(
        cluster,
        &policy("dry-run", "ALLOW", "Audit", &rules),
        "dry-run",
    )
    .await?;
    let node_ip = cluster.node_ip("node-2")?;
    let counted = || -> Result<f64> {
        let (_, metrics) = admin_get(&node_ip, "/metrics")?;
        Ok(metrics
            .lines()
            .filter(|l| l.starts_with("aether_proxy_authz_decisions_total{"))
            .filter(|l| l.contains("policy=\"e2e-authz/dry-run\"") && l.contains("mode=\"audit\""))
            .filter(|l| l.contains("decision=\"deny\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    };
    let before = counted()?;
    for _ in 0..3 {
        let answer = call(cluster, batch, "GET", "/", None)?;
        if answer.status != 200 {
            bail!("an audit policy refused batch: {answer:?}");
        }
    }
    eventually("audit refusals are counted", || {
        let now = counted()?;
        Ok((now < before + 3.0).then(|| format!("{now} counted, {before} before")))
    })?;
    let proxy = proxy_on(cluster, &aether_e2e::node_of(server)?).await?;
    let logs = cluster.logs(&proxy, "proxy")?;
    let logged = logs.lines().any(|l| {
        l.contains("an audit policy would have denied")
            && l.contains(&format!("spiffe://cluster.local/ns/{NS}/sa/batch"))
            && l.contains(&format!("spiffe://cluster.local/ns/{NS}/sa/server"))
    });
    if !logged {
        bail!("no audit line with both identities in the proxy's log");
    }
    eprintln!("audit mode: batch passes, the would-be refusals are counted and logged");
    delete_policies(cluster)?;
    Ok(())
}

async fn proxy_on(cluster: &Cluster, node: &str) -> Result<Pod> {
    let name = aether_e2e::mesh::proxy_pod_field(cluster, node, "metadata.name")?;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), "aether-system");
    Ok(api.get(&name).await?)
}

async fn opaque_connections(cluster: &Cluster, web: &Pod) -> Result<()> {
    // Only the HTTP port is allowed: the tunnel to 9000 is refused at its setup.
    let rules = format!("[{{sources: [{{serviceAccount: {NS}/web}}], ports: [8080]}}]");
    apply_and_wait(
        cluster,
        &policy("http-only", "ALLOW", "Enforce", &rules),
        "http-only",
    )
    .await?;
    expect(cluster, web, "GET", "/", 200, None)?;
    eventually(
        "a tunnel to a port the policy leaves out is refused",
        || {
            let echoed = echo_lines(cluster, web, &["ping"], 1)?;
            Ok(echoed
                .contains("ping")
                .then(|| format!("echoed {echoed:?}")))
        },
    )?;
    delete_policies(cluster)?;

    let rules = format!("[{{sources: [{{serviceAccount: {NS}/web}}]}}]");
    apply_and_wait(cluster, &policy("web", "ALLOW", "Enforce", &rules), "web").await?;
    eventually("the tunnel passes with every port allowed", || {
        let echoed = echo_lines(cluster, web, &["one", "two"], 1)?;
        Ok((!echoed.contains("two")).then(|| format!("echoed {echoed:?}")))
    })?;
    // An open tunnel, then a DENY for it: the proxy closes it, so the later line never returns.
    let (cluster_, web_) = (Cluster::get().await?, web.clone());
    let open = std::thread::spawn(move || echo_lines(&cluster_, &web_, &["before", "after"], 8));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deny = format!("[{{sources: [{{serviceAccount: {NS}/web}}], ports: [9000]}}]");
    apply_and_wait(
        cluster,
        &policy("no-tunnel", "DENY", "Enforce", &deny),
        "no-tunnel",
    )
    .await?;
    let echoed = open.join().expect("the tunnel's client thread")?;
    if !echoed.contains("before") || echoed.contains("after") {
        bail!("an open tunnel the new policy denies was not closed: echoed {echoed:?}");
    }
    eprintln!(
        "opaque TCP: refused at setup on a port left out, an open tunnel closed by a new DENY"
    );
    delete_policies(cluster)?;
    Ok(())
}

async fn namespace_default_deny(cluster: &Cluster, web: &Pod, server: &Pod) -> Result<()> {
    cluster.label_namespace(NS, "aether.io/authorization=deny")?;
    wait_nodes_applied(cluster).await?;
    expect(cluster, web, "GET", "/", 403, Some("denies by default"))?;
    // The kubelet probes every 2 s and marks the pod unready at the first failure.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let now = api
        .get(server.metadata.name.as_deref().unwrap_or_default())
        .await?;
    if !aether_e2e::is_ready(&now) {
        bail!(
            "the server lost its readiness under a default-deny namespace: its probes were refused"
        );
    }
    let rules = format!("[{{sources: [{{serviceAccount: {NS}/web}}]}}]");
    apply_and_wait(cluster, &policy("web", "ALLOW", "Enforce", &rules), "web").await?;
    expect(cluster, web, "GET", "/", 200, None)?;
    eprintln!("namespace default deny: refused until an ALLOW admits the caller; probes pass");
    delete_policies(cluster)?;
    cluster.label_namespace(NS, "aether.io/authorization-")?;
    wait_nodes_applied(cluster).await?;
    Ok(())
}

async fn invalid_fields(cluster: &Cluster, web: &Pod, batch: &Pod) -> Result<()> {
    let good = format!("[{{sources: [{{serviceAccount: {NS}/web}}]}}]");
    apply_and_wait(cluster, &policy("good", "ALLOW", "Enforce", &good), "good").await?;
    let bad = format!(
        "apiVersion: aether.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {{name: bad, namespace: {NS}}}\n\
         spec:\n  targetRefs: [{{group: \"\", kind: Service, name: missing}}]\n  action: ALLOW\n\
         \x20 rules: [{{sources: [{{serviceAccount: web}}, {{spiffeId: \"not-a-uri\"}}], routeRule: {{route: server, rule: writes}}}}]\n"
    );
    cluster.apply_text(&bad)?;
    let status = wait_condition(cluster, "bad", "Accepted", "False").await?;
    let message = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Accepted")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    for reason in [
        "spec.targetRefs[0]: Service e2e-authz/missing not found",
        "spec.rules[0].sources[0]: serviceAccount",
        "spec.rules[0].sources[1]: spiffeId",
        "spec.rules[0].routeRule: HTTPRoute e2e-authz/server has no rule named \"writes\"",
    ] {
        if !message.contains(reason) {
            bail!("Accepted=False of the bad policy does not say {reason:?}: {message}");
        }
    }
    // `kubectl describe` shows the same reasons as a Warning Event.
    eventually("a Warning Event on the bad policy", || {
        let events = cluster.event_messages(
            NS,
            "involvedObject.kind=AuthorizationPolicy,involvedObject.name=bad,type=Warning",
        )?;
        Ok((!events.contains("Service e2e-authz/missing not found")).then_some(events))
    })?;
    wait_condition(cluster, "good", "Accepted", "True").await?;
    expect(cluster, web, "GET", "/", 200, None)?;
    expect(cluster, batch, "GET", "/", 403, Some("good"))?;
    // An edit with a typo fails closed: the rule it cannot read admits nobody, so the
    // workload the valid version closed stays closed.
    let typo = format!(
        "[{{sources: [{{serviceAccount: {NS}/batch}}]}}, {{sources: [{{serviceAccount: web}}]}}]"
    );
    cluster.apply_text(&policy("good", "ALLOW", "Enforce", &typo))?;
    wait_condition(cluster, "good", "Accepted", "False").await?;
    expect(cluster, web, "GET", "/", 403, Some("good"))?;
    expect(cluster, batch, "GET", "/", 200, None)?;
    eprintln!(
        "invalid fields: each named in Accepted=False; the valid policy stays in force; a typo fails closed"
    );
    delete_policies(cluster)
}
