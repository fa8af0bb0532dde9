//! aether's entries in Gateway API routes' `status.parents`.

use std::collections::BTreeMap;
use std::fmt::Debug;

use aether_crds::route_status::{self, ExistingParent, RouteParentStatus};
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::grpcroutes::GrpcRoute;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::{STATUS_WRITES_IN_FLIGHT, Write, WriteError, Writer};
use crate::cache::Stores;
use crate::index::{Index, Key};
use crate::status;
use crate::targets::Target;

impl Writer {
    pub(super) async fn route_status(
        &self,
        stores: &Stores,
        index: &Index,
        targets: &BTreeMap<Key, Target>,
        now: &Time,
    ) -> Vec<WriteError> {
        let ours = status::route_parents(targets, index, now);
        let mut writes: Vec<Write<'_>> = Vec::new();
        // HTTPRoute and GRPCRoute: two generated types of one shape.
        macro_rules! route_writes {
            ($store:expr, $kind:literal, $type:ty) => {
                for route in $store.state() {
                    let key = (
                        $kind,
                        route.namespace().unwrap_or_default(),
                        route.name_any(),
                    );
                    let parents = route.status.as_ref().map_or(&[][..], |s| &s.parents[..]);
                    let existing = route_status::existing_parents(parents);
                    writes.extend(self.write_route_status::<$type>(
                        key.clone(),
                        existing,
                        ours.get(&key),
                    ));
                }
            };
        }
        route_writes!(stores.http_routes, "HTTPRoute", HttpRoute);
        route_writes!(stores.grpc_routes, "GRPCRoute", GrpcRoute);
        super::all(writes, STATUS_WRITES_IN_FLIGHT).await
    }

    /// The write of a route's merged status.parents, if it changes.
    pub(super) fn write_route_status<K>(
        &self,
        key: (&'static str, String, String),
        existing: serde_json::Result<Vec<ExistingParent>>,
        ours: Option<&Vec<RouteParentStatus>>,
    ) -> Option<Write<'_>>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
        K::DynamicType: Default,
    {
        let object = format!("{} {}/{} status", key.0, key.1, key.2);
        // Parents that cannot be read are not taken for none: that write would drop other
        // controllers' entries.
        let existing = match existing {
            Ok(existing) => existing,
            Err(e) => {
                let error = WriteError::new(object, kube::Error::SerdeError(e));
                return Some(Box::pin(std::future::ready(Err(error))));
            }
        };
        let merged =
            route_status::merge_parents(&existing, ours.map(Vec::as_slice).unwrap_or_default());
        if merged == existing {
            return None;
        }
        Some(self.guarded(Box::pin(async move {
            let api: Api<K> = Api::namespaced(self.client.clone(), &key.1);
            api.patch_status(
                &key.2,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"parents": merged}})),
            )
            .await
            .map_err(|e| WriteError::new(object, e))?;
            self.metrics.writes.inc();
            Ok(())
        })))
    }
}
