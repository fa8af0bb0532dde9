//! aether-cni: the chained CNI plugin that installs a pod's capture table.
//! Not built yet: it fails every command, so a runtime never mistakes it for a working plugin.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("aether-cni: the CNI plugin is not implemented yet");
    ExitCode::from(2)
}
