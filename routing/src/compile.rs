//! Compiles every route attached to one Service into that Service's [`RouteTable`], and
//! says for each of the route's parentRefs whether it is accepted and its references resolved.

use std::collections::{BTreeMap, BTreeSet};

use aether_crds::conditions::reason;

use crate::protocol::PortProtocol;
use crate::rules::{CompiledRoute, RankedEntry, compile_route};
use crate::source::{RouteSource, ServiceInfo, ServiceKind, ServiceLookup};
use crate::table::{
    BackendTarget, Entry, PortRoutes, Protocol, RouteRef, RouteTable, Rule, RuleSet,
};

/// The result of compiling the routes of one Service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Compiled {
    pub table: RouteTable,
    /// One per route given, in the same order.
    pub routes: Vec<RouteOutcome>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteOutcome {
    pub route: RouteRef,
    /// One per parentRef of the route that names this Service.
    pub parents: Vec<ParentOutcome>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParentOutcome {
    /// Index of the parentRef in the route's `parentRefs`.
    pub parent_index: usize,
    /// A consumer route: it applies only to clients in the route's namespace.
    pub consumer: bool,
    /// The Service ports the route applies to through this parentRef.
    pub ports: Vec<u16>,
    pub accepted: Verdict,
    pub resolved_refs: Verdict,
}

/// A condition's status, reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

impl Verdict {
    fn ok(reason: &str, message: impl Into<String>) -> Self {
        Verdict {
            ok: true,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    fn fail(reason: &str, message: impl Into<String>) -> Self {
        Verdict {
            ok: false,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

/// Whether Service `namespace/name` (as `service` has it, if it exists) can be a route target:
/// it needs a ClusterIP to capture. One verdict for a route's parentRef and for a RouteTarget.
pub fn service_verdict(namespace: &str, name: &str, service: Option<&ServiceInfo>) -> Verdict {
    let svc = format!("{namespace}/{name}");
    match service.map(|s| s.kind) {
        None => Verdict::fail(
            reason::SERVICE_NOT_FOUND,
            format!("Service {svc} not found"),
        ),
        Some(ServiceKind::Headless) => Verdict::fail(
            reason::UNSUPPORTED_SERVICE_TYPE,
            format!("Service {svc} is headless: it has no ClusterIP to route"),
        ),
        Some(ServiceKind::ExternalName) => Verdict::fail(
            reason::UNSUPPORTED_SERVICE_TYPE,
            format!("Service {svc} is an ExternalName Service: it has no ClusterIP to route"),
        ),
        Some(ServiceKind::ClusterIp) => {
            Verdict::ok(reason::ACCEPTED, format!("routing Service {svc}"))
        }
    }
}

/// Who a rule set is for on one port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Producer,
    Consumer(String),
}

/// Compiles the routes attached to Service `namespace/name`. Routes whose parentRefs do not
/// name the Service are reported with no parents and contribute nothing.
pub fn compile(
    namespace: &str,
    name: &str,
    routes: &[RouteSource],
    services: &(impl ServiceLookup + ?Sized),
) -> Compiled {
    let service = services.service(namespace, name);
    let compiled: Vec<Result<CompiledRoute, crate::RuleError>> =
        routes.iter().map(|r| compile_route(r, services)).collect();

    let mut outcomes: Vec<RouteOutcome> = routes
        .iter()
        .zip(&compiled)
        .map(|(route, rules)| RouteOutcome {
            route: route.route.clone(),
            parents: route
                .parents
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_service(&route.route.namespace, namespace, name))
                .map(|(parent_index, parent)| {
                    let consumer = route.route.namespace != namespace;
                    let verdict = service_verdict(namespace, name, service);
                    let (ports, accepted) = match service {
                        Some(service) if verdict.ok => {
                            attach(service, parent.port, parent.section_name.as_deref(), rules)
                        }
                        _ => (Vec::new(), verdict),
                    };
                    ParentOutcome {
                        parent_index,
                        consumer,
                        ports,
                        accepted,
                        resolved_refs: resolved_refs(rules),
                    }
                })
                .collect(),
        })
        .collect();

    reject_conflicting_kinds(routes, &mut outcomes);

    if service.is_none() {
        return Compiled {
            table: RouteTable::default(),
            routes: outcomes,
        };
    }
    // Which routes apply to each (port, scope), with no route counted twice.
    let mut attached: BTreeMap<(u16, Scope), BTreeSet<usize>> = BTreeMap::new();
    for (i, port, scope) in attachments(&outcomes) {
        attached.entry((port, scope)).or_default().insert(i);
    }
    let mut ports: BTreeMap<u16, PortRoutes> = BTreeMap::new();
    for ((port, scope), route_indices) in attached {
        let set = rule_set(routes, &compiled, &route_indices);
        let entry = ports.entry(port).or_insert_with(|| PortRoutes {
            port,
            ..Default::default()
        });
        match scope {
            Scope::Producer => entry.producer = Some(set),
            Scope::Consumer(ns) => {
                entry.consumers.insert(ns, set);
            }
        }
    }
    Compiled {
        table: RouteTable {
            ports: ports.into_values().collect(),
        },
        routes: outcomes,
    }
}

/// Decides whether one parentRef attaches, and to which ports.
fn attach(
    service: &ServiceInfo,
    port: Option<i32>,
    section_name: Option<&str>,
    rules: &Result<CompiledRoute, crate::RuleError>,
) -> (Vec<u16>, Verdict) {
    let svc = format!("{}/{}", service.namespace, service.name);
    let mut ports: Vec<u16> = service.ports.iter().map(|p| p.port).collect();
    if let Some(section) = section_name {
        match service
            .ports
            .iter()
            .find(|p| p.name.as_deref() == Some(section))
        {
            Some(p) => ports.retain(|x| *x == p.port),
            None => {
                return (
                    Vec::new(),
                    Verdict::fail(
                        reason::NO_MATCHING_PARENT,
                        format!("Service {svc} has no port named {section:?}"),
                    ),
                );
            }
        }
    }
    if let Some(port) = port {
        ports.retain(|p| i32::from(*p) == port);
        if ports.is_empty() {
            let message = match section_name {
                Some(section) => {
                    format!("port {port} is not the port named {section:?} of Service {svc}")
                }
                None => format!("Service {svc} has no port {port}"),
            };
            return (
                Vec::new(),
                Verdict::fail(reason::NO_MATCHING_PARENT, message),
            );
        }
    }
    // Opaque ports carry bytes as they are: an HTTP or gRPC route never applies to them.
    let (opaque, ports): (Vec<u16>, Vec<u16>) = ports.into_iter().partition(|port| {
        service.ports.iter().any(|p| {
            p.port == *port
                && PortProtocol::of(p.name.as_deref(), p.app_protocol.as_deref())
                    == PortProtocol::Opaque
        })
    });
    if ports.is_empty() && !opaque.is_empty() {
        return (
            Vec::new(),
            Verdict::fail(
                reason::UNSUPPORTED_PROTOCOL,
                format!(
                    "port {} of Service {svc} is declared non-HTTP (by appProtocol or name): its bytes pass as they are and no route applies",
                    join_ports(&opaque)
                ),
            ),
        );
    }
    let skipped = if opaque.is_empty() {
        String::new()
    } else {
        format!(
            " (not its non-HTTP port {}: bytes pass as they are)",
            join_ports(&opaque)
        )
    };
    match rules {
        Ok(_) => (
            ports,
            Verdict::ok(
                reason::ACCEPTED,
                format!("attached to Service {svc}{skipped}"),
            ),
        ),
        Err(error) => (Vec::new(), Verdict::fail(error.reason(), error.to_string())),
    }
}

fn join_ports(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn resolved_refs(rules: &Result<CompiledRoute, crate::RuleError>) -> Verdict {
    let Ok(rules) = rules else {
        return Verdict::ok(
            reason::RESOLVED_REFS,
            "the route is not accepted; its references were not resolved",
        );
    };
    let mut problems = rules.rules.iter().flat_map(|rule| {
        let backends = rule.backends.iter().map(|b| &b.target);
        let mirrors = rule.filters.mirrors.iter().map(|m| &m.target);
        backends.chain(mirrors).filter_map(|target| match target {
            BackendTarget::Unresolved { reason, message } => {
                Some((reason.as_str(), message.as_str()))
            }
            BackendTarget::Service(_) => None,
        })
    });
    match problems.next() {
        None => Verdict::ok(reason::RESOLVED_REFS, "all references resolved"),
        Some((first_reason, first_message)) => {
            let mut message = first_message.to_owned();
            for (_, more) in problems {
                message.push_str("; ");
                message.push_str(more);
            }
            Verdict::fail(first_reason, message)
        }
    }
}

/// Which routes attach where: each accepted parentRef's ports, with whom the route is for
/// (route index, port, scope). The table and the kind-conflict check both follow it.
fn attachments(outcomes: &[RouteOutcome]) -> impl Iterator<Item = (usize, u16, Scope)> + '_ {
    outcomes.iter().enumerate().flat_map(|(i, outcome)| {
        let accepted = outcome.parents.iter().filter(|p| p.accepted.ok);
        accepted.flat_map(move |parent| {
            let scope = scope_of(parent, &outcome.route.namespace);
            parent
                .ports
                .iter()
                .map(move |&port| (i, port, scope.clone()))
        })
    })
}

/// A consumer route is for its own namespace's clients; a producer route for every client.
fn scope_of(parent: &ParentOutcome, route_namespace: &str) -> Scope {
    if parent.consumer {
        Scope::Consumer(route_namespace.to_owned())
    } else {
        Scope::Producer
    }
}

/// Gateway API forbids merging GRPCRoute and HTTPRoute rules. Where both kinds attach to
/// the same port for the same clients, the kind of the oldest route wins and the parentRefs
/// of the other kind are refused.
fn reject_conflicting_kinds(routes: &[RouteSource], outcomes: &mut [RouteOutcome]) {
    let age = |i: usize| {
        (
            routes[i].created.unwrap_or(i64::MAX),
            routes[i].route.namespace.as_str(),
            routes[i].route.name.as_str(),
        )
    };
    let mut oldest: BTreeMap<(u16, Scope), usize> = BTreeMap::new();
    for (i, port, scope) in attachments(outcomes) {
        let slot = oldest.entry((port, scope)).or_insert(i);
        if age(i) < age(*slot) {
            *slot = i;
        }
    }
    for outcome in outcomes.iter_mut() {
        let protocol = outcome.route.kind.protocol();
        let namespace = outcome.route.namespace.clone();
        for parent in outcome.parents.iter_mut().filter(|p| p.accepted.ok) {
            let scope = scope_of(parent, &namespace);
            let winner = parent
                .ports
                .iter()
                .map(|port| oldest[&(*port, scope.clone())])
                .find(|w| routes[*w].route.kind.protocol() != protocol);
            if let Some(winner) = winner {
                parent.accepted = Verdict::fail(
                    reason::CONFLICTING_ROUTE_KIND,
                    format!(
                        "{} is older and attaches to the same Service port; HTTPRoute and GRPCRoute rules cannot be merged",
                        routes[winner].route
                    ),
                );
                parent.ports.clear();
            }
        }
    }
}

/// Merges the compiled rules of the given routes into one rule set in precedence order.
fn rule_set(
    routes: &[RouteSource],
    compiled: &[Result<CompiledRoute, crate::RuleError>],
    indices: &BTreeSet<usize>,
) -> RuleSet {
    let mut rules: Vec<Rule> = Vec::new();
    let mut ranked: Vec<(&RouteSource, &RankedEntry, u32)> = Vec::new();
    let mut protocol = Protocol::Http;
    for &i in indices {
        let Ok(route) = &compiled[i] else { continue };
        protocol = routes[i].route.kind.protocol();
        let offset = rules.len() as u32;
        rules.extend(route.rules.iter().cloned());
        ranked.extend(
            route
                .entries
                .iter()
                .map(|e| (&routes[i], e, offset + e.entry.rule)),
        );
    }
    ranked.sort_by(|(ra, a, rule_a), (rb, b, rule_b)| {
        b.specificity
            .cmp(&a.specificity)
            .then_with(|| {
                ra.created
                    .unwrap_or(i64::MAX)
                    .cmp(&rb.created.unwrap_or(i64::MAX))
            })
            .then_with(|| ra.route.namespace.cmp(&rb.route.namespace))
            .then_with(|| ra.route.name.cmp(&rb.route.name))
            .then_with(|| ra.route.kind.cmp(&rb.route.kind))
            .then_with(|| rule_a.cmp(rule_b))
            .then_with(|| a.match_index.cmp(&b.match_index))
    });
    let entries = ranked
        .into_iter()
        .map(|(_, e, rule)| Entry {
            rule,
            ..e.entry.clone()
        })
        .collect();
    RuleSet {
        protocol,
        entries,
        rules,
    }
}
