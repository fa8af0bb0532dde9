//! AuthorizationPolicy status: `Accepted` with a reason per invalid field, `Programmed` with the
//! nodes that enforce the policy. One merge patch per policy whose status changed, and an
//! Event when its Accepted condition changes.

use aether_crds::AuthorizationPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::{Model, STATUS_WRITES_IN_FLIGHT, Write, WriteError, Writer};
use crate::authz;
use crate::cache::Stores;

impl Writer {
    pub(super) async fn policy_status(
        &self,
        stores: &Stores,
        model: &Model,
        now: &Time,
    ) -> Vec<WriteError> {
        let mut writes: Vec<Write<'_>> = Vec::new();
        for object in stores.policies.state() {
            let namespace = object.namespace().unwrap_or_default();
            let name = object.name_any();
            // A policy newer than the model gets its status from the model that has seen it.
            let Some(compiled) = model
                .shared
                .policies
                .get(&(namespace.clone(), name.clone()))
            else {
                continue;
            };
            let previous = object.status.as_ref();
            let desired =
                authz::policy_status(&model.index, compiled, &model.required, previous, now);
            if previous == Some(&desired) {
                continue;
            }
            let previous = previous.map(|s| s.conditions.clone()).unwrap_or_default();
            writes.push(self.guarded(Box::pin(async move {
                let api: Api<AuthorizationPolicy> =
                    Api::namespaced(self.client.clone(), &namespace);
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": desired})),
                )
                .await
                .map_err(|e| {
                    WriteError::new(format!("AuthorizationPolicy {namespace}/{name} status"), e)
                })?;
                self.accepted_event(&object.object_ref(&()), &previous, &desired.conditions)
                    .await;
                Ok(())
            })));
        }
        super::all(writes, STATUS_WRITES_IN_FLIGHT).await
    }
}
