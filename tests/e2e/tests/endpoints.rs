//! Whether an endpoint takes mTLS is known per pod, not per namespace: behind one Service in a
//! managed namespace, a meshed pod, a pod opted out with `aether.io/capture: disabled` and a
//! hostNetwork pod all answer a meshed caller. The meshed pod sees the caller's SPIFFE ID
//! (mTLS); the other two are reached with plain connections (no inbound listener to send mTLS
//! to, so no 503), and see no identity. The same holds for a Service with a route (`web`) and
//! for one without (`bare`): a Service with meshed endpoints is captured either way.
//!
//! Behind a headless Service (`pods`), a caller dials the pods' own addresses: the meshed pod
//! is reached over mTLS (it sees the caller's identity; its own table leaves its address
//! alone, so its inbound side can deliver there), the opted-out one with a plain connection.

use std::collections::BTreeMap;
use std::time::Duration;

use aether_e2e::mesh::{
    ECHO_IMAGE, TRUST_DOMAIN, client, install, uninstall, wait_accepted, wait_nodes_applied,
};
use aether_e2e::{Cluster, pod_ip};
use aether_test_support::cases::RouteRef;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const NS: &str = "e2e-endpoints";
/// The hostNetwork pod's port on node-2's network; no other test's pod uses it.
const HOST_PORT: u16 = 18099;
const REQUESTS: usize = 45;

fn workloads() -> String {
    let pod = |name: &str, extra: &str, port: u16| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}, labels: {{app: web}}{extra}}}\n\
             spec:\n  serviceAccountName: web\n  nodeName: node-2\n{}  containers:\n  - name: echo\n\
             \x20   image: \"{ECHO_IMAGE}\"\n    args: [--port={port}]\n\
             \x20   ports: [{{name: http, containerPort: {port}}}]\n\
             \x20   readinessProbe: {{tcpSocket: {{port: {port}}}, periodSeconds: 1}}\n---\n",
            if port == HOST_PORT {
                "  hostNetwork: true\n"
            } else {
                ""
            }
        )
    };
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: web, namespace: {NS}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: caller, namespace: {NS}}}\n---\n\
         {}{}{}\
         apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {NS}}}\n\
         spec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: http, appProtocol: http}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: bare, namespace: {NS}}}\n\
         spec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: http, appProtocol: http}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: pods, namespace: {NS}}}\n\
         spec:\n  clusterIP: None\n  selector: {{app: web}}\n  ports: [{{name: http, port: 8080, targetPort: http}}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: web, namespace: {NS}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: web, port: 80}}]\n\
         \x20 rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: caller, namespace: {NS}}}\n\
         spec:\n  serviceAccountName: caller\n  nodeName: node-1\n\
         \x20 containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n",
        pod("meshed", "", 8080),
        pod(
            "opted-out",
            ", annotations: {aether.io/capture: disabled}",
            8080
        ),
        pod("host", "", HOST_PORT),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshed_opted_out_and_host_network_endpoints_of_a_service_all_answer() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&workloads())?;
    cluster.wait_ready(NS, 4, Duration::from_secs(90)).await?;
    wait_accepted(
        &cluster,
        &[RouteRef {
            kind: "HTTPRoute".into(),
            name: "web".into(),
            namespace: NS.into(),
            parent_ref: None,
        }],
    )
    .await?;
    wait_nodes_applied(&cluster).await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let caller = pods.get("caller").await.context("the caller pod")?;
    let identity = format!("spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/caller");
    for url in ["http://web/", "http://bare/"] {
        answered_by_all_three(&cluster, &caller, url, &identity).await?;
    }
    for (name, meshed) in [("meshed", true), ("opted-out", false)] {
        let pod = pods
            .get(name)
            .await
            .with_context(|| format!("pod {name}"))?;
        let want = meshed.then_some(identity.as_str());
        answered_directly(&cluster, &caller, &pod, want).await?;
    }
    cluster.delete_namespaces(&[NS])?;
    uninstall(&cluster).await?;
    Ok(())
}

/// `REQUESTS` requests to `url`, every one answered, by each of the three pods; only the
/// meshed one sees `identity`.
async fn answered_by_all_three(
    cluster: &Cluster,
    caller: &Pod,
    url: &str,
    identity: &str,
) -> Result<()> {
    let exchanges = client(
        cluster,
        caller,
        &[url.to_owned(), format!("--count={REQUESTS}")],
    )
    .await?;
    // Served by -> the identities it saw.
    let mut seen: BTreeMap<&str, Vec<Option<String>>> = BTreeMap::new();
    for exchange in &exchanges {
        if exchange.status != Some(200) {
            bail!("{url}: a request failed: {exchange:?}");
        }
        let body = &exchange.body;
        let by = if body.service_port == HOST_PORT.to_string() {
            "host"
        } else {
            match body.hostname.as_str() {
                "meshed" => "meshed",
                "opted-out" => "opted-out",
                other => bail!("served by an unknown pod {other:?}: {exchange:?}"),
            }
        };
        seen.entry(by).or_default().push(body.identity());
    }
    if exchanges.len() != REQUESTS || seen.len() != 3 {
        bail!(
            "{url}: {} answers of {REQUESTS}, not from all three pods: {seen:?}",
            exchanges.len()
        );
    }
    for (pod, identities) in &seen {
        let want = (*pod == "meshed").then_some(identity);
        if identities.iter().any(|i| i.as_deref() != want) {
            bail!(
                "{url}: pod {pod} saw callers {identities:?}, expected {want:?} on every request"
            );
        }
    }
    eprintln!(
        "{url}: {REQUESTS} requests, none failed: the meshed pod saw {identity} on each, the opted-out and hostNetwork pods plain requests ({seen:?})"
    );
    Ok(())
}

/// Requests from `caller` to `pod`'s own address, a headless Service's endpoint: each is
/// answered by that pod, which sees `identity` (mTLS) or none (a plain connection).
async fn answered_directly(
    cluster: &Cluster,
    caller: &Pod,
    pod: &Pod,
    identity: Option<&str>,
) -> Result<()> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let url = format!("http://{}:8080/", pod_ip(pod)?);
    let exchanges = client(cluster, caller, &[url.clone(), "--count=10".into()]).await?;
    for exchange in &exchanges {
        if exchange.status != Some(200)
            || exchange.body.hostname != name
            || exchange.body.identity().as_deref() != identity
        {
            bail!(
                "{url} (headless {NS}/pods): expected {name} to answer seeing {identity:?}: {exchange:?}"
            );
        }
    }
    if exchanges.len() != 10 {
        bail!("{url}: {} answers of 10: {exchanges:?}", exchanges.len());
    }
    eprintln!("{url}: the headless Service's pod {name} answered 10 requests, seeing {identity:?}");
    Ok(())
}
