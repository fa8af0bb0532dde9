//! `kubectl aether`: aether's kubectl plugin (kubectl runs `kubectl-aether` from the PATH).
//!
//! - `check`: what a healthy installation has (Kubernetes version, CRDs, the operator, a
//!   Ready proxy on every Ready node that applied its current NodeConfig); exits 1 when a
//!   check fails, each failure one line naming what and where.
//! - `status`: per node, the proxy, its version, the config generation it applied, the pods
//!   it captures and the drift it repaired.
//! - `analyze`: routes that attach nowhere, conflicting or unresolved RouteTargets, backends
//!   served by unmeshed pods, meshed pods no proxy captures; exits 1 when it finds one.
//!
//! Human-readable by default, `-o json` for scripts. Uses the kubeconfig kubectl would.

mod analyze;
mod checks;
mod facts;
mod gather;
mod metrics;
mod status;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

#[derive(Parser)]
#[command(name = "kubectl-aether", about = "Check and inspect the aether mesh")]
struct Cli {
    /// The namespace aether is installed in.
    #[arg(short = 'n', long, global = true, default_value = "aether-system")]
    namespace: String,
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Checks the installation; exits 1 when a check fails.
    Check,
    /// Shows each node's proxy and what it applied.
    Status,
    /// Finds configuration that does not do what it likely means; exits 1 when it finds one.
    Analyze,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubectl aether: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let client = kube::Client::try_default()
        .await
        .context("cannot load a kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    match cli.command {
        Command::Check => check(&client, &cli.namespace, cli.output).await,
        Command::Status => status(&client, &cli.namespace, cli.output).await,
        Command::Analyze => analyze(&client, cli.output).await,
    }
}

/// Exit code 1 when `failed`.
fn exit(failed: bool) -> ExitCode {
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn check(client: &kube::Client, namespace: &str, output: Output) -> Result<ExitCode> {
    let findings = checks::check(&gather::facts(client, namespace).await?);
    let failed = findings.iter().filter(|f| !f.ok).count();
    match output {
        Output::Json => println!("{}", json!({"ok": failed == 0, "checks": findings})),
        Output::Text => {
            for f in &findings {
                let mark = if f.ok { "ok  " } else { "FAIL" };
                println!("{mark} {}: {}", f.check, f.detail);
            }
            if failed == 0 {
                println!("every check passed");
            } else {
                println!("{failed} of {} checks failed", findings.len());
            }
        }
    }
    Ok(exit(failed > 0))
}

async fn status(client: &kube::Client, namespace: &str, output: Output) -> Result<ExitCode> {
    let rows = status::rows(&gather::facts(client, namespace).await?);
    match output {
        Output::Json => println!("{}", json!({"nodes": rows})),
        Output::Text => {
            let cells: Vec<Vec<String>> = rows.iter().map(status::NodeRow::cells).collect();
            print!("{}", status::table(&status::HEADERS, &cells));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn analyze(client: &kube::Client, output: Output) -> Result<ExitCode> {
    let problems = analyze::analyze(&gather::inventory(client).await?);
    match output {
        Output::Json => println!("{}", json!({"problems": problems})),
        Output::Text if problems.is_empty() => println!("no problem found"),
        Output::Text => {
            for p in &problems {
                println!("{}: {}", p.object, p.problem);
            }
        }
    }
    Ok(exit(!problems.is_empty()))
}
