//! aether's chained CNI plugin, as a library so the node proxy can reuse its parts.
//!
//! - [`cni_io`]: CNI spec 1.1 input (environment, stdin config) and output (results, error JSON).
//! - [`protocol`]: the versioned plugin ↔ node proxy protocol over a Unix socket (client and server helpers).
//! - [`nft`]: the per-pod `inet aether` nftables table: install, replace set elements, verify, delete.
//! - [`decision`]: whether a pod is meshed, from the API server, when the proxy cannot say.
//! - [`plugin`]: the ADD/DEL/CHECK/VERSION/STATUS/GC commands built from the parts above.
//! - [`fuzzing`]: the fuzz targets' checks, for `cargo fuzz` and the stable mutation test.
//! - [`install`]: `aether-cni install`/`uninstall`: the binary and the conflist entry on the node.

pub mod cni_io;
pub mod decision;
pub mod fuzzing;
pub mod install;
pub mod nft;
pub mod plugin;
pub mod protocol;

/// An error and its causes, for messages a person reads: a client library's own message
/// alone ("client error (Connect)") hides the one a person needs ("Connection refused").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
