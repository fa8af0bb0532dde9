//! The node of `aether_test_support::node` (real network namespaces and the real CNI chain,
//! with the built `aether-cni` binary) and the proxy's own CNI server and listeners,
//! in-process.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod chain;
pub mod proxy;

// Each test binary uses a different part of these.
#[allow(unused_imports)]
pub use aether_test_support::node::{
    CNI_BIN_DIR, Netns, PluginRun, Pod, TempDir, in_netns, netns, require_root, run_here, run_in,
    sockets, unique,
};
