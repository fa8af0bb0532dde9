//! The node proxies' memory at scale: their resident memory with the cluster as the suite
//! leaves it (the baseline), then with 10,000 more Services and 50,000 endpoints in a managed
//! namespace (selector-less Services, each with one EndpointSlice of 5 ready endpoints at
//! addresses no pod has), once it has settled; the figures per Service and per endpoint; then
//! again once they are deleted (what is left over is memory not given back). Every proxy
//! watches every Service and EndpointSlice (any pod may dial any Service), so this is each
//! node's cost of a cluster of that size.
//!
//! `cargo bench -p aether-e2e --bench proxy_memory` (root; starts the cluster if it is not
//! running, installs aether, and leaves it installed). `-- SERVICES` changes the count (5
//! endpoints each).

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{install, proxy_rss};
use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "bench-proxy-memory";
const NODES: [&str; 2] = ["node-1", "node-2"];
const ENDPOINTS_PER_SERVICE: usize = 5;
/// Creations in flight at once.
const CONCURRENCY: usize = 32;
/// RSS is settled when it moved less than this over [`SETTLE_SAMPLES`] samples.
const SETTLED: f64 = 0.02;
const SETTLE_SAMPLES: usize = 3;
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

fn service(i: usize) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("s{i}"), "namespace": NS},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))?)
}

/// Service `i`'s endpoints: addresses in 10.250.0.0/16 and up, which no pod has.
fn slice(i: usize) -> Result<EndpointSlice> {
    let endpoints: Vec<_> = (0..ENDPOINTS_PER_SERVICE)
        .map(|e| {
            let n = i * ENDPOINTS_PER_SERVICE + e;
            let address = format!("10.{}.{}.{}", 250 + n / 65_536, (n / 256) % 256, n % 256);
            json!({"addresses": [address], "conditions": {"ready": true}})
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": format!("s{i}-1"),
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": format!("s{i}")},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))?)
}

/// Samples the proxies' RSS until every one has settled; returns the last sample.
async fn settled(cluster: &Cluster) -> Result<Vec<u64>> {
    let started = Instant::now();
    let mut samples: Vec<Vec<u64>> = Vec::new();
    loop {
        samples.push(proxy_rss(cluster, &NODES).await?);
        if samples.len() >= SETTLE_SAMPLES {
            let recent = &samples[samples.len() - SETTLE_SAMPLES..];
            let steady = (0..NODES.len()).all(|n| {
                let (low, high) = recent
                    .iter()
                    .fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s[n]), hi.max(s[n])));
                (high - low) as f64 <= high as f64 * SETTLED
            });
            if steady {
                return Ok(recent[SETTLE_SAMPLES - 1].clone());
            }
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the proxies' memory did not settle within 10 minutes: {samples:?}");
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let count: usize = match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        Some(n) => n.parse().context("the Service count")?,
        None => 10_000,
    };
    let cluster = Cluster::get().await?;
    install(&cluster, &[]).await?;
    cluster.delete_namespaces(&[NS])?;
    cluster.apply_text(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, labels: {{aether.io/managed: \"true\"}}}}\n"
    ))?;
    let baseline = settled(&cluster).await?;

    let services: Api<Service> = Api::namespaced(cluster.client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client.clone(), NS);
    let created = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                services
                    .create(&PostParams::default(), &service(i)?)
                    .await?;
                slices.create(&PostParams::default(), &slice(i)?).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    eprintln!(
        "created {count} Services and {} endpoints in {:.0} s",
        count * ENDPOINTS_PER_SERVICE,
        created.elapsed().as_secs_f64()
    );
    let loaded = settled(&cluster).await?;
    let endpoints = count * ENDPOINTS_PER_SERVICE;
    println!("proxy RSS, MiB: baseline / with {count} Services and {endpoints} endpoints");
    for (n, node) in NODES.iter().enumerate() {
        let grown = loaded[n].saturating_sub(baseline[n]);
        println!(
            "{node}: {:.1} / {:.1} ({:.1}x); {:.1} KiB more per Service with its endpoints",
            mib(baseline[n]),
            mib(loaded[n]),
            loaded[n] as f64 / baseline[n] as f64,
            grown as f64 / count as f64,
        );
    }

    // Deleting 20,000 objects takes the namespace controller minutes on this machine.
    cluster.kubectl(&["delete", "namespace", NS, "--wait", "--timeout=1200s"])?;
    let emptied = settled(&cluster).await?;
    let left: Vec<String> = emptied
        .iter()
        .map(|kib| format!("{:.1}", mib(*kib)))
        .collect();
    println!("once they are deleted again, MiB: {}", left.join(" / "));
    Ok(())
}
