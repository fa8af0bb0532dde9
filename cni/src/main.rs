//! aether-cni: run by the container runtime as a chained CNI plugin (no arguments, `CNI_*`
//! environment, config on stdin), or by the DaemonSet's init container as
//! `aether-cni install` / `aether-cni uninstall`.

use std::io::{self, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use aether_cni::cni_io::{
    CniError, ErrorCode, LATEST_VERSION, RawEnv, declared_version, parse_env,
};
use aether_cni::install;
use aether_cni::plugin::{self, Settings};
use aether_cni::protocol::DEFAULT_SOCKET;
use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "aether-cni",
    about = "aether's chained CNI plugin. Without arguments it speaks the CNI protocol."
)]
struct Cli {
    #[command(subcommand)]
    command: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Copy this binary into the CNI bin dir and append aether-cni to the node's primary
    /// network config list. Idempotent.
    Install {
        #[arg(long)]
        cni_bin_dir: PathBuf,
        #[arg(long)]
        cni_conf_dir: PathBuf,
        /// Kubeconfig for the plugin's API server fallback, as a path on the node.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The node proxy's socket, as a path on the node.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        proxy_socket: PathBuf,
        /// An `nft` program on the node to run instead of libnftables in-process.
        #[arg(long)]
        nft_path: Option<PathBuf>,
    },
    /// Remove aether-cni from every network config list and the binary from the CNI bin dir.
    Uninstall {
        #[arg(long)]
        cni_bin_dir: PathBuf,
        #[arg(long)]
        cni_conf_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    if std::env::args_os().len() > 1 {
        return match admin(Cli::parse()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("aether-cni: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    cni()
}

/// The CNI protocol: the result or the error JSON on stdout.
fn cni() -> ExitCode {
    // The environment first: a person running the binary by hand gets told what it is
    // instead of a hang on stdin.
    let invocation = match parse_env(&RawEnv::from_process()) {
        Ok(invocation) => invocation,
        Err(e) => return fail(&e, LATEST_VERSION),
    };
    let mut stdin = Vec::new();
    if let Err(e) = io::stdin().read_to_end(&mut stdin) {
        let error = CniError::new(ErrorCode::Io, "cannot read stdin", e.to_string());
        return fail(&error, LATEST_VERSION);
    }
    let version = declared_version(&stdin).unwrap_or_else(|| LATEST_VERSION.to_owned());
    match plugin::run(&invocation, &stdin) {
        Ok(Some(result)) => {
            println!("{result}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => fail(&e, &version),
    }
}

fn fail(error: &CniError, version: &str) -> ExitCode {
    println!("{}", error.to_json(version));
    eprintln!("aether-cni: {error}");
    ExitCode::FAILURE
}

fn admin(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Mode::Install {
            cni_bin_dir,
            cni_conf_dir,
            kubeconfig,
            proxy_socket,
            nft_path,
        } => {
            let binary = std::env::current_exe().context("cannot find this program's own path")?;
            let settings = Settings {
                proxy_socket,
                kubeconfig,
                nft_path,
            };
            let done = install::install(&binary, &cni_bin_dir, &cni_conf_dir, &settings)?;
            eprintln!(
                "aether-cni: installed {}; {} {}",
                done.binary.display(),
                if done.config_changed {
                    "added to"
                } else {
                    "already in"
                },
                done.config.display()
            );
        }
        Mode::Uninstall {
            cni_bin_dir,
            cni_conf_dir,
        } => {
            let edited = install::uninstall(&cni_bin_dir, &cni_conf_dir)?;
            for path in edited {
                eprintln!("aether-cni: removed from {}", path.display());
            }
            eprintln!("aether-cni: uninstalled from {}", cni_bin_dir.display());
        }
    }
    Ok(())
}
