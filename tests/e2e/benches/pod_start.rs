//! What aether costs a pod at start, on the local cluster's real nodes (kubelet, containerd,
//! runc, the node's CNI chain), for pods created one after another:
//!
//! - **create → Ready** (median, p90) without aether, and with aether installed for pods of an
//!   unmanaged and of a managed namespace (`aether.io/managed=true`: aether-cni installs the
//!   pod's capture table and registers it with the node proxy). The cases take turns over a
//!   few rounds (aether uninstalled, then installed again), and the unmanaged and managed pods
//!   alternate, so the machine's noise hits them alike;
//! - **CNI ADD as containerd invokes it**: each plugin of the node's chain (bridge, portmap,
//!   aether-cni) is wrapped for the run by a script that logs the time around the real plugin,
//!   so the chain's ADD without aether-cni and aether-cni's own ADD are read per pod;
//! - **the node proxy's resident memory per captured pod** (before and after the last round's
//!   managed pods).
//!
//! Run: `cargo bench -p aether-e2e --bench pod_start` (root; starts the cluster if it is not
//! running; leaves aether installed or not, as it found it). Figures are of the build the
//! cluster runs: start it with `AETHER_PROFILE=release tests/cluster/up.sh` for release ones.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aether_e2e::mesh::{ECHO_IMAGE, install, proxy_rss, uninstall};
use aether_e2e::{Cluster, is_ready};
use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

/// Pods per case and round; the cases take turns over the rounds.
const PODS: usize = 8;
const ROUNDS: usize = 3;
const WARM_UP: usize = 2;
const SETTLE: Duration = Duration::from_secs(15);
const NODES: [&str; 2] = ["node-1", "node-2"];
/// Where the wrapped plugins log, on each node (its own /run).
const TIMES: &str = "/run/aether-bench-cni-times";

async fn start_one(pods: &Api<Pod>, name: &str) -> Result<Duration> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "echo", "image": ECHO_IMAGE}]},
    }))?;
    let started = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    while started.elapsed() < Duration::from_secs(60) {
        if pods.get_opt(name).await?.as_ref().is_some_and(is_ready) {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bail!("pod {name} not Ready after 60 s")
}

async fn namespace(cluster: &Cluster, name: &str, managed: bool) -> Result<Api<Pod>> {
    cluster.kubectl(&["delete", "namespace", name, "--ignore-not-found", "--wait"])?;
    cluster.kubectl(&["create", "namespace", name])?;
    if managed {
        cluster.kubectl(&["label", "namespace", name, "aether.io/managed=true"])?;
    }
    cluster.kubectl(&[
        "-n",
        name,
        "wait",
        "--for=create",
        "serviceaccount/default",
        "--timeout=30s",
    ])?;
    Ok(Api::namespaced(cluster.client.clone(), name))
}

/// Wraps (or, with `wrap` false, unwraps) the plugins in each node's CNI bin directory.
fn wrap_plugins(cluster: &Cluster, plugins: &[&str], wrap: bool) -> Result<()> {
    for node in NODES {
        for plugin in plugins {
            let script = if wrap {
                // bash's EPOCHREALTIME reads the clock without a fork, so the wrapper adds
                // only its own start to what it measures.
                format!(
                    "cd /opt/cni/bin && [ ! -e {plugin}.timed ] && mv {plugin} {plugin}.timed && \
                     printf '%s\\n' '#!/bin/bash' 's=$EPOCHREALTIME' '/opt/cni/bin/{plugin}.timed \"$@\"; rc=$?' \
                     'echo \"{plugin} $CNI_COMMAND $s $EPOCHREALTIME $CNI_ARGS\" >> {TIMES}' 'exit $rc' > {plugin} && \
                     chmod 755 {plugin}"
                )
            } else {
                format!(
                    "cd /opt/cni/bin && [ -e {plugin}.timed ] && mv -f {plugin}.timed {plugin}; true"
                )
            };
            cluster.on_node_ok(node, &["sh", "-c", &script])?;
        }
    }
    Ok(())
}

/// A plugin's ADD time for one pod: (plugin, pod namespace, pod name) → duration.
type AddTimes = BTreeMap<(String, String, String), Duration>;

/// ADD durations from the wrappers' logs, which are then cleared.
fn add_times(cluster: &Cluster) -> Result<AddTimes> {
    let mut times = AddTimes::new();
    for node in NODES {
        let log = cluster.on_node_ok(
            node,
            &[
                "sh",
                "-c",
                &format!("cat {TIMES} 2>/dev/null; rm -f {TIMES}"),
            ],
        )?;
        for line in log.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [plugin, "ADD", start, end, args, ..] = words.as_slice() else {
                continue;
            };
            let (Ok(start), Ok(end)) = (start.parse::<f64>(), end.parse::<f64>()) else {
                continue;
            };
            let arg = |key: &str| {
                args.split(';')
                    .find_map(|kv| kv.strip_prefix(key))
                    .unwrap_or_default()
                    .to_owned()
            };
            times.insert(
                (
                    (*plugin).to_owned(),
                    arg("K8S_POD_NAMESPACE="),
                    arg("K8S_POD_NAME="),
                ),
                Duration::from_secs_f64((end - start).max(0.0)),
            );
        }
    }
    Ok(times)
}

/// The median over a namespace's measured pods of the summed ADD times of `plugins`.
fn median_add(times: &AddTimes, plugins: &[&str], namespace: &str) -> Duration {
    let mut per_pod: BTreeMap<&str, Duration> = BTreeMap::new();
    for ((plugin, ns, pod), took) in times {
        if ns == namespace && pod.starts_with("bench-") && plugins.contains(&plugin.as_str()) {
            *per_pod.entry(pod).or_default() += *took;
        }
    }
    let mut sorted: Vec<Duration> = per_pod.into_values().collect();
    sorted.sort();
    quantile(&sorted, 0.5)
}

fn installed(cluster: &Cluster) -> bool {
    cluster
        .kubectl(&[
            "-n",
            "aether-system",
            "get",
            "deployment",
            "aether-operator",
        ])
        .is_ok()
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted
        .get(((sorted.len().saturating_sub(1)) as f64 * q).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

const PLAIN: &str = "bench-pod-start-plain";
const UNMANAGED: &str = "bench-pod-start-unmanaged";
const MANAGED: &str = "bench-pod-start-managed";

#[tokio::main]
async fn main() -> Result<()> {
    let cluster = Cluster::get().await?;
    let was_installed = installed(&cluster);
    let chain = ["bridge", "portmap"];
    wrap_plugins(&cluster, &chain, true)?;
    let plain = namespace(&cluster, PLAIN, false).await?;
    let unmanaged = namespace(&cluster, UNMANAGED, false).await?;
    let managed = namespace(&cluster, MANAGED, true).await?;
    let (mut without, mut with_unmanaged, mut with_managed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut before, mut after, mut placed) = (Vec::new(), Vec::new(), BTreeMap::new());
    for round in 0..ROUNDS {
        // Without aether, then with it: the cases take turns, round after round.
        if installed(&cluster) {
            wrap_plugins(&cluster, &["aether-cni"], false)?;
            uninstall(&cluster).await?;
        }
        // What an install or uninstall sets off (caches filling, SVIDs, tables removed) is
        // over before a case is measured.
        tokio::time::sleep(SETTLE).await;
        for i in 0..WARM_UP {
            start_one(&plain, &format!("warm-{round}-{i}")).await?;
        }
        for i in 0..PODS {
            without.push(start_one(&plain, &format!("bench-{round}-{i}")).await?);
        }
        install(&cluster, &[]).await?;
        wrap_plugins(&cluster, &["aether-cni"], true)?;
        tokio::time::sleep(SETTLE).await;
        // The first pods after an install bring SVIDs and config to the nodes.
        for i in 0..WARM_UP {
            start_one(&unmanaged, &format!("warm-{round}-{i}")).await?;
            start_one(&managed, &format!("warm-{round}-{i}")).await?;
        }
        before = proxy_rss(&cluster, &NODES).await?;
        for i in 0..PODS {
            with_unmanaged.push(start_one(&unmanaged, &format!("bench-{round}-{i}")).await?);
            with_managed.push(start_one(&managed, &format!("bench-{round}-{i}")).await?);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        after = proxy_rss(&cluster, &NODES).await?;
        placed.clear();
        let prefix = format!("bench-{round}-");
        for pod in managed.list(&ListParams::default()).await?.items {
            if pod
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&prefix))
            {
                let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
                *placed.entry(node).or_insert(0usize) += 1;
            }
        }
    }
    let times = add_times(&cluster)?;
    wrap_plugins(&cluster, &["aether-cni"], false)?;
    wrap_plugins(&cluster, &chain, false)?;
    for ns in [PLAIN, UNMANAGED, MANAGED] {
        cluster.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    }
    if !was_installed {
        uninstall(&cluster).await?;
    }

    println!(
        "pod start on the local cluster's nodes, {} pods per case created one after another, over {ROUNDS} rounds:",
        PODS * ROUNDS
    );
    println!(
        "{:<16} {:>10} {:>10} {:>22} {:>18}",
        "case", "median", "p90", "bridge+portmap ADD", "aether-cni ADD"
    );
    for (name, ns, latencies) in [
        ("without aether", PLAIN, &mut without),
        ("unmanaged", UNMANAGED, &mut with_unmanaged),
        ("managed", MANAGED, &mut with_managed),
    ] {
        latencies.sort();
        let cni = if ns == PLAIN {
            "-".to_owned()
        } else {
            format!("{:.1} ms", ms(median_add(&times, &["aether-cni"], ns)))
        };
        println!(
            "{:<16} {:>7.0} ms {:>7.0} ms {:>19.1} ms {:>18}",
            name,
            ms(quantile(latencies, 0.5)),
            ms(quantile(latencies, 0.9)),
            ms(median_add(&times, &chain, ns)),
            cni
        );
    }
    println!(
        "aether adds {:+.0} ms to the median pod start of a managed pod, {:+.0} ms to an unmanaged one's",
        ms(quantile(&with_managed, 0.5)) - ms(quantile(&without, 0.5)),
        ms(quantile(&with_unmanaged, 0.5)) - ms(quantile(&without, 0.5)),
    );
    for (i, node) in NODES.iter().enumerate() {
        let pods = placed.get(*node).copied().unwrap_or_default();
        if pods > 0 {
            println!(
                "proxy RSS on {node}: {} KiB before, {} KiB with {pods} more captured pods: {:.0} KiB per pod",
                before[i],
                after[i],
                after[i].saturating_sub(before[i]) as f64 / pods as f64
            );
        }
    }
    Ok(())
}
