//! The proxy's view of the cluster and the loops that act on it.
//!
//! - [`cluster`]: the watches' view from the node, and the loops that apply what it sees.
//! - [`node_pods`]: this node's pods, from the operator's node-scoped feed.
//! - [`pod_view`]: namespace labels and pod annotations, which decide whether a pod is meshed.
//! - [`enrol`]: which running pods of the node to mesh or take out of the mesh, no restart.
//! - [`cni_kubeconfig`]: the token the CNI plugin falls back to when the proxy is down.

pub mod cluster;
pub mod cni_kubeconfig;
pub mod enrol;
pub mod node_pods;
pub mod pod_view;
