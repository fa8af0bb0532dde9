//! What aether's tests share, at every tier: the Gateway API release they test against (its
//! CRDs and conformance manifests, from the Go module proxy), the mesh conformance cases as
//! data (`tests/gateway-conformance/cases.yaml`), and a node's network namespaces, pods and CNI
//! chain for the CNI plugin's and the proxy's tests (`node`).

// One block needs it: entering a pod's network namespace between fork and exec (`node::netns`).
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};

pub mod cases;
pub mod fuzz;
pub mod node;
pub mod upstream;

/// The checkout the tests run from. Cargo gives a test or bench process its package's
/// directory at run time; the checkout is the nearest directory above it with `Cargo.lock`.
/// Not the directory this crate was compiled in: a target directory shared by several
/// checkouts (CI's cache) may hold this crate built in another one.
pub fn repo_root() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    package
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
            Path::to_path_buf,
        )
}
