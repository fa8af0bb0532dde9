//! aether's chained CNI plugin, as a library so the node proxy can reuse its parts.
//!
//! - [`cni_io`]: CNI spec 1.1 input (environment, stdin config) and output (results, error JSON).
//! - [`protocol`]: the versioned plugin ↔ node proxy protocol over a Unix socket (client and server helpers).
//! - [`nft`]: the per-pod `inet aether` nftables table: install, replace set elements, verify, delete.
//! - [`decision`]: whether a pod is meshed, from the API server, when the proxy cannot say.
//! - [`plugin`]: the ADD/DEL/CHECK/VERSION/STATUS/GC commands built from the parts above.
//! - [`install`]: `aether-cni install`/`uninstall`: the binary and the conflist entry on the node.

pub mod cni_io;
pub mod decision;
pub mod install;
pub mod nft;
pub mod plugin;
pub mod protocol;
