//! The README's first command, `tests/cluster/demo.sh`, does what the README says: aether
//! installed with helm, a 70/30 split of `echo` between echo-v1 and echo-v2, and every request
//! shown with the backend that served it and the caller identity that backend saw.

use aether_e2e::Cluster;
use aether_e2e::mesh::{TRUST_DOMAIN, uninstall};
use anyhow::{Result, bail};

/// The namespace demo.yaml deploys.
const DEMO_NS: &str = "aether-demo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_command_shows_the_split_with_identities() -> Result<()> {
    let cluster = Cluster::get().await?;
    let script = cluster.paths.repo.join("tests/cluster/demo.sh");
    let output =
        tokio::task::spawn_blocking(move || std::process::Command::new(script).output()).await??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "demo.sh failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let caller = format!("saw caller spiffe://{TRUST_DOMAIN}/ns/{DEMO_NS}/sa/echo-v1");
    let served: Vec<&str> = stdout.lines().filter(|l| l.contains("served by")).collect();
    let by = |version: &str| {
        served
            .iter()
            .filter(|l| l.contains(&format!("served by echo-{version}-")))
            .count()
    };
    if served.len() != 20 || by("v1") == 0 || by("v2") == 0 || by("v1") + by("v2") != 20 {
        bail!("expected 20 requests split between echo-v1 and echo-v2:\n{stdout}");
    }
    for line in &served {
        let own = if line.contains("served by echo-v1-") {
            "echo-v1"
        } else {
            "echo-v2"
        };
        if !line.starts_with("  200")
            || !line.contains(&caller)
            || !line.contains(&format!("(sa {own})"))
        {
            bail!("a request without the expected status, backend identity or caller: {line}");
        }
    }
    if !stdout.contains("split:") || !stdout.contains("tests/cluster/down.sh") {
        bail!("no summary or stop instructions:\n{stdout}");
    }

    cluster.kubectl(&["delete", "namespace", DEMO_NS, "--wait"])?;
    uninstall(&cluster).await?;
    Ok(())
}
