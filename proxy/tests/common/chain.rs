//! The node of the proxy's tests: `aether_test_support::node` with this workspace's aether-cni.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use aether_test_support::node::aether_entry;
// Each test binary uses a different part of these.
#[allow(unused_imports)]
pub use aether_test_support::node::{Node, pod_ips};

/// The `aether-cni` binary of this workspace, built once per test binary. Cargo offers
/// `CARGO_BIN_EXE_*` only for the package's own binaries, so it is built here into the same
/// target directory the tests were built in (a no-op when `cargo build --workspace` ran first,
/// as tests/run.sh does).
pub fn aether_cni() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Test binaries live in <target>/<profile>/deps.
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let target_dir = profile_dir.parent().unwrap();
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
        // What cargo sets for running this test (the package's CARGO_PKG_* and manifest
        // variables, the build scripts' LD_LIBRARY_PATH) would change dependencies' build
        // fingerprints and make every run rebuild the plugin.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_MANIFEST_")
                || key == "LD_LIBRARY_PATH"
            {
                cargo.env_remove(&*key);
            }
        }
        cargo
            .args([
                "build",
                "--quiet",
                "-p",
                "aether-cni",
                "--bin",
                "aether-cni",
            ])
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().unwrap();
        assert!(status.success(), "cargo build -p aether-cni failed");
        let binary = profile_dir.join("aether-cni");
        assert!(binary.exists(), "{} was not built", binary.display());
        binary
    })
}

/// A node whose aether-cni talks to the proxy at `socket`.
pub fn node(dual_stack: bool, socket: &Path) -> Node {
    Node::new(dual_stack, aether_entry(socket), aether_cni())
}
