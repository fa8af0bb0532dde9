//! The thin async shell around the pure parts: watches keep caches of every kind the
//! operator reads; on any change (debounced) the leader rebuilds the index, computes the
//! desired state, and writes only what differs from what the API server holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aether_core::names::DERIVED_LABEL;
use aether_crds::route_status::{self, ExistingParent, RouteParentStatus};
use aether_crds::{NodeConfig, NodeConfigSpec, RouteTarget, RouteTargetSpec};
use futures::StreamExt;
use gateway_api::grpcroutes::GrpcRoute;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::cache::{Changes, Stores};
use crate::index::{Index, Key};
use crate::metrics::Metrics;
use crate::node_config::{self, Shared};
use crate::status;
use crate::targets::{Target, compile_all};
use crate::writes::{self, Write, WriteError};

const FIELD_MANAGER: &str = "aether-operator";
/// Changes arriving within this window are handled together.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// API writes of one config pass in flight at once: a first sync writes thousands of objects.
const WRITES_IN_FLIGHT: usize = 32;
/// Status writes in flight at once: fewer, so that a first sync's thousands of status writes
/// leave the API server room for the config loop's.
const STATUS_WRITES_IN_FLIGHT: usize = 8;
/// Status passes are at least this far apart: each looks at every RouteTarget and route,
/// and a burst of route changes needs only the last one.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// A NodeConfig write: the node and the generation it wrote.
type ConfigWrite<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(String, Option<i64>), WriteError>> + Send + 'a>,
>;
/// A pass that wrote with failures is run again after this long at first, doubling up to
/// [`MAX_RETRY`]; the objects that did not fail converge meanwhile.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Replaces a NodeConfig's spec (a JSON patch), leaving its status to the proxy; the object
/// as written.
async fn replace_spec(
    api: &Api<NodeConfig>,
    node: &str,
    spec: &NodeConfigSpec,
) -> Result<NodeConfig, kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(
        serde_json::json!([{"op": "replace", "path": "/spec", "value": spec}]),
    )
    .map_err(kube::Error::SerdeError)?;
    api.patch(node, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
}

/// A pass allocates and frees tens of MB on whichever runtime threads run it; glibc keeps
/// freed memory in per-thread arenas, so without giving it back after a pass the resident
/// size creeps toward the sum of every thread's peak.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages to the kernel; it touches no live memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub trust_domain: String,
}

/// What one config pass computed, handed to the status loop.
struct Model {
    index: Arc<Index>,
    targets: BTreeMap<Key, Target>,
    shared: Shared,
    /// The NodeConfig generations holding this model's per-node config.
    required: status::Required,
}

/// Runs until the process ends; writes only while `leader` is true. Two loops: the config
/// loop keeps the index up to date, compiles the targets and writes what the data plane
/// reads; the status loop writes what users read from the latest model, so thousands of
/// status writes after a start never delay a route change reaching the nodes.
pub async fn run(
    client: kube::Client,
    config: Config,
    mut leader: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    ready: watch::Sender<aether_admin::Readiness>,
) {
    let changes = Arc::new(Changes::default());
    let (stores, mut watches) = Stores::start(&client, &changes);
    let stores = Arc::new(stores);
    if !stores.ready().await {
        tracing::error!("watch caches never became ready");
        return;
    }
    let _ = ready.send(Ok(()));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let writer = Arc::new(Writer {
        client,
        config,
        recorder,
        metrics,
        leader: leader.clone(),
    });
    let (models, model) = watch::channel(None);
    let mut statuses = tokio::spawn(status_loop(writer.clone(), stores.clone(), model));
    let mut index = Arc::new(Index::default());
    let mut retry = Retry::default();
    loop {
        tokio::select! {
            _ = changes.notify.notified() => {}
            _ = leader.changed() => {}
            _ = retry.due() => {}
            // The status loop never ends by itself: if it did (a panic), this replica would
            // write no status any more; ending here makes the process exit and restart.
            ended = &mut statuses => {
                tracing::error!(error = ?ended.err(), "the status loop ended");
                return;
            }
            // Likewise a watch: its cache would go stale.
            Some(ended) = watches.join_next() => {
                tracing::error!(watch = ?ended, "a watch task ended");
                return;
            }
        }
        tokio::time::sleep(DEBOUNCE).await;
        // The index follows the caches on every replica, so a new leader starts up to date.
        let started = Instant::now();
        let changed = changes.take();
        writer.metrics.queue_depth.set(changed.len() as i64);
        stores.refresh(Arc::make_mut(&mut index), &changed);
        let indexed = started.elapsed();
        if !*leader.borrow() {
            continue;
        }
        let targets = compile_all(&index);
        let shared = Shared::new(&index, &targets, &writer.config.trust_domain);
        let compiled = started.elapsed();
        let (required, failed) = writer.configs(&stores, &index, &targets, &shared).await;
        writer
            .metrics
            .observe("config", started.elapsed(), failed.is_empty());
        tracing::debug!(
            parts = changed.len(),
            index_ms = indexed.as_millis() as u64,
            compile_ms = (compiled - indexed).as_millis() as u64,
            write_ms = (started.elapsed() - compiled).as_millis() as u64,
            targets = targets.len(),
            "config pass"
        );
        let _ = models.send(Some(Arc::new(Model {
            index: index.clone(),
            targets,
            shared,
            required,
        })));
        release_freed_memory();
        writer.report("config", &failed);
        retry.after(&failed);
    }
}

/// When a pass whose writes failed is run again without a change to set it off: soon at
/// first, then backing off while the same objects keep failing.
#[derive(Default)]
struct Retry {
    at: Option<tokio::time::Instant>,
    delay: Option<Duration>,
}

impl Retry {
    fn after(&mut self, failed: &[WriteError]) {
        if failed.is_empty() {
            *self = Retry::default();
            return;
        }
        let delay = self.delay.map_or(FIRST_RETRY, |d| (d * 2).min(MAX_RETRY));
        self.delay = Some(delay);
        self.at = Some(tokio::time::Instant::now() + delay);
    }

    async fn due(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// Writes the status of every RouteTarget and route from the latest model.
async fn status_loop(
    writer: Arc<Writer>,
    stores: Arc<Stores>,
    mut model: watch::Receiver<Option<Arc<Model>>>,
) {
    let mut retry = Retry::default();
    loop {
        tokio::select! {
            changed = model.changed() => if changed.is_err() { return },
            _ = retry.due() => {}
        }
        tokio::time::sleep(STATUS_INTERVAL).await;
        let Some(current) = model.borrow_and_update().clone() else {
            continue;
        };
        if !writer.leading() {
            continue;
        }
        let started = Instant::now();
        let failed = writer.status(&stores, &current).await;
        writer
            .metrics
            .observe("status", started.elapsed(), failed.is_empty());
        tracing::debug!(ms = started.elapsed().as_millis() as u64, "status pass");
        writer.report("status", &failed);
        retry.after(&failed);
    }
}

struct Writer {
    client: kube::Client,
    config: Config,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
}

impl Writer {
    /// Logs and counts a pass's failed writes, each with its object.
    fn report(&self, pass: &'static str, failed: &[WriteError]) {
        for error in failed {
            let reason = error.metric_label();
            self.metrics.write_failed(reason);
            if error.namespace_terminating() {
                tracing::info!(pass, object = %error.object, "not written: its namespace is being deleted");
            } else {
                tracing::warn!(pass, object = %error.object, reason, error = %error.source, "write failed; the others went ahead, this one is retried");
            }
        }
    }

    /// What the data plane reads: derived RouteTargets, then every node's config.
    async fn configs(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        shared: &Shared,
    ) -> (status::Required, Vec<WriteError>) {
        let mut failed = self.derived_targets(stores, index, targets).await;
        let (required, nodes) = self.node_configs(stores, index, targets, shared).await;
        failed.extend(nodes);
        (required, failed)
    }

    async fn status(&self, stores: &Stores, model: &Model) -> Vec<WriteError> {
        let now = Time(Timestamp::now());
        let mut failed = self.target_status(stores, model, &now).await;
        failed.extend(
            self.route_status(stores, &model.index, &model.targets, &now)
                .await,
        );
        failed
    }

    /// Whether this replica still leads: checked right before each write, so a replica that
    /// lost its lease stops writing at once.
    fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    /// A write that runs only while this replica leads.
    fn guarded<'a>(&'a self, write: Write<'a>) -> Write<'a> {
        Box::pin(async move { if self.leading() { write.await } else { Ok(()) } })
    }

    /// A Warning Event on every route that names the Service `key`: its RouteTarget could not
    /// be written.
    async fn target_write_failed(
        &self,
        stores: &Stores,
        index: &Index,
        key: &Key,
        error: &WriteError,
    ) {
        let (namespace, service) = key;
        let note = format!(
            "cannot write RouteTarget {namespace}/{service} for this route's parentRef: {}",
            error.source
        );
        for ((kind, route_namespace, name), source) in &index.routes {
            if !source
                .parents
                .iter()
                .any(|p| p.is_service(route_namespace, namespace, service))
            {
                continue;
            }
            let reference = match *kind {
                "HTTPRoute" => stores
                    .http_routes
                    .get(&ObjectRef::new(name).within(route_namespace))
                    .map(|r| r.object_ref(&())),
                _ => stores
                    .grpc_routes
                    .get(&ObjectRef::new(name).within(route_namespace))
                    .map(|r| r.object_ref(&())),
            };
            let Some(reference) = reference else { continue };
            let event = Event {
                type_: EventType::Warning,
                reason: "TargetNotWritten".into(),
                note: Some(note.clone()),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, "cannot publish event");
            }
        }
    }

    /// Creates a RouteTarget for each target Service without one, and deletes derived
    /// RouteTargets no route names any more.
    async fn derived_targets(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
    ) -> Vec<WriteError> {
        let mut failed = Vec::new();
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
            if !self.leading() {
                return failed;
            }
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
                Err(e) => {
                    let error = WriteError::new(format!("RouteTarget {namespace}/{service}"), e);
                    self.target_write_failed(stores, index, key, &error).await;
                    failed.push(error);
                }
            }
        }
        for ((namespace, name), target) in &index.targets {
            let service = (namespace.clone(), target.service.clone());
            let superseded = targets.get(&service).is_none_or(|t| t.hand_written());
            if target.derived && superseded && self.leading() {
                let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), namespace);
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(
                        namespace,
                        name,
                        "deleted derived RouteTarget: no route names its Service, or a hand-written one does"
                    ),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => failed.push(WriteError::new(
                        format!("RouteTarget {namespace}/{name}"),
                        e,
                    )),
                }
            }
        }
        failed
    }

    async fn target_status(&self, stores: &Stores, model: &Model, now: &Time) -> Vec<WriteError> {
        let (index, targets) = (&*model.index, &model.targets);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for object in stores.targets.state() {
            let namespace = object.namespace().unwrap_or_default();
            // The store may hold objects, or generations, newer than the model: their status is
            // written from the model that has seen them (observedGeneration says which one).
            let Some(known) = index.targets.get(&(namespace.clone(), object.name_any())) else {
                continue;
            };
            let Some(target) = targets.get(&(namespace.clone(), known.service.clone())) else {
                continue;
            };
            // A hand-written RouteTarget takes precedence over a derived one for the same Service.
            if known.derived && target.hand_written() {
                continue;
            }
            let previous = object.status.as_ref();
            let desired = match &target.in_force {
                Some(winner) if !known.derived && *winner != object.name_any() => {
                    status::conflicted_status(
                        index,
                        &target.key,
                        winner,
                        known.generation,
                        previous,
                        now,
                    )
                }
                _ => status::route_target_status(
                    index,
                    target,
                    &model.shared.identities,
                    &model.required,
                    known.generation,
                    previous,
                    now,
                ),
            };
            if previous == Some(&desired) {
                continue;
            }
            let previous = previous.cloned();
            writes.push(self.guarded(Box::pin(async move {
                let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), &namespace);
                let name = object.name_any();
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": desired})),
                )
                .await
                .map_err(|e| {
                    WriteError::new(format!("RouteTarget {namespace}/{name} status"), e)
                })?;
                self.metrics.writes.inc();
                self.accepted_event(&object, previous.as_ref(), &desired)
                    .await;
                Ok(())
            })));
        }
        writes::all(writes, STATUS_WRITES_IN_FLIGHT).await
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
    ) -> Vec<WriteError> {
        let ours = status::route_parents(targets, index, now);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for route in stores.http_routes.state() {
            let key = (
                "HTTPRoute",
                route.namespace().unwrap_or_default(),
                route.name_any(),
            );
            let existing = route_status::existing_parents(
                route
                    .status
                    .as_ref()
                    .map_or(&[][..], |s| s.parents.as_slice()),
            );
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
            let existing = route_status::existing_parents(
                route
                    .status
                    .as_ref()
                    .map_or(&[][..], |s| s.parents.as_slice()),
            );
            writes.extend(self.write_route_status::<GrpcRoute>(
                key.clone(),
                existing,
                ours.get(&key),
            ));
        }
        writes::all(writes, STATUS_WRITES_IN_FLIGHT).await
    }

    /// The write of a route's merged status.parents, if it changes.
    fn write_route_status<K>(
        &self,
        key: (&'static str, String, String),
        existing: serde_json::Result<Vec<ExistingParent>>,
        ours: Option<&Vec<RouteParentStatus>>,
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
        let object = format!("{} {}/{} status", key.0, key.1, key.2);
        // Parents that cannot be read are not taken for none: that write would drop other
        // controllers' entries.
        let existing = match existing {
            Ok(existing) => existing,
            Err(e) => {
                let error = WriteError::new(object, kube::Error::SerdeError(e));
                return Some(Box::pin(std::future::ready(Err(error))));
            }
        };
        let merged =
            route_status::merge_parents(&existing, ours.map(Vec::as_slice).unwrap_or_default());
        if merged == existing {
            return None;
        }
        Some(self.guarded(Box::pin(async move {
            let api: Api<K> = Api::namespaced(self.client.clone(), &key.1);
            api.patch_status(
                &key.2,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"parents": merged}})),
            )
            .await
            .map_err(|e| WriteError::new(object, e))?;
            self.metrics.writes.inc();
            Ok(())
        })))
    }

    /// One NodeConfig per node; a node's object is written only when its content changes.
    /// Returns, per node, the generation that holds the computed config.
    async fn node_configs(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        shared: &Shared,
    ) -> (status::Required, Vec<WriteError>) {
        let api: Api<NodeConfig> = Api::all(self.client.clone());
        let existing: BTreeMap<String, Arc<NodeConfig>> = stores
            .node_configs
            .state()
            .into_iter()
            .map(|c| (c.name_any(), c))
            .collect();
        let mut required = status::Required::new();
        let mut writes: Vec<ConfigWrite<'_>> = Vec::new();
        for node in &index.nodes {
            let spec: NodeConfigSpec = node_config::node_config(node, targets, shared);
            let exists = existing.contains_key(node);
            if let Some(stored) = existing.get(node).filter(|c| c.spec == spec) {
                if let Some(generation) = stored.metadata.generation {
                    required.insert(node.clone(), generation);
                }
                continue;
            }
            let api = api.clone();
            writes.push(Box::pin(async move {
                let failed = |e| WriteError::new(format!("NodeConfig {node}"), e);
                if !self.leading() {
                    return Ok((node.clone(), None));
                }
                // The spec is the operator's alone: replaced whole, which costs the API
                // server far less than a server-side apply of a large object.
                let written = if exists {
                    replace_spec(&api, node, &spec).await.map_err(failed)?
                } else {
                    let object = NodeConfig::new(node, spec.clone());
                    let params = PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    match api.create(&params, &object).await {
                        Ok(created) => created,
                        // Written by an earlier pass whose write the cache has not seen yet.
                        Err(kube::Error::Api(e)) if e.code == 409 => {
                            replace_spec(&api, node, &spec).await.map_err(failed)?
                        }
                        Err(e) => return Err(failed(e)),
                    }
                };
                self.metrics.writes.inc();
                tracing::info!(node, "updated NodeConfig");
                Ok((node.clone(), written.metadata.generation))
            }));
        }
        let results: Vec<Result<(String, Option<i64>), WriteError>> = futures::stream::iter(writes)
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let mut failed = Vec::new();
        for result in results {
            match result {
                Ok((node, Some(generation))) => {
                    required.insert(node, generation);
                }
                Ok((_, None)) => {}
                Err(e) => failed.push(e),
            }
        }
        for name in existing.keys().filter(|n| !index.nodes.contains(*n)) {
            if !self.leading() {
                break;
            }
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => failed.push(WriteError::new(format!("NodeConfig {name}"), e)),
            }
        }
        (required, failed)
    }
}
