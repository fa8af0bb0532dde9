//! Everything done inside a pod's network namespace, and the node agent that decides it.
//!
//! - [`netns`]: a pod's network namespace as a handle holding its descriptor, and every
//!   `setns(2)`: sockets made inside it, `SO_ORIGINAL_DST`.
//! - [`listeners`]: each pod's capture and inbound listeners.
//! - [`capture_set`]: the ClusterIP:ports every meshed pod's table captures.
//! - [`probes`]: how the kubelet probes a pod, which strict mode lets through.
//! - [`agent`]: the answers to the CNI plugin, the pods' listeners and tables, drift repair.
//! - [`protocol`]: the plugin's requests answered by the agent.
//! - [`cni_server`]: the plugin ↔ proxy protocol (`aether_cni::protocol`) on a Unix socket.

pub mod agent;
pub mod capture_set;
pub mod cni_server;
pub mod listeners;
pub mod netns;
pub mod probes;
pub mod protocol;
