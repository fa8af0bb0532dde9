//! The thin async shell around the pure parts: watches keep caches of every kind the
//! operator reads; on any change (debounced) the leader rebuilds the index, computes the
//! desired state, and writes only what differs from what the API server holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aether_crds::well_known::DERIVED_LABEL;
use aether_crds::{NodeConfig, NodeConfigSpec, RouteTarget, RouteTargetSpec};
use futures::{StreamExt, TryStreamExt};
use gateway_api::grpcroutes::GrpcRoute;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};

use crate::index::{Index, Key};
use crate::metrics::Metrics;
use crate::targets::{Target, compile_all};
use crate::{node_config, status};

const FIELD_MANAGER: &str = "aether-operator";
/// Changes arriving within this window are handled together.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// API writes of one pass in flight at once: a first sync writes thousands of objects.
const WRITES_IN_FLIGHT: usize = 32;

type Write<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// Runs a pass's writes concurrently; the first error fails the pass (it is retried).
async fn write_all(writes: Vec<Write<'_>>) -> anyhow::Result<()> {
    futures::stream::iter(writes)
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct Config {
    pub trust_domain: String,
}

/// The watch caches.
struct Stores {
    services: Store<Service>,
    http_routes: Store<HttpRoute>,
    grpc_routes: Store<GrpcRoute>,
    targets: Store<RouteTarget>,
    namespaces: Store<Namespace>,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    node_configs: Store<NodeConfig>,
    nodes: Store<Node>,
}

/// Starts a watch feeding a cache; every event wakes `changed`.
fn watch<K>(api: Api<K>, changed: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(error) = event {
                tracing::warn!(kind = std::any::type_name::<K>(), error = %error, "watch failed; retrying");
            }
            changed.notify_one();
        }
    });
    store
}

impl Stores {
    fn start(client: &kube::Client, changed: &Arc<Notify>) -> Self {
        Stores {
            services: watch(Api::all(client.clone()), changed.clone()),
            http_routes: watch(Api::all(client.clone()), changed.clone()),
            grpc_routes: watch(Api::all(client.clone()), changed.clone()),
            targets: watch(Api::all(client.clone()), changed.clone()),
            namespaces: watch(Api::all(client.clone()), changed.clone()),
            pods: watch(Api::all(client.clone()), changed.clone()),
            slices: watch(Api::all(client.clone()), changed.clone()),
            node_configs: watch(Api::all(client.clone()), changed.clone()),
            nodes: watch(Api::all(client.clone()), changed.clone()),
        }
    }

    async fn ready(&self) -> bool {
        self.services.wait_until_ready().await.is_ok()
            && self.http_routes.wait_until_ready().await.is_ok()
            && self.grpc_routes.wait_until_ready().await.is_ok()
            && self.targets.wait_until_ready().await.is_ok()
            && self.namespaces.wait_until_ready().await.is_ok()
            && self.pods.wait_until_ready().await.is_ok()
            && self.slices.wait_until_ready().await.is_ok()
            && self.node_configs.wait_until_ready().await.is_ok()
            && self.nodes.wait_until_ready().await.is_ok()
    }

    fn index(&self) -> Index {
        let mut index = Index::default();
        self.services
            .state()
            .iter()
            .for_each(|s| index.add_service(s));
        self.http_routes
            .state()
            .iter()
            .for_each(|r| index.add_http_route(r));
        self.grpc_routes
            .state()
            .iter()
            .for_each(|r| index.add_grpc_route(r));
        self.targets
            .state()
            .iter()
            .for_each(|t| index.add_route_target(t));
        self.namespaces
            .state()
            .iter()
            .for_each(|n| index.add_namespace(n));
        self.pods.state().iter().for_each(|p| index.add_pod(p));
        self.slices
            .state()
            .iter()
            .for_each(|s| index.add_endpoint_slice(s));
        self.node_configs
            .state()
            .iter()
            .for_each(|c| index.add_node_config(c));
        self.nodes
            .state()
            .iter()
            .for_each(|n| index.add_node(&n.name_any()));
        index
    }
}

/// Runs until the process ends; writes only while `leader` is true.
pub async fn run(
    client: kube::Client,
    config: Config,
    mut leader: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    ready: watch::Sender<bool>,
) {
    let changed = Arc::new(Notify::new());
    let stores = Stores::start(&client, &changed);
    if !stores.ready().await {
        tracing::error!("watch caches never became ready");
        return;
    }
    let _ = ready.send(true);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let writer = Writer {
        client,
        config,
        recorder,
        metrics,
    };
    loop {
        tokio::select! {
            _ = changed.notified() => {}
            _ = leader.changed() => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        if !*leader.borrow() {
            continue;
        }
        let started = Instant::now();
        let result = writer.reconcile(&stores).await;
        writer.metrics.observe(started.elapsed(), result.is_ok());
        if let Err(error) = result {
            tracing::warn!(error = format!("{error:#}"), "reconcile failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            changed.notify_one();
        }
    }
}

struct Writer {
    client: kube::Client,
    config: Config,
    recorder: Recorder,
    metrics: Arc<Metrics>,
}

impl Writer {
    async fn reconcile(&self, stores: &Stores) -> anyhow::Result<()> {
        let started = Instant::now();
        let index = stores.index();
        let indexed = started.elapsed();
        let targets = compile_all(&index);
        let compiled = started.elapsed();
        let now = Time(Timestamp::now());
        // The data plane's configs first, then what users read.
        self.derived_targets(stores, &index, &targets).await?;
        self.node_configs(stores, &index, &targets).await?;
        let configs = started.elapsed();
        self.target_status(stores, &index, &targets, &now).await?;
        self.route_status(stores, &index, &targets, &now).await?;
        tracing::debug!(
            index_ms = indexed.as_millis() as u64,
            compile_ms = (compiled - indexed).as_millis() as u64,
            node_configs_ms = (configs - compiled).as_millis() as u64,
            status_ms = (started.elapsed() - configs).as_millis() as u64,
            targets = targets.len(),
            "reconcile pass"
        );
        Ok(())
    }

    /// Creates a RouteTarget for each target Service without one, and deletes derived
    /// RouteTargets no route names any more.
    async fn derived_targets(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
    ) -> anyhow::Result<()> {
        let covered: BTreeSet<Key> = index
            .targets
            .iter()
            .map(|((ns, _), t)| (ns.clone(), t.service.clone()))
            .collect();
        for key in targets.keys().filter(|k| !covered.contains(*k)) {
            let (namespace, service) = key;
            let owners: Vec<OwnerReference> = stores
                .http_routes
                .state()
                .iter()
                .filter(|r| r.namespace().as_deref() == Some(namespace.as_str()))
                .filter(|r| {
                    r.spec
                        .parent_refs
                        .iter()
                        .flatten()
                        .any(|p| p.kind.as_deref() == Some("Service") && &p.name == service)
                })
                .filter_map(|r| {
                    r.controller_owner_ref(&()).map(|mut o| {
                        o.controller = Some(false);
                        o
                    })
                })
                .collect();
            let mut target = RouteTarget::new(
                service,
                RouteTargetSpec {
                    service: service.clone(),
                    rules: Vec::new(),
                },
            );
            target.metadata.namespace = Some(namespace.clone());
            target.metadata.labels = Some([(DERIVED_LABEL.to_owned(), "true".to_owned())].into());
            target.metadata.owner_references = (!owners.is_empty()).then_some(owners);
            let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), namespace);
            match api
                .create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &target,
                )
                .await
            {
                Ok(_) => tracing::info!(namespace, service, "created derived RouteTarget"),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        for ((namespace, name), target) in &index.targets {
            let service = (namespace.clone(), target.service.clone());
            let superseded = targets.get(&service).is_none_or(|t| t.hand_written);
            if target.derived && superseded {
                let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), namespace);
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(
                        namespace,
                        name,
                        "deleted derived RouteTarget: no route names its Service, or a hand-written one does"
                    ),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    async fn target_status(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        now: &Time,
    ) -> anyhow::Result<()> {
        let mut writes: Vec<Write<'_>> = Vec::new();
        for object in stores.targets.state() {
            let namespace = object.namespace().unwrap_or_default();
            let Some(target) = targets.get(&(namespace.clone(), object.spec.service.clone()))
            else {
                continue;
            };
            // A hand-written RouteTarget takes precedence over a derived one for the same Service.
            let derived = index
                .targets
                .get(&(namespace.clone(), object.name_any()))
                .is_some_and(|t| t.derived);
            if derived && target.hand_written {
                continue;
            }
            let previous = object.status.as_ref();
            let desired = status::route_target_status(
                index,
                target,
                &self.config.trust_domain,
                object.metadata.generation,
                previous,
                now,
            );
            if previous == Some(&desired) {
                continue;
            }
            let previous = previous.cloned();
            writes.push(Box::pin(async move {
                let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), &namespace);
                api.patch_status(
                    &object.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": desired})),
                )
                .await?;
                self.metrics.writes.inc();
                self.accepted_event(&object, previous.as_ref(), &desired)
                    .await;
                Ok(())
            }));
        }
        write_all(writes).await
    }

    /// An Event on the RouteTarget when its Accepted condition changes.
    async fn accepted_event(
        &self,
        object: &RouteTarget,
        previous: Option<&aether_crds::RouteTargetStatus>,
        desired: &aether_crds::RouteTargetStatus,
    ) {
        let accepted = |s: Option<&aether_crds::RouteTargetStatus>| {
            s.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Accepted"))
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        let Some((status, reason, message)) =
            accepted(Some(desired)).filter(|now| Some(now) != accepted(previous).as_ref())
        else {
            return;
        };
        let event = Event {
            type_: if status == "True" {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason,
            note: Some(message),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(error = %error, "cannot publish event");
        }
    }

    async fn route_status(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        now: &Time,
    ) -> anyhow::Result<()> {
        let ours = status::route_parents(targets, index, now);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for route in stores.http_routes.state() {
            let key = (
                "HTTPRoute",
                route.namespace().unwrap_or_default(),
                route.name_any(),
            );
            let existing = serde_json::to_value(route.status.as_ref().map(|s| &s.parents))?;
            writes.extend(self.write_route_status::<HttpRoute>(
                key.clone(),
                existing,
                ours.get(&key),
            ));
        }
        for route in stores.grpc_routes.state() {
            let key = (
                "GRPCRoute",
                route.namespace().unwrap_or_default(),
                route.name_any(),
            );
            let existing = serde_json::to_value(route.status.as_ref().map(|s| &s.parents))?;
            writes.extend(self.write_route_status::<GrpcRoute>(
                key.clone(),
                existing,
                ours.get(&key),
            ));
        }
        write_all(writes).await
    }

    /// The write of a route's merged status.parents, if it changes.
    fn write_route_status<K>(
        &self,
        key: (&'static str, String, String),
        existing: serde_json::Value,
        ours: Option<&Vec<serde_json::Value>>,
    ) -> Option<Write<'_>>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
        K::DynamicType: Default,
    {
        let existing: Vec<serde_json::Value> = existing.as_array().cloned().unwrap_or_default();
        let merged = status::merge_parents(&existing, ours.map(Vec::as_slice).unwrap_or_default());
        if merged == existing {
            return None;
        }
        Some(Box::pin(async move {
            let api: Api<K> = Api::namespaced(self.client.clone(), &key.1);
            api.patch_status(
                &key.2,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"parents": merged}})),
            )
            .await?;
            self.metrics.writes.inc();
            Ok(())
        }))
    }

    /// One NodeConfig per node; a node's object is written only when its content changes.
    async fn node_configs(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
    ) -> anyhow::Result<()> {
        let api: Api<NodeConfig> = Api::all(self.client.clone());
        let existing: BTreeMap<String, Arc<NodeConfig>> = stores
            .node_configs
            .state()
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();
        let shared = node_config::Shared::new(index, targets, &self.config.trust_domain);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for node in &index.nodes {
            let spec: NodeConfigSpec = node_config::node_config(node, targets, &shared);
            if existing.get(node).is_some_and(|c| c.spec == spec) {
                continue;
            }
            let api = api.clone();
            writes.push(Box::pin(async move {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                let object = serde_json::json!({
                    "apiVersion": "aether.io/v1alpha1", "kind": "NodeConfig", "metadata": {"name": node}, "spec": spec,
                });
                api.patch(node, &params, &Patch::Apply(object)).await?;
                self.metrics.writes.inc();
                tracing::info!(node, "updated NodeConfig");
                Ok(())
            }));
        }
        write_all(writes).await?;
        for name in existing.keys().filter(|n| !index.nodes.contains(*n)) {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
