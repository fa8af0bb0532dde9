//! `aether-echo`: the echo server the local cluster runs for the conformance Deployments'
//! `echo-advanced` image, and (`aether-echo client URL`, or invoked as `client`) the client the
//! conformance harness execs in those pods. See the crate's README for the formats.

mod cli;
mod client;
mod grpc_wire;
mod identity;
mod server;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_from(cli::normalize_args(std::env::args_os().collect()));
    // stdout belongs to the client's report, so logs go to stderr; the client only logs
    // problems unless RUST_LOG asks for more.
    let default_level = match cli.command {
        Some(Command::Client(_)) => "warn",
        None => "info",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .init();

    let result = match cli.command {
        Some(Command::Client(args)) => client::run(args).await,
        None => server::run(cli.server).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line with the whole cause chain; a backtrace would bury it.
            let _ = writeln!(std::io::stderr(), "aether-echo: {error:#}");
            ExitCode::FAILURE
        }
    }
}
