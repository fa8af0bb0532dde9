//! What a port carries decides how the mesh treats it, on the local cluster:
//!
//! - A protocol whose server speaks first (an SMTP-like banner) on a port that declares
//!   nothing: the caller's proxy waits briefly for the client's first bytes, gets none, and
//!   carries the connection as bytes over the mesh, so the banner reaches the client. Parsed as
//!   HTTP it would never arrive.
//! - A tenant's HTTPRoute on `default/kubernetes`, whose port is named `https`: the route is not
//!   accepted (`UnsupportedProtocol`), and the tenant's own meshed pods still reach the API
//!   server over its TLS.
//! - A WebSocket on an HTTP port, from a pod on one node to a pod on the other: the handshake
//!   and a message both ways go through, over mTLS to a meshed pod (which sees the caller's
//!   identity on the handshake) and in plaintext to a pod that opted out.
//! - A CONNECT on an HTTP port (the backend is a forward proxy), from a pod on one node to a
//!   pod on the other: the backend's tunnel carries bytes both ways, over mTLS to a meshed pod
//!   (which sees the caller's identity on the CONNECT) and in plaintext to one that opted out.
//! - On the wire: while raw TCP (both ways: the client's line and the server's banner) and an
//!   HTTP request cross from node-1 to node-2 through the mesh, a capture of node-1's link sees
//!   TLS records and none of their bytes; the same request to the opted-out pod is seen in the
//!   clear there, so the capture would see plaintext if there were any.

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{ECHO_IMAGE, client, install, uninstall, wait_nodes_applied};
use aether_e2e::node::NODE_SHELL_IMAGE;
use aether_e2e::wire::Capture;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::Value;

const NS: &str = "e2e-protocols";
const BANNER: &str = "220 aether-banner ready";
/// A forward proxy in busybox: it answers a CONNECT with 200, says which caller identity the
/// CONNECT carried, then echoes the tunnel's bytes.
const TUNNEL_SCRIPT: &str = r#"#!/bin/sh
id=none
while read -r line; do
  line=$(echo "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in x-aether-client-identity:*) id=${line#*: };; esac
done
printf 'HTTP/1.1 200 Connection established\r\n\r\n'
echo "tunnel-open identity=$id"
cat
"#;

/// The forward proxy `name` on node-2 (opted out of the mesh when `plain`) behind Service
/// `name`, port 80 named `http`.
fn tunnel(name: &str, plain: bool) -> String {
    let annotations = if plain {
        ", annotations: {aether.io/capture: disabled}"
    } else {
        ""
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}, labels: {{app: {name}}}{annotations}}}\n\
         spec:\n  nodeName: node-2\n  containers:\n  - name: shell\n    image: \"{NODE_SHELL_IMAGE}\"\n\
         \x20   command: [nc, -ll, -p, \"3128\", -e, /scripts/tunnel.sh]\n\
         \x20   ports: [{{name: proxy, containerPort: 3128}}]\n\
         \x20   volumeMounts: [{{name: scripts, mountPath: /scripts}}]\n\
         \x20 volumes: [{{name: scripts, configMap: {{name: tunnel-script, defaultMode: 493}}}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: proxy}}]\n---\n"
    )
}

fn workloads() -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: banner, namespace: {NS}, labels: {{app: banner}}}}\n\
         spec:\n  nodeName: node-2\n  containers:\n  - name: shell\n    image: \"{NODE_SHELL_IMAGE}\"\n\
         \x20   command: [sh, -c, \"while true; do echo '{BANNER}' | nc -l -p 2525; done\"]\n\
         \x20   ports: [{{name: smtp, containerPort: 2525}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: mail, namespace: {NS}}}\n\
         spec:\n  selector: {{app: banner}}\n  ports: [{{name: mail, port: 25, targetPort: smtp}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: shell, namespace: {NS}}}\n\
         spec:\n  nodeName: node-1\n  containers:\n  - name: shell\n    image: \"{NODE_SHELL_IMAGE}\"\n\
         \x20   command: [sleep, \"86400\"]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: echo, namespace: {NS}}}\n\
         spec:\n  nodeName: node-1\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: ws, namespace: {NS}, labels: {{app: ws}}}}\n\
         spec:\n  nodeName: node-2\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: ws-plain, namespace: {NS}, labels: {{app: ws-plain}},\n\
         \x20 annotations: {{aether.io/capture: disabled}}}}\n\
         spec:\n  nodeName: node-2\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: ws, namespace: {NS}}}\n\
         spec:\n  selector: {{app: ws}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: ws-plain, namespace: {NS}}}\n\
         spec:\n  selector: {{app: ws-plain}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         {tunnel}{tunnel_plain}\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: hijack, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: kubernetes, namespace: default, port: 443}}]\n\
         \x20 rules: [{{backendRefs: [{{name: mail, port: 25}}]}}]\n---\n\
         {script}",
        tunnel = tunnel("tunnel", false),
        tunnel_plain = tunnel("tunnel-plain", true),
        script = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "tunnel-script", "namespace": NS},
            "data": {"tunnel.sh": TUNNEL_SCRIPT},
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_carried_as_what_they_are() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&workloads())?;
    cluster.wait_ready(NS, 7, Duration::from_secs(90)).await?;
    wait_nodes_applied(&cluster).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);

    let shell = pods.get("shell").await.context("the shell pod")?;
    a_server_first_protocol_gets_its_banner_through(&cluster, &shell).await?;
    let echo = pods.get("echo").await.context("the echo pod")?;
    a_route_on_the_api_servers_https_port_changes_nothing(&cluster, &echo).await?;
    a_websocket_goes_through(&cluster, &echo, "ws", true).await?;
    a_websocket_goes_through(&cluster, &echo, "ws-plain", false).await?;
    a_connect_tunnel_goes_through(&cluster, &shell, "tunnel", true).await?;
    a_connect_tunnel_goes_through(&cluster, &shell, "tunnel-plain", false).await?;
    only_tls_crosses_the_node_link(&cluster, &shell, &echo).await?;

    cluster.delete_namespaces(&[NS])?;
    uninstall(&cluster).await?;
    Ok(())
}

async fn a_server_first_protocol_gets_its_banner_through(
    cluster: &Cluster,
    shell: &Pod,
) -> Result<()> {
    // The client stays silent for 2 s, well past the proxy's sniffing wait: it only reads.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = cluster.exec(shell, "shell", &["sh", "-c", "sleep 2 | nc -w 5 mail 25"])?;
        let got = String::from_utf8_lossy(&output.stdout);
        if got.contains(BANNER) {
            eprintln!(
                "a server-first protocol on an undeclared port got its banner through the mesh"
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "no banner from a server-first protocol: {got:?} {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A WebSocket from `from` to Service `service`: the echo server answers the client's message
/// with what it saw of the handshake. Over mTLS (`meshed`) it saw the caller's identity.
async fn a_websocket_goes_through(
    cluster: &Cluster,
    from: &Pod,
    service: &str,
    meshed: bool,
) -> Result<()> {
    // The server appends its status line right after the message: a newline keeps it apart.
    let args = [format!("ws://{service}/"), "--msg=ping\n".to_string()];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answered = client(cluster, from, &args).await;
        let exchange = answered.as_ref().ok().and_then(|a| a.first());
        let identity = exchange.and_then(|e| e.body.identity());
        let expected = format!("spiffe://cluster.local/ns/{NS}/sa/default");
        match exchange {
            Some(e)
                if e.status == Some(200) && (identity.as_deref() == Some(&expected)) == meshed =>
            {
                eprintln!(
                    "a WebSocket to {service} went through (caller identity seen: {identity:?})"
                );
                return Ok(());
            }
            _ if Instant::now() > deadline => {
                bail!("a WebSocket to {service} (meshed: {meshed}) got {answered:?}")
            }
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

async fn a_route_on_the_api_servers_https_port_changes_nothing(
    cluster: &Cluster,
    echo: &Pod,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let route: Value = serde_json::from_str(&cluster.kubectl(&[
            "-n",
            NS,
            "get",
            "httproute",
            "hijack",
            "-o",
            "json",
        ])?)?;
        let accepted = route["status"]["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["conditions"].as_array().into_iter().flatten())
            .find(|c| c["type"] == "Accepted")
            .cloned();
        match accepted {
            Some(c) if c["status"] == "False" && c["reason"] == "UnsupportedProtocol" => break,
            Some(c) if c["status"] == "True" => {
                bail!("a tenant's route on default/kubernetes:443 was accepted: {c}")
            }
            _ if Instant::now() > deadline => {
                bail!("the route on default/kubernetes:443 has no verdict: {route}")
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    let args = [
        "https://kubernetes.default.svc/version".to_string(),
        "--insecure-skip-verify".to_string(),
    ];
    let answered = client(cluster, echo, &args).await?;
    match answered.first().and_then(|e| e.status) {
        // Anonymous: the API server answers, its TLS untouched by the mesh.
        Some(status) => eprintln!(
            "a tenant's route on default/kubernetes:443 is UnsupportedProtocol; the API server still answers its pods ({status})"
        ),
        None => bail!(
            "with a tenant's route on default/kubernetes, the API server did not answer: {answered:?}"
        ),
    }
    Ok(())
}

/// A CONNECT from `shell` to the forward proxy behind `service`: the tunnel opens, the proxy
/// says which identity the CONNECT carried (the caller's over mTLS, `meshed`, else none), and a
/// line sent through the tunnel comes back.
async fn a_connect_tunnel_goes_through(
    cluster: &Cluster,
    shell: &Pod,
    service: &str,
    meshed: bool,
) -> Result<()> {
    let client = format!(
        "(printf 'CONNECT upstream.example:443 HTTP/1.1\\r\\nHost: upstream.example:443\\r\\n\\r\\n'; \
         sleep 1; echo tunnel-ping; sleep 2) | nc -w 5 {service} 80"
    );
    let expected = if meshed {
        format!("tunnel-open identity=spiffe://cluster.local/ns/{NS}/sa/default")
    } else {
        "tunnel-open identity=none".to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = cluster.exec(shell, "shell", &["sh", "-c", &client])?;
        let got = String::from_utf8_lossy(&output.stdout);
        let opened = got.starts_with("HTTP/1.1 200");
        if opened && got.contains(&expected) && got.contains("tunnel-ping") {
            eprintln!("a CONNECT to {service} went through: {expected}");
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "a CONNECT to {service} (meshed: {meshed}) got {got:?} {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn only_tls_crosses_the_node_link(cluster: &Cluster, shell: &Pod, echo: &Pod) -> Result<()> {
    let marker = format!("aether-wire-{}", std::process::id());
    let (tcp, http, plain) = (
        format!("{marker}-tcp"),
        format!("{marker}-http"),
        format!("{marker}-plain"),
    );
    let capture = Capture::start("vh-node-1")?;
    let banner = cluster.exec(
        shell,
        "shell",
        &["sh", "-c", &format!("echo {tcp} | nc -w 3 mail 25")],
    );
    let meshed = client(cluster, echo, &[format!("http://ws/{http}")]).await;
    let clear = client(cluster, echo, &[format!("http://ws-plain/{plain}")]).await;
    let captured = capture.stop()?;

    let banner = banner?;
    if !String::from_utf8_lossy(&banner.stdout).contains(BANNER) {
        bail!("raw TCP through the mesh got no banner: {banner:?}");
    }
    for (what, answered) in [("meshed", &meshed), ("opted-out", &clear)] {
        let status = answered
            .as_ref()
            .ok()
            .and_then(|a| a.first())
            .and_then(|e| e.status);
        if status != Some(200) {
            bail!("the request to the {what} pod got {answered:?}");
        }
    }
    if !captured.contains(plain.as_bytes()) {
        bail!(
            "the capture of node-1's link ({} frames) missed the plaintext request to the opted-out pod",
            captured.frames
        );
    }
    for (what, bytes) in [
        ("the raw TCP client's line", tcp.as_bytes()),
        ("the server's banner", BANNER.as_bytes()),
        ("the meshed HTTP request", http.as_bytes()),
    ] {
        if captured.contains(bytes) {
            bail!("{what} crossed node-1's link in plaintext");
        }
    }
    if captured.tls_records() == 0 {
        bail!("no TLS record crossed node-1's link");
    }
    eprintln!(
        "node-1's link: {} frames, {} TLS records, no byte of the meshed traffic in the clear; the opted-out request in the clear",
        captured.frames,
        captured.tls_records()
    );
    Ok(())
}
