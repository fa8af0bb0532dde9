//! What the proxy keeps on the node's disk for a restart, each written atomically.
//!
//! - [`registry`]: the registered pods, so a restarted proxy reopens their listeners.
//! - [`last_config`]: the node's last NodeConfig, kept for a restart without it.
//! - [`watch_cache`]: the watches' caches, saved for a restart while the API server is down.
//! - [`file`]: the atomic write they share.

pub mod file;
pub mod last_config;
pub mod registry;
pub mod watch_cache;
