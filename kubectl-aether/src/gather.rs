//! Reads [`Facts`] and the [`Inventory`] from the API server, with the user's kubeconfig, as kubectl does. Each node
//! proxy's metrics come through the API server's pod proxy, so the plugin needs no route to
//! the nodes. A read that fails for one node is recorded on that node; the others are read.

use std::collections::{BTreeMap, BTreeSet};

use aether_core::meshing::namespace_is_managed;
use aether_core::names::{CONTROLLER_NAME, DERIVED_LABEL};
use aether_crds::{NodeConfig, RouteTarget};
use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::analyze::{BackendFacts, ConditionFacts, Inventory, RouteFacts, TargetFacts};
use crate::facts::{Facts, NodeFacts, Rollout};
use crate::metrics;

/// The label of the chart's proxy pods.
const PROXY_PODS: &str = "app.kubernetes.io/name=aether-proxy";
/// The chart's default admin port, used when the pod does not say (no readiness probe).
const DEFAULT_ADMIN_PORT: i32 = 15020;

pub async fn facts(client: &Client, namespace: &str) -> Result<Facts> {
    let version = client
        .apiserver_version()
        .await
        .context("cannot reach the API server")?;
    let kubernetes = parse_version(&version.major, &version.minor);
    let crds = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list CustomResourceDefinitions")?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let operator = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt("aether-operator")
        .await
        .with_context(|| format!("cannot read deployment {namespace}/aether-operator"))?
        .map(|d| Rollout {
            desired: d.spec.and_then(|s| s.replicas).unwrap_or(1),
            ready: d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
        });
    let proxies = Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .get_opt("aether-proxy")
        .await
        .with_context(|| format!("cannot read daemonset {namespace}/aether-proxy"))?
        .map(|d| {
            let status = d.status.unwrap_or_default();
            Rollout {
                desired: status.desired_number_scheduled,
                ready: status.number_ready,
            }
        });
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(PROXY_PODS))
        .await
        .context("cannot list the proxy pods")?
        .items;
    let by_node: BTreeMap<String, &Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
        .collect();
    let configs: BTreeMap<String, NodeConfig> = Api::<NodeConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list NodeConfigs (is the aether.io CRD installed?)")?
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let mut nodes = Vec::new();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list nodes")?
    {
        let name = node.name_any();
        let pod = by_node.get(&name).copied();
        let config = configs.get(&name);
        let (figures, scrape_error) = match pod {
            None => (None, None),
            Some(pod) => match scrape(client, namespace, pod).await {
                Ok(text) => (Some(metrics::parse(&text)), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            },
        };
        nodes.push(NodeFacts {
            ready: condition_true(
                node.status.as_ref().and_then(|s| s.conditions.as_ref()),
                "Ready",
            ),
            proxy_pod: pod.map(ResourceExt::name_any),
            proxy_ready: pod.is_some_and(|p| {
                condition_true(
                    p.status.as_ref().and_then(|s| s.conditions.as_ref()),
                    "Ready",
                )
            }),
            config_generation: config.and_then(|c| c.metadata.generation),
            applied_generation: config
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.applied_generation),
            figures,
            scrape_error,
            name,
        });
    }
    Ok(Facts {
        kubernetes,
        crds,
        namespace: namespace.to_owned(),
        operator,
        proxies,
        nodes,
    })
}

/// `major.minor` of the API server; providers append to the minor (`"36+"`).
fn parse_version(major: &str, minor: &str) -> Option<(u32, u32)> {
    let digits = |s: &str| -> Option<u32> {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    Some((digits(major)?, digits(minor)?))
}

trait HasCondition {
    fn is(&self, kind: &str) -> bool;
}

impl HasCondition for k8s_openapi::api::core::v1::NodeCondition {
    fn is(&self, kind: &str) -> bool {
        self.type_ == kind && self.status == "True"
    }
}

impl HasCondition for k8s_openapi::api::core::v1::PodCondition {
    fn is(&self, kind: &str) -> bool {
        self.type_ == kind && self.status == "True"
    }
}

fn condition_true<C: HasCondition>(conditions: Option<&Vec<C>>, kind: &str) -> bool {
    conditions.is_some_and(|cs| cs.iter().any(|c| c.is(kind)))
}

/// The proxy's `/metrics`, through the API server's proxy to the pod's admin port.
async fn scrape(client: &Client, namespace: &str, pod: &Pod) -> Result<String> {
    let port = admin_port(pod);
    let path = format!(
        "/api/v1/namespaces/{namespace}/pods/{}:{port}/proxy/metrics",
        pod.name_any()
    );
    let request = http::Request::get(&path)
        .body(Vec::new())
        .context("a metrics request")?;
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.request_text(request),
    )
    .await
    .with_context(|| format!("{path}: no answer in 10 s"))?
    .with_context(|| format!("GET {path}"))
}

/// The port the proxy's readiness probe uses: its admin port, whatever the chart set.
fn admin_port(pod: &Pod) -> i32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == "proxy")
        .and_then(|c| c.readiness_probe.as_ref()?.http_get.as_ref())
        .and_then(|get| match get.port {
            IntOrString::Int(port) => Some(port),
            IntOrString::String(_) => None,
        })
        .unwrap_or(DEFAULT_ADMIN_PORT)
}

/// How long a meshed pod may run before `analyze` expects its node's report to list it.
const CAPTURE_REPORT_GRACE: i64 = 30;

/// The objects `analyze` judges: RouteTargets, the mesh's routes, and meshed pods no proxy
/// reports capturing.
pub async fn inventory(client: &Client) -> Result<Inventory> {
    let captured: BTreeSet<String> = Api::<NodeConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list NodeConfigs")?
        .items
        .into_iter()
        .flat_map(|c| c.status.map(|s| s.captured_pods).unwrap_or_default())
        .collect();
    let mut route_targets = Vec::new();
    for rt in Api::<RouteTarget>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list RouteTargets")?
    {
        let status = rt.status.clone().unwrap_or_default();
        let mut backends = Vec::new();
        for b in &status.backends {
            backends.push(BackendFacts {
                name: format!("{}/{}:{}", b.namespace, b.service, b.port),
                ready_endpoints: b.ready_endpoints,
                meshed_endpoints: meshed_endpoints(client, &b.namespace, &b.service, &captured)
                    .await?,
            });
        }
        route_targets.push(TargetFacts {
            name: format!("{}/{}", rt.namespace().unwrap_or_default(), rt.name_any()),
            derived: rt.labels().get(DERIVED_LABEL).is_some_and(|v| v == "true"),
            conditions: status.conditions.iter().map(condition_facts).collect(),
            backends,
        });
    }
    let mut routes = Vec::new();
    for kind in ["HTTPRoute", "GRPCRoute"] {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            "v1",
            kind,
        ));
        let listed = Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("cannot list {kind}s"))?;
        routes.extend(listed.items.iter().map(|route| route_facts(kind, route)));
    }
    let managed: BTreeSet<String> = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list namespaces")?
        .items
        .iter()
        .filter(|ns| namespace_is_managed(ns.labels()))
        .map(ResourceExt::name_any)
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut uncaptured_pods = Vec::new();
    for namespace in &managed {
        let pods = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("cannot list the pods of {namespace}"))?;
        for pod in &pods.items {
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let settled = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| now.as_second() - t.0.as_second() > CAPTURE_REPORT_GRACE);
            let key = format!("{namespace}/{}", pod.name_any());
            if running
                && settled
                && aether_crds::pods::meshing(true, pod).is_meshed()
                && !captured.contains(&key)
            {
                uncaptured_pods.push(key);
            }
        }
    }
    Ok(Inventory {
        route_targets,
        routes,
        uncaptured_pods,
    })
}

/// How many ready endpoints of the Service are pods a node's proxy captures (`captured`).
async fn meshed_endpoints(
    client: &Client,
    namespace: &str,
    service: &str,
    captured: &BTreeSet<String>,
) -> Result<usize> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .with_context(|| format!("cannot list the EndpointSlices of {namespace}/{service}"))?;
    Ok(slices
        .items
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter(|r| {
            let pod = format!(
                "{}/{}",
                r.namespace.as_deref().unwrap_or(namespace),
                r.name.as_deref().unwrap_or_default()
            );
            captured.contains(&pod)
        })
        .count())
}

fn condition_facts(c: &Condition) -> ConditionFacts {
    ConditionFacts {
        kind: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
    }
}

/// A route's Service parents and aether's entries in its status, from its JSON.
fn route_facts(kind: &str, route: &DynamicObject) -> RouteFacts {
    let namespace = route.namespace().unwrap_or_default();
    let service = |parent: &Value| {
        let group = parent["group"].as_str().unwrap_or_default();
        (parent["kind"] == "Service" && (group.is_empty() || group == "core")).then(|| {
            format!(
                "{}/{}",
                parent["namespace"].as_str().unwrap_or(&namespace),
                parent["name"].as_str().unwrap_or_default()
            )
        })
    };
    let empty = Vec::new();
    let list = |value: &Value| value.as_array().unwrap_or(&empty).clone();
    let aether_parents = list(&route.data["status"]["parents"])
        .iter()
        .filter(|p| p["controllerName"] == CONTROLLER_NAME)
        .map(|p| {
            let parent = service(&p["parentRef"])
                .map_or_else(|| "a parent".to_owned(), |s| format!("Service {s}"));
            let accepted = list(&p["conditions"])
                .iter()
                .find(|c| c["type"] == "Accepted")
                .map(|c| ConditionFacts {
                    kind: "Accepted".into(),
                    status: c["status"].as_str().unwrap_or_default().into(),
                    reason: c["reason"].as_str().unwrap_or_default().into(),
                    message: c["message"].as_str().unwrap_or_default().into(),
                });
            (parent, accepted)
        })
        .collect();
    RouteFacts {
        name: format!("{kind} {namespace}/{}", route.name_any()),
        service_parents: list(&route.data["spec"]["parentRefs"])
            .iter()
            .filter_map(service)
            .collect(),
        aether_parents,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_with_a_provider_suffix_parse() {
        assert_eq!(parse_version("1", "36"), Some((1, 36)));
        assert_eq!(parse_version("1", "29+"), Some((1, 29)));
        assert_eq!(parse_version("", "29"), None);
    }
}
