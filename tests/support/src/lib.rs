//! What aether's tests share, at every tier: the Gateway API release they test against (its
//! CRDs and conformance manifests, from the Go module proxy) and the mesh conformance cases
//! as data (`tests/gateway-conformance/cases.yaml`).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

pub mod cases;
pub mod fuzz;
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
