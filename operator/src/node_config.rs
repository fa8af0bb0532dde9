//! Per-node config, as a pure function: the capture set of the whole mesh (with the part
//! that only some namespaces' pods capture), and the route tables and backend identities
//! that this node's meshed pods may need (demand scope). A Service with meshed endpoints and
//! no route is captured too, with an identity route: an empty table, so every request goes
//! to its own endpoints, over mTLS to the meshed ones.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use aether_crds::node_config::{NamespaceCapture, NodeConfigSpec, ServiceIdentities, TargetTable};
use aether_routing::table::BackendTarget;
use aether_routing::{RouteTable, ServiceKind};

use crate::index::{Index, Key, key};
use crate::targets::Target;

/// The addresses a meshed pod dials to reach `service`: its `ClusterIP:port`s, or for a
/// headless Service the `podIP:port` of its meshed endpoints (its callers dial the pods).
/// Only the pods it selects, all in its own namespace: EndpointSlices are written by anyone
/// in the namespace, and one naming another namespace's pods must not take over how every
/// meshed pod reaches them.
fn service_addresses(index: &Index, service: &Key, meshed: &BTreeSet<String>) -> Vec<SocketAddr> {
    let Some(data) = index.services.get(service) else {
        return Vec::new();
    };
    match data.info.kind {
        ServiceKind::ClusterIp => data
            .cluster_ips
            .iter()
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .flat_map(|ip| {
                data.info
                    .ports
                    .iter()
                    .map(move |p| SocketAddr::new(ip, p.port))
            })
            .collect(),
        ServiceKind::Headless => {
            let own: BTreeSet<&String> = index
                .selected_pods(service)
                .flat_map(|(_, pod)| &pod.ips)
                .filter(|ip| meshed.contains(*ip))
                .collect();
            index
                .endpoint_sockets
                .get(service)
                .into_iter()
                .flatten()
                .filter(|(address, _)| own.contains(address))
                .filter_map(|(address, port)| Some(SocketAddr::new(address.parse().ok()?, *port)))
                .collect()
        }
        ServiceKind::ExternalName => Vec::new(),
    }
}

/// The capture set: what every meshed pod captures, and what only the pods of one
/// namespace do (per namespace), sorted, none of the latter among the former.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Capture {
    pub everyone: Vec<String>,
    pub namespaces: BTreeMap<String, Vec<String>>,
}

/// Every pod captures the Services with an identity route, and the route targets with a
/// producer route or a meshed endpoint. A target whose only routes are consumer routes is
/// captured for the pods of those routes' namespaces alone (GEP-1294: a consumer route
/// applies to its own namespace's clients), so that a route in one namespace never changes
/// how another namespace's pods reach a Service.
pub fn capture(
    index: &Index,
    targets: &BTreeMap<Key, Target>,
    identity_routed: &BTreeSet<Key>,
    meshed: &BTreeSet<String>,
) -> Capture {
    let mut everyone: BTreeSet<SocketAddr> = BTreeSet::new();
    let mut namespaces: BTreeMap<String, BTreeSet<SocketAddr>> = BTreeMap::new();
    for key in identity_routed {
        everyone.extend(service_addresses(index, key, meshed));
    }
    for (key, target) in targets {
        let addresses = service_addresses(index, key, meshed);
        let ports = &target.compiled.table.ports;
        if ports.iter().any(|p| p.producer.is_some())
            || !index.meshed_endpoints(key, meshed).is_empty()
        {
            everyone.extend(addresses);
            continue;
        }
        for namespace in ports.iter().flat_map(|p| p.consumers.keys()) {
            namespaces
                .entry(namespace.clone())
                .or_default()
                .extend(addresses.iter().copied());
        }
    }
    let strings = |set: &BTreeSet<SocketAddr>| set.iter().map(SocketAddr::to_string).collect();
    Capture {
        namespaces: namespaces
            .into_iter()
            .map(|(namespace, set)| (namespace, set.difference(&everyone).copied().collect()))
            .filter(|(_, set): &(String, BTreeSet<SocketAddr>)| !set.is_empty())
            .map(|(namespace, set)| (namespace, strings(&set)))
            .collect(),
        everyone: strings(&everyone),
    }
}

/// The Services with no route target that have a meshed endpoint to capture: captured with
/// an identity route.
pub fn identity_routed(
    index: &Index,
    targets: &BTreeMap<Key, Target>,
    meshed: &BTreeSet<String>,
) -> BTreeSet<Key> {
    index
        .services
        .keys()
        .filter(|k| {
            !targets.contains_key(*k)
                && !index.meshed_endpoints(k, meshed).is_empty()
                && !service_addresses(index, k, meshed).is_empty()
        })
        .cloned()
        .collect()
}

/// The backend Services a table sends traffic or mirrors to.
fn backends(table: &RouteTable) -> BTreeSet<Key> {
    let mut out = BTreeSet::new();
    for port in &table.ports {
        for set in port.producer.iter().chain(port.consumers.values()) {
            for rule in &set.rules {
                let targets = rule
                    .backends
                    .iter()
                    .map(|b| &b.target)
                    .chain(rule.filters.mirrors.iter().map(|m| &m.target));
                for target in targets {
                    if let BackendTarget::Service(s) = target {
                        out.insert(key(&s.namespace, &s.name));
                    }
                }
            }
        }
    }
    out
}

/// The route targets whose tables the node needs: targets in the namespaces of its meshed
/// pods, those its pods name in `aether.io/depends-on` or its proxy asked for, those with
/// consumer routes of a namespace with clients on the node, plus the targets among their
/// backends. Also the namespaces with clients on the node.
pub fn demand(
    clients: Option<&Clients>,
    targets: &BTreeMap<Key, Target>,
) -> (BTreeSet<Key>, BTreeSet<String>) {
    let Some(clients) = clients else {
        return Default::default();
    };
    let mut wanted: BTreeSet<Key> = targets
        .keys()
        .filter(|(ns, _)| clients.namespaces.contains(ns))
        .cloned()
        .collect();
    wanted.extend(
        clients
            .depends_on
            .iter()
            .filter(|k| targets.contains_key(*k))
            .cloned(),
    );
    wanted.extend(
        targets
            .iter()
            .filter(|(_, t)| {
                t.compiled
                    .table
                    .ports
                    .iter()
                    .any(|p| p.consumers.keys().any(|ns| clients.namespaces.contains(ns)))
            })
            .map(|(k, _)| k.clone()),
    );
    let backends: BTreeSet<Key> = wanted
        .iter()
        .filter_map(|k| targets.get(k))
        .flat_map(|t| backends(&t.compiled.table))
        .filter(|k| targets.contains_key(k))
        .collect();
    wanted.extend(backends);
    (wanted, clients.namespaces.clone())
}

/// What a node's meshed pods ask for.
#[derive(Debug, Default)]
pub struct Clients {
    pub namespaces: BTreeSet<String>,
    pub depends_on: BTreeSet<Key>,
}

/// What every node's config is cut from, computed once per pass: identities and meshed
/// endpoints, and each node's clients.
pub struct Shared {
    pub capture: Capture,
    pub identities: BTreeMap<Key, Vec<String>>,
    pub meshed: BTreeMap<Key, Vec<String>>,
    /// Services captured with an identity route (an empty table).
    pub identity_routed: BTreeSet<Key>,
    pub clients: BTreeMap<String, Clients>,
    pub policies: BTreeMap<Key, crate::authz::CompiledPolicy>,
    pub deny_by_default: BTreeSet<String>,
}

impl Shared {
    pub fn new(index: &Index, targets: &BTreeMap<Key, Target>, trust_domain: &str) -> Self {
        let mut clients: BTreeMap<String, Clients> = BTreeMap::new();
        for ((namespace, _), pod) in &index.pods {
            let Some(node) = pod.node.as_ref().filter(|_| pod.meshed && !pod.terminating) else {
                continue;
            };
            let entry = clients.entry(node.clone()).or_default();
            entry.namespaces.insert(namespace.clone());
            entry.depends_on.extend(pod.depends_on.iter().cloned());
        }
        for (node, demand) in &index.node_demand {
            if let Some(entry) = clients.get_mut(node) {
                entry.depends_on.extend(demand.iter().cloned());
            }
        }
        let meshed = index.meshed_pod_addresses();
        let identity_routed = identity_routed(index, targets, &meshed);
        let mut identities = identity_map(index, targets, trust_domain);
        identities.extend(
            identity_routed
                .iter()
                .map(|k| (k.clone(), index.identities(trust_domain, k))),
        );
        Shared {
            capture: capture(index, targets, &identity_routed, &meshed),
            identities,
            meshed: routed_services(targets)
                .chain(identity_routed.iter().cloned())
                .map(|k| {
                    let addresses = index.meshed_endpoints(&k, &meshed);
                    (k, addresses)
                })
                .collect(),
            identity_routed,
            clients,
            policies: crate::authz::compile_all(index),
            deny_by_default: index.deny_by_default.clone(),
        }
    }
}

/// A table with only the consumer rules of namespaces that have clients on the node.
fn scoped(table: &RouteTable, client_namespaces: &BTreeSet<String>) -> RouteTable {
    let mut table = table.clone();
    for port in &mut table.ports {
        port.consumers
            .retain(|ns, _| client_namespaces.contains(ns));
    }
    table
}

/// The identities of every route target and every backend, computed once for all nodes.
pub fn identity_map(
    index: &Index,
    targets: &BTreeMap<Key, Target>,
    trust_domain: &str,
) -> BTreeMap<Key, Vec<String>> {
    routed_services(targets)
        .map(|k| {
            let ids = index.identities(trust_domain, &k);
            (k, ids)
        })
        .collect()
}

/// Every route target and every backend of one.
fn routed_services(targets: &BTreeMap<Key, Target>) -> impl Iterator<Item = Key> {
    let mut services: BTreeSet<Key> = targets.keys().cloned().collect();
    services.extend(targets.values().flat_map(|t| backends(&t.compiled.table)));
    services.into_iter()
}

pub fn node_config(node: &str, targets: &BTreeMap<Key, Target>, shared: &Shared) -> NodeConfigSpec {
    let capture = shared.capture.everyone.clone();
    let identities = &shared.identities;
    let clients = shared.clients.get(node);
    let namespace_capture: Vec<NamespaceCapture> = shared
        .capture
        .namespaces
        .iter()
        .filter(|(namespace, _)| clients.is_some_and(|c| c.namespaces.contains(*namespace)))
        .map(|(namespace, addresses)| NamespaceCapture {
            namespace: namespace.clone(),
            addresses: addresses.clone(),
        })
        .collect();
    let (wanted, client_namespaces) = demand(clients, targets);
    // Identity routes in the same scope as route targets: the namespaces of the node's
    // clients, what they depend on, and what the node's proxy asked for.
    let identity_routed: Vec<&Key> = clients
        .map(|clients| {
            shared
                .identity_routed
                .iter()
                .filter(|k| clients.namespaces.contains(&k.0) || clients.depends_on.contains(*k))
                .collect()
        })
        .unwrap_or_default();
    let mut tables: Vec<TargetTable> = wanted
        .iter()
        .filter_map(|k| targets.get(k))
        .map(|t| {
            // Consumer rules of namespaces without clients here are cut; most tables have none.
            let foreign = t
                .compiled
                .table
                .ports
                .iter()
                .any(|p| p.consumers.keys().any(|ns| !client_namespaces.contains(ns)));
            let table = if foreign {
                scoped(&t.compiled.table, &client_namespaces)
            } else {
                t.compiled.table.clone()
            };
            TargetTable {
                namespace: t.key.0.clone(),
                service: t.key.1.clone(),
                table: table.into(),
            }
        })
        .collect();
    tables.extend(identity_routed.iter().map(|k| TargetTable {
        namespace: k.0.clone(),
        service: k.1.clone(),
        table: RouteTable::default().into(),
    }));
    // Identities of every Service a request from this node may reach: the wanted targets
    // themselves (traffic with no route passes through to them), their backends, and the
    // identity-routed Services.
    let mut services: BTreeSet<Key> = wanted.clone();
    services.extend(identity_routed.into_iter().cloned());
    services.extend(
        wanted
            .iter()
            .filter_map(|k| targets.get(k))
            .flat_map(|t| backends(&t.compiled.table)),
    );
    let identities = services
        .into_iter()
        .filter_map(|k| {
            let ids = identities.get(&k).cloned().unwrap_or_default();
            let meshed = shared.meshed.get(&k).cloned().unwrap_or_default();
            // A meshed endpoint of a Service that selects no pod (endpoints written by hand)
            // still takes mTLS, and is refused for an identity outside the empty set.
            (!ids.is_empty() || !meshed.is_empty()).then_some(ServiceIdentities {
                identities: ids,
                meshed_addresses: meshed,
                namespace: k.0,
                service: k.1,
            })
        })
        .collect();
    NodeConfigSpec {
        capture_count: (capture.len()
            + namespace_capture
                .iter()
                .map(|c| c.addresses.len())
                .sum::<usize>()) as i32,
        capture_addresses: capture,
        namespace_capture,
        table_count: tables.len() as i32,
        tables,
        identities,
        authorization: crate::authz::node_authorization(
            &shared.policies,
            &shared.deny_by_default,
            &client_namespaces,
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::index::key;

    fn index() -> Index {
        let mut index = Index::default();
        index.add_namespace(
            &serde_json::from_value(
                json!({"metadata": {"name": "shop", "labels": {"aether.io/managed": "true"}}}),
            )
            .unwrap(),
        );
        for (name, cluster_ip) in [("echo", "10.96.0.10"), ("db", "None")] {
            index.add_service(
                &serde_json::from_value(json!({
                    "metadata": {"namespace": "shop", "name": name},
                    "spec": {"clusterIP": cluster_ip, "selector": {"app": name}, "ports": [{"port": 80}]},
                }))
                .unwrap(),
            );
            index.add_pod(
                &serde_json::from_value(json!({
                    "metadata": {"namespace": "shop", "name": format!("{name}-0"), "labels": {"app": name}},
                    "spec": {"nodeName": "n1", "containers": []},
                    "status": {"podIPs": [{"ip": if name == "db" { "10.0.0.7" } else { "10.0.0.5" }}]},
                }))
                .unwrap(),
            );
        }
        // db's slice also names a pod of another namespace, which it does not select.
        index.add_endpoint_slice(
            &serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": "db-1",
                             "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "ports": [{"port": 5432, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["10.0.0.7"]}, {"addresses": ["10.0.9.9"]}],
            }))
            .unwrap(),
        );
        index
    }

    #[test]
    fn a_cluster_ip_service_is_dialled_at_its_ports_and_a_headless_one_at_its_own_meshed_pods() {
        let index = index();
        let meshed = BTreeSet::from(["10.0.0.7".to_owned(), "10.0.9.9".to_owned()]);
        assert_eq!(
            service_addresses(&index, &key("shop", "echo"), &meshed),
            vec!["10.96.0.10:80".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            service_addresses(&index, &key("shop", "db"), &meshed),
            vec!["10.0.0.7:5432".parse::<SocketAddr>().unwrap()],
            "the slice's foreign address is not the Service's to capture"
        );
        assert!(service_addresses(&index, &key("shop", "db"), &BTreeSet::new()).is_empty());
    }
}
