//! Leader election on a real Lease: of two replicas exactly one leads, and when the leader
//! stops renewing, the other takes over.

mod common;

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_operator::leader;
use anyhow::{Result, bail};
use common::{INSTALL, setup};
use tokio::sync::watch;

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_replica_takes_over() -> Result<()> {
    let cluster = Cluster::get().await?;
    let client = setup(&cluster).await?;
    let lease = format!("aether-operator-test-{}", std::process::id());
    let (a_tx, a) = watch::channel(false);
    let (b_tx, b) = watch::channel(false);
    let replica_a = tokio::spawn(leader::elect(
        client.clone(),
        INSTALL.into(),
        lease.clone(),
        "replica-a".into(),
        a_tx,
    ));
    let replica_b = tokio::spawn(leader::elect(
        client.clone(),
        INSTALL.into(),
        lease.clone(),
        "replica-b".into(),
        b_tx,
    ));

    let started = Instant::now();
    while !(*a.borrow() || *b.borrow()) {
        if started.elapsed() > Duration::from_secs(20) {
            bail!("no replica became leader");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(*a.borrow() != *b.borrow(), "exactly one replica leads");

    let (leader_task, standby) = if *a.borrow() {
        (replica_a, b)
    } else {
        (replica_b, a)
    };
    leader_task.abort();
    let stopped = Instant::now();
    while !*standby.borrow() {
        if stopped.elapsed() > Duration::from_secs(40) {
            bail!("the standby replica did not take over");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.kubectl(&["-n", INSTALL, "delete", "lease", &lease])?;
    Ok(())
}
