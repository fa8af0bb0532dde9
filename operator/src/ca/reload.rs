//! Follows the root Secret: a rotation (new signing root, previous/next roots added or
//! removed) replaces the authority and republishes the bundle; the serving certificate is
//! renewed before it expires; a hand-edited bundle ConfigMap is put back.
//!
//! The bundle has one writer: the leader, and only right after it read the Secret and holds
//! its roots. A replica that cannot read the Secret, or finds it unusable, keeps signing with
//! the roots it has but publishes nothing, so stale roots never overwrite a rotation.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;
use tracing::{error, info, warn};

use super::authority::{Authority, Skipped};
use super::config::CaConfig;
use super::store;

pub async fn reload_loop(
    client: kube::Client,
    config: Arc<CaConfig>,
    authority: watch::Sender<Arc<Authority>>,
    mut leading: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(config.reload_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut election_over = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // A new leader publishes at once, not a reload interval later.
            changed = leading.changed(), if !election_over => {
                election_over = changed.is_err();
                if !*leading.borrow_and_update() {
                    continue;
                }
            }
            _ = super::until_stopped(&mut shutdown) => return,
        }
        let fresh = reload_once(&client, &config, &authority).await;
        if fresh && *leading.borrow() {
            publish(&client, &config, &authority).await;
        }
    }
}

/// Re-reads the root Secret; whether the authority now holds exactly its roots.
async fn reload_once(
    client: &kube::Client,
    config: &CaConfig,
    authority: &watch::Sender<Arc<Authority>>,
) -> bool {
    let now = SystemTime::now();
    let current = authority.borrow().clone();
    match store::read_root(client, config).await {
        Ok(Some(material)) => {
            let rotated = material != *current.material();
            if !rotated && !current.serving_needs_renewal(now) {
                return true;
            }
            match Authority::build(material, config, now) {
                Ok((next, skipped)) => {
                    log_skipped(&skipped);
                    if rotated {
                        info!(
                            signing_root = next.signing_root().subject(),
                            trusted_roots = next.bundle().roots().len(),
                            "root Secret changed; using the new roots"
                        );
                    } else {
                        info!("renewed the CA endpoint's serving certificate");
                    }
                    authority.send_replace(Arc::new(next));
                    true
                }
                // A broken edit must not take signing down: keep the last good roots.
                Err(e) => {
                    error!(
                        secret = config.secret_name,
                        error = %e,
                        "root Secret is unusable; still using the previous roots"
                    );
                    !rotated
                }
            }
        }
        // Recreating it would silently mint a new root and break trust: say so and carry on.
        Ok(None) => {
            warn!(
                secret = config.secret_name,
                "root Secret is gone; still using the roots in memory"
            );
            false
        }
        Err(e) => {
            warn!(error = %e, "cannot re-read the root Secret");
            false
        }
    }
}

async fn publish(
    client: &kube::Client,
    config: &CaConfig,
    authority: &watch::Sender<Arc<Authority>>,
) {
    let bundle = authority.borrow().bundle_pem().to_owned();
    match store::publish_bundle(client, config, &bundle).await {
        Ok(true) => info!(
            config_map = config.bundle_config_map,
            "published the trust bundle"
        ),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "cannot publish the trust bundle"),
    }
}

/// Expired previous/next roots are left out of the bundle; an operator should clean them up.
pub fn log_skipped(skipped: &Skipped) {
    for cert in skipped {
        warn!(
            root = cert.subject(),
            "expired root left out of the trust bundle; remove it from the root Secret"
        );
    }
}
