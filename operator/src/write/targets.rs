//! Derived RouteTargets, their status, and the Events on them and on the routes behind them.

use std::collections::{BTreeMap, BTreeSet};

use aether_core::names::DERIVED_LABEL;
use aether_crds::{RouteTarget, RouteTargetSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::{FIELD_MANAGER, Model, STATUS_WRITES_IN_FLIGHT, Write, WriteError, Writer};
use crate::cache::Stores;
use crate::index::{Index, Key};
use crate::status;
use crate::targets::Target;

impl Writer {
    /// A Warning Event on every route that names the Service `key`: its RouteTarget could not
    /// be written.
    pub(super) async fn target_write_failed(
        &self,
        stores: &Stores,
        index: &Index,
        key: &Key,
        error: &WriteError,
    ) {
        let (namespace, service) = key;
        let note = format!(
            "cannot write RouteTarget {namespace}/{service} for this route's parentRef: {}",
            error.source
        );
        for ((kind, route_namespace, name), source) in &index.routes {
            if !source
                .parents
                .iter()
                .any(|p| p.is_service(route_namespace, namespace, service))
            {
                continue;
            }
            let reference = match *kind {
                "HTTPRoute" => stores
                    .http_routes
                    .get(&ObjectRef::new(name).within(route_namespace))
                    .map(|r| r.object_ref(&())),
                _ => stores
                    .grpc_routes
                    .get(&ObjectRef::new(name).within(route_namespace))
                    .map(|r| r.object_ref(&())),
            };
            let Some(reference) = reference else { continue };
            let event = Event {
                type_: EventType::Warning,
                reason: "TargetNotWritten".into(),
                note: Some(note.clone()),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, "cannot publish event");
            }
        }
    }

    /// Creates a RouteTarget for each target Service without one, and deletes derived
    /// RouteTargets no route names any more.
    pub(super) async fn derived_targets(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
    ) -> Vec<WriteError> {
        let mut failed = Vec::new();
        let covered: BTreeSet<Key> = index
            .targets
            .iter()
            .map(|((ns, _), t)| (ns.clone(), t.service.clone()))
            .collect();
        for key in targets.keys().filter(|k| !covered.contains(*k)) {
            let (namespace, service) = key;
            let owners: Vec<OwnerReference> = stores
                .http_routes
                .state()
                .iter()
                .filter(|r| r.namespace().as_deref() == Some(namespace.as_str()))
                .filter(|r| {
                    r.spec
                        .parent_refs
                        .iter()
                        .flatten()
                        .any(|p| p.kind.as_deref() == Some("Service") && &p.name == service)
                })
                .filter_map(|r| {
                    r.controller_owner_ref(&()).map(|mut o| {
                        o.controller = Some(false);
                        o
                    })
                })
                .collect();
            let mut target = RouteTarget::new(
                service,
                RouteTargetSpec {
                    service: service.clone(),
                    rules: Vec::new(),
                },
            );
            target.metadata.namespace = Some(namespace.clone());
            target.metadata.labels = Some([(DERIVED_LABEL.to_owned(), "true".to_owned())].into());
            target.metadata.owner_references = (!owners.is_empty()).then_some(owners);
            if !self.leading() {
                return failed;
            }
            let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), namespace);
            match api
                .create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &target,
                )
                .await
            {
                Ok(_) => tracing::info!(namespace, service, "created derived RouteTarget"),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    let error = WriteError::new(format!("RouteTarget {namespace}/{service}"), e);
                    self.target_write_failed(stores, index, key, &error).await;
                    failed.push(error);
                }
            }
        }
        for ((namespace, name), target) in &index.targets {
            let service = (namespace.clone(), target.service.clone());
            let superseded = targets.get(&service).is_none_or(|t| t.hand_written());
            if target.derived && superseded && self.leading() {
                let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), namespace);
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(
                        namespace,
                        name,
                        "deleted derived RouteTarget: no route names its Service, or a hand-written one does"
                    ),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => failed.push(WriteError::new(
                        format!("RouteTarget {namespace}/{name}"),
                        e,
                    )),
                }
            }
        }
        failed
    }

    pub(super) async fn target_status(
        &self,
        stores: &Stores,
        model: &Model,
        now: &Time,
    ) -> Vec<WriteError> {
        let (index, targets) = (&*model.index, &model.targets);
        let mut writes: Vec<Write<'_>> = Vec::new();
        for object in stores.targets.state() {
            let namespace = object.namespace().unwrap_or_default();
            // The store may hold objects, or generations, newer than the model: their status is
            // written from the model that has seen them (observedGeneration says which one).
            let Some(known) = index.targets.get(&(namespace.clone(), object.name_any())) else {
                continue;
            };
            let Some(target) = targets.get(&(namespace.clone(), known.service.clone())) else {
                continue;
            };
            // A hand-written RouteTarget takes precedence over a derived one for the same Service.
            if known.derived && target.hand_written() {
                continue;
            }
            let previous = object.status.as_ref();
            let desired = match &target.in_force {
                Some(winner) if !known.derived && *winner != object.name_any() => {
                    status::conflicted_status(
                        index,
                        &target.key,
                        winner,
                        known.generation,
                        previous,
                        now,
                    )
                }
                _ => status::route_target_status(
                    index,
                    target,
                    &model.shared.identities,
                    &model.required,
                    known.generation,
                    previous,
                    now,
                ),
            };
            if previous == Some(&desired) {
                continue;
            }
            let previous = previous.cloned();
            writes.push(self.guarded(Box::pin(async move {
                let api: Api<RouteTarget> = Api::namespaced(self.client.clone(), &namespace);
                let name = object.name_any();
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": desired})),
                )
                .await
                .map_err(|e| {
                    WriteError::new(format!("RouteTarget {namespace}/{name} status"), e)
                })?;
                self.metrics.writes.inc();
                let previous = previous.map(|s| s.conditions).unwrap_or_default();
                self.accepted_event(&object.object_ref(&()), &previous, &desired.conditions)
                    .await;
                Ok(())
            })));
        }
        super::all(writes, STATUS_WRITES_IN_FLIGHT).await
    }

    /// An Event on an object (a RouteTarget, an AuthorizationPolicy) when its Accepted
    /// condition changes: Normal when it becomes True, Warning with the reasons otherwise.
    pub(super) async fn accepted_event(
        &self,
        reference: &ObjectReference,
        previous: &[Condition],
        desired: &[Condition],
    ) {
        let accepted = |conditions: &[Condition]| {
            conditions
                .iter()
                .find(|c| c.type_ == "Accepted")
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        let Some((status, reason, message)) =
            accepted(desired).filter(|now| Some(now) != accepted(previous).as_ref())
        else {
            return;
        };
        let event = Event {
            type_: if status == "True" {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason,
            note: Some(message),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, reference).await {
            tracing::warn!(error = %error, "cannot publish event");
        }
    }
}
