//! The operator at scale, against the local cluster's real API server: 100 namespaces,
//! 5,000 Services, 1,000 HTTPRoutes (so 1,000 route targets), 20,000 Pods and 50 Nodes (API
//! objects only: the pods are bound to Nodes no kubelet runs). Each namespace's pods run on
//! two nodes, as a team's workloads would. Prints the full-sync time, the time from an
//! HTTPRoute change to the affected NodeConfigs (p50/p99), the peak RSS of this process
//! (operator caches included), and the largest NodeConfig against the whole mesh.
//!
//! Run (as root): `cargo bench -p aether-operator --bench scale`. It takes a few minutes,
//! most of them creating the objects, and deletes them afterwards.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aether_crds::NodeConfig;
use aether_e2e::Cluster;
use aether_routing::table::BackendTarget;
use anyhow::{Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use gateway_api::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NAMESPACES: usize = 100;
const SERVICES_PER_NS: usize = 50;
const PODS_PER_NS: usize = 200;
const ROUTES_PER_NS: usize = 10;
const NODES: usize = 50;
const CHANGES: usize = 20;
const CONCURRENCY: usize = 32;
const METRICS: &str = "127.0.0.1:19090";

/// Reconcile passes, their mean duration and the writes, from the operator's /metrics.
fn reconcile_summary() -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(METRICS)?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    // `name{pass="..."} value` or `name value`.
    let value = |name: &str, pass: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|rest| pass.is_empty() || rest.contains(&format!("pass=\"{pass}\"")))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            // An empty sum is -0.0.
            .sum::<f64>()
            + 0.0
    };
    let pass = |pass: &str| {
        let count = value("aether_operator_reconcile_duration_seconds_count", pass);
        let seconds = value("aether_operator_reconcile_duration_seconds_sum", pass);
        format!(
            "{count:.0} {pass} passes, mean {:.0} ms",
            1000.0 * seconds / count.max(1.0)
        )
    };
    Ok(format!(
        "{}; {}; {:.0} writes",
        pass("config"),
        pass("status"),
        value("aether_operator_writes_total", "")
    ))
}

const PREFIX: &str = "bench-scale-";
const NODE_PREFIX: &str = "bench-node-";

/// Names carry the process id: a previous run's namespaces may still be terminating.
fn ns(i: usize) -> String {
    format!("{PREFIX}{}-{i}", std::process::id())
}

fn node(j: usize) -> String {
    format!("{NODE_PREFIX}{}-{j}", std::process::id())
}

/// Deletes every bench namespace, Node and NodeConfig, this run's and any earlier run's.
async fn remove_bench_objects(client: &kube::Client) -> Result<()> {
    let named = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                 prefix: &str| {
        meta.name.clone().filter(|n| n.starts_with(prefix))
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    // The bench's pods have no kubelet to confirm their deletion: they go at once, or the
    // namespace would wait for the pod garbage collector, a few hundred pods a minute.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for name in namespaces
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(|n| named(&n.metadata, PREFIX))
    {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &name);
        let _ = pods.delete_collection(&now, &Default::default()).await;
        let _ = namespaces.delete(&name, &DeleteParams::default()).await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for name in nodes
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(|n| named(&n.metadata, NODE_PREFIX))
    {
        let _ = nodes.delete(&name, &DeleteParams::default()).await;
    }
    let configs: Api<NodeConfig> = Api::all(client.clone());
    for name in configs
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(|n| named(&n.metadata, NODE_PREFIX))
    {
        let _ = configs.delete(&name, &DeleteParams::default()).await;
    }
    Ok(())
}

/// The two nodes namespace `i`'s pods run on.
fn nodes_of(i: usize) -> [usize; 2] {
    [i % NODES, (i + 1) % NODES]
}

async fn create_all<K>(api_for: impl Fn(&K) -> Api<K>, objects: Vec<K>) -> Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    stream::iter(objects)
        .map(|object| {
            let api = api_for(&object);
            async move {
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(anyhow::Error::from(e)),
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn route(i: usize, r: usize, weight: u32) -> Result<HttpRoute> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": format!("route-{r}"), "namespace": ns(i)},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": format!("svc-{r}")}],
            "rules": [{"backendRefs": [
                {"name": format!("svc-{}", ROUTES_PER_NS + r), "port": 80, "weight": weight},
                {"name": format!("svc-{}", 2 * ROUTES_PER_NS + r), "port": 80, "weight": 100 - weight},
            ]}],
        },
    }))?)
}

async fn populate(client: &kube::Client) -> Result<()> {
    let namespaces: Vec<Namespace> = (0..NAMESPACES)
        .map(|i| {
            serde_json::from_value(
                json!({"metadata": {"name": ns(i), "labels": {"aether.io/managed": "true"}}}),
            )
        })
        .collect::<Result<_, _>>()?;
    create_all(|_| Api::all(client.clone()), namespaces).await?;
    let nodes: Vec<Node> = (0..NODES)
        .map(|j| serde_json::from_value(json!({"metadata": {"name": node(j)}})))
        .collect::<Result<_, _>>()?;
    create_all(|_| Api::all(client.clone()), nodes).await?;
    let mut services = Vec::new();
    let mut routes = Vec::new();
    let mut pods = Vec::new();
    for i in 0..NAMESPACES {
        for k in 0..SERVICES_PER_NS {
            services.push(serde_json::from_value::<Service>(json!({
                "metadata": {"name": format!("svc-{k}"), "namespace": ns(i)},
                "spec": {"selector": {"app": format!("svc-{k}")}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }))?);
        }
        for r in 0..ROUTES_PER_NS {
            routes.push(route(i, r, 90)?);
        }
        for p in 0..PODS_PER_NS {
            pods.push(serde_json::from_value::<Pod>(json!({
                "metadata": {"name": format!("pod-{p}"), "namespace": ns(i), "labels": {"app": format!("svc-{}", p % SERVICES_PER_NS)}},
                "spec": {"nodeName": node(nodes_of(i)[p % 2]), "serviceAccountName": "default",
                         "containers": [{"name": "app", "image": "registry.k8s.io/gateway-api/echo-advanced:v1.5.1"}]},
            }))?);
        }
    }
    let namespaced = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.namespace.clone().unwrap_or_default()
    };
    create_all(
        |s: &Service| Api::namespaced(client.clone(), &namespaced(&s.metadata)),
        services,
    )
    .await?;
    create_all(
        |r: &HttpRoute| Api::namespaced(client.clone(), &namespaced(&r.metadata)),
        routes,
    )
    .await?;
    // Pods are refused until a namespace's default ServiceAccount exists.
    tokio::time::sleep(Duration::from_secs(2)).await;
    create_all(
        |p: &Pod| Api::namespaced(client.clone(), &namespaced(&p.metadata)),
        pods,
    )
    .await?;
    Ok(())
}

/// Keeps the bench nodes alive as their kubelets would (Ready condition, Lease renewed),
/// so the node lifecycle controller does not mark 20,000 pods not ready in the middle of
/// the measurement.
async fn heartbeat(client: kube::Client) {
    use k8s_openapi::api::coordination::v1::Lease;
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    loop {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        for j in 0..NODES {
            let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "bench", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
            let _ = nodes
                .patch_status(&node(j), &PatchParams::default(), &Patch::Merge(&ready))
                .await;
            let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": node(j)},
                "spec": {"holderIdentity": node(j), "leaseDurationSeconds": 40, "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}});
            let _ = leases
                .patch(
                    &node(j),
                    &PatchParams::apply("aether-bench").force(),
                    &Patch::Apply(&lease),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// The weight of `svc-<10+r>` in node `j`'s table for target `ns(i)/svc-r`, if present.
fn weight_in(config: &NodeConfig, i: usize, r: usize) -> Option<u64> {
    let table = config
        .spec
        .tables
        .iter()
        .find(|t| t.namespace == ns(i) && t.service == format!("svc-{r}"))?;
    let backend = format!("svc-{}", ROUTES_PER_NS + r);
    let rules = &table
        .table
        .valid()
        .ok()?
        .ports
        .first()?
        .producer
        .as_ref()?
        .rules;
    rules
        .first()?
        .backends
        .iter()
        .find(|b| matches!(&b.target, BackendTarget::Service(s) if s.name == backend))
        .map(|b| u64::from(b.weight))
}

/// The operator's process, killed however the bench ends.
struct Operator(std::process::Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Peak resident memory of a process, from the kernel's high-water mark.
fn peak_rss_mb(pid: u32) -> f64 {
    memory_mb(pid, "VmHWM:")
}

/// A memory figure of `/proc/PID/status`, in MB.
fn memory_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let cluster = Cluster::get().await?;
    let client = cluster.client.clone();
    cluster.apply(&cluster.paths.repo.join("charts/aether/crds"))?;
    cluster.apply_kustomization(&aether_test_support::upstream::release()?.crds())?;
    // A run that failed half way leaves its objects; they would be measured with this one's.
    remove_bench_objects(&client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    while namespaces
        .list(&Default::default())
        .await?
        .items
        .iter()
        .any(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(PREFIX))
        })
    {
        if Instant::now() > deadline {
            bail!("namespaces of an earlier run are still terminating after 600 s");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let created = Instant::now();
    let nodes_alive = tokio::spawn(heartbeat(client.clone()));
    populate(&client).await?;
    eprintln!(
        "created {} objects in {:.0} s",
        NAMESPACES * (SERVICES_PER_NS + PODS_PER_NS + ROUTES_PER_NS + 1) + NODES,
        created.elapsed().as_secs_f64()
    );

    // The real operator binary, in its own process, so its memory is measured alone.
    let _ = cluster.kubectl(&["create", "namespace", "aether-system"]);
    let started = Instant::now();
    let operator = Operator(
        std::process::Command::new(env!("CARGO_BIN_EXE_aether-operator"))
            .args([
                "--metrics-addr",
                METRICS,
                "--ca-addr",
                "127.0.0.1:0",
                "--identity",
                "bench",
            ])
            .env("KUBECONFIG", &cluster.paths.kubeconfig)
            .env("RUST_LOG", "warn,aether_operator::controller=debug")
            .stderr(std::fs::File::create(
                std::env::temp_dir().join("aether-scale-operator.log"),
            )?)
            .spawn()?,
    );
    let configs: Api<NodeConfig> = Api::all(client.clone());
    // Synced when every bench node holds the tables of the targets in its two namespaces'
    // worth of clients (each node hosts pods of the namespaces i with j in nodes_of(i)).
    let expected: BTreeMap<String, usize> = (0..NODES)
        .map(|j| {
            (
                node(j),
                (0..NAMESPACES)
                    .filter(|i| nodes_of(*i).contains(&j))
                    .count()
                    * ROUTES_PER_NS,
            )
        })
        .collect();
    loop {
        let list = configs.list(&Default::default()).await?.items;
        let synced = expected.iter().all(|(n, want)| {
            list.iter().any(|c| {
                c.metadata.name.as_deref() == Some(n) && c.spec.table_count as usize == *want
            })
        });
        if synced {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("NodeConfigs not synced after 600 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let full_sync = started.elapsed();
    let peak_at_sync = peak_rss_mb(operator.0.id());

    let mut latencies = Vec::with_capacity(CHANGES);
    for c in 0..CHANGES {
        let (i, r) = ((c * 37) % NAMESPACES, c % ROUTES_PER_NS);
        let weight = if c % 2 == 0 { 70 } else { 80 };
        let routes: Api<HttpRoute> = Api::namespaced(client.clone(), &ns(i));
        let changed = Instant::now();
        routes
            .patch(
                &format!("route-{r}"),
                &PatchParams::apply("aether-bench").force(),
                &Patch::Apply(route(i, r, weight)?),
            )
            .await?;
        for j in nodes_of(i) {
            loop {
                if configs
                    .get(&node(j))
                    .await
                    .ok()
                    .and_then(|c| weight_in(&c, i, r))
                    == Some(u64::from(weight))
                {
                    break;
                }
                if changed.elapsed() > Duration::from_secs(60) {
                    bail!("change {c} never reached {}", node(j));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        latencies.push(changed.elapsed());
    }
    latencies.sort();

    let list = configs.list(&Default::default()).await?.items;
    let size = |c: &NodeConfig| serde_json::to_vec(&c.spec).map(|v| v.len()).unwrap_or(0);
    let largest = list
        .iter()
        .filter(|c| expected.contains_key(c.metadata.name.as_deref().unwrap_or("")))
        .map(size)
        .max()
        .unwrap_or(0);
    let mut whole = NodeConfig::new("whole-mesh", Default::default());
    whole.spec.capture_addresses = list
        .first()
        .map(|c| c.spec.capture_addresses.clone())
        .unwrap_or_default();
    let mut all_tables = BTreeMap::new();
    for config in &list {
        for table in &config.spec.tables {
            all_tables.insert(
                (table.namespace.clone(), table.service.clone()),
                table.clone(),
            );
        }
    }
    whole.spec.tables = all_tables.into_values().collect();
    let mut all_identities = BTreeMap::new();
    for config in &list {
        for ids in &config.spec.identities {
            all_identities.insert((ids.namespace.clone(), ids.service.clone()), ids.clone());
        }
    }
    whole.spec.identities = all_identities.into_values().collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "operator at scale: {NAMESPACES} namespaces, {} Services, {} route targets, {} Pods, {NODES} nodes",
        NAMESPACES * SERVICES_PER_NS,
        NAMESPACES * ROUTES_PER_NS,
        NAMESPACES * PODS_PER_NS
    );
    println!(
        "  full sync (start -> every NodeConfig written): {:.1} s",
        full_sync.as_secs_f64()
    );
    println!(
        "  HTTPRoute change -> affected NodeConfigs updated, {CHANGES} changes: p50 {:.0} ms, p99 {:.0} ms",
        ms(latencies[CHANGES / 2]),
        ms(latencies[(CHANGES * 99 / 100).min(CHANGES - 1)])
    );
    println!("  {}", reconcile_summary()?);
    println!(
        "  operator peak RSS: {:.0} MB ({peak_at_sync:.0} MB by the end of the full sync); {:.0} MB resident at the end",
        peak_rss_mb(operator.0.id()),
        memory_mb(operator.0.id(), "VmRSS:")
    );
    println!(
        "  largest NodeConfig {:.0} KB vs the whole mesh {:.0} KB ({:.1}%)",
        largest as f64 / 1024.0,
        size(&whole) as f64 / 1024.0,
        100.0 * largest as f64 / size(&whole).max(1) as f64
    );

    drop(operator);
    nodes_alive.abort();
    remove_bench_objects(&client).await
}
