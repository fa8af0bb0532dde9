//! The proxy's view of the cluster and the loops that act on it.
//!
//! - [`view`]: the watches' caches of what this node's proxy needs to know.
//! - [`apply`]: the loop that applies what the view sees: snapshot, capture sets, SVIDs, status.
//! - [`enroller`]: meshes and unmeshes the node's running pods, with Events.
//! - [`drift`]: puts back pods' capture tables and the node's CNI config when changed.
//! - [`node`]: the NodeConfig's demand and the node's readiness taint.
//! - [`uninstall`]: whether a stop is `helm uninstall`'s.
//! - [`node_pods`]: this node's pods, from the operator's node-scoped feed.
//! - [`pod_view`]: namespace labels and pod annotations, which decide whether a pod is meshed.
//! - [`enrol`]: which running pods of the node to mesh or take out of the mesh, no restart.
//! - [`cni_kubeconfig`]: the token the CNI plugin falls back to when the proxy is down.

pub mod apply;
pub mod cni_kubeconfig;
pub mod drift;
pub mod enrol;
pub mod enroller;
pub mod node;
pub mod node_pods;
pub mod pod_view;
pub mod uninstall;
pub mod view;
