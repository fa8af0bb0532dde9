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
    /// A hand-written RouteTarget exists for the Service.
    pub hand_written: bool,
}

/// Compiles every route target: each Service named as a core `Service` parentRef by any
/// route, and each Service of a hand-written RouteTarget.
pub fn compile_all(index: &Index) -> BTreeMap<Key, Target> {
    let mut sources: BTreeMap<Key, (Vec<RouteSource>, Option<RouteSource>)> = BTreeMap::new();
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
