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

/// Services named as a core `Service` parentRef by any route, and those of hand-written
/// RouteTargets.
pub fn target_keys(index: &Index) -> BTreeSet<Key> {
    let mut keys: BTreeSet<Key> = index
        .routes
        .values()
        .flat_map(|route| {
            route.parents.iter().filter_map(|p| {
                let core = matches!(p.group.as_deref(), Some("") | Some("core"));
                (core && p.kind.as_deref() == Some("Service")).then(|| {
                    key(
                        p.namespace.as_deref().unwrap_or(&route.route.namespace),
                        &p.name,
                    )
                })
            })
        })
        .collect();
    keys.extend(
        index
            .targets
            .iter()
            .filter(|(_, t)| !t.derived)
            .map(|((ns, _), t)| key(ns, &t.service)),
    );
    keys
}

/// Compiles every route target.
pub fn compile_all(index: &Index) -> BTreeMap<Key, Target> {
    target_keys(index)
        .into_iter()
        .map(|target| {
            let mut routes: Vec<RouteSource> = index
                .routes
                .values()
                .filter(|r| {
                    r.parents
                        .iter()
                        .any(|p| p.is_service(&r.route.namespace, &target.0, &target.1))
                })
                .cloned()
                .collect();
            let inline = index
                .targets
                .iter()
                .find(|((ns, _), t)| *ns == target.0 && t.service == target.1 && !t.derived)
                .and_then(|(_, t)| t.inline.clone());
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
