//! aether's node proxy, laid out by concern.
//!
//! - [`inpod`]: pods' network namespaces, their listeners and capture tables, and the agent
//!   that answers the CNI plugin.
//! - [`state`]: what is kept on the node's disk for a restart.
//! - [`control`]: the view of the cluster from the node, and the loops that apply it.
//! - [`dataplane`]: the snapshot of routes and endpoints, outbound routing, inbound mTLS
//!   termination, pooled clients.
//! - [`identity`]: SVIDs, their renewal, and the TLS configurations of the mesh hop.
//! - [`handover`]: the listening sockets, from a proxy process to its successor.
//! - [`metrics`]: Prometheus metrics and health endpoints.
//! - [`fuzzing`]: what the HTTP routing fuzz target checks.

pub mod control;
pub mod dataplane;
pub mod fuzzing;
pub mod handover;
pub mod identity;
pub mod inpod;
pub mod metrics;
pub mod state;
