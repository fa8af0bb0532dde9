//! The operator's view of the cluster, as plain data: what the watches delivered, reduced
//! to what routing, status and per-node config need. Built from the watch caches; every
//! computation on it is a pure function.

use std::collections::{BTreeMap, BTreeSet};

use aether_core::identity::ServiceAccount;
use aether_core::meshing::namespace_is_managed;
use aether_core::names::{DEPENDS_ON_ANNOTATION, DERIVED_LABEL};
use aether_core::service;
use aether_crds::pods;
use aether_crds::{NodeConfig, RouteTarget, slices};
use aether_routing::{RouteSource, ServiceInfo, ServiceKind, ServicePort};
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::grpcroutes::GrpcRoute;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// `namespace/name`.
pub type Key = (String, String);

pub fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_owned(), name.to_owned())
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceData {
    pub info: ServiceInfo,
    pub cluster_ips: Vec<String>,
    /// None for a Service without a selector (its endpoints are managed by hand).
    pub selector: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodData {
    pub node: Option<String>,
    pub service_account: ServiceAccount,
    pub labels: BTreeMap<String, String>,
    /// In a managed namespace and not opted out.
    pub meshed: bool,
    /// Route targets named by `aether.io/depends-on`.
    pub depends_on: Vec<Key>,
    pub terminating: bool,
    /// `status.podIPs`.
    pub ips: Vec<String>,
}

/// A RouteTarget object as it exists.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetObject {
    pub service: String,
    pub derived: bool,
    pub generation: Option<i64>,
    /// `metadata.creationTimestamp`: of several hand-written RouteTargets for one Service,
    /// the oldest is in force.
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    /// Its inline rules, for a hand-written one.
    pub inline: Option<RouteSource>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Index {
    pub services: BTreeMap<Key, ServiceData>,
    pub routes: BTreeMap<(&'static str, String, String), RouteSource>,
    /// `metadata.generation` of each route, for its conditions' `observedGeneration`.
    pub route_generations: BTreeMap<(&'static str, String, String), i64>,
    pub targets: BTreeMap<Key, TargetObject>,
    pub pods: BTreeMap<Key, PodData>,
    pub managed_namespaces: BTreeSet<String>,
    /// Ready endpoint addresses per Service.
    pub ready_endpoints: BTreeMap<Key, usize>,
    /// Every endpoint address of each Service, ready or not.
    pub endpoint_addresses: BTreeMap<Key, BTreeSet<String>>,
    /// Every endpoint address of each Service with each TCP port its slice gives it.
    pub endpoint_sockets: BTreeMap<Key, BTreeSet<(String, u16)>>,
    /// Node name -> the config generation its proxy reports as applied, and the
    /// generation of the object.
    pub node_configs: BTreeMap<String, (Option<i64>, Option<i64>)>,
    /// Node name -> route targets its proxy asked for (cold path, `status.demand`).
    pub node_demand: BTreeMap<String, BTreeSet<Key>>,
    /// Node name -> the pods its proxy reports capturing (`status.capturedPods`).
    pub node_captured: BTreeMap<String, BTreeSet<Key>>,
    pub nodes: BTreeSet<String>,
    pub policies: BTreeMap<Key, crate::authz::PolicyObject>,
    /// Namespaces labelled to deny what no ALLOW policy admits.
    pub deny_by_default: BTreeSet<String>,
}

fn ns_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    key(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// The `namespace/name` entries of a list a proxy reported; malformed ones are skipped.
fn keys(reported: &[String]) -> BTreeSet<Key> {
    reported
        .iter()
        .filter_map(|entry| entry.split_once('/'))
        .map(|(ns, name)| key(ns, name))
        .collect()
}

/// Removes the entries of one namespace (or all) from a map keyed by namespace first.
fn clear_namespace<K: Ord, V>(
    map: &mut BTreeMap<K, V>,
    namespace_of: impl Fn(&K) -> &str,
    namespace: Option<&str>,
) {
    match namespace {
        Some(namespace) => map.retain(|k, _| namespace_of(k) != namespace),
        None => map.clear(),
    }
}

impl Index {
    /// The `clear_*` methods drop one namespace's part (or all) of a kind before it is
    /// re-read from the cache.
    pub fn clear_services(&mut self, namespace: Option<&str>) {
        clear_namespace(&mut self.services, |k| &k.0, namespace);
    }

    pub fn clear_routes(&mut self, kind: &str, namespace: Option<&str>) {
        let other = |k: &(&'static str, String, String)| {
            k.0 != kind || namespace.is_some_and(|ns| ns != k.1)
        };
        self.routes.retain(|k, _| other(k));
        self.route_generations.retain(|k, _| other(k));
    }

    pub fn clear_targets(&mut self, namespace: Option<&str>) {
        clear_namespace(&mut self.targets, |k| &k.0, namespace);
    }

    pub fn clear_pods(&mut self, namespace: Option<&str>) {
        clear_namespace(&mut self.pods, |k| &k.0, namespace);
    }

    pub fn clear_endpoints(&mut self, namespace: Option<&str>) {
        clear_namespace(&mut self.ready_endpoints, |k| &k.0, namespace);
        clear_namespace(&mut self.endpoint_addresses, |k| &k.0, namespace);
        clear_namespace(&mut self.endpoint_sockets, |k| &k.0, namespace);
    }

    pub fn add_service(&mut self, service: &Service) {
        let (namespace, name) = ns_name(&service.metadata);
        let spec = service.spec.clone().unwrap_or_default();
        let kind = match (spec.type_.as_deref(), spec.cluster_ip.as_deref()) {
            (Some("ExternalName"), _) => ServiceKind::ExternalName,
            (_, Some("None")) => ServiceKind::Headless,
            _ => ServiceKind::ClusterIp,
        };
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| {
                Some(ServicePort {
                    name: p.name.clone(),
                    port: u16::try_from(p.port).ok()?,
                    app_protocol: p.app_protocol.clone(),
                })
            })
            .collect();
        let cluster_ips = spec
            .cluster_ips
            .clone()
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default()
            .into_iter()
            .filter(|ip| ip != "None" && !ip.is_empty())
            .collect();
        let info = ServiceInfo {
            namespace: namespace.clone(),
            name: name.clone(),
            kind,
            ports,
        };
        self.services.insert(
            (namespace, name),
            ServiceData {
                info,
                cluster_ips,
                selector: spec.selector,
            },
        );
    }

    pub fn add_http_route(&mut self, route: &HttpRoute) {
        let (namespace, name) = ns_name(&route.metadata);
        let key = ("HTTPRoute", namespace, name);
        if let Some(generation) = route.metadata.generation {
            self.route_generations.insert(key.clone(), generation);
        }
        self.routes.insert(key, RouteSource::from_http_route(route));
    }

    pub fn add_grpc_route(&mut self, route: &GrpcRoute) {
        let (namespace, name) = ns_name(&route.metadata);
        let key = ("GRPCRoute", namespace, name);
        if let Some(generation) = route.metadata.generation {
            self.route_generations.insert(key.clone(), generation);
        }
        self.routes.insert(key, RouteSource::from_grpc_route(route));
    }

    pub fn add_route_target(&mut self, target: &RouteTarget) {
        let derived = target
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DERIVED_LABEL))
            .is_some_and(|v| v == "true");
        self.targets.insert(
            ns_name(&target.metadata),
            TargetObject {
                service: target.spec.service.clone(),
                derived,
                generation: target.metadata.generation,
                created: target.metadata.creation_timestamp.as_ref().map(|t| t.0),
                inline: (!derived).then(|| RouteSource::from_route_target(target)),
            },
        );
    }

    pub fn add_namespace(&mut self, namespace: &Namespace) {
        let name = namespace.metadata.name.clone().unwrap_or_default();
        let managed = namespace
            .metadata
            .labels
            .as_ref()
            .is_some_and(namespace_is_managed);
        if namespace
            .metadata
            .labels
            .as_ref()
            .is_some_and(aether_core::authz::namespace_denies_by_default)
        {
            self.deny_by_default.insert(name.clone());
        }
        if managed {
            self.managed_namespaces.insert(name);
        }
    }

    pub fn clear_policies(&mut self, namespace: Option<&str>) {
        clear_namespace(&mut self.policies, |k| &k.0, namespace);
    }

    pub fn add_policy(&mut self, policy: &aether_crds::AuthorizationPolicy) {
        self.policies.insert(
            ns_name(&policy.metadata),
            crate::authz::PolicyObject {
                generation: policy.metadata.generation,
                spec: policy.spec.clone(),
            },
        );
    }

    /// Pods are added after namespaces: whether a pod is meshed depends on its namespace.
    pub fn add_pod(&mut self, pod: &Pod) {
        let (namespace, name) = ns_name(&pod.metadata);
        let depends_on = (pod.metadata.annotations.as_ref())
            .and_then(|a| a.get(DEPENDS_ON_ANNOTATION))
            .map(|v| service::depends_on(&namespace, v))
            .unwrap_or_default()
            .into_iter()
            .map(|s| key(&s.namespace, &s.name))
            .collect();
        let data = PodData {
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            service_account: pods::service_account(pod),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            meshed: pods::meshing(self.managed_namespaces.contains(&namespace), pod).is_meshed(),
            depends_on,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            ips: pod
                .status
                .iter()
                .flat_map(|s| s.pod_ips.iter().flatten())
                .map(|ip| ip.ip.clone())
                .collect(),
        };
        self.pods.insert((namespace, name), data);
    }

    pub fn add_endpoint_slice(&mut self, slice: &EndpointSlice) {
        let Some(service) = slices::service_of(slice).map(|(ns, name)| key(ns, name)) else {
            return;
        };
        let endpoints = slice.endpoints.iter().flatten();
        let ready = (endpoints.clone())
            .filter(|e| slices::is_ready(e))
            .map(|e| e.addresses.len())
            .sum::<usize>();
        *self.ready_endpoints.entry(service.clone()).or_default() += ready;
        let addresses = endpoints.flat_map(|e| &e.addresses);
        (self.endpoint_addresses.entry(service.clone()).or_default())
            .extend(addresses.clone().cloned());
        let ports = slices::tcp_ports(slice);
        let sockets = self.endpoint_sockets.entry(service).or_default();
        for address in addresses {
            sockets.extend(ports.iter().map(|&port| (address.clone(), port)));
        }
    }

    pub fn add_node_config(&mut self, config: &NodeConfig) {
        let name = config.metadata.name.clone().unwrap_or_default();
        let status = config.status.clone().unwrap_or_default();
        let demand = keys(&status.demand);
        if !demand.is_empty() {
            self.node_demand.insert(name.clone(), demand);
        }
        let captured = keys(&status.captured_pods);
        if !captured.is_empty() {
            self.node_captured.insert(name.clone(), captured);
        }
        self.node_configs.insert(
            name,
            (status.applied_generation, config.metadata.generation),
        );
    }

    pub fn add_node(&mut self, name: &str) {
        self.nodes.insert(name.to_owned());
    }

    /// The pods a Service selects (not terminating). Pods are keyed by namespace first, so
    /// only the Service's namespace is scanned.
    pub fn selected_pods<'a>(
        &'a self,
        service: &'a Key,
    ) -> impl Iterator<Item = (&'a Key, &'a PodData)> + 'a {
        let selector = self.services.get(service).and_then(|s| s.selector.as_ref());
        self.pods
            .range((service.0.clone(), String::new())..)
            .take_while(move |((namespace, _), _)| namespace == &service.0)
            .filter(move |(_, pod)| {
                !pod.terminating
                    && selector.is_some_and(|sel| {
                        !sel.is_empty() && sel.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
                    })
            })
    }

    /// SPIFFE identities of the pods behind a Service, sorted.
    pub fn identities(&self, trust_domain: &str, service: &Key) -> Vec<String> {
        let ids: BTreeSet<String> = self
            .selected_pods(service)
            .map(|(_, pod)| pod.service_account.spiffe_id(trust_domain))
            .collect();
        ids.into_iter().collect()
    }

    /// The addresses of the pods that have aether's inbound listener: meshed pods that their
    /// own node's proxy reports capturing. A proxy is believed about the pods of its node
    /// only, so one stolen proxy token cannot make callers send mTLS to pods elsewhere that
    /// would refuse it.
    pub fn meshed_pod_addresses(&self) -> BTreeSet<String> {
        self.pods
            .iter()
            .filter(|(pod_key, pod)| {
                pod.meshed
                    && pod.node.as_ref().is_some_and(|node| {
                        self.node_captured
                            .get(node)
                            .is_some_and(|captured| captured.contains(*pod_key))
                    })
            })
            .flat_map(|(_, pod)| pod.ips.iter().cloned())
            .collect()
    }

    /// The endpoint addresses of a Service that take mTLS, sorted: whoever wrote its
    /// EndpointSlices, an address of a meshed pod never gets plaintext.
    pub fn meshed_endpoints(&self, service: &Key, meshed: &BTreeSet<String>) -> Vec<String> {
        self.endpoint_addresses
            .get(service)
            .into_iter()
            .flatten()
            .filter(|address| meshed.contains(*address))
            .cloned()
            .collect()
    }
}

impl aether_routing::ServiceLookup for Index {
    fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo> {
        self.services.get(&key(namespace, name)).map(|s| &s.info)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn namespace(name: &str, managed: bool) -> Namespace {
        object(
            json!({"metadata": {"name": name, "labels": {"aether.io/managed": managed.to_string()}}}),
        )
    }

    fn pod(namespace: &str, name: &str, node: &str, spec: Value, annotations: Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = json!(node);
        spec["containers"] = json!([]);
        object(json!({
            "metadata": {"namespace": namespace, "name": name, "labels": {"app": "echo"},
                         "annotations": annotations},
            "spec": spec,
            "status": {"podIPs": [{"ip": format!("10.0.0.{}", name.len())}]},
        }))
    }

    fn index() -> Index {
        let mut index = Index::default();
        index.add_namespace(&namespace("shop", true));
        index.add_namespace(&namespace("plain", false));
        index.add_service(&object(json!({
            "metadata": {"namespace": "shop", "name": "echo"},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "echo"},
                     "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]},
        })));
        index
    }

    #[test]
    fn pods_follow_the_meshing_rule_and_default_to_the_default_service_account() {
        let mut index = index();
        index.add_pod(&pod(
            "shop",
            "a",
            "n1",
            json!({"serviceAccountName": "web"}),
            json!({}),
        ));
        index.add_pod(&pod(
            "shop",
            "b",
            "n1",
            json!({}),
            json!({"aether.io/capture": "disabled"}),
        ));
        index.add_pod(&pod(
            "shop",
            "c",
            "n1",
            json!({"hostNetwork": true}),
            json!({}),
        ));
        index.add_pod(&pod("plain", "d", "n1", json!({}), json!({})));
        let meshed = |ns: &str, name: &str| index.pods[&key(ns, name)].meshed;
        assert!(meshed("shop", "a"));
        assert!(!meshed("shop", "b"), "opted out");
        assert!(!meshed("shop", "c"), "host network");
        assert!(!meshed("plain", "d"), "unmanaged namespace");
        assert_eq!(
            index.pods[&key("shop", "b")].service_account,
            ServiceAccount::new("shop", "default")
        );
        assert_eq!(
            index.identities("cluster.local", &key("shop", "echo")),
            vec![
                "spiffe://cluster.local/ns/shop/sa/default",
                "spiffe://cluster.local/ns/shop/sa/web",
            ]
        );
    }

    #[test]
    fn depends_on_names_services_of_the_pods_namespace_or_another() {
        let mut index = index();
        let annotations = json!({"aether.io/depends-on": "far/api, echo, not/a/key"});
        index.add_pod(&pod("shop", "a", "n1", json!({}), annotations));
        assert_eq!(
            index.pods[&key("shop", "a")].depends_on,
            vec![key("far", "api"), key("shop", "echo")]
        );
    }

    #[test]
    fn only_tcp_ports_and_ready_endpoints_count() {
        let mut index = index();
        assert_eq!(index.services[&key("shop", "echo")].info.ports.len(), 1);
        index.add_endpoint_slice(&object(json!({
            "metadata": {"namespace": "shop", "name": "echo-1",
                         "labels": {"kubernetes.io/service-name": "echo"}},
            "addressType": "IPv4",
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                          {"addresses": ["10.0.0.2"], "conditions": {"ready": false}}],
        })));
        let echo = key("shop", "echo");
        assert_eq!(index.ready_endpoints[&echo], 1);
        assert_eq!(index.endpoint_addresses[&echo].len(), 2);
    }

    #[test]
    fn a_proxy_is_believed_about_the_pods_of_its_own_node_only() {
        let mut index = index();
        index.add_pod(&pod("shop", "a", "n1", json!({}), json!({})));
        index.add_pod(&pod("shop", "bb", "n2", json!({}), json!({})));
        // n1's proxy claims to capture both pods; only its own counts.
        index.add_node_config(&object(json!({
            "metadata": {"name": "n1"},
            "spec": {},
            "status": {"capturedPods": ["shop/a", "shop/bb"]},
        })));
        assert_eq!(
            index.meshed_pod_addresses(),
            BTreeSet::from(["10.0.0.1".to_owned()])
        );
    }
}
