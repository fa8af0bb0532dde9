//! aether played by an attacker on the local cluster, each probe asserting the safe outcome.
//!
//! A stolen node-proxy token: a token of the proxies' ServiceAccount bound to the proxy pod on
//! node-1 (what reading that pod's token file gives) may not taint or label node-2, forge
//! node-2's applied config generation, or label or taint its own node (to attract workloads
//! and then obtain their SVIDs); it may still do what that proxy does (report its own
//! NodeConfig's status). A token of the same ServiceAccount bound to no pod writes nothing.
//! RBAC allows every one of these writes; the chart's admission policy is what refuses them.
//! Nor may it read pods, its own node's included (it has those through the operator, which
//! checks the node its token is bound to: `operator/tests/ca.rs`), nor may the CNI plugin's
//! fallback identity, whose tokens it mints.
//!
//! An oversized request head from a meshed pod: one limit end to end, so a 70 KB header is
//! answered 431 by the client's own proxy (never a 503 from further on), a 40 KB one reaches
//! the backend, and the next request is served.
//!
//! A forged caller identity: a meshed pod sending its own `x-aether-client-identity` (an
//! admin's SPIFFE ID) reaches the backend as itself, with that one value only.
//!
//! A tenant aiming at what another namespace's pod keeps to itself: a Service of its own with a
//! hand-written EndpointSlice naming the victim pod's loopback-only port, and a route on it,
//! never reaches that port (its own proxy refuses the victim's identity for its Service; the
//! victim's proxy would refuse the port); the victim's server bound to its pod address only is
//! reached through the mesh.
//!
//! An app leaving capture by itself: a root pod with the default capabilities (CAP_NET_RAW
//! lets it set SO_MARK) marks its socket with the mark that once exempted the proxy's own, and
//! with every bit set, and calls a meshed Service: each request still arrives over mTLS, with
//! the caller's identity.
//!
//! What a compromised proxy process holds: on each node it is root with exactly CAP_NET_ADMIN
//! and CAP_SYS_ADMIN (effective and bounding), under a seccomp filter, as the kernel reports it.
//!
//! The proxy's admin port: on the node's address only (not on its loopback, nor any other
//! address of the node), and a pod holding silent connections to it is cut off after the head
//! timeout, while the kubelet's probes keep the proxy Ready.

use aether_crds::NodeConfig;
use std::time::Duration;

use aether_e2e::mesh::{
    Accounts, ECHO_IMAGE, MESH_NS, TRUST_DOMAIN, client_pod, install, mesh_workloads,
    proxy_pod_field, uninstall, unmesh_workloads, wait_accepted, wait_nodes_applied,
};
use aether_e2e::node::NODE_SHELL_IMAGE;
use aether_e2e::stream::apply_split;
use aether_e2e::{Cluster, echo};
use aether_test_support::cases::RouteRef;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "aether-system";
const POLICY: &str = "aether-proxy-node-restriction";

/// One write a token holder tries.
enum Write<'a> {
    Node(&'a str, Value),
    ConfigStatus(&'a str, Value),
}

/// The API as the holder of one token, and nothing else.
struct Holder {
    client: kube::Client,
    nodes: Api<Node>,
    configs: Api<NodeConfig>,
}

impl Holder {
    async fn new(cluster: &Cluster, token: &str) -> Result<Holder> {
        let client = cluster.client_with_token(token).await?;
        Ok(Holder {
            nodes: Api::all(client.clone()),
            configs: Api::all(client.clone()),
            client,
        })
    }

    async fn write(&self, write: &Write<'_>) -> Result<(), kube::Error> {
        let params = PatchParams::default();
        match write {
            Write::Node(name, patch) => self
                .nodes
                .patch(name, &params, &Patch::Merge(patch))
                .await
                .map(drop),
            Write::ConfigStatus(name, patch) => self
                .configs
                .patch_status(name, &params, &Patch::Merge(patch))
                .await
                .map(drop),
        }
    }

    /// `write` must be refused by the node restriction policy (not by RBAC, not by accident).
    async fn refused(&self, what: &str, write: Write<'_>) -> Result<()> {
        match self.write(&write).await {
            Ok(()) => bail!("a stolen proxy token could {what}"),
            // The policy's own verdict, not an error evaluating it (which would refuse the
            // proxy's legitimate writes too).
            Err(kube::Error::Api(e))
                if e.message.contains(POLICY)
                    && e.message.contains("node proxy may")
                    && !e.message.contains("resulted in error") =>
            {
                eprintln!("refused: {what} ({})", e.message);
                Ok(())
            }
            Err(e) => bail!("{what}: refused, but not by {POLICY}: {e}"),
        }
    }

    async fn allowed(&self, what: &str, write: Write<'_>) -> Result<()> {
        self.write(&write)
            .await
            .with_context(|| format!("the proxy's own write refused ({what})"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_are_contained() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    a_stolen_proxy_token_acts_for_its_node_only(&cluster).await?;
    oversized_heads_get_431(&cluster).await?;
    a_forged_identity_header_is_replaced(&cluster).await?;
    a_pods_own_ports_stay_its_own(&cluster).await?;
    a_socket_mark_does_not_escape_capture(&cluster).await?;
    the_proxy_holds_two_capabilities_under_seccomp(&cluster)?;
    the_admin_port_is_on_the_node_address_only(&cluster).await?;
    uninstall(&cluster).await.context("uninstalling aether")?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

async fn a_stolen_proxy_token_acts_for_its_node_only(cluster: &Cluster) -> Result<()> {
    let proxy_pod = proxy_pod_field(cluster, "node-1", "metadata.name")?;
    let token = |bound: &[&str]| -> Result<String> {
        let mut args = vec![
            "-n",
            NAMESPACE,
            "create",
            "token",
            "aether-proxy",
            "--duration=10m",
        ];
        args.extend(bound);
        Ok(cluster.kubectl(&args)?.trim().to_owned())
    };
    let bound = format!("--bound-object-name={proxy_pod}");
    let stolen = Holder::new(cluster, &token(&["--bound-object-kind=Pod", &bound])?).await?;
    let taint =
        || json!({"spec": {"taints": [{"key": "aether.io/attacker", "effect": "NoSchedule"}]}});
    let label = || json!({"metadata": {"labels": {"attacker": "here"}}});
    let generation = |value: Value| json!({"status": {"appliedGeneration": value}});

    stolen
        .refused("taint node-2", Write::Node("node-2", taint()))
        .await?;
    stolen
        .refused("label node-2", Write::Node("node-2", label()))
        .await?;
    stolen
        .refused(
            "forge node-2's applied config generation",
            Write::ConfigStatus("node-2", generation(json!(999_999))),
        )
        .await?;
    stolen
        .refused(
            "label its own node to attract workloads",
            Write::Node("node-1", label()),
        )
        .await?;
    stolen
        .refused("taint its own node", Write::Node("node-1", taint()))
        .await?;
    // What the proxy on node-1 does itself stays allowed: reporting its NodeConfig's status
    // (the value it already reported, so the running proxy is not disturbed).
    let configs: Api<NodeConfig> = Api::all(cluster.client.clone());
    let applied = configs
        .get("node-1")
        .await?
        .status
        .and_then(|s| s.applied_generation);
    stolen
        .allowed(
            "report node-1's applied generation",
            Write::ConfigStatus("node-1", generation(json!(applied))),
        )
        .await?;

    let unbound = Holder::new(cluster, &token(&[])?).await?;
    unbound
        .refused(
            "write node-1's NodeConfig status with a token bound to no pod",
            Write::ConfigStatus("node-1", generation(json!(applied))),
        )
        .await?;
    let labelled = cluster.kubectl(&["get", "nodes", "-l", "attacker", "-o", "name"])?;
    if !labelled.trim().is_empty() {
        bail!("a node was labelled by the attacker: {labelled}");
    }
    reads_no_pod(cluster, &stolen.client).await
}

/// The holder of a stolen proxy token lists and gets no pod: not of another node, not of its
/// own, and not through the CNI fallback's identity either.
async fn reads_no_pod(cluster: &Cluster, stolen: &kube::Client) -> Result<()> {
    let victim = proxy_pod_field(cluster, "node-2", "metadata.name")?;
    let forbidden = |what: &str, result: Result<(), kube::Error>| match result {
        Err(kube::Error::Api(e)) if e.code == 403 => {
            eprintln!("refused: {what}");
            Ok(())
        }
        Ok(()) => bail!("a stolen proxy token could {what}"),
        Err(e) => bail!("{what}: failed, but not as forbidden: {e}"),
    };
    let all: Api<Pod> = Api::all(stolen.clone());
    forbidden(
        "list every pod",
        all.list_metadata(&ListParams::default()).await.map(drop),
    )?;
    forbidden(
        "list node-1's pods",
        all.list_metadata(&ListParams::default().fields("spec.nodeName=node-1"))
            .await
            .map(drop),
    )?;
    let install: Api<Pod> = Api::namespaced(stolen.clone(), NAMESPACE);
    forbidden(
        "get the proxy pod on node-2",
        install.get_metadata(&victim).await.map(drop),
    )?;
    let minted = Api::<ServiceAccount>::namespaced(stolen.clone(), NAMESPACE)
        .create_token_request(
            "aether-cni",
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(600),
                    ..TokenRequestSpec::default()
                }),
                ..TokenRequest::default()
            },
        )
        .await
        .context("the proxy's token mints the CNI fallback's")?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest answered without a token")?;
    let cni = cluster.client_with_token(&minted).await?;
    forbidden(
        "get the proxy pod on node-2 as the CNI fallback",
        Api::<Pod>::namespaced(cni, NAMESPACE)
            .get_metadata(&victim)
            .await
            .map(drop),
    )
}

async fn oversized_heads_get_431(cluster: &Cluster) -> Result<()> {
    mesh_workloads(cluster, Accounts::PerVersion).await?;
    let split = apply_split(cluster).await?;
    wait_nodes_applied(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    // One request with a header of `header_kb` KiB; `None` when the client got no answer.
    let request = |header_kb: usize| -> Result<Option<u16>> {
        let header = format!("X-Big:{}", "a".repeat(header_kb * 1024));
        let output = cluster.exec(&pod, "echo", &["client", "http://echo/v1", "-H", &header])?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let status = echo::parse(&stdout).first().and_then(|e| e.status);
        if status.is_none() {
            eprintln!(
                "no answer ({}): {stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(status)
    };
    // A proxy that refuses a head closes the connection with the rest of it unread, so the
    // client may see a reset before the 431, as with any HTTP/1 server: it asks again.
    let status = |header_kb: usize| -> Result<u16> {
        for _ in 0..5 {
            if let Some(status) = request(header_kb)? {
                return Ok(status);
            }
        }
        bail!("no answer to a request with a {header_kb} KB header, five times")
    };
    // Twice: the proxy goes on serving the pod after refusing one.
    for _ in 0..2 {
        let big = status(70)?;
        if big != 431 {
            bail!("a 70 KB header: expected 431 from the client's proxy, got {big}");
        }
    }
    let fits = status(40)?;
    if fits != 200 {
        bail!("a 40 KB header: expected it served end to end, got {fits}");
    }
    eprintln!("a 70 KB request header got 431 at the edge, a 40 KB one was served end to end");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    Ok(())
}

async fn a_forged_identity_header_is_replaced(cluster: &Cluster) -> Result<()> {
    let split = apply_split(cluster).await?;
    wait_nodes_applied(cluster).await?;
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let forged = "spiffe://cluster.local/ns/kube-system/sa/admin";
    // busybox wget, as the echo client refuses a header value with a colon in it.
    let header = format!("{}: {forged}", echo::IDENTITY_HEADER);
    let output = cluster.exec(
        &pod,
        "echo",
        &[
            "wget",
            "-q",
            "-O",
            "-",
            "--header",
            &header,
            "http://echo/v1",
        ],
    )?;
    let body = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wget with a forged identity failed ({}): {body}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // The echo server prints each request header as `RequestHeader=Name:value`.
    let seen: Vec<&str> = body
        .lines()
        .filter_map(|line| line.strip_prefix("RequestHeader=")?.split_once(':'))
        .filter(|(name, _)| name.eq_ignore_ascii_case(echo::IDENTITY_HEADER))
        .map(|(_, value)| value)
        .collect();
    let real = format!("spiffe://cluster.local/ns/{MESH_NS}/sa/echo-v1");
    if seen != [real.as_str()] {
        bail!("a caller claiming {forged}: the backend saw {seen:?}, not only {real}");
    }
    eprintln!("a forged identity header reached the backend as the caller's real identity only");
    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    Ok(())
}

async fn a_pods_own_ports_stay_its_own(cluster: &Cluster) -> Result<()> {
    const VICTIM: &str = "e2e-security-victim";
    const TENANT: &str = "e2e-security-tenant";
    cluster.delete_namespaces(&[VICTIM, TENANT])?;
    // The victim: 8080 on every address, 8081 on its pod address only, 9000 on loopback only
    // (an admin port). Its Service sends to 8080 and 8081, with a route on 8081.
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {VICTIM}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: vault, namespace: {VICTIM}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: vault, namespace: {VICTIM}, labels: {{app: vault}}}}\n\
         spec:\n  serviceAccountName: vault\n  containers:\n  - name: echo\n    image: \"{ECHO_IMAGE}\"\n\
         \x20   args: [--port=8080, --port=8081, --bind-ip=8081, --port=9000, --bind-localhost=9000]\n\
         \x20   env: [{{name: INSTANCE_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: vault, namespace: {VICTIM}}}\n\
         spec:\n  selector: {{app: vault}}\n  ports:\n\
         \x20 - {{name: http, port: 80, targetPort: 8080, appProtocol: http}}\n\
         \x20 - {{name: pod-ip, port: 81, targetPort: 8081, appProtocol: http}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: vault, namespace: {VICTIM}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: vault, port: 81}}]\n\
         \x20 rules: [{{backendRefs: [{{name: vault, port: 81}}]}}]\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {{name: {TENANT}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: tenant, namespace: {TENANT}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: {TENANT}}}\n\
         spec:\n  serviceAccountName: tenant\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n"
    ))?;
    cluster
        .wait_ready(VICTIM, 1, Duration::from_secs(60))
        .await?;
    let client = cluster
        .wait_ready(TENANT, 1, Duration::from_secs(60))
        .await?
        .remove(0);
    let vault: Api<Pod> = Api::namespaced(cluster.client.clone(), VICTIM);
    let vault_ip = aether_e2e::pod_ip(&vault.get("vault").await?)?;
    // The tenant's own Service, its endpoints written by hand: the victim's admin port.
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: sneak, namespace: {TENANT}}}\n\
         spec:\n  ports: [{{name: admin, port: 80, appProtocol: http}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: sneak-1, namespace: {TENANT}, labels: {{kubernetes.io/service-name: sneak}}}}\n\
         addressType: IPv4\nports: [{{name: admin, port: 9000, protocol: TCP}}]\n\
         endpoints: [{{addresses: [\"{vault_ip}\"]}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: sneak, namespace: {TENANT}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: sneak, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: sneak, port: 80}}]}}]\n"
    ))?;
    let route = |namespace: &str, name: &str| RouteRef {
        kind: "HTTPRoute".into(),
        name: name.into(),
        namespace: namespace.into(),
        parent_ref: None,
    };
    wait_accepted(cluster, &[route(VICTIM, "vault"), route(TENANT, "sneak")]).await?;
    wait_nodes_applied(cluster).await?;

    let output = cluster.exec(
        &client,
        "echo",
        &["client", &format!("http://sneak.{TENANT}/")],
    )?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let refused = echo::parse(&stdout);
    let status = refused.first().and_then(|e| e.status);
    if !matches!(status, Some(403 | 503)) || refused.iter().any(|e| e.body.hostname == "vault") {
        bail!(
            "a tenant's hand-made endpoint reached the victim's loopback port ({status:?}): {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    eprintln!("a tenant's hand-made endpoint for another pod's loopback-only port got {status:?}");
    let pod_ip_only = cluster.exec(
        &client,
        "echo",
        &["client", &format!("http://vault.{VICTIM}:81/")],
    )?;
    let stdout = String::from_utf8_lossy(&pod_ip_only.stdout);
    let answered = echo::parse(&stdout);
    let caller = format!("spiffe://{TRUST_DOMAIN}/ns/{TENANT}/sa/tenant");
    match answered.first() {
        Some(e)
            if e.status == Some(200) && e.body.identity().as_deref() == Some(caller.as_str()) => {}
        _ => bail!(
            "a server bound to its pod address was not reached through the mesh: {stdout}{}",
            String::from_utf8_lossy(&pod_ip_only.stderr)
        ),
    }
    eprintln!(
        "a server bound to its pod address only is reached through the mesh, with the caller's identity"
    );
    cluster.delete_namespaces(&[VICTIM, TENANT])?;
    Ok(())
}

async fn a_socket_mark_does_not_escape_capture(cluster: &Cluster) -> Result<()> {
    const NS: &str = "e2e-security-mark";
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: marker, namespace: {NS}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: backend, namespace: {NS}, labels: {{app: backend}}}}\n\
         spec:\n  containers:\n  - name: echo\n    image: \"{ECHO_IMAGE}\"\n\
         \x20   args: [--port=8080]\n\
         \x20   env: [{{name: INSTANCE_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: backend, namespace: {NS}}}\n\
         spec:\n  selector: {{app: backend}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: marker, namespace: {NS}}}\n\
         spec:\n  serviceAccountName: marker\n  containers:\n\
         \x20 - {{name: shell, image: \"{NODE_SHELL_IMAGE}\", command: [sleep, \"86400\"]}}\n"
    ))?;
    let pods = cluster.wait_ready(NS, 2, Duration::from_secs(60)).await?;
    let marker = pods
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some("marker"))
        .context("no marker pod")?;
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), NS);
    let ip = services
        .get("backend")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("Service backend has no ClusterIP")?;
    let caller = format!("spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/marker");
    // The Service is captured once the operator has seen its meshed endpoint.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for mark in ["0", "0x0ae70000", "0xffffffff"] {
        loop {
            let output = cluster.exec(&marker, "shell", &["marked-get", mark, &ip, "80", "/"])?;
            let reply = String::from_utf8_lossy(&output.stdout);
            let identity = reply
                .lines()
                .filter_map(|line| line.strip_prefix("RequestHeader=")?.split_once(':'))
                .find(|(name, _)| name.eq_ignore_ascii_case(echo::IDENTITY_HEADER))
                .map(|(_, value)| value.to_string());
            if identity.as_deref() == Some(caller.as_str()) {
                eprintln!("a request from a socket marked {mark} arrived over mTLS as {caller}");
                break;
            }
            // Only the unmarked control may wait for capture; once it is captured, a marked
            // request that arrives without mTLS has left capture.
            if mark != "0" || tokio::time::Instant::now() > deadline {
                bail!(
                    "a request from a socket marked {mark} arrived without the mesh (identity {identity:?}): {reply}{}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    cluster.delete_namespaces(&[NS])?;
    Ok(())
}

fn the_proxy_holds_two_capabilities_under_seccomp(cluster: &Cluster) -> Result<()> {
    // CAP_NET_ADMIN is bit 12, CAP_SYS_ADMIN bit 21.
    const CAPS: &str = "0000000000201000";
    const NONE: &str = "0000000000000000";
    for node in ["node-1", "node-2"] {
        let shell = aether_e2e::node::shell(cluster, node)?;
        // The host's procfs: the shell has its own PID namespace, the node's root has not. Each
        // process says first what it runs: `run` (the proxy) or `hold` (its socket holder).
        let script = "for d in /host/proc/[0-9]*; do \
            [ \"$(cat $d/comm 2>/dev/null)\" = aether-proxy ] && \
            echo \"Role: $(tr '\\000' ' ' < $d/cmdline | cut -d' ' -f2)\" && \
            grep -E '^(CapEff|CapBnd|Seccomp):' $d/status | tr -s '\t' ' '; done";
        let output = cluster.exec(&shell, "shell", &["sh", "-c", script])?;
        let status = String::from_utf8_lossy(&output.stdout);
        let lines: Vec<&str> = status.lines().collect();
        let expected = |caps: &str| {
            [
                format!("CapEff: {caps}"),
                format!("CapBnd: {caps}"),
                "Seccomp: 2".to_string(),
            ]
        };
        // Every proxy and holder on the machine (both nodes' share its kernel): at least one
        // proxy, each with exactly its two capabilities; a holder with none at all.
        let mut proxies = 0;
        let as_expected = lines.chunks(4).all(|process| match process {
            [role, rest @ ..] if *role == "Role: run" => {
                proxies += 1;
                rest == expected(CAPS)
            }
            [role, rest @ ..] if *role == "Role: hold" => rest == expected(NONE),
            _ => false,
        });
        if proxies == 0 || !as_expected {
            bail!(
                "the proxy processes seen from {node} do not hold exactly NET_ADMIN and SYS_ADMIN (their holders none) under seccomp: {status}{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    eprintln!(
        "every proxy process holds CAP_NET_ADMIN and CAP_SYS_ADMIN only, every socket holder none, under a seccomp filter"
    );
    Ok(())
}

/// The proxy's admin port listens on the node's address only, and a pod's silent connections
/// to it are closed after the head timeout (5 s).
async fn the_admin_port_is_on_the_node_address_only(cluster: &Cluster) -> Result<()> {
    let node_ip = cluster.node_ip("node-1")?;
    let shell = aether_e2e::node::shell(cluster, "node-1")?;
    let reach = |host: &str| -> Result<bool> {
        let script = format!("nc -w 2 {host} 15020 </dev/null; echo exit=$?");
        let output = cluster.exec(&shell, "shell", &["sh", "-c", &script])?;
        Ok(String::from_utf8_lossy(&output.stdout)
            .trim_end()
            .ends_with("exit=0"))
    };
    if !reach(&node_ip)? || reach("127.0.0.1")? {
        bail!("the admin port is not on node-1's address {node_ip} alone");
    }
    // A meshed pod opens a connection and says nothing: the proxy closes it.
    let pod = client_pod(cluster, MESH_NS, "app=echo,version=v1").await?;
    let started = std::time::Instant::now();
    // Its stdin a pipe nobody writes to: nc sends nothing and ends only when the proxy closes.
    let script = format!(
        "f=/dev/shm/silent-$$; mkfifo $f; exec 3<>$f; timeout 30 nc {node_ip} 15020 <&3; echo closed"
    );
    let output = cluster.exec(&pod, "echo", &["sh", "-c", &script])?;
    let waited = started.elapsed();
    if !String::from_utf8_lossy(&output.stdout).contains("closed")
        || waited > Duration::from_secs(20)
    {
        bail!("a silent connection to the admin port was held for {waited:?}: {output:?}");
    }
    eprintln!(
        "the admin port listens on the node's address only; a pod's silent connection was closed after {waited:?}"
    );
    Ok(())
}
