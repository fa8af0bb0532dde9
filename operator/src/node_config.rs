//! Per-node config, as a pure function: the capture set of the whole mesh, and the route
//! tables and backend identities that this node's meshed pods may need (demand scope). A
//! Service with meshed endpoints and no route is captured too, with an identity route: an
//! empty table, so every request goes to its own endpoints, over mTLS to the meshed ones.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use aether_crds::node_config::{NodeConfigSpec, ServiceIdentities, TargetTable};
use aether_routing::table::BackendTarget;
use aether_routing::{RouteTable, ServiceKind};

use crate::index::{Index, Key, key};
use crate::targets::Target;

/// `ClusterIP:port` of every one of `services`, sorted by address.
pub fn capture_set<'a>(index: &Index, services: impl Iterator<Item = &'a Key>) -> Vec<String> {
    let mut capture: Vec<SocketAddr> = services
        .filter_map(|k| index.services.get(k))
        .flat_map(|service| {
            service
                .cluster_ips
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .flat_map(|ip| {
                    service
                        .info
                        .ports
                        .iter()
                        .map(move |p| SocketAddr::new(ip, p.port))
                })
        })
        .collect();
    capture.sort();
    capture.dedup();
    capture.iter().map(SocketAddr::to_string).collect()
}

/// The ClusterIP Services with no route target that have a meshed endpoint: captured with an
/// identity route.
pub fn identity_routed(
    index: &Index,
    targets: &BTreeMap<Key, Target>,
    meshed: &BTreeSet<String>,
) -> BTreeSet<Key> {
    index
        .services
        .iter()
        .filter(|(k, service)| {
            !targets.contains_key(*k)
                && service.info.kind == ServiceKind::ClusterIp
                && !service.cluster_ips.is_empty()
                && !index.meshed_endpoints(k, meshed).is_empty()
        })
        .map(|(k, _)| k.clone())
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
/// endpoints, each target's serialised table, and each node's clients.
pub struct Shared {
    pub capture: Vec<String>,
    pub identities: BTreeMap<Key, Vec<String>>,
    pub meshed: BTreeMap<Key, Vec<String>>,
    pub tables: BTreeMap<Key, serde_json::Value>,
    /// Services captured with an identity route, and the empty table they get.
    pub identity_routed: BTreeSet<Key>,
    identity_table: serde_json::Value,
    pub clients: BTreeMap<String, Clients>,
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
            capture: capture_set(index, targets.keys().chain(&identity_routed)),
            identities,
            meshed: routed_services(targets)
                .chain(identity_routed.iter().cloned())
                .map(|k| {
                    let addresses = index.meshed_endpoints(&k, &meshed);
                    (k, addresses)
                })
                .collect(),
            identity_routed,
            identity_table: serde_json::to_value(RouteTable::default()).unwrap_or_default(),
            tables: targets
                .iter()
                .map(|(k, t)| {
                    (
                        k.clone(),
                        serde_json::to_value(&t.compiled.table).unwrap_or_default(),
                    )
                })
                .collect(),
            clients,
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
    let capture = shared.capture.clone();
    let identities = &shared.identities;
    let clients = shared.clients.get(node);
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
                serde_json::to_value(scoped(&t.compiled.table, &client_namespaces))
                    .unwrap_or_default()
            } else {
                shared.tables.get(&t.key).cloned().unwrap_or_default()
            };
            TargetTable {
                namespace: t.key.0.clone(),
                service: t.key.1.clone(),
                table,
            }
        })
        .collect();
    tables.extend(identity_routed.iter().map(|k| TargetTable {
        namespace: k.0.clone(),
        service: k.1.clone(),
        table: shared.identity_table.clone(),
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
        capture_count: capture.len() as i32,
        capture_addresses: capture,
        table_count: tables.len() as i32,
        tables,
        identities,
    }
}
