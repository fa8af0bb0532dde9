//! aether's node proxy, first slice: the CNI plugin's registry and the capture listeners inside
//! each meshed pod's network namespace.
//!
//! - [`cni_server`]: the plugin ↔ proxy protocol (`aether_cni::protocol`) on a Unix socket.
//! - [`agent`]: the answers to the plugin, the pods' listeners and their tables' capture sets.
//! - [`registry`]: the registered pods, persisted so a restarted proxy reopens their listeners.
//! - [`pod_view`]: namespace labels and pod annotations, which decide whether a pod is meshed.
//! - [`capture_set`]: the route-target ClusterIP:ports every meshed pod's table captures.
//! - [`listeners`]: per-pod capture listeners; captured connections go to their original
//!   destination.
//! - [`netns`]: every `setns(2)`: sockets inside a pod's network namespace, `SO_ORIGINAL_DST`.

pub mod agent;
pub mod capture_set;
pub mod cni_server;
pub mod listeners;
pub mod netns;
pub mod pod_view;
pub mod registry;
