//! aether-proxy: the per-node data plane (in-pod capture listeners, routing, mTLS).
//! Not built yet: the binary refuses to start rather than pretend to proxy anything.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("aether-proxy: the node proxy is not implemented yet");
    ExitCode::from(2)
}
