//! The watch caches: one reflector store per kind, holding objects reduced to the fields
//! the operator reads (20,000 full Pods would hold hundreds of MB of container specs and
//! managed fields), and a record of what changed since the last pass, by kind and
//! namespace, so a pass refreshes only that part of the index.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use aether_core::names::{CAPTURE_ANNOTATION, DEPENDS_ON_ANNOTATION};
use aether_crds::{AuthorizationPolicy, NodeConfig, RouteTarget};
use futures::StreamExt;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::grpcroutes::GrpcRoute;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, PodSpec, PodStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::index::Index;

/// The kinds the operator watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Service,
    HttpRoute,
    GrpcRoute,
    RouteTarget,
    Namespace,
    Pod,
    EndpointSlice,
    NodeConfig,
    Node,
    AuthorizationPolicy,
}

/// A part of the index that changed: one namespace of a kind, or all of it (`None`: a
/// cluster-scoped kind, or a watch that restarted and relisted).
pub type Part = (Kind, Option<String>);

/// What changed since the last pass; wakes the controller.
#[derive(Default)]
pub struct Changes {
    parts: Mutex<BTreeSet<Part>>,
    pub notify: Notify,
}

impl Changes {
    fn record(&self, part: Part) {
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(part);
        self.notify.notify_one();
    }

    /// Everything recorded so far; the record starts empty again.
    pub fn take(&self) -> BTreeSet<Part> {
        std::mem::take(&mut *self.parts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Keeps the metadata the operator reads: identity, labels, generation, deletion.
fn slim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    meta.annotations = None;
    meta.resource_version = None;
}

/// Drops what the operator never reads from an object before it is cached, and tells
/// whether an update changed what the index reads.
trait Reduce {
    fn reduce(&mut self);
    fn same(&self, other: &Self) -> bool;
}

impl Reduce for Pod {
    fn reduce(&mut self) {
        let keep: std::collections::BTreeMap<String, String> = self
            .annotations()
            .iter()
            .filter(|(k, _)| *k == CAPTURE_ANNOTATION || *k == DEPENDS_ON_ANNOTATION)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slim_meta(&mut self.metadata);
        self.metadata.owner_references = None;
        self.metadata.annotations = (!keep.is_empty()).then_some(keep);
        self.spec = self.spec.take().map(|spec| PodSpec {
            node_name: spec.node_name,
            service_account_name: spec.service_account_name,
            host_network: spec.host_network,
            ..Default::default()
        });
        // The addresses only: conditions change with every probe.
        self.status = self.status.take().map(|status| PodStatus {
            pod_ips: status.pod_ips,
            ..Default::default()
        });
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

impl Reduce for Service {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
        self.status = None;
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

impl Reduce for EndpointSlice {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
        self.metadata.owner_references = None;
        for endpoint in self.endpoints.iter_mut().flatten() {
            endpoint.target_ref = None;
            endpoint.hints = None;
            endpoint.node_name = None;
            endpoint.zone = None;
        }
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

impl Reduce for Namespace {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
        self.spec = None;
        self.status = None;
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

impl Reduce for Node {
    fn reduce(&mut self) {
        // Only the name is read; the status changes with every heartbeat.
        slim_meta(&mut self.metadata);
        self.metadata.labels = None;
        self.spec = None;
        self.status = None;
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

// The status of routes and RouteTargets is written by the operator and read from the cache
// by the status loop, never by the index: a status write is not a change. A NodeConfig's
// spec is the operator's own; its status is the proxy's report.
impl Reduce for HttpRoute {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
    }

    fn same(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.spec == other.spec
    }
}

impl Reduce for GrpcRoute {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
    }

    fn same(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.spec == other.spec
    }
}

impl Reduce for RouteTarget {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
    }

    fn same(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.spec == other.spec
    }
}

impl Reduce for AuthorizationPolicy {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
    }

    fn same(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.spec == other.spec
    }
}

impl Reduce for NodeConfig {
    fn reduce(&mut self) {
        slim_meta(&mut self.metadata);
    }

    fn same(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.status == other.status
    }
}

/// Starts a watch feeding a cache of reduced objects, as a task of `tasks` that ends only by a
/// panic. An event whose reduced object equals the cached one (a heartbeat, a status the
/// operator does not read) is not a change.
fn watch<K>(api: Api<K>, kind: Kind, changes: Arc<Changes>, tasks: &mut JoinSet<Kind>) -> Store<K>
where
    K: Resource + Reduce + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = reflector::store();
    let reader = store.clone();
    let stream = watcher(api, watcher::Config::default())
        .modify(K::reduce)
        .default_backoff();
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    tracing::warn!(kind = ?kind, error = %error, "watch failed; retrying");
                    continue;
                }
            };
            let part = match &event {
                watcher::Event::Apply(object) => {
                    let cached = reader.get(&ObjectRef::from_obj(object));
                    let same = cached.is_some_and(|c| c.same(object));
                    (!same).then(|| (kind, scope_of(kind, object)))
                }
                watcher::Event::Delete(object) => Some((kind, scope_of(kind, object))),
                watcher::Event::InitDone => Some((kind, None)),
                watcher::Event::Init | watcher::Event::InitApply(_) => None,
            };
            writer.apply_watcher_event(&event);
            if let Some(part) = part {
                changes.record(part);
            }
        }
        kind
    });
    store
}

/// The watch caches.
pub struct Stores {
    pub services: Store<Service>,
    pub http_routes: Store<HttpRoute>,
    pub grpc_routes: Store<GrpcRoute>,
    pub targets: Store<RouteTarget>,
    pub namespaces: Store<Namespace>,
    pub pods: Store<Pod>,
    pub slices: Store<EndpointSlice>,
    pub node_configs: Store<NodeConfig>,
    pub nodes: Store<Node>,
    pub policies: Store<AuthorizationPolicy>,
}

impl Stores {
    /// Starts every watch. The tasks are returned so that the controller ends, and with it the
    /// process, when one ends: a cache nobody fills would serve stale objects for ever.
    pub fn start(client: &kube::Client, changes: &Arc<Changes>) -> (Self, JoinSet<Kind>) {
        let mut tasks = JoinSet::new();
        let all = || client.clone();
        let stores = Stores {
            services: watch(Api::all(all()), Kind::Service, changes.clone(), &mut tasks),
            http_routes: watch(
                Api::all(all()),
                Kind::HttpRoute,
                changes.clone(),
                &mut tasks,
            ),
            grpc_routes: watch(
                Api::all(all()),
                Kind::GrpcRoute,
                changes.clone(),
                &mut tasks,
            ),
            targets: watch(
                Api::all(all()),
                Kind::RouteTarget,
                changes.clone(),
                &mut tasks,
            ),
            namespaces: watch(
                Api::all(all()),
                Kind::Namespace,
                changes.clone(),
                &mut tasks,
            ),
            pods: watch(Api::all(all()), Kind::Pod, changes.clone(), &mut tasks),
            slices: watch(
                Api::all(all()),
                Kind::EndpointSlice,
                changes.clone(),
                &mut tasks,
            ),
            node_configs: watch(
                Api::all(all()),
                Kind::NodeConfig,
                changes.clone(),
                &mut tasks,
            ),
            nodes: watch(Api::all(all()), Kind::Node, changes.clone(), &mut tasks),
            policies: watch(
                Api::all(all()),
                Kind::AuthorizationPolicy,
                changes.clone(),
                &mut tasks,
            ),
        };
        (stores, tasks)
    }

    pub async fn ready(&self) -> bool {
        self.services.wait_until_ready().await.is_ok()
            && self.http_routes.wait_until_ready().await.is_ok()
            && self.grpc_routes.wait_until_ready().await.is_ok()
            && self.targets.wait_until_ready().await.is_ok()
            && self.namespaces.wait_until_ready().await.is_ok()
            && self.pods.wait_until_ready().await.is_ok()
            && self.slices.wait_until_ready().await.is_ok()
            && self.node_configs.wait_until_ready().await.is_ok()
            && self.nodes.wait_until_ready().await.is_ok()
            && self.policies.wait_until_ready().await.is_ok()
    }

    /// Brings the index up to date with the caches, re-reading only the parts that changed.
    pub fn refresh(&self, index: &mut Index, changed: &BTreeSet<Part>) {
        let mut parts: BTreeSet<Part> = changed.clone();
        // Whether a pod is meshed depends on its namespace's label.
        for (kind, namespace) in changed {
            if *kind == Kind::Namespace {
                parts.insert((Kind::Pod, namespace.clone()));
            }
        }
        for (kind, namespace) in &parts {
            let scope = Scope(namespace.as_deref());
            match kind {
                Kind::Service => {
                    index.clear_services(scope.0);
                    scope.of(&self.services).for_each(|s| index.add_service(&s));
                }
                Kind::HttpRoute => {
                    index.clear_routes("HTTPRoute", scope.0);
                    scope
                        .of(&self.http_routes)
                        .for_each(|r| index.add_http_route(&r));
                }
                Kind::GrpcRoute => {
                    index.clear_routes("GRPCRoute", scope.0);
                    scope
                        .of(&self.grpc_routes)
                        .for_each(|r| index.add_grpc_route(&r));
                }
                Kind::RouteTarget => {
                    index.clear_targets(scope.0);
                    scope
                        .of(&self.targets)
                        .for_each(|t| index.add_route_target(&t));
                }
                Kind::Namespace => {
                    index.managed_namespaces.clear();
                    index.deny_by_default.clear();
                    self.namespaces
                        .state()
                        .iter()
                        .for_each(|n| index.add_namespace(n));
                }
                Kind::Pod => {}
                Kind::AuthorizationPolicy => {
                    index.clear_policies(scope.0);
                    scope.of(&self.policies).for_each(|p| index.add_policy(&p));
                }
                Kind::EndpointSlice => {
                    index.clear_endpoints(scope.0);
                    scope
                        .of(&self.slices)
                        .for_each(|s| index.add_endpoint_slice(&s));
                }
                Kind::NodeConfig => {
                    index.node_configs.clear();
                    index.node_demand.clear();
                    index.node_captured.clear();
                    self.node_configs
                        .state()
                        .iter()
                        .for_each(|c| index.add_node_config(c));
                }
                Kind::Node => {
                    index.nodes.clear();
                    self.nodes
                        .state()
                        .iter()
                        .for_each(|n| index.add_node(&n.name_any()));
                }
            }
        }
        // Pods last: whether one is meshed reads the namespaces refreshed above.
        for (_, namespace) in parts.iter().filter(|(k, _)| *k == Kind::Pod) {
            let scope = Scope(namespace.as_deref());
            index.clear_pods(scope.0);
            scope.of(&self.pods).for_each(|p| index.add_pod(&p));
        }
    }
}

/// The namespace an object's change concerns: a Namespace's own name, so that a label
/// change re-reads only that namespace's pods.
fn scope_of<K: Resource>(kind: Kind, object: &K) -> Option<String> {
    match kind {
        Kind::Namespace => object.meta().name.clone(),
        _ => object.meta().namespace.clone(),
    }
}

/// One namespace of a cache, or all of it.
struct Scope<'a>(Option<&'a str>);

impl Scope<'_> {
    fn of<K>(&self, store: &Store<K>) -> impl Iterator<Item = Arc<K>>
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let namespace = self.0.map(str::to_owned);
        store
            .state()
            .into_iter()
            .filter(move |o| namespace.is_none() || o.meta().namespace == namespace)
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use serde_json::json;

    use super::*;

    fn object<K: DeserializeOwned>(value: serde_json::Value) -> K {
        serde_json::from_value(value).unwrap()
    }

    fn pod(namespace: &str, name: &str, node: &str) -> Pod {
        let mut pod: Pod = object(json!({
            "metadata": {"namespace": namespace, "name": name, "labels": {"app": "web"},
                "annotations": {"aether.io/depends-on": "shop/echo", "kubectl.kubernetes.io/restartedAt": "now"},
                "managedFields": [{"manager": "kubectl"}], "resourceVersion": "7"},
            "spec": {"nodeName": node, "serviceAccountName": "web", "containers": [{"name": "app", "image": "web"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.1.5"}],
                "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        pod.reduce();
        pod
    }

    fn namespace(name: &str, managed: bool) -> Namespace {
        object(
            json!({"metadata": {"name": name, "labels": {"aether.io/managed": managed.to_string()}}}),
        )
    }

    struct Writers {
        namespaces: Writer<Namespace>,
        pods: Writer<Pod>,
    }

    /// Caches fed by hand, as the watches would.
    fn stores() -> (Stores, Writers) {
        fn store<K>() -> (Store<K>, Writer<K>)
        where
            K: Resource + Clone + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone,
        {
            let (store, writer) = reflector::store();
            (store, writer)
        }
        let (namespaces, namespaces_w) = store();
        let (pods, pods_w) = store();
        let stores = Stores {
            services: store().0,
            http_routes: store().0,
            grpc_routes: store().0,
            targets: store().0,
            namespaces,
            pods,
            slices: store().0,
            node_configs: store().0,
            nodes: store().0,
            policies: store().0,
        };
        (
            stores,
            Writers {
                namespaces: namespaces_w,
                pods: pods_w,
            },
        )
    }

    #[test]
    fn a_reduced_pod_keeps_what_the_index_reads() {
        let pod = pod("shop", "web-1", "node-1");
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.resource_version, None);
        assert_eq!(
            pod.annotations().keys().collect::<Vec<_>>(),
            ["aether.io/depends-on"]
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(spec.service_account_name.as_deref(), Some("web"));
        assert!(spec.containers.is_empty());
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "10.244.1.5");
        assert!(status.phase.is_none() && status.conditions.is_none());
    }

    #[test]
    fn a_heartbeat_or_a_status_write_is_no_change() {
        let mut node: Node = object(json!({"metadata": {"name": "node-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}}));
        let mut later = node.clone();
        later.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_heartbeat_time = None;
        node.reduce();
        later.reduce();
        assert!(node.same(&later));

        let route = |status: serde_json::Value| -> HttpRoute {
            object(
                json!({"metadata": {"namespace": "shop", "name": "r", "generation": 1},
                "spec": {"parentRefs": [{"name": "echo"}]}, "status": status}),
            )
        };
        let before = route(json!({"parents": []}));
        let after = route(json!({"parents": [{"controllerName": "aether.io/mesh",
            "parentRef": {"name": "echo"}, "conditions": []}]}));
        assert!(before.same(&after));
        let mut edited = before.clone();
        edited.metadata.generation = Some(2);
        assert!(!before.same(&edited));
    }

    #[test]
    fn refresh_rereads_only_the_changed_namespaces() {
        let (stores, mut writers) = stores();
        for ns in [namespace("shop", true), namespace("other", false)] {
            writers
                .namespaces
                .apply_watcher_event(&watcher::Event::Apply(ns));
        }
        for p in [pod("shop", "a", "node-1"), pod("other", "b", "node-2")] {
            writers.pods.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let mut index = Index::default();
        let all: BTreeSet<Part> = [(Kind::Namespace, None), (Kind::Pod, None)].into();
        stores.refresh(&mut index, &all);
        assert_eq!(index.pods.len(), 2);
        assert!(index.pods[&("shop".into(), "a".into())].meshed);
        assert!(!index.pods[&("other".into(), "b".into())].meshed);

        // A pod of `shop` goes; a pod of `other` appears in the cache but its namespace is
        // not among the changed parts, so the index does not see it yet.
        writers
            .pods
            .apply_watcher_event(&watcher::Event::Delete(pod("shop", "a", "node-1")));
        writers
            .pods
            .apply_watcher_event(&watcher::Event::Apply(pod("other", "c", "node-2")));
        stores.refresh(&mut index, &[(Kind::Pod, Some("shop".to_owned()))].into());
        assert_eq!(
            index.pods.keys().cloned().collect::<Vec<_>>(),
            [("other".to_owned(), "b".to_owned())]
        );

        // `other` opts in: its namespace's change re-reads its pods, which are meshed now.
        writers
            .namespaces
            .apply_watcher_event(&watcher::Event::Apply(namespace("other", true)));
        stores.refresh(
            &mut index,
            &[(Kind::Namespace, Some("other".to_owned()))].into(),
        );
        assert_eq!(index.pods.len(), 2);
        assert!(index.pods.values().all(|p| p.meshed));
    }
}
