//! SVIDs kept across a restart of the proxy, so that a proxy restarted while the certificate
//! authority cannot issue (it needs the API server to review the proxy's token) still presents
//! its pods' identities.
//!
//! They are kept in the proxy pod's memory-backed volume (the chart's `holder` emptyDir,
//! `medium: Memory`), never on the node's disk: a disk outlives the pod (node images, backups,
//! a machine handed back), and a private key must not. The volume lives as long as the pod, so
//! a crash or a kill of the proxy's container keeps the SVIDs and the pod's deletion (a rolling
//! update, an uninstall) takes them away. Each file is readable by root only.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tracing::{info, warn};

use super::ServiceAccount;
use super::svid::Issued;
use super::tls::Certs;

/// The directory SVIDs are kept in; without one, nothing is kept.
#[derive(Clone, Debug, Default)]
pub struct KeptSvids {
    dir: Option<PathBuf>,
}

impl KeptSvids {
    pub fn new(dir: Option<PathBuf>) -> KeptSvids {
        KeptSvids { dir }
    }

    fn path(dir: &Path, sa: &ServiceAccount) -> PathBuf {
        // A namespace name has no dot; the ServiceAccount's name may.
        dir.join(format!("{}.{}.pem", sa.namespace, sa.name))
    }

    /// Keeps `sa`'s SVID (its chain and key, `issued.pem`) in place of the one kept before.
    pub fn keep(&self, sa: &ServiceAccount, issued: &Issued) {
        let Some(dir) = &self.dir else { return };
        let path = KeptSvids::path(dir, sa);
        if let Err(e) = crate::state::file::write_in_private_dir(&path, issued.pem.as_bytes()) {
            warn!(service_account = %sa, path = %path.display(), error = %e, "cannot keep the SVID for a restart");
        }
    }

    /// Forgets `sa`'s SVID (its last pod left the node).
    pub fn forget(&self, sa: &ServiceAccount) {
        let Some(dir) = &self.dir else { return };
        let path = KeptSvids::path(dir, sa);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(service_account = %sa, path = %path.display(), error = %e, "cannot remove a kept SVID");
        }
    }

    /// Installs in `certs` every kept SVID still valid at `now`, and removes the others; returns
    /// the ServiceAccounts restored with when each is to be renewed. The identity is the one
    /// the certificate names, not the file's name.
    pub fn restore(&self, certs: &Certs, now: SystemTime) -> Vec<(ServiceAccount, SystemTime)> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "cannot read the kept SVIDs");
                return Vec::new();
            }
        };
        let trust_domain = certs.trust().trust_domain().to_owned();
        let mut restored = Vec::new();
        for path in entries.flatten().map(|entry| entry.path()) {
            if path.extension().is_none_or(|e| e != "pem") {
                continue;
            }
            match restore_one(&path, certs, &trust_domain, now) {
                Ok((sa, renew_at)) => {
                    info!(service_account = %sa, "restored the SVID kept by the proxy before");
                    restored.push((sa, renew_at));
                }
                Err(why) => {
                    warn!(path = %path.display(), why, "dropping a kept SVID");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        restored
    }
}

fn restore_one(
    path: &Path,
    certs: &Certs,
    trust_domain: &str,
    now: SystemTime,
) -> Result<(ServiceAccount, SystemTime), String> {
    let pem = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let issued = Issued::from_pem(pem).map_err(|e| e.to_string())?;
    if issued.not_after <= now {
        return Err("it has expired".into());
    }
    let leaf = issued.chain.first().ok_or("no certificate")?;
    let ids = super::spiffe_ids(leaf);
    let [id] = ids.as_slice() else {
        return Err(format!("its certificate names {} SPIFFE IDs", ids.len()));
    };
    let sa = ServiceAccount::from_spiffe_id(trust_domain, id)
        .ok_or_else(|| format!("{id} is no ServiceAccount of {trust_domain}"))?;
    let renew_at = issued.renew_at(now);
    certs
        .install(&sa, issued.chain, issued.key)
        .map_err(|e| e.to_string())?;
    Ok((sa, renew_at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tls::TrustStore;
    use rcgen::{CertificateParams, KeyPair, SanType};
    use std::time::Duration;

    fn svid(uri: &str, not_after: SystemTime) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        params.not_after = not_after.into();
        let cert = params.self_signed(&key).unwrap();
        Issued::from_pem(cert.pem() + &key.serialize_pem()).unwrap()
    }

    /// What is kept comes back after a restart under the identity its certificate names;
    /// an expired, foreign or forgotten SVID does not, and its file goes.
    #[test]
    fn kept_svids_are_restored_only_while_valid_and_of_the_mesh() {
        let dir = std::env::temp_dir().join(format!("aether-kept-{}", std::process::id()));
        let kept = KeptSvids::new(Some(dir.clone()));
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        let (web, db, old) = (
            ServiceAccount::new("shop", "web"),
            ServiceAccount::new("shop", "db"),
            ServiceAccount::new("shop", "old"),
        );
        kept.keep(
            &web,
            &svid("spiffe://cluster.local/ns/shop/sa/web", now + hour),
        );
        kept.keep(
            &db,
            &svid("spiffe://cluster.local/ns/shop/sa/db", now + hour),
        );
        kept.forget(&db);
        kept.keep(
            &old,
            &svid("spiffe://cluster.local/ns/shop/sa/old", now - hour),
        );
        // A file that says one ServiceAccount and holds another's certificate.
        kept.keep(
            &ServiceAccount::new("shop", "api"),
            &svid("spiffe://other.domain/ns/shop/sa/api", now + hour),
        );

        let certs = Certs::new(TrustStore::new("cluster.local"));
        let restored = kept.restore(&certs, now);
        let names: Vec<_> = restored.iter().map(|(sa, _)| sa.clone()).collect();
        assert_eq!(names, std::slice::from_ref(&web));
        assert!(certs.has(&web) && !certs.has(&db) && !certs.has(&old));
        let renew_at = restored[0].1;
        assert!(
            renew_at > now + hour / 3 && renew_at < now + hour,
            "renewed half-way"
        );
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(files.len(), 1, "only the restored SVID's file is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
