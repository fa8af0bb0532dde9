//! aether-operator: turns GAMMA routes into RouteTargets, their status and per-node config,
//! and runs the mesh certificate authority.
//! Not built yet: the binary refuses to start rather than pretend to run.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("aether-operator: the controller is not implemented yet");
    ExitCode::from(2)
}
