//! aether's node proxy.
//!
//! - [`cni_server`]: the plugin ↔ proxy protocol (`aether_cni::protocol`) on a Unix socket.
//! - [`agent`]: the answers to the plugin, the pods' listeners, their tables' capture sets,
//!   drift repair.
//! - [`registry`]: the registered pods, persisted so a restarted proxy reopens their listeners.
//! - [`node_pods`]: this node's pods, from the operator's node-scoped feed.
//! - [`pod_view`]: namespace labels and pod annotations, which decide whether a pod is meshed.
//! - [`probes`]: how the kubelet probes a pod, which strict mode lets through.
//! - [`enrol`]: which running pods of the node to mesh or take out of the mesh, no restart.
//! - [`capture_set`]: the route-target ClusterIP:ports every meshed pod's table captures.
//! - [`last_config`]: the node's last NodeConfig, kept for a restart without it.
//! - [`listeners`]: per-pod capture and inbound listeners.
//! - [`handover`]: the listening sockets, from a proxy process to its successor.
//! - [`netns`]: every `setns(2)`: sockets inside a pod's network namespace, `SO_ORIGINAL_DST`.
//! - [`cni_kubeconfig`]: the token the CNI plugin falls back to when the proxy is down.
//! - [`cluster`]: the cluster's view from the node, and the loops that apply what it sees.
//! - [`watch_cache`]: the watches' caches, saved for a restart while the API server is down.
//! - [`mesh`]: the snapshot of routes, endpoints and identities the data plane reads (pure).
//! - [`dataplane`]: outbound routing, inbound mTLS termination, pooled clients.
//! - [`balancer`]: endpoint choice (power of two choices over EWMA latency).
//! - [`identity`]: SVIDs, their renewal, and the TLS configurations of the mesh hop.
//! - [`metrics`]: Prometheus metrics and health endpoints.
//! - [`fuzzing`]: what the HTTP routing fuzz target checks.

pub mod agent;
pub mod balancer;
pub mod capture_set;
pub mod cluster;
pub mod cni_kubeconfig;
pub mod cni_server;
pub mod dataplane;
pub mod enrol;
pub mod fuzzing;
pub mod handover;
pub mod identity;
pub mod last_config;
pub mod listeners;
pub mod mesh;
pub mod metrics;
pub mod netns;
pub mod node_pods;
pub mod pod_view;
pub mod probes;
pub mod registry;
pub mod state_file;
pub mod watch_cache;
