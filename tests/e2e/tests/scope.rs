//! A consumer route changes how its own namespace's pods reach a Service, and nobody else's
//! (GEP-1294), on the local cluster. `e2e-scope-a` has an HTTPRoute on `e2e-scope-ext/web`, a
//! Service of a namespace outside the mesh, that redirects every request. Two meshed pods on
//! the same node: the one of `e2e-scope-a` captures web's ClusterIP and gets the redirect; the
//! one of `e2e-scope-b` does not capture it (its table does not hold the address) and reaches
//! web's pod as before.

use std::time::Duration;

use aether_e2e::Cluster;
use aether_e2e::mesh::{ECHO_IMAGE, client, install, uninstall, wait_accepted, wait_nodes_applied};
use aether_test_support::cases::RouteRef;
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;

const EXT: &str = "e2e-scope-ext";
const A: &str = "e2e-scope-a";
const B: &str = "e2e-scope-b";

fn workloads() -> String {
    let caller = |ns: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{aether.io/managed: \"true\"}}}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: caller, namespace: {ns}}}\n\
             spec:\n  nodeName: node-1\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n---\n"
        )
    };
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {EXT}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: {EXT}, labels: {{app: web}}}}\n\
         spec:\n  nodeName: node-2\n  containers: [{{name: echo, image: \"{ECHO_IMAGE}\"}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {EXT}}}\n\
         spec:\n  selector: {{app: web}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
         {a}{b}\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: away, namespace: {A}}}\n\
         spec:\n  parentRefs: [{{group: \"\", kind: Service, name: web, namespace: {EXT}, port: 80}}]\n\
         \x20 rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{hostname: elsewhere.example, statusCode: 302}}}}]}}]\n",
        a = caller(A),
        b = caller(B),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_route_changes_only_its_own_namespaces_pods() -> Result<()> {
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[EXT, A, B])?;
    cluster.apply_text(&workloads())?;
    for ns in [EXT, A, B] {
        cluster.wait_ready(ns, 1, Duration::from_secs(90)).await?;
    }
    wait_accepted(
        &cluster,
        &[RouteRef {
            kind: "HTTPRoute".into(),
            name: "away".into(),
            namespace: A.into(),
            parent_ref: None,
        }],
    )
    .await?;
    wait_nodes_applied(&cluster).await?;
    let web: Service = Api::namespaced(cluster.client.clone(), EXT)
        .get("web")
        .await
        .context("Service web")?;
    let ip = web
        .spec
        .and_then(|s| s.cluster_ip)
        .context("web has no ClusterIP")?;
    let element = format!("{ip} . 80");
    let url = format!("http://web.{EXT}/");
    for (ns, routed) in [(A, true), (B, false)] {
        let caller: Pod = Api::namespaced(cluster.client.clone(), ns)
            .get("caller")
            .await
            .with_context(|| format!("{ns}/caller"))?;
        let set = cluster.nft_in_pod(&caller, &["list", "set", "inet", "aether", "capture4"])?;
        let set = String::from_utf8_lossy(&set.stdout).into_owned();
        if set.contains(&element) != routed {
            bail!("{ns}/caller's table should capture {element}: {routed}; it holds:\n{set}");
        }
        let exchanges = client(&cluster, &caller, &[url.clone(), "--count=5".into()]).await?;
        for exchange in &exchanges {
            let good = if routed {
                exchange.status == Some(302)
                    && exchange
                        .response_header("location")
                        .is_some_and(|l| l.contains("elsewhere.example"))
            } else {
                exchange.status == Some(200)
                    && exchange.body.hostname == "web"
                    && exchange.body.identity().is_none()
            };
            if !good {
                bail!("{ns}/caller to {url} (route of {A}: {routed}): {exchange:?}");
            }
        }
        if exchanges.len() != 5 {
            bail!(
                "{ns}/caller: {} answers of 5: {exchanges:?}",
                exchanges.len()
            );
        }
        eprintln!(
            "{ns}/caller: captures {element}: {routed}; 5 requests to {url} answered as {}",
            if routed {
                "the route's redirect"
            } else {
                "web's pod, untouched"
            }
        );
    }
    cluster.delete_namespaces(&[EXT, A, B])?;
    uninstall(&cluster).await?;
    Ok(())
}
