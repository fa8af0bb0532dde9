//! This node's pods. The proxy may not read pods from the API server: RBAC cannot scope a read
//! to one node, and a stolen proxy token would read every pod of the cluster. It lists and
//! watches them through the operator's pod feed (`GET /api/v1/pods` on the CA endpoint, the API
//! server's own answers, for the node its pod-bound token is bound to), with the same token
//! and trust bundle as its SVID requests.
//!
//! What it last knew is kept on disk, so that a proxy restarted while the operator is away
//! still knows its pods (their identities, probes and ports). Until the feed has answered, the
//! list is marked not live: enrolment does not act on a saved list, whose pods may have gone
//! meanwhile.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::identity::svid::Resolver;
use crate::state::watch_cache::SavedCache;

const PODS_FILE: &str = "node-pods.json";
/// kube's TLS verifier re-reads this file (about every minute), so a root rotation reaches
/// the feed's connection without a new client.
const BUNDLE_FILE: &str = "trust-bundle.pem";
/// How often the saved list and the bundle file are brought up to date.
const SAVE_EVERY: Duration = Duration::from_secs(2);
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// The API server ends a watch after 290 s; a connection silent for longer is dead.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("no trust bundle yet to verify the operator")]
    NoTrust,
    #[error("the operator's address {0} does not resolve yet")]
    Unresolved(String),
    #[error("operator address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build the pod feed's client: {0}")]
    Client(#[from] kube::Error),
}

/// The node's pods as last listed or watched.
pub struct NodePods {
    store: Store<Pod>,
    live: AtomicBool,
}

impl NodePods {
    /// The store, filled from the list saved in `state_dir` when there is one, and the writer
    /// [`feed`] keeps it current with.
    pub fn load(state_dir: &Path) -> (Arc<NodePods>, Writer<Pod>) {
        let mut writer = Writer::default();
        if let Some(pods) = saved_pods(state_dir).load::<Pod>() {
            info!(
                pods = pods.len(),
                "serving the saved list of the node's pods until the feed answers"
            );
            crate::state::watch_cache::seed(&mut writer, pods);
        }
        let pods = NodePods {
            store: writer.as_reader(),
            live: AtomicBool::new(false),
        };
        (Arc::new(pods), writer)
    }

    pub fn store(&self) -> &Store<Pod> {
        &self.store
    }

    /// Whether the list is the feed's, not only the saved one.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }
}

/// Where and how the feed is read.
pub struct FeedConfig {
    /// The CA endpoint, `host:port`; the host is the name its certificate carries.
    pub address: String,
    pub token_file: PathBuf,
    pub node: String,
    pub state_dir: PathBuf,
}

/// Keeps `writer`'s store current from the operator's feed, for ever: retries with backoff
/// while the operator is away, keeping what it knew. `bundle` is the current trust bundle.
pub async fn feed(
    mut writer: Writer<Pod>,
    pods: Arc<NodePods>,
    config: FeedConfig,
    bundle: impl Fn() -> Option<String>,
    resolve: Resolver,
    changed: Arc<Notify>,
) {
    let pods_file = saved_pods(&config.state_dir);
    let bundle_file = config.state_dir.join(BUNDLE_FILE);
    let mut written = None;
    let mut retry = RETRY_MIN;
    loop {
        let built = write_bundle(&bundle_file, bundle(), &mut written)
            .and_then(|()| feed_client(&config, &bundle_file, &resolve));
        let (client, target) = match built {
            Ok(built) => built,
            Err(e) => {
                // The bundle and the operator's Service come from watches that fill at start.
                if matches!(e, FeedError::NoTrust | FeedError::Unresolved(_)) {
                    info!(reason = %e, "the pod feed waits");
                } else {
                    warn!(error = %e, "the pod feed cannot start; retrying");
                }
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
        };
        retry = RETRY_MIN;
        let selector = format!("spec.nodeName={}", config.node);
        let stream = watcher::watcher(
            Api::<Pod>::all(client),
            watcher::Config::default().fields(&selector),
        )
        .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut tick = tokio::time::interval(SAVE_EVERY);
        let mut dirty = false;
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(event)) => {
                        writer.apply_watcher_event(&event);
                        if matches!(event, Event::InitDone) && !pods.live.swap(true, Ordering::AcqRel) {
                            info!(pods = pods.store.state().len(), "the pod feed answered");
                        }
                        dirty = true;
                        changed.notify_one();
                    }
                    Some(Err(error)) => {
                        warn!(%error, "the pod feed failed; serving the last known pods and retrying");
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if dirty {
                        dirty = false;
                        save(&pods_file, &pods.store.state());
                    }
                    if let Err(e) = write_bundle(&bundle_file, bundle(), &mut written) {
                        warn!(error = %e, "cannot update the pod feed's trust bundle");
                    }
                    // The operator's Service was recreated with another address.
                    if resolve_target(&config.address, &resolve).is_ok_and(|now| now != target) {
                        info!("the operator's address changed; reconnecting the pod feed");
                        break;
                    }
                }
            }
        }
    }
}

/// Writes the trust bundle for kube's verifier when it changed.
fn write_bundle(
    path: &Path,
    bundle: Option<String>,
    written: &mut Option<String>,
) -> Result<(), FeedError> {
    let bundle = bundle.ok_or(FeedError::NoTrust)?;
    if written.as_ref() == Some(&bundle) {
        return Ok(());
    }
    crate::state::file::write_in_private_dir(path, bundle.as_bytes()).map_err(|source| {
        FeedError::Write {
            path: path.to_owned(),
            source,
        }
    })?;
    *written = Some(bundle);
    Ok(())
}

fn resolve_target(address: &str, resolve: &Resolver) -> Result<SocketAddr, FeedError> {
    let (host, port) = address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .ok_or_else(|| FeedError::Address {
            address: address.to_owned(),
            reason: "expected host:port".into(),
        })?;
    let ip = resolve(host).ok_or_else(|| FeedError::Unresolved(address.to_owned()))?;
    Ok(SocketAddr::new(ip, port))
}

/// A client of the operator's address (resolved as the SVID client resolves it), verifying its
/// certificate for the host name against the trust bundle, with the pod-bound token.
fn feed_client(
    config: &FeedConfig,
    bundle_file: &Path,
    resolve: &Resolver,
) -> Result<(kube::Client, SocketAddr), FeedError> {
    let target = resolve_target(&config.address, resolve)?;
    let host = config
        .address
        .rsplit_once(':')
        .map(|(host, _)| host.to_owned())
        .unwrap_or_default();
    let url = format!("https://{target}")
        .parse::<http::Uri>()
        .map_err(|e| FeedError::Address {
            address: config.address.clone(),
            reason: e.to_string(),
        })?;
    let bundle = std::fs::read(bundle_file).map_err(|source| FeedError::Read {
        path: bundle_file.to_owned(),
        source,
    })?;
    let roots: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&bundle)
        .filter_map(Result::ok)
        .map(|der| der.to_vec())
        .collect();
    if roots.is_empty() {
        return Err(FeedError::NoTrust);
    }
    let mut kube_config = kube::Config::new(url);
    kube_config.root_cert = Some(roots);
    kube_config.root_cert_file = Some(bundle_file.to_owned());
    kube_config.tls_server_name = Some(host);
    kube_config.read_timeout = Some(READ_TIMEOUT);
    kube_config.auth_info.token_file = Some(config.token_file.to_string_lossy().into_owned());
    Ok((kube::Client::try_from(kube_config)?, target))
}

/// Where the list is saved for a restart.
fn saved_pods(state_dir: &Path) -> SavedCache {
    SavedCache::at(state_dir.join(PODS_FILE))
}

/// Saves the list for a restart; a failure costs only that restart's knowledge. Without the
/// managed fields, which nothing here reads and which are most of a pod's size.
fn save(saved: &SavedCache, pods: &[Arc<Pod>]) {
    let list: Vec<Pod> = pods
        .iter()
        .map(|pod| {
            let mut pod = Pod::clone(pod);
            pod.metadata.managed_fields = None;
            pod
        })
        .collect();
    if let Err(error) = saved.save(&list) {
        warn!(path = %saved.path().display(), %error, "cannot save the node's pods");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[test]
    fn a_saved_list_is_served_but_not_live_and_a_bad_file_is_ignored() {
        let dir = std::env::temp_dir().join(format!("aether-node-pods-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (empty, _) = NodePods::load(&dir);
        assert!(empty.store().state().is_empty());

        let pod = |name: &str| {
            Arc::new(Pod {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("shop".into()),
                    ..ObjectMeta::default()
                },
                ..Pod::default()
            })
        };
        save(&saved_pods(&dir), &[pod("web-1"), pod("web-2")]);
        let (loaded, _) = NodePods::load(&dir);
        let mut names: Vec<String> = loaded
            .store()
            .state()
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        assert_eq!(names, ["web-1", "web-2"]);
        assert!(!loaded.is_live());

        std::fs::write(dir.join(PODS_FILE), b"[{").unwrap();
        assert!(NodePods::load(&dir).0.store().state().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_operator_address_is_host_and_port() {
        let resolve: Resolver = Arc::new(|host: &str| {
            (host == "aether-operator.aether-system.svc").then(|| "10.96.0.20".parse().unwrap())
        });
        assert_eq!(
            resolve_target("aether-operator.aether-system.svc:15012", &resolve).unwrap(),
            "10.96.0.20:15012".parse().unwrap()
        );
        assert!(matches!(
            resolve_target("elsewhere.svc:15012", &resolve),
            Err(FeedError::Unresolved(_))
        ));
        assert!(matches!(
            resolve_target("no-port", &resolve),
            Err(FeedError::Address { .. })
        ));
    }
}
