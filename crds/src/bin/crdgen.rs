//! Writes the aether CRDs as YAML into the directory given (the chart's `crds/`),
//! or prints them when no directory is given.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let documents = match aether_crds::crd_documents() {
        Ok(documents) => documents,
        Err(error) => {
            eprintln!("aether-crdgen: cannot render the CRDs as YAML: {error}");
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        for (_, body) in documents {
            print!("---\n{body}");
        }
        return ExitCode::SUCCESS;
    };
    for (file, body) in documents {
        let path = dir.join(file);
        if let Err(error) = std::fs::write(&path, body) {
            eprintln!("aether-crdgen: cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
