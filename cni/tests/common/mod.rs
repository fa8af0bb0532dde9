//! The node of `aether_test_support::node`, with this package's aether-cni binary, and a proxy
//! double that speaks the real protocol (through `aether_cni::protocol`'s server helpers).
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod proxy;

use serde_json::Value;

// Each test binary uses a different part of these.
#[allow(unused_imports)]
pub use aether_test_support::node::{
    CNI_BIN_DIR, Netns, Node, PluginRun, Pod, TempDir, aether_entry, in_netns, netns, pod_ips,
    require_root, ruleset, run_here, run_in, sockets, unique,
};

pub const AETHER_CNI: &str = env!("CARGO_BIN_EXE_aether-cni");

/// A node whose aether-cni entry is `aether`, running this package's plugin.
pub fn node(dual_stack: bool, aether: Value) -> Node {
    Node::new(dual_stack, aether, AETHER_CNI)
}
