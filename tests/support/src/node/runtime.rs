//! A container runtime's side of the CNI tests: the root check, unique names, temporary
//! directories, a plugin run's result, and a pod's identity. Used by the CNI plugin's
//! and the node proxy's integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

use super::CNI_BIN_DIR;
use super::netns::Netns;

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
    // It creates a directory: no plain default value.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let path = std::env::temp_dir().join(unique("aether-test-"));
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

    /// The CNI error code, asserting that the run failed.
    pub fn error_code(&self) -> u64 {
        assert!(!self.success, "plugin succeeded: {self:?}");
        self.json()["code"].as_u64().unwrap()
    }
}

/// A pod as the runtime knows it: its netns and the kubelet's identity for it.
pub struct Pod {
    pub netns: Netns,
    pub container_id: String,
    pub namespace: String,
    pub name: String,
}

impl Pod {
    pub fn new(namespace: &str) -> Self {
        let netns = Netns::new("aep");
        // Tentative IPv6 addresses would delay the pod's first connections; a runtime's pods
        // get them through the same sysctl.
        netns.sysctl("net.ipv6.conf.default.accept_dad", "0");
        netns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        Pod {
            container_id: unique("ABCdef"),
            name: unique("pod-"),
            namespace: namespace.to_owned(),
            netns,
        }
    }

    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID=uid-{}",
            self.namespace, self.name, self.container_id, self.name
        )
    }
}
