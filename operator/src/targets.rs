//! Which Services are route targets, and their compiled routing.

use std::collections::{BTreeMap, BTreeSet};

use aether_routing::{Compiled, ParentRef, RouteSource, compile};

use crate::index::{Index, Key, key};

/// A route target and everything compiled for it.
#[derive(Debug, Clone)]
pub struct Target {
    pub key: Key,
    /// The routes that name the Service in a parentRef (and the inline rules of a
    /// hand-written RouteTarget), in the order `compiled.routes` reports them.
    pub routes: Vec<RouteSource>,
    pub compiled: Compiled,
    /// A hand-written RouteTarget exists for the Service.
    pub hand_written: bool,
}

/// The Service a parentRef names, if it is a core `Service` parentRef.
fn parent_service(parent: &ParentRef, route_namespace: &str) -> Option<Key> {
    let core = matches!(parent.group.as_deref(), Some("") | Some("core"));
    (core && parent.kind.as_deref() == Some("Service")).then(|| {
        key(
            parent.namespace.as_deref().unwrap_or(route_namespace),
            &parent.name,
        )
    })
}

/// Compiles every route target: each Service named as a core `Service` parentRef by any
/// route, and each Service of a hand-written RouteTarget.
pub fn compile_all(index: &Index) -> BTreeMap<Key, Target> {
    let mut sources: BTreeMap<Key, (Vec<RouteSource>, Option<RouteSource>)> = BTreeMap::new();
    for route in index.routes.values() {
        let named: BTreeSet<Key> = route
            .parents
            .iter()
            .filter_map(|p| parent_service(p, &route.route.namespace))
            .collect();
        for target in named {
            sources.entry(target).or_default().0.push(route.clone());
        }
    }
    for ((namespace, _), object) in &index.targets {
        if object.derived {
            continue;
        }
        let entry = sources.entry(key(namespace, &object.service)).or_default();
        if entry.1.is_none() {
            entry.1 = object.inline.clone();
        }
    }
    sources
        .into_iter()
        .map(|(target, (mut routes, inline))| {
            let hand_written = inline.is_some();
            routes.extend(inline);
            let compiled = compile(&target.0, &target.1, &routes, index);
            (
                target.clone(),
                Target {
                    key: target,
                    routes,
                    compiled,
                    hand_written,
                },
            )
        })
        .collect()
}
