//! Real network namespaces, the real CNI chain (`loopback`, `bridge` + `host-local`, then the
//! built `aether-cni` binary) and the proxy's own CNI server and listeners, in-process. Every
//! resource is removed by a `Drop` guard, so a failing test leaves nothing behind, and named
//! uniquely, so tests run in parallel.
#![allow(dead_code)] // each test binary uses a different part of this module

// The CNI plugin's test helpers for namespaces and sockets, used as they are.
#[path = "../../../cni/tests/common/netns.rs"]
pub mod netns;
#[path = "../../../cni/tests/common/runtime.rs"]
pub mod runtime;
#[path = "../../../cni/tests/common/sockets.rs"]
pub mod sockets;

pub mod chain;
pub mod proxy;

pub use netns::{Netns, in_netns, run_here, run_in};
// Each test binary uses a different part of these.
#[allow(unused_imports)]
pub use runtime::{PluginRun, Pod, TempDir, require_root, unique};

pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
