//! What aether's tests share, at every tier: the Gateway API release they test against (its
//! CRDs and conformance manifests, from the Go module proxy) and the mesh conformance cases
//! as data (`tests/gateway-conformance/cases.yaml`).

#![forbid(unsafe_code)]

pub mod cases;
pub mod fuzz;
pub mod upstream;
