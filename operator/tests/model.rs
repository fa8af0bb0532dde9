//! The operator's pure computations on an index built from Kubernetes objects: which
//! Services become route targets, their status, the routes' `status.parents`, and the
//! per-node config with its demand scope.

use std::collections::BTreeMap;

use aether_crds::NodeConfig;
use aether_crds::route_status::merge_parents;
use aether_operator::index::{Index, key};
use aether_operator::node_config::identity_map;
use aether_operator::node_config::{Shared, node_config};
use aether_operator::status::{Required, route_parents, route_target_status};
use aether_operator::targets::compile_all;
use gateway_api::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

const MESH: &str = "mesh";
const CLIENTS: &str = "clients";
const TD: &str = "cluster.local";

fn service(name: &str, ip: &str, selector: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": MESH},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "selector": selector,
                 "ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 7070}]},
    }))
    .unwrap()
}

fn pod(
    namespace: &str,
    name: &str,
    node: &str,
    sa: &str,
    labels: Value,
    annotations: Value,
) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {"nodeName": node, "serviceAccountName": sa, "containers": []},
    }))
    .unwrap()
}

fn route(namespace: &str, name: &str, parent: Value, backends: Value) -> HttpRoute {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 3},
        "spec": {"parentRefs": [parent], "rules": [{"backendRefs": backends}]},
    }))
    .unwrap()
}

/// echo (-> v1 70 / v2 30) in `mesh`; a consumer route for v1 from `clients`; pods on two nodes.
fn index() -> Index {
    let mut index = Index::default();
    for ns in [MESH, CLIENTS, "plain"] {
        let managed = ns != "plain";
        index.add_namespace(&serde_json::from_value::<Namespace>(json!({"metadata": {"name": ns, "labels": {"aether.io/managed": managed.to_string()}}})).unwrap());
    }
    index.add_service(&service("echo", "10.96.0.20", json!({"app": "echo"})));
    index.add_service(&service(
        "v1",
        "10.96.0.21",
        json!({"app": "echo", "version": "v1"}),
    ));
    index.add_service(&service(
        "v2",
        "10.96.0.22",
        json!({"app": "echo", "version": "v2"}),
    ));
    index.add_service(&service("lonely", "10.96.0.23", json!({"app": "lonely"})));
    index.add_pod(&pod(
        MESH,
        "v1-a",
        "node-1",
        "sa-v1",
        json!({"app": "echo", "version": "v1"}),
        json!({}),
    ));
    index.add_pod(&pod(
        MESH,
        "v2-a",
        "node-2",
        "sa-v2",
        json!({"app": "echo", "version": "v2"}),
        json!({}),
    ));
    index.add_pod(&pod(
        CLIENTS,
        "client",
        "node-3",
        "default",
        json!({}),
        json!({"aether.io/depends-on": "mesh/echo"}),
    ));
    index.add_pod(&pod(
        "plain",
        "outsider",
        "node-4",
        "default",
        json!({}),
        json!({}),
    ));
    index.add_http_route(&route(MESH, "split", json!({"group": "", "kind": "Service", "name": "echo"}),
        json!([{"name": "v1", "port": 80, "weight": 70}, {"name": "v2", "port": 80, "weight": 30}, {"name": "gone", "port": 80, "weight": 0}])));
    index.add_http_route(&route(
        CLIENTS,
        "consumer",
        json!({"group": "", "kind": "Service", "name": "v1", "namespace": MESH}),
        json!([{"name": "v2", "namespace": MESH, "port": 80}]),
    ));
    for (i, n) in ["node-1", "node-2", "node-3", "node-4"].iter().enumerate() {
        index.add_node(n);
        if i < 2 {
            index
                .node_configs
                .insert((*n).to_owned(), (Some(3), Some(3)));
        }
    }
    index
}

fn now() -> Time {
    Time(Timestamp::from_second(1_800_000_000).unwrap())
}

#[test]
fn services_named_as_parents_become_route_targets() {
    let index = index();
    let keys: Vec<_> = compile_all(&index).into_keys().collect();
    assert_eq!(
        keys,
        [key(MESH, "echo"), key(MESH, "v1")],
        "not lonely, not v2 (only a backend)"
    );
}

#[test]
fn route_target_status_reports_ips_routes_backends_identities_and_conditions() {
    let index = index();
    let targets = compile_all(&index);
    let status = route_target_status(
        &index,
        &targets[&key(MESH, "echo")],
        &identity_map(&index, &targets, TD),
        &Required::new(),
        Some(1),
        None,
        &now(),
    );
    assert_eq!(status.cluster_ip.as_deref(), Some("10.96.0.20"));
    assert_eq!(status.port_summary.as_deref(), Some("80,7070"));
    assert_eq!(status.route_count, 1);
    let backends: Vec<_> = status
        .backends
        .iter()
        .map(|b| (b.service.as_str(), b.weight, b.identities.clone()))
        .collect();
    assert_eq!(
        backends,
        [
            (
                "v1",
                140,
                vec!["spiffe://cluster.local/ns/mesh/sa/sa-v1".to_owned()]
            ),
            (
                "v2",
                60,
                vec!["spiffe://cluster.local/ns/mesh/sa/sa-v2".to_owned()]
            )
        ],
        "weights summed over the two ports"
    );
    let conditions: BTreeMap<_, _> = status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), (c.status.as_str(), c.reason.as_str())))
        .collect();
    assert_eq!(conditions["Accepted"], ("True", "Accepted"));
    assert_eq!(
        conditions["ResolvedRefs"],
        ("False", "BackendNotFound"),
        "the weight-0 backend `gone` does not exist"
    );
    assert_eq!(
        conditions["Programmed"],
        ("False", "Pending"),
        "2 of 4 nodes applied"
    );
    let programmed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Programmed")
        .unwrap();
    assert_eq!(
        programmed.message,
        "applied by 2 of 4 nodes; not yet by node-3 (applied nothing yet), node-4 (applied nothing yet)"
    );
    // A node that applied an older generation than the one holding this config lags too.
    let required = Required::from([("node-1".to_owned(), 4)]);
    let lagging = route_target_status(
        &index,
        &targets[&key(MESH, "echo")],
        &identity_map(&index, &targets, TD),
        &required,
        Some(1),
        None,
        &now(),
    );
    let message = &lagging
        .conditions
        .iter()
        .find(|c| c.type_ == "Programmed")
        .unwrap()
        .message;
    assert!(
        message.starts_with("applied by 1 of 4 nodes; not yet by node-1 (applied generation 3)"),
        "{message}"
    );

    // Unchanged conditions keep their transition time.
    let later = Time(Timestamp::from_second(1_900_000_000).unwrap());
    let again = route_target_status(
        &index,
        &targets[&key(MESH, "echo")],
        &identity_map(&index, &targets, TD),
        &Required::new(),
        Some(1),
        Some(&status),
        &later,
    );
    assert_eq!(again, status);
}

#[test]
fn a_missing_or_headless_service_is_not_accepted() {
    let mut index = index();
    index.add_http_route(&route(
        MESH,
        "to-nothing",
        json!({"group": "", "kind": "Service", "name": "nothing"}),
        json!([]),
    ));
    let targets = compile_all(&index);
    let status = route_target_status(
        &index,
        &targets[&key(MESH, "nothing")],
        &identity_map(&index, &targets, TD),
        &Required::new(),
        None,
        None,
        &now(),
    );
    assert_eq!(
        (
            status.conditions[0].status.as_str(),
            status.conditions[0].reason.as_str()
        ),
        ("False", "ServiceNotFound")
    );
}

#[test]
fn route_parents_are_written_for_aether_and_others_are_kept() {
    let index = index();
    let targets = compile_all(&index);
    let parents = route_parents(&targets, &index, &now());
    let split = &parents[&("HTTPRoute", MESH.to_owned(), "split".to_owned())];
    assert_eq!(split.len(), 1);
    let split_json = serde_json::to_value(split).unwrap();
    assert_eq!(split_json[0]["controllerName"], "aether.io/mesh");
    assert_eq!(
        split_json[0]["parentRef"],
        json!({"group": "", "kind": "Service", "name": "echo"})
    );
    assert_eq!(split_json[0]["conditions"][0]["status"], "True");
    assert_eq!(split_json[0]["conditions"][1]["reason"], "BackendNotFound");
    // Conformance requires the conditions to name the route generation they describe.
    for condition in &split[0].conditions {
        assert_eq!(condition.observed_generation, Some(3));
    }

    let other = json!({"controllerName": "example.com/gateway", "parentRef": {"name": "gw"}, "conditions": []});
    let existing = vec![serde_json::from_value(other.clone()).unwrap()];
    let merged = merge_parents(&existing, split);
    assert_eq!(merged.len(), 2);
    assert_eq!(serde_json::to_value(&merged[0]).unwrap(), other);
}

#[test]
fn node_config_has_the_whole_capture_set_and_only_the_tables_its_pods_need() {
    let index = index();
    let targets = compile_all(&index);
    let tables = |node: &str| -> Vec<String> {
        node_config(node, &targets, &Shared::new(&index, &targets, TD))
            .tables
            .iter()
            .map(|t| format!("{}/{}", t.namespace, t.service))
            .collect()
    };
    let v1: Vec<String> = ["10.96.0.21:80", "10.96.0.21:7070"]
        .map(String::from)
        .into();
    for node in ["node-1", "node-2", "node-3", "node-4"] {
        let config = node_config(node, &targets, &Shared::new(&index, &targets, TD));
        assert_eq!(
            config.capture_addresses.len(),
            2,
            "{node}: echo's two ports, as echo has a producer route"
        );
        assert!(config.capture_addresses.iter().all(|a| !v1.contains(a)));
        // v1 has only a consumer route, of `clients`, and no meshed endpoint: only that
        // namespace's pods capture it, and only node-3 has pods of it.
        let scoped: Vec<(&str, &[String])> = (config.namespace_capture.iter())
            .map(|c| (c.namespace.as_str(), c.addresses.as_slice()))
            .collect();
        if node == "node-3" {
            assert_eq!(scoped, [("clients", v1.as_slice())]);
            assert_eq!(config.capture_count, 4);
        } else {
            assert!(scoped.is_empty(), "{node}: {scoped:?}");
            assert_eq!(config.capture_count, 2);
        }
    }
    assert_eq!(
        tables("node-1"),
        ["mesh/echo", "mesh/v1"],
        "targets of its pods' namespace"
    );
    assert_eq!(
        tables("node-3"),
        ["mesh/echo", "mesh/v1"],
        "depends-on mesh/echo, and its backend v1; plus the consumer route's v1"
    );
    assert!(tables("node-4").is_empty(), "no meshed pods");

    // The consumer route for v1 is only in the config of the node with a client in `clients`.
    let consumers = |node: &str| -> usize {
        let config = node_config(node, &targets, &Shared::new(&index, &targets, TD));
        let table = config.tables.iter().find(|t| t.service == "v1").unwrap();
        table.table.valid().unwrap().ports[0].consumers.len()
    };
    assert_eq!(consumers("node-3"), 1);
    assert_eq!(consumers("node-1"), 0);

    let config = node_config("node-1", &targets, &Shared::new(&index, &targets, TD));
    let ids: Vec<_> = config
        .identities
        .iter()
        .map(|s| (s.service.as_str(), s.identities.len()))
        .collect();
    assert_eq!(ids, [("echo", 2), ("v1", 1), ("v2", 1)]);
}

#[test]
fn consumer_routes_and_the_proxys_demand_widen_a_nodes_scope() {
    let mut index = index();
    // A client whose namespace only has a consumer route (for mesh/v1), alone on its node.
    index.add_pod(&pod(
        CLIENTS,
        "client-2",
        "node-5",
        "default",
        json!({}),
        json!({}),
    ));
    index.add_node("node-5");
    let tables = |index: &Index| -> Vec<String> {
        let targets = compile_all(index);
        node_config("node-5", &targets, &Shared::new(index, &targets, TD))
            .tables
            .iter()
            .map(|t| format!("{}/{}", t.namespace, t.service))
            .collect()
    };
    assert_eq!(tables(&index), ["mesh/v1"]);

    // The node's proxy saw a captured connection to mesh/echo without its table.
    let config: NodeConfig = serde_json::from_value(json!({
        "metadata": {"name": "node-5", "generation": 2},
        "spec": {},
        "status": {"appliedGeneration": 2, "demand": ["mesh/echo", "malformed"]},
    }))
    .unwrap();
    index.add_node_config(&config);
    assert_eq!(tables(&index), ["mesh/echo", "mesh/v1"]);
}

#[test]
fn only_endpoints_whose_own_nodes_proxy_captures_them_take_mtls() {
    let mut index = index();
    let with_ip = |mut pod: Pod, ip: &str| {
        pod.status = Some(serde_json::from_value(json!({"podIPs": [{"ip": ip}]})).unwrap());
        pod
    };
    let v1 = json!({"app": "echo", "version": "v1"});
    index.add_pod(&with_ip(
        pod(MESH, "v1-a", "node-1", "sa-v1", v1.clone(), json!({})),
        "10.244.1.5",
    ));
    // Opted out: no inbound listener, whatever a proxy says.
    index.add_pod(&with_ip(
        pod(
            MESH,
            "v1-b",
            "node-1",
            "sa-v1",
            v1,
            json!({"aether.io/capture": "disabled"}),
        ),
        "10.244.1.6",
    ));
    index.add_pod(&with_ip(
        pod(
            MESH,
            "v2-a",
            "node-2",
            "sa-v2",
            json!({"app": "echo", "version": "v2"}),
            json!({}),
        ),
        "10.244.2.5",
    ));
    let slice = |service: &str, name: &str, addresses: &[&str]| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": MESH, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": addresses.iter().map(|a| json!({"addresses": [a]})).collect::<Vec<_>>(),
        }))
        .unwrap()
    };
    index.add_endpoint_slice(&slice(
        "echo",
        "echo-1",
        &["10.244.1.5", "10.244.1.6", "10.244.2.5"],
    ));
    index.add_endpoint_slice(&slice("v1", "v1-1", &["10.244.1.5", "10.244.1.6"]));
    // Written by hand: v2's pod behind v1. It is a meshed pod, so never plaintext.
    index.add_endpoint_slice(&slice("v1", "v1-extra", &["10.244.2.5"]));
    index.add_endpoint_slice(&slice("v2", "v2-1", &["10.244.2.5"]));
    // node-1's proxy claims node-2's pod too; node-2's proxy has not reported it yet.
    let config: NodeConfig = serde_json::from_value(json!({
        "metadata": {"name": "node-1", "generation": 3},
        "spec": {},
        "status": {"appliedGeneration": 3, "capturedPods": ["mesh/v1-a", "mesh/v1-b", "mesh/v2-a", "malformed"]},
    }))
    .unwrap();
    index.add_node_config(&config);
    let targets = compile_all(&index);
    let meshed = |index: &Index| -> Vec<(String, Vec<String>)> {
        node_config("node-1", &targets, &Shared::new(index, &targets, TD))
            .identities
            .into_iter()
            .map(|s| (s.service, s.meshed_addresses))
            .collect()
    };
    let ips = |s: &[&str]| s.iter().map(|ip| ip.to_string()).collect::<Vec<_>>();
    assert_eq!(
        meshed(&index),
        [
            ("echo".into(), ips(&["10.244.1.5"])),
            ("v1".into(), ips(&["10.244.1.5"])),
            ("v2".into(), vec![]),
        ]
    );

    let config: NodeConfig = serde_json::from_value(json!({
        "metadata": {"name": "node-2", "generation": 3},
        "spec": {},
        "status": {"capturedPods": ["mesh/v2-a"]},
    }))
    .unwrap();
    index.add_node_config(&config);
    let both = ips(&["10.244.1.5", "10.244.2.5"]);
    assert_eq!(
        meshed(&index),
        [
            ("echo".into(), both.clone()),
            ("v1".into(), both),
            ("v2".into(), ips(&["10.244.2.5"])),
        ]
    );
}

#[test]
fn a_service_with_meshed_endpoints_and_no_route_is_captured_with_an_identity_route() {
    let mut index = index();
    let mut lonely = pod(
        MESH,
        "lonely-a",
        "node-2",
        "sa-lonely",
        json!({"app": "lonely"}),
        json!({}),
    );
    lonely.status =
        Some(serde_json::from_value(json!({"podIPs": [{"ip": "10.244.2.9"}]})).unwrap());
    index.add_pod(&lonely);
    index.add_endpoint_slice(
        &serde_json::from_value(json!({
            "metadata": {"name": "lonely-1", "namespace": MESH, "labels": {"kubernetes.io/service-name": "lonely"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.2.9"]}],
        }))
        .unwrap(),
    );
    let targets = compile_all(&index);
    let config =
        |index: &Index, node: &str| node_config(node, &targets, &Shared::new(index, &targets, TD));
    // Not captured until its pod's own node reports it.
    assert_eq!(config(&index, "node-1").capture_addresses.len(), 2);
    index.add_node_config(
        &serde_json::from_value(json!({
            "metadata": {"name": "node-2", "generation": 3},
            "spec": {},
            "status": {"capturedPods": ["mesh/lonely-a"]},
        }))
        .unwrap(),
    );
    let node1 = config(&index, "node-1");
    assert_eq!(node1.capture_addresses.len(), 4, "and lonely's two ports");
    assert!(
        node1
            .capture_addresses
            .contains(&"10.96.0.23:80".to_string())
    );
    let table = node1.tables.iter().find(|t| t.service == "lonely").unwrap();
    assert_eq!(
        table.table.valid().unwrap().clone(),
        aether_routing::RouteTable::default(),
        "an identity route: no rules, every request to lonely's own endpoints"
    );
    let lonely = node1
        .identities
        .iter()
        .find(|s| s.service == "lonely")
        .unwrap();
    assert_eq!(
        lonely.identities,
        ["spiffe://cluster.local/ns/mesh/sa/sa-lonely"]
    );
    assert_eq!(lonely.meshed_addresses, ["10.244.2.9"]);
    // A node without clients in `mesh` captures it (the capture set is the mesh's) but gets
    // its table only on demand.
    let node4 = config(&index, "node-4");
    assert_eq!(node4.capture_addresses.len(), 4);
    assert!(node4.tables.is_empty());
}

#[test]
fn a_headless_services_own_meshed_pods_are_captured_by_their_addresses() {
    let mut index = index();
    let mut headless = service("db", "None", json!({"app": "db"}));
    headless.spec.as_mut().unwrap().cluster_ips = Some(vec!["None".into()]);
    index.add_service(&headless);
    for (namespace, name, ip, labels) in [
        (MESH, "db-0", "10.244.2.20", json!({"app": "db"})),
        (MESH, "db-1", "10.244.2.21", json!({"app": "db"})),
        // Meshed, captured, but another namespace's: the slice below names it by hand.
        (CLIENTS, "victim", "10.244.2.30", json!({"app": "db"})),
    ] {
        let mut pod = pod(namespace, name, "node-2", "sa-db", labels, json!({}));
        pod.status = Some(serde_json::from_value(json!({"podIPs": [{"ip": ip}]})).unwrap());
        index.add_pod(&pod);
    }
    index.add_endpoint_slice(
        &serde_json::from_value(json!({
            "metadata": {"name": "db-1", "namespace": MESH, "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}],
            "endpoints": [{"addresses": ["10.244.2.20"]}, {"addresses": ["10.244.2.21"]}, {"addresses": ["10.244.2.30"]}],
        }))
        .unwrap(),
    );
    // db-1 is not captured by its node (opted out, or not yet): plain, and not captured.
    index.add_node_config(
        &serde_json::from_value(json!({
            "metadata": {"name": "node-2", "generation": 3},
            "spec": {},
            "status": {"capturedPods": ["mesh/db-0", "clients/victim"]},
        }))
        .unwrap(),
    );
    let targets = compile_all(&index);
    let config = node_config("node-1", &targets, &Shared::new(&index, &targets, TD));
    let headless: Vec<&String> = (config.capture_addresses.iter())
        .filter(|a| a.starts_with("10.244."))
        .collect();
    assert_eq!(headless, ["10.244.2.20:5432"]);
    let db = config
        .identities
        .iter()
        .find(|s| s.service == "db")
        .unwrap();
    assert_eq!(db.identities, ["spiffe://cluster.local/ns/mesh/sa/sa-db"]);
    assert!(
        config.tables.iter().any(|t| t.service == "db"),
        "an identity route"
    );
}
