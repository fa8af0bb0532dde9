//! The rules of aether's domain, each written once: the names of its labels and annotations,
//! whether a pod is meshed, what an identity is, what a Service key is, what a compiled route
//! table holds, and the certificate authority's wire format. Plain types and pure functions with no Kubernetes client types, so
//! the operator, the CNI plugin and the proxy share one answer and it is tested without a
//! cluster.
#![forbid(unsafe_code)]

pub mod authz;
pub mod ca_api;
pub mod identity;
pub mod k8s_names;
pub mod lenient;
pub mod meshing;
pub mod names;
pub mod route_table;
pub mod service;
