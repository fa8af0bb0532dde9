//! Which Services are route targets, and their compiled routing.

use std::collections::{BTreeMap, BTreeSet};

use aether_routing::{Compiled, RouteSource, compile};

use crate::index::{Index, Key, key};

/// A route target and everything compiled for it.
#[derive(Debug, Clone)]
pub struct Target {
    pub key: Key,
    /// The routes that name the Service in a parentRef (and the inline rules of a
    /// hand-written RouteTarget), in the order `compiled.routes` reports them.
    pub routes: Vec<RouteSource>,
    pub compiled: Compiled,
    /// The hand-written RouteTarget in force for the Service, if there is one: the oldest,
    /// then by name. Any other hand-written one for the Service is conflicted.
    pub in_force: Option<String>,
}

impl Target {
    /// A hand-written RouteTarget exists for the Service.
    pub fn hand_written(&self) -> bool {
        self.in_force.is_some()
    }
}

/// The routes attached to a Service, and the hand-written RouteTarget in force for it (its
/// name and inline rules).
type Sources = (Vec<RouteSource>, Option<(String, RouteSource)>);

/// Compiles every route target: each Service named as a core `Service` parentRef by any
/// route, and each Service of a hand-written RouteTarget.
pub fn compile_all(index: &Index) -> BTreeMap<Key, Target> {
    let mut sources: BTreeMap<Key, Sources> = BTreeMap::new();
    for route in index.routes.values() {
        let named: BTreeSet<Key> = route
            .parents
            .iter()
            .filter_map(|p| p.service(&route.route.namespace))
            .map(|(ns, name)| key(ns, name))
            .collect();
        for target in named {
            sources.entry(target).or_default().0.push(route.clone());
        }
    }
    for (service, name) in in_force(index) {
        let object = &index.targets[&key(&service.0, &name)];
        if let Some(inline) = &object.inline {
            sources.entry(service).or_default().1 = Some((name, inline.clone()));
        }
    }
    sources
        .into_iter()
        .map(|(target, (mut routes, inline))| {
            let in_force = inline.as_ref().map(|(name, _)| name.clone());
            routes.extend(inline.map(|(_, rules)| rules));
            let compiled = compile(&target.0, &target.1, &routes, index);
            (
                target.clone(),
                Target {
                    key: target,
                    routes,
                    compiled,
                    in_force,
                },
            )
        })
        .collect()
}

/// For each Service with hand-written RouteTargets, the name of the one in force: the oldest
/// by `creationTimestamp`, then by name, so that a newer one never takes over a working
/// Service and deleting the one in force hands over to the next.
pub fn in_force(index: &Index) -> BTreeMap<Key, String> {
    let mut winners: BTreeMap<Key, (Option<k8s_openapi::jiff::Timestamp>, String)> =
        BTreeMap::new();
    for ((namespace, name), object) in &index.targets {
        if object.derived {
            continue;
        }
        let candidate = (object.created, name.clone());
        let entry = winners.entry(key(namespace, &object.service));
        entry
            .and_modify(|best| {
                if older(&candidate, best) {
                    *best = candidate.clone();
                }
            })
            .or_insert(candidate);
    }
    winners
        .into_iter()
        .map(|(service, (_, name))| (service, name))
        .collect()
}

/// Whether `a` was created before `b` (an unknown time counts as newest), the name deciding
/// between equal times.
fn older(
    a: &(Option<k8s_openapi::jiff::Timestamp>, String),
    b: &(Option<k8s_openapi::jiff::Timestamp>, String),
) -> bool {
    match (a.0, b.0) {
        (Some(x), Some(y)) if x != y => x < y,
        (Some(_), None) => true,
        (None, Some(_)) => false,
        _ => a.1 < b.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TargetObject;
    use k8s_openapi::jiff::Timestamp;

    fn hand_written(service: &str, created: Option<i64>) -> TargetObject {
        TargetObject {
            service: service.into(),
            derived: false,
            generation: Some(1),
            created: created.map(|s| Timestamp::from_second(s).unwrap()),
            inline: None,
        }
    }

    #[test]
    fn the_oldest_hand_written_target_is_in_force_then_by_name() {
        let mut index = Index::default();
        index
            .targets
            .insert(key("shop", "newer"), hand_written("web", Some(200)));
        index
            .targets
            .insert(key("shop", "older"), hand_written("web", Some(100)));
        index
            .targets
            .insert(key("shop", "b-same"), hand_written("api", Some(50)));
        index
            .targets
            .insert(key("shop", "a-same"), hand_written("api", Some(50)));
        index
            .targets
            .insert(key("shop", "unknown"), hand_written("api", None));
        index.targets.insert(
            key("shop", "db"),
            TargetObject {
                derived: true,
                ..hand_written("db", Some(1))
            },
        );
        let winners = in_force(&index);
        assert_eq!(winners[&key("shop", "web")], "older");
        assert_eq!(winners[&key("shop", "api")], "a-same");
        assert!(
            !winners.contains_key(&key("shop", "db")),
            "a derived target is never in force"
        );
        index.targets.remove(&key("shop", "older"));
        assert_eq!(in_force(&index)[&key("shop", "web")], "newer", "hand-over");
    }
}
