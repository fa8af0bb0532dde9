//! Our own small CNI spec 1.1 I/O. The `cni-plugin` crate is not used: it rejects a bridge
//! `prevResult` (`missing field sandbox`), advertises 1.1.0 but refuses STATUS and GC, and rejects
//! upper-case container ids (see the crate README).
//!
//! Everything here is pure: the binary reads the process environment into [`RawEnv`] and stdin
//! into bytes, and these functions turn them into a checked [`Invocation`] and [`NetConf`].

mod args;
mod config;
mod env;
mod error;
mod version;

pub use args::{CniArgs, parse_cni_args};
pub use config::{NetConf, ValidAttachment, declared_version, parse_config};
pub use env::{Attachment, Command, Invocation, RawEnv, parse_env};
pub use error::{CniError, ErrorCode};
pub use version::{LATEST_VERSION, SUPPORTED_VERSIONS, check_version, version_reply};
