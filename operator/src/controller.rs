//! The thin async shell around the pure parts: watches keep caches of every kind the
//! operator reads; on any change (debounced) the leader rebuilds the index, computes the
//! desired state, and writes only what differs from what the API server holds.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::watch;

use crate::cache::{Changes, Stores};
use crate::index::Index;
use crate::metrics::Metrics;
use crate::node_config::Shared;
use crate::targets::compile_all;
use crate::write::{FIELD_MANAGER, Model, WriteError, Writer};

/// Changes arriving within this window are handled together.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Status passes are at least this far apart: each looks at every RouteTarget and route,
/// and a burst of route changes needs only the last one.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// A pass that wrote with failures is run again after this long at first, doubling up to
/// [`MAX_RETRY`]; the objects that did not fail converge meanwhile.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A pass allocates and frees tens of MB on whichever runtime threads run it; glibc keeps
/// freed memory in per-thread arenas, so without giving it back after a pass the resident
/// size creeps toward the sum of every thread's peak.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages to the kernel; it touches no live memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub trust_domain: String,
}

/// Runs until the process ends; writes only while `leader` is true. Two loops: the config
/// loop keeps the index up to date, compiles the targets and writes what the data plane
/// reads; the status loop writes what users read from the latest model, so thousands of
/// status writes after a start never delay a route change reaching the nodes.
pub async fn run(
    client: kube::Client,
    config: Config,
    mut leader: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    ready: watch::Sender<aether_admin::Readiness>,
) {
    let changes = Arc::new(Changes::default());
    let (stores, mut watches) = Stores::start(&client, &changes);
    let stores = Arc::new(stores);
    if !stores.ready().await {
        tracing::error!("watch caches never became ready");
        return;
    }
    let _ = ready.send(Ok(()));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let writer = Arc::new(Writer {
        client,
        config,
        recorder,
        metrics,
        leader: leader.clone(),
    });
    let (models, model) = watch::channel(None);
    let mut statuses = tokio::spawn(status_loop(writer.clone(), stores.clone(), model));
    let mut index = Arc::new(Index::default());
    let mut retry = Retry::default();
    loop {
        tokio::select! {
            _ = changes.notify.notified() => {}
            _ = leader.changed() => {}
            _ = retry.due() => {}
            // The status loop never ends by itself: if it did (a panic), this replica would
            // write no status any more; ending here makes the process exit and restart.
            ended = &mut statuses => {
                tracing::error!(error = ?ended.err(), "the status loop ended");
                return;
            }
            // Likewise a watch: its cache would go stale.
            Some(ended) = watches.join_next() => {
                tracing::error!(watch = ?ended, "a watch task ended");
                return;
            }
        }
        tokio::time::sleep(DEBOUNCE).await;
        // The index follows the caches on every replica, so a new leader starts up to date.
        let started = Instant::now();
        let changed = changes.take();
        writer.metrics.queue_depth.set(changed.len() as i64);
        stores.refresh(Arc::make_mut(&mut index), &changed);
        let indexed = started.elapsed();
        if !*leader.borrow() {
            continue;
        }
        let targets = compile_all(&index);
        let shared = Shared::new(&index, &targets, &writer.config.trust_domain);
        let compiled = started.elapsed();
        let (required, failed) = writer.configs(&stores, &index, &targets, &shared).await;
        writer
            .metrics
            .observe("config", started.elapsed(), failed.is_empty());
        tracing::debug!(
            parts = changed.len(),
            index_ms = indexed.as_millis() as u64,
            compile_ms = (compiled - indexed).as_millis() as u64,
            write_ms = (started.elapsed() - compiled).as_millis() as u64,
            targets = targets.len(),
            "config pass"
        );
        let _ = models.send(Some(Arc::new(Model {
            index: index.clone(),
            targets,
            shared,
            required,
        })));
        release_freed_memory();
        writer.report("config", &failed);
        retry.after(&failed);
    }
}

/// When a pass whose writes failed is run again without a change to set it off: soon at
/// first, then backing off while the same objects keep failing.
#[derive(Default)]
struct Retry {
    at: Option<tokio::time::Instant>,
    delay: Option<Duration>,
}

impl Retry {
    fn after(&mut self, failed: &[WriteError]) {
        if failed.is_empty() {
            *self = Retry::default();
            return;
        }
        let delay = self.delay.map_or(FIRST_RETRY, |d| (d * 2).min(MAX_RETRY));
        self.delay = Some(delay);
        self.at = Some(tokio::time::Instant::now() + delay);
    }

    async fn due(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// Writes the status of every RouteTarget and route from the latest model.
async fn status_loop(
    writer: Arc<Writer>,
    stores: Arc<Stores>,
    mut model: watch::Receiver<Option<Arc<Model>>>,
) {
    let mut retry = Retry::default();
    loop {
        tokio::select! {
            changed = model.changed() => if changed.is_err() { return },
            _ = retry.due() => {}
        }
        tokio::time::sleep(STATUS_INTERVAL).await;
        let Some(current) = model.borrow_and_update().clone() else {
            continue;
        };
        if !writer.leading() {
            continue;
        }
        let started = Instant::now();
        let failed = writer.status(&stores, &current).await;
        writer
            .metrics
            .observe("status", started.elapsed(), failed.is_empty());
        tracing::debug!(ms = started.elapsed().as_millis() as u64, "status pass");
        writer.report("status", &failed);
        retry.after(&failed);
    }
}
