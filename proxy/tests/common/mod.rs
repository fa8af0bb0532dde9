//! Real network namespaces, the real CNI chain (`loopback`, `bridge` + `host-local`, then the
//! built `aether-cni` binary) and the proxy's own CNI server and listeners, in-process. Every
//! resource is removed by a `Drop` guard, so a failing test leaves nothing behind, and named
//! uniquely, so tests run in parallel.
#![allow(dead_code)] // each test binary uses a different part of this module

// The CNI plugin's test helpers for namespaces and sockets, used as they are.
#[path = "../../../cni/tests/common/netns.rs"]
pub mod netns;
#[path = "../../../cni/tests/common/sockets.rs"]
pub mod sockets;

pub mod chain;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

pub use netns::{Netns, in_netns, run_here, run_in};

pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Fails the test with instructions when it cannot run here.
pub fn require_root() {
    use std::os::unix::fs::MetadataExt;
    assert!(
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0),
        "these tests create network namespaces: run them as root (CI does)"
    );
    for plugin in ["loopback", "bridge", "host-local"] {
        assert!(
            Path::new(CNI_BIN_DIR).join(plugin).exists(),
            "{CNI_BIN_DIR}/{plugin} is missing: apt-get install containernetworking-plugins"
        );
    }
    assert!(
        Command::new("nft")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "nft is missing: apt-get install nftables"
    );
}

/// A name no other test (in this or a parallel process) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}-{n}", std::process::id())
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(unique("aether-proxy-test-"));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One plugin run: what a runtime sees.
#[derive(Debug)]
pub struct PluginRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl PluginRun {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    pub fn ok(self) -> Self {
        assert!(self.success, "plugin failed: {self:?}");
        self
    }
}
