//! Warm bring-up of the local cluster: with everything built and every image up to date, the
//! time from a stopped cluster (`tests/cluster/down.sh`) until `tests/cluster/up.sh` is done
//! (control plane ready, images imported into each node's containerd, every node Ready, cluster
//! DNS rolled out), over a few rounds, median and worst. Run (root):
//! `cargo bench -p aether-e2e --bench bring_up`. Leaves the cluster up.

use std::process::Command;
use std::time::{Duration, Instant};

use aether_e2e::Paths;
use anyhow::{Result, bail};

const ROUNDS: usize = 3;

fn run(script: &str) -> Result<Duration> {
    let path = Paths::from_env().repo.join("tests/cluster").join(script);
    let started = Instant::now();
    let output = Command::new(&path).output()?;
    if !output.status.success() {
        bail!(
            "{} failed ({}):\n{}{}",
            path.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(started.elapsed())
}

fn main() -> Result<()> {
    // The first up.sh builds whatever is missing; it is not a warm bring-up.
    run("up.sh")?;
    let mut rounds = Vec::new();
    for round in 1..=ROUNDS {
        run("down.sh")?;
        let took = run("up.sh")?;
        eprintln!("round {round}: {took:.1?}");
        rounds.push(took);
    }
    rounds.sort();
    println!(
        "warm bring-up of the local cluster (down.sh, then up.sh), {ROUNDS} rounds: median {:.1} s, worst {:.1} s",
        rounds[ROUNDS / 2].as_secs_f64(),
        rounds[ROUNDS - 1].as_secs_f64()
    );
    Ok(())
}
