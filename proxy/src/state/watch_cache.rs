//! The proxy's watch caches, each saved in the state directory: a proxy that starts while the
//! API server does not answer (a restart in an outage) serves from what the last run saw
//! instead of waiting for a first list that cannot come.
//!
//! A saved cache is only a stand-in. It is loaded when no list has begun [`SEED_AFTER`] after
//! the start, and the first list that completes replaces it whole. It is written from listed
//! state only, at most every [`SAVE_EVERY`] while objects change.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

/// How long a watch waits for its first list before it serves the saved cache: more than a
/// reachable API server takes, little enough to add no more to a restart than a kubelet does.
pub const SEED_AFTER: Duration = Duration::from_secs(3);
/// The most often a changing cache is written (10,000 Services are a few MB).
const SAVE_EVERY: Duration = Duration::from_secs(10);
/// The annotation `kubectl apply` keeps the whole manifest in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Where a cache is saved: `<state dir>/watch/<name>.json`.
#[derive(Clone, Debug)]
pub struct SavedCache {
    path: PathBuf,
}

impl SavedCache {
    pub fn new(state_dir: &Path, name: &str) -> SavedCache {
        SavedCache {
            path: state_dir.join("watch").join(format!("{name}.json")),
        }
    }

    /// The objects saved last; `None` when there are none or they cannot be read (said).
    pub fn load<K: DeserializeOwned>(&self) -> Option<Vec<K>> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "cannot read a saved watch cache");
                return None;
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(objects) => Some(objects),
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "ignoring a saved watch cache that does not parse");
                None
            }
        }
    }

    /// A cache saved at `path`.
    pub fn at(path: PathBuf) -> SavedCache {
        SavedCache { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn save<K: Serialize>(&self, objects: &[K]) -> std::io::Result<()> {
        let json = serde_json::to_vec(objects).map_err(std::io::Error::other)?;
        crate::state::file::write_in_private_dir(&self.path, &json)
    }
}

/// Fills `writer`'s store with `objects` as one whole list: ready, and replaced whole by the
/// next list.
pub fn seed<K>(writer: &mut reflector::store::Writer<K>, objects: Vec<K>)
where
    K: Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// The tasks that keep the proxy's caches, supervised with its other lifelong tasks.
pub type Tasks = Vec<(&'static str, JoinHandle<()>)>;

/// A cache of `api`'s objects, kept by a watch for the process's life (a task pushed on
/// `tasks`) and saved in `saved`; `changed` is notified at every event.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: Arc<Notify>,
    saved: SavedCache,
    tasks: &mut Tasks,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    // Every Service and EndpointSlice of the cluster is cached: what the proxy never reads
    // (field managers, the last applied manifest) would be most of their memory.
    let events = watcher(api, config)
        .default_backoff()
        .modify(|object: &mut K| {
            let meta = object.meta_mut();
            meta.managed_fields = None;
            if let Some(annotations) = meta.annotations.as_mut() {
                annotations.remove(LAST_APPLIED);
            }
        });
    let timing = Timing {
        seed_after: SEED_AFTER,
        save_every: SAVE_EVERY,
    };
    let task = tokio::spawn(keep(events, writer, store.clone(), changed, saved, timing));
    tasks.push(("a watch cache", task));
    store
}

/// When a watch serves its saved cache, and how often it saves.
struct Timing {
    seed_after: Duration,
    save_every: Duration,
}

/// Fills `writer` from `events`, or from `saved` when no list has begun in time, and saves
/// listed state; for the process's life.
async fn keep<K>(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>>,
    mut writer: reflector::store::Writer<K>,
    store: Store<K>,
    changed: Arc<Notify>,
    saved: SavedCache,
    timing: Timing,
) where
    K: Resource + Clone + DeserializeOwned + Serialize + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let kind = std::any::type_name::<K>()
        .rsplit("::")
        .next()
        .unwrap_or("?");
    let mut events = std::pin::pin!(events);
    let seed_at = Instant::now() + timing.seed_after;
    // Pages of a list are arriving: a saved cache served now would split them. (The watcher
    // says `Init` before each attempt to list, so that alone is no answer.)
    let mut paging = false;
    // The API server delivered a whole list: from then on only it fills the cache.
    let mut listed = false;
    let mut seeded = false;
    // When the listed state changed and is not saved yet, and the soonest it may be.
    let mut unsaved: Option<Instant> = None;
    let mut last_save = Instant::now() - timing.save_every;
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return };
                match event {
                    Ok(event) => {
                        let complete = match &event {
                            watcher::Event::Init => {
                                paging = false;
                                false
                            }
                            watcher::Event::InitApply(_) => {
                                paging = true;
                                false
                            }
                            watcher::Event::InitDone => {
                                paging = false;
                                listed = true;
                                true
                            }
                            watcher::Event::Apply(_) | watcher::Event::Delete(_) => true,
                        };
                        writer.apply_watcher_event(&event);
                        if listed && complete && unsaved.is_none() {
                            unsaved = Some(last_save + timing.save_every);
                        }
                    }
                    Err(error) => {
                        warn!(kind, error = %error, "watch failed; serving the last known state and retrying");
                    }
                }
                changed.notify_one();
            }
            _ = tokio::time::sleep_until(seed_at), if !listed && !seeded && !paging => {
                seeded = true;
                let objects: Vec<K> = saved.load().unwrap_or_default();
                info!(kind, objects = objects.len(), "no answer from the API server yet: serving the watch cache saved by the last run");
                seed(&mut writer, objects);
                changed.notify_one();
            }
            _ = tokio::time::sleep_until(unsaved.unwrap_or_else(Instant::now)), if unsaved.is_some() => {
                unsaved = None;
                last_save = Instant::now();
                let (state, saved) = (store.state(), saved.clone());
                let save = move || saved.save(&state.iter().map(Arc::as_ref).collect::<Vec<_>>());
                match tokio::task::spawn_blocking(save).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(kind, error = %e, "cannot save the watch cache; a restart in an outage would not have it"),
                    Err(e) => warn!(kind, error = %e, "saving the watch cache failed"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    #[test]
    fn a_saved_cache_loads_what_was_saved_and_nothing_from_a_bad_file() {
        let dir = std::env::temp_dir().join(format!("aether-watch-cache-{}", std::process::id()));
        let saved = SavedCache::new(&dir, "services");
        assert!(saved.load::<Service>().is_none(), "nothing saved yet");
        let mut service = Service::default();
        service.metadata.name = Some("web".into());
        service.metadata.namespace = Some("shop".into());
        saved.save(std::slice::from_ref(&service)).unwrap();
        assert_eq!(saved.load::<Service>(), Some(vec![service]));
        std::fs::write(dir.join("watch/services.json"), b"[{\"metadata\": 3}]").unwrap();
        assert!(
            saved.load::<Service>().is_none(),
            "a corrupt file is ignored"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn service(name: &str) -> Service {
        let mut service = Service::default();
        service.metadata.name = Some(name.into());
        service.metadata.namespace = Some("shop".into());
        service
    }

    fn names(store: &Store<Service>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Waits until `saved` holds the Services `expected`, and no save is under way.
    async fn wait_saved(saved: &SavedCache, expected: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let loaded: Vec<Service> = saved.load().unwrap_or_default();
            let mut on_disk: Vec<_> = loaded.into_iter().filter_map(|s| s.metadata.name).collect();
            on_disk.sort();
            if on_disk == expected {
                // Saves come 50 ms apart at the most: one may be writing its temporary file.
                tokio::time::sleep(FAST.save_every * 2).await;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the listed cache was never saved"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    type Feed = futures::channel::mpsc::UnboundedSender<watcher::Result<watcher::Event<Service>>>;

    /// A cache kept by [`keep`] from `first` and then what is fed, saved in `saved`.
    fn kept(
        saved: &SavedCache,
        first: impl IntoIterator<Item = watcher::Event<Service>>,
    ) -> (Feed, Store<Service>) {
        let (feed, events) = futures::channel::mpsc::unbounded();
        for event in first {
            feed.unbounded_send(Ok(event)).unwrap();
        }
        let (store, writer) = reflector::store();
        let changed = Arc::default();
        tokio::spawn(keep(
            events,
            writer,
            store.clone(),
            changed,
            saved.clone(),
            FAST,
        ));
        (feed, store)
    }

    const FAST: Timing = Timing {
        seed_after: Duration::from_millis(50),
        save_every: Duration::from_millis(50),
    };

    /// With no answer from the API server, the cache is the saved one; the first list replaces
    /// it whole, and is saved in its turn.
    #[tokio::test]
    async fn an_unanswered_watch_serves_the_saved_cache_until_a_list_replaces_it() {
        let dir = std::env::temp_dir().join(format!("aether-watch-seed-{}", std::process::id()));
        let saved = SavedCache::new(&dir, "services");
        saved.save(&[service("old"), service("gone")]).unwrap();
        // The watcher says this before every attempt to list, answered or not.
        let (feed, store) = kept(&saved, [watcher::Event::Init]);
        tokio::time::timeout(Duration::from_secs(5), store.wait_until_ready())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(names(&store), ["gone", "old"]);

        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(service("old")),
            watcher::Event::InitApply(service("new")),
            watcher::Event::InitDone,
        ] {
            feed.unbounded_send(Ok(event)).unwrap();
        }
        wait_saved(&saved, &["new", "old"]).await;
        assert_eq!(names(&store), ["new", "old"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A list under way when the saved cache would be due is not disturbed by it.
    #[tokio::test]
    async fn a_list_under_way_is_not_replaced_by_the_saved_cache() {
        let dir = std::env::temp_dir().join(format!("aether-watch-listing-{}", std::process::id()));
        let saved = SavedCache::new(&dir, "services");
        saved.save(&[service("stale")]).unwrap();
        let (feed, store) = kept(
            &saved,
            [
                watcher::Event::Init,
                watcher::Event::InitApply(service("fresh")),
            ],
        );
        tokio::time::sleep(FAST.seed_after * 4).await;
        assert!(store.is_empty(), "the saved cache was served during a list");
        feed.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        store.wait_until_ready().await.unwrap();
        assert_eq!(names(&store), ["fresh"]);
        wait_saved(&saved, &["fresh"]).await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
