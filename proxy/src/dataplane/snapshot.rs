//! The proxy's picture of the mesh at one moment, built from the node's NodeConfig, Services,
//! EndpointSlices and Namespaces by a pure function. The data plane reads one immutable
//! [`Snapshot`] per request; the cluster watcher builds a new one after each change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use aether_core::authz::{NodeAuthorization, PolicySet};
use aether_core::lenient::Lenient;
use aether_crds::node_config::NodeConfigSpec;
use aether_crds::slices;
use aether_routing::{PortProtocol, RouteTable, Router};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tracing::warn;

use crate::inpod::capture_set::CaptureSet;

pub use aether_core::service::ServiceKey;

/// A route target's compiled table, with the JSON it came from (to reuse it when unchanged).
#[derive(Debug)]
pub struct Target {
    pub router: Router,
    source: Lenient<RouteTable>,
}

/// Where one Service port's traffic can go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Pod IP and target port.
    pub addr: SocketAddr,
    /// The pod has aether's inbound listener (its node's proxy captures it): mTLS, else plain.
    pub meshed: bool,
}

#[derive(Debug, Default)]
pub struct ServiceEntry {
    /// Ready endpoints per Service port number.
    pub ports: HashMap<u16, Vec<Endpoint>>,
    /// What each Service port carries.
    pub protocols: HashMap<u16, PortProtocol>,
}

#[derive(Debug, Default)]
pub struct Snapshot {
    /// The NodeConfig generation this snapshot holds; `None` before the first one arrived.
    pub generation: Option<i64>,
    pub capture: CaptureSet,
    /// Route target of each captured ClusterIP:port.
    pub captured: HashMap<SocketAddr, ServiceKey>,
    /// The Service behind every ClusterIP:port the watch has delivered.
    pub addresses: HashMap<SocketAddr, ServiceKey>,
    /// The headless Service behind every `podIP:port` of its endpoints (ready or not: a
    /// caller that dials a pod chose it), with the Service port it stands for.
    pub pinned: HashMap<SocketAddr, (ServiceKey, u16)>,
    pub targets: HashMap<ServiceKey, Arc<Target>>,
    /// SPIFFE IDs each backend Service may present.
    pub identities: HashMap<ServiceKey, BTreeSet<String>>,
    /// The endpoint addresses of each backend Service that take mTLS.
    pub meshed: HashMap<ServiceKey, HashSet<IpAddr>>,
    pub services: HashMap<ServiceKey, ServiceEntry>,
    /// The target ports of every EndpointSlice address, with the slice's namespace: the ports
    /// a pod serves are those its own namespace's Services send to (a slice of another
    /// namespace naming the pod proves nothing, anyone may write one).
    pub served: HashMap<IpAddr, Vec<(String, u16)>>,
    /// The node's authorization policies, ready to decide.
    pub authz: Arc<Authorization>,
    /// Tables that did not load, with the reason (reported, never fatal).
    pub errors: Vec<String>,
}

/// The node's policies compiled, with what they came from (to reuse them when unchanged).
#[derive(Debug, Default)]
pub struct Authorization {
    pub policies: PolicySet,
    source: NodeAuthorization,
}

/// The inputs of a snapshot.
pub struct Inputs<'a> {
    pub node_config: Option<(i64, &'a NodeConfigSpec)>,
    pub services: &'a [Arc<Service>],
    pub slices: &'a [Arc<EndpointSlice>],
}

impl Snapshot {
    /// Builds a snapshot, reusing `previous`'s compiled tables and capture generation where
    /// nothing changed.
    pub fn build(inputs: &Inputs<'_>, previous: &Snapshot) -> Snapshot {
        let mut snapshot = Snapshot {
            generation: inputs.node_config.map(|(g, _)| g),
            served: served(inputs.slices),
            addresses: service_addresses(inputs.services),
            pinned: pinned(inputs),
            ..Snapshot::default()
        };
        // No NodeConfig (deleted, or not written yet while the operator is down) is not an
        // empty config: the pods keep the last capture set and routes, never fail open.
        let Some((generation, spec)) = inputs.node_config else {
            snapshot.generation = previous.generation;
            snapshot.capture = previous.capture.clone();
            snapshot.captured = previous.captured.clone();
            snapshot.targets = previous.targets.clone();
            snapshot.identities = previous.identities.clone();
            snapshot.meshed = previous.meshed.clone();
            snapshot.authz = previous.authz.clone();
            snapshot.services = services(inputs, &snapshot.meshed);
            return snapshot;
        };
        let mut parse = |entries: &[String]| -> Vec<SocketAddr> {
            let mut addresses = Vec::new();
            for entry in entries {
                let Ok(addr) = entry.parse::<SocketAddr>() else {
                    snapshot
                        .errors
                        .push(format!("capture entry {entry:?} is not an IP:port"));
                    continue;
                };
                addresses.push(addr);
                // A Service this proxy's watch has not delivered yet is captured; its
                // connections wait a little for it, then are refused.
                let key = (snapshot.addresses.get(&addr))
                    .or_else(|| snapshot.pinned.get(&addr).map(|(key, _)| key));
                if let Some(key) = key {
                    snapshot.captured.insert(addr, key.clone());
                }
            }
            addresses
        };
        let mut capture = CaptureSet {
            generation: 0,
            targets: parse(&spec.capture_addresses),
            namespaces: (spec.namespace_capture.iter())
                .map(|scoped| (scoped.namespace.clone(), parse(&scoped.addresses)))
                .collect(),
        };
        capture.normalise();
        snapshot.capture = if (&capture.targets, &capture.namespaces)
            == (&previous.capture.targets, &previous.capture.namespaces)
        {
            previous.capture.clone()
        } else {
            // Never a generation the pods' tables may already record: a NodeConfig deleted and
            // written again starts its generations over.
            capture.generation = u64::try_from(generation)
                .unwrap_or_default()
                .max(previous.capture.generation + 1);
            capture
        };
        for table in &spec.tables {
            let key = ServiceKey::new(&table.namespace, &table.service);
            if let Some(old) = previous.targets.get(&key)
                && old.source == table.table
            {
                snapshot.targets.insert(key, old.clone());
                continue;
            }
            let router = (table.table.valid())
                .map_err(str::to_owned)
                .and_then(|t| Router::new(t).map_err(|e| e.to_string()));
            match router {
                Ok(router) => {
                    snapshot.targets.insert(
                        key,
                        Arc::new(Target {
                            router,
                            source: table.table.clone(),
                        }),
                    );
                }
                Err(e) => {
                    warn!(target = %key, error = %e, "cannot load a route table; its requests get 503");
                    snapshot.errors.push(format!("route table of {key}: {e}"));
                }
            }
        }
        for ids in &spec.identities {
            let key = ServiceKey::new(&ids.namespace, &ids.service);
            let meshed: HashSet<IpAddr> = ids
                .meshed_addresses
                .iter()
                .filter_map(|ip| ip.parse().ok())
                .collect();
            if meshed.len() < ids.meshed_addresses.len() {
                snapshot
                    .errors
                    .push(format!("a meshed address of {key} is not an IP"));
            }
            snapshot.meshed.insert(key.clone(), meshed);
            snapshot
                .identities
                .insert(key, ids.identities.iter().cloned().collect());
        }
        snapshot.authz = if previous.authz.source == spec.authorization {
            previous.authz.clone()
        } else {
            let (policies, errors) = PolicySet::new(&spec.authorization);
            for error in errors {
                warn!(%error, "an authorization rule does not compile; it fails closed");
                snapshot.errors.push(error.to_string());
            }
            Arc::new(Authorization {
                policies,
                source: spec.authorization.clone(),
            })
        };
        snapshot.services = services(inputs, &snapshot.meshed);
        snapshot
    }

    /// For a connection dialled to `address`, an endpoint of a headless Service: its Service
    /// and Service port, and the endpoint itself, whether ready or not (the caller chose it).
    pub fn pinned_endpoint(&self, address: SocketAddr) -> Option<(&ServiceKey, u16, Endpoint)> {
        let (key, port) = self.pinned.get(&address)?;
        let meshed = (self.meshed.get(key)).is_some_and(|m| m.contains(&address.ip()));
        let endpoint = Endpoint {
            addr: address,
            meshed,
        };
        Some((key, *port, endpoint))
    }

    /// The ready endpoints of `service`'s port `port`.
    pub fn endpoints(&self, service: &ServiceKey, port: u16) -> &[Endpoint] {
        self.services
            .get(service)
            .and_then(|s| s.ports.get(&port))
            .map_or(&[], Vec::as_slice)
    }
}

/// A Service's key and spec, when it has both.
fn keyed(service: &Service) -> Option<(ServiceKey, &ServiceSpec)> {
    let meta = &service.metadata;
    let key = ServiceKey::new(meta.namespace.as_deref()?, meta.name.as_deref()?);
    Some((key, service.spec.as_ref()?))
}

/// The Service behind each ClusterIP:port.
fn service_addresses(services: &[Arc<Service>]) -> HashMap<SocketAddr, ServiceKey> {
    let mut out = HashMap::new();
    for (key, spec) in services.iter().filter_map(|s| keyed(s)) {
        let ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|ip| ip.parse::<IpAddr>().ok());
        for ip in ips {
            for port in spec.ports.iter().flatten() {
                if let Ok(port) = u16::try_from(port.port) {
                    out.insert(SocketAddr::new(ip, port), key.clone());
                }
            }
        }
    }
    out
}

/// The `podIP:port` of every endpoint of the headless Services, with its Service and the
/// Service port whose target port it is (by the slice port's name, as kube-proxy matches them).
fn pinned(inputs: &Inputs<'_>) -> HashMap<SocketAddr, (ServiceKey, u16)> {
    let mut ports: HashMap<ServiceKey, Vec<(&str, u16)>> = HashMap::new();
    for (key, spec) in inputs.services.iter().filter_map(|s| keyed(s)) {
        if spec.cluster_ip.as_deref() != Some("None") {
            continue;
        }
        let named = (spec.ports.iter().flatten())
            .filter_map(|p| {
                Some((
                    p.name.as_deref().unwrap_or_default(),
                    u16::try_from(p.port).ok()?,
                ))
            })
            .collect();
        ports.insert(key, named);
    }
    let mut out = HashMap::new();
    for slice in inputs.slices {
        let Some(key) = slice_service(slice) else {
            continue;
        };
        let Some(service_ports) = ports.get(&key) else {
            continue;
        };
        for port in slice.ports.iter().flatten() {
            if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                continue;
            }
            let name = port.name.as_deref().unwrap_or_default();
            let (Some(target), Some(&(_, number))) = (
                port.port.and_then(|p| u16::try_from(p).ok()),
                service_ports.iter().find(|(n, _)| *n == name),
            ) else {
                continue;
            };
            let addresses = (slice.endpoints.iter().flatten()).flat_map(|e| &e.addresses);
            for ip in addresses.filter_map(|a| a.parse::<IpAddr>().ok()) {
                out.insert(SocketAddr::new(ip, target), (key.clone(), number));
            }
        }
    }
    out
}

/// The Service an EndpointSlice belongs to.
fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    slices::service_of(slice).map(|(ns, name)| ServiceKey::new(ns, name))
}

fn served(slices: &[Arc<EndpointSlice>]) -> HashMap<IpAddr, Vec<(String, u16)>> {
    let mut out: HashMap<IpAddr, Vec<(String, u16)>> = HashMap::new();
    for slice in slices {
        let Some(ns) = slice.metadata.namespace.as_deref() else {
            continue;
        };
        let ports = slices::tcp_ports(slice);
        for endpoint in slice.endpoints.iter().flatten() {
            for ip in endpoint
                .addresses
                .iter()
                .filter_map(|a| a.parse::<IpAddr>().ok())
            {
                let served = out.entry(ip).or_default();
                for &port in &ports {
                    if !served.iter().any(|(n, p)| *p == port && n == ns) {
                        served.push((ns.to_owned(), port));
                    }
                }
            }
        }
    }
    out
}

impl Snapshot {
    /// What `service`'s port `port` carries; a port the watch does not know is sniffed.
    pub fn protocol(&self, service: &ServiceKey, port: u16) -> PortProtocol {
        self.services
            .get(service)
            .and_then(|s| s.protocols.get(&port))
            .copied()
            .unwrap_or(PortProtocol::Detect)
    }

    /// Whether a Service of `namespace` sends to `ip:port`.
    pub fn serves(&self, namespace: &str, ip: IpAddr, port: u16) -> bool {
        self.served
            .get(&ip)
            .is_some_and(|ports| ports.iter().any(|(n, p)| *p == port && n == namespace))
    }
}

fn services(
    inputs: &Inputs<'_>,
    meshed: &HashMap<ServiceKey, HashSet<IpAddr>>,
) -> HashMap<ServiceKey, ServiceEntry> {
    let mut slices: HashMap<ServiceKey, Vec<&EndpointSlice>> = HashMap::new();
    for slice in inputs.slices {
        if let Some(key) = slice_service(slice) {
            slices.entry(key).or_default().push(slice);
        }
    }
    let mut out = HashMap::new();
    for service in inputs.services {
        let (Some(ns), Some(name)) = (
            service.metadata.namespace.as_deref(),
            service.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let key = ServiceKey::new(ns, name);
        let meshed = meshed.get(&key);
        let mut entry = ServiceEntry::default();
        let ports = service.spec.as_ref().and_then(|s| s.ports.as_deref());
        for port in ports.unwrap_or_default() {
            let Ok(number) = u16::try_from(port.port) else {
                continue;
            };
            entry.protocols.insert(
                number,
                PortProtocol::of(port.name.as_deref(), port.app_protocol.as_deref()),
            );
            let port_name = port.name.as_deref().unwrap_or_default();
            let mut endpoints = Vec::new();
            for slice in slices.get(&key).into_iter().flatten() {
                let Some(target) = slice.ports.iter().flatten().find(|p| {
                    p.name.as_deref().unwrap_or_default() == port_name
                        && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
                }) else {
                    continue;
                };
                let Some(target_port) = target.port.and_then(|p| u16::try_from(p).ok()) else {
                    continue;
                };
                for endpoint in slice.endpoints.iter().flatten() {
                    if !slices::is_ready(endpoint) {
                        continue;
                    }
                    for address in &endpoint.addresses {
                        if let Ok(ip) = address.parse::<IpAddr>() {
                            endpoints.push(Endpoint {
                                addr: SocketAddr::new(ip, target_port),
                                meshed: meshed.is_some_and(|m| m.contains(&ip)),
                            });
                        }
                    }
                }
            }
            endpoints.sort_by_key(|e| e.addr);
            endpoints.dedup();
            entry.ports.insert(number, endpoints);
        }
        out.insert(key, entry);
    }
    out
}

#[cfg(test)]
mod tests {
    use aether_crds::node_config::{ServiceIdentities, TargetTable};
    use serde_json::json;

    use super::*;

    fn service(ns: &str, name: &str, cluster_ip: &str, ports: &[(&str, i32)]) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": name},
                "spec": {"clusterIP": cluster_ip, "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p})).collect::<Vec<_>>()},
            }))
            .unwrap(),
        )
    }

    fn slice(
        ns: &str,
        service: &str,
        ports: &[(&str, i32)],
        eps: &[(&str, bool)],
    ) -> Arc<EndpointSlice> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": format!("{service}-x"),
                    "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
                "endpoints": eps.iter().map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect::<Vec<_>>(),
            }))
            .unwrap(),
        )
    }

    fn spec() -> NodeConfigSpec {
        NodeConfigSpec {
            capture_addresses: vec![
                "10.96.0.20:80".into(),
                // No Service of this proxy's watch has it (yet).
                "10.96.0.30:80".into(),
                "bad:80".into(),
            ],
            capture_count: 3,
            namespace_capture: vec![],
            tables: vec![
                TargetTable {
                    namespace: "shop".into(),
                    service: "echo".into(),
                    table: RouteTable::default().into(),
                },
                TargetTable {
                    namespace: "shop".into(),
                    service: "broken".into(),
                    table: serde_json::from_value(json!({"ports": 7})).unwrap(),
                },
            ],
            table_count: 2,
            identities: vec![ServiceIdentities {
                namespace: "shop".into(),
                service: "echo-v1".into(),
                identities: vec!["spiffe://cluster.local/ns/shop/sa/v1".into()],
                meshed_addresses: vec!["10.244.1.5".into(), "nonsense".into()],
            }],
            authorization: NodeAuthorization::default(),
        }
    }

    #[test]
    fn a_headless_services_pods_are_pinned_and_a_namespaces_targets_kept_apart() {
        let services = [
            service("shop", "db", "None", &[("pg", 5432)]),
            service("ext", "web", "10.96.0.40", &[("http", 80)]),
        ];
        let slices = [slice(
            "shop",
            "db",
            &[("pg", 15432)],
            &[("10.244.1.7", true), ("10.244.1.8", false)],
        )];
        let spec = NodeConfigSpec {
            capture_addresses: vec!["10.244.1.7:15432".into()],
            namespace_capture: vec![aether_crds::node_config::NamespaceCapture {
                namespace: "shop".into(),
                addresses: vec!["10.96.0.40:80".into(), "10.244.1.7:15432".into()],
            }],
            identities: vec![ServiceIdentities {
                namespace: "shop".into(),
                service: "db".into(),
                identities: vec!["spiffe://cluster.local/ns/shop/sa/db".into()],
                meshed_addresses: vec!["10.244.1.7".into()],
            }],
            ..NodeConfigSpec::default()
        };
        let snapshot = Snapshot::build(
            &Inputs {
                node_config: Some((1, &spec)),
                services: &services,
                slices: &slices,
            },
            &Snapshot::default(),
        );
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let db = ServiceKey::new("shop", "db");
        assert_eq!(snapshot.captured[&addr("10.244.1.7:15432")], db);
        assert_eq!(
            snapshot.captured[&addr("10.96.0.40:80")],
            ServiceKey::new("ext", "web")
        );
        assert!(snapshot.capture.captures("shop", &addr("10.96.0.40:80")));
        assert!(!snapshot.capture.captures("other", &addr("10.96.0.40:80")));
        assert_eq!(
            snapshot.capture.namespaces["shop"],
            [addr("10.96.0.40:80")],
            "what every pod captures is not repeated per namespace"
        );
        // The dialled pod, as its Service port, ready or not; mTLS only to the meshed one.
        let pinned = |s: &str| {
            snapshot
                .pinned_endpoint(addr(s))
                .map(|(key, port, e)| (key.clone(), port, e.meshed))
        };
        assert_eq!(pinned("10.244.1.7:15432"), Some((db.clone(), 5432, true)));
        assert_eq!(pinned("10.244.1.8:15432"), Some((db, 5432, false)));
        assert_eq!(pinned("10.244.1.7:5432"), None);
        assert_eq!(pinned("10.96.0.40:80"), None);
    }

    #[test]
    fn builds_endpoints_capture_tables_and_identities() {
        let spec = spec();
        let services = [
            service("shop", "echo", "10.96.0.20", &[("http", 80)]),
            service(
                "shop",
                "echo-v1",
                "10.96.0.21",
                &[("http", 80), ("grpc", 7070)],
            ),
        ];
        let slices = [
            slice(
                "shop",
                "echo-v1",
                &[("http", 8080)],
                // 10.244.3.9 is an opted-out pod: no inbound listener.
                &[
                    ("10.244.1.5", true),
                    ("10.244.2.7", false),
                    ("10.244.3.9", true),
                ],
            ),
            slice(
                "shop",
                "echo-v1",
                &[("grpc", 7070)],
                &[("10.244.1.5", true)],
            ),
        ];
        let inputs = Inputs {
            node_config: Some((4, &spec)),
            services: &services,
            slices: &slices,
        };
        let snapshot = Snapshot::build(&inputs, &Snapshot::default());
        let v1 = ServiceKey::new("shop", "echo-v1");
        assert_eq!(
            snapshot.endpoints(&v1, 80),
            [
                Endpoint {
                    addr: "10.244.1.5:8080".parse().unwrap(),
                    meshed: true
                },
                Endpoint {
                    addr: "10.244.3.9:8080".parse().unwrap(),
                    meshed: false
                }
            ]
        );
        assert_eq!(snapshot.endpoints(&v1, 7070).len(), 1);
        assert!(snapshot.endpoints(&v1, 9999).is_empty());
        assert_eq!(snapshot.protocol(&v1, 7070), PortProtocol::Http);
        assert_eq!(snapshot.protocol(&v1, 9999), PortProtocol::Detect);
        assert_eq!(snapshot.capture.generation, 4);
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            snapshot.capture.targets,
            [addr("10.96.0.20:80"), addr("10.96.0.30:80")]
        );
        assert_eq!(
            snapshot.captured[&addr("10.96.0.20:80")],
            ServiceKey::new("shop", "echo")
        );
        assert!(!snapshot.captured.contains_key(&addr("10.96.0.30:80")));
        assert!(
            snapshot
                .targets
                .contains_key(&ServiceKey::new("shop", "echo"))
        );
        assert_eq!(snapshot.errors.len(), 3, "{:?}", snapshot.errors);
        assert_eq!(snapshot.identities[&v1].len(), 1);

        // The same capture targets keep their generation (no pod table is rewritten) and an
        // unchanged table is not compiled again.
        let next = Snapshot::build(
            &Inputs {
                node_config: Some((5, &spec)),
                ..inputs
            },
            &snapshot,
        );
        assert_eq!(next.capture.generation, 4);
        let key = ServiceKey::new("shop", "echo");
        assert!(Arc::ptr_eq(&next.targets[&key], &snapshot.targets[&key]));

        // The NodeConfig goes (deleted, or the operator is away): the last one stays in force,
        // while endpoints still follow the watch.
        let orphaned = Snapshot::build(
            &Inputs {
                node_config: None,
                slices: &slices[..1],
                ..inputs
            },
            &next,
        );
        assert_eq!(orphaned.generation, Some(5));
        assert_eq!(orphaned.capture, next.capture);
        assert_eq!(orphaned.captured, next.captured);
        assert!(Arc::ptr_eq(&orphaned.targets[&key], &next.targets[&key]));
        assert_eq!(orphaned.identities, next.identities);
        assert!(orphaned.endpoints(&v1, 7070).is_empty());
        assert!(orphaned.endpoints(&v1, 80)[0].meshed);
    }

    #[test]
    fn a_pod_serves_the_ports_its_own_namespace_sends_to() {
        let slices = [
            slice(
                "shop",
                "web",
                &[("http", 8080)],
                &[("10.0.0.5", true), ("10.0.0.6", false)],
            ),
            // Anyone may write a slice naming another namespace's pod.
            slice("evil", "sneak", &[("admin", 9000)], &[("10.0.0.5", true)]),
        ];
        let inputs = Inputs {
            node_config: None,
            services: &[],
            slices: &slices,
        };
        let snapshot = Snapshot::build(&inputs, &Snapshot::default());
        let pod: IpAddr = "10.0.0.5".parse().unwrap();
        assert!(snapshot.serves("shop", pod, 8080));
        assert!(
            !snapshot.serves("shop", pod, 9000),
            "a slice of another namespace counts"
        );
        assert!(!snapshot.serves("shop", pod, 8081));
        // A pod that is not ready still serves its port.
        assert!(snapshot.serves("shop", "10.0.0.6".parse().unwrap(), 8080));
        assert!(!snapshot.serves("shop", "10.0.0.7".parse().unwrap(), 8080));
    }
}
