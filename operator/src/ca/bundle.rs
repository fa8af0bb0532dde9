//! The trust bundle: every root a peer must accept, and the ConfigMap it is published in.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

use super::cert::CaCert;

/// The ConfigMap key holding the PEM bundle (the name kube-root-ca.crt also uses).
pub const BUNDLE_KEY: &str = "ca.crt";

/// Roots in a stable order: the signing root first, then the others as listed in the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    roots: Vec<CaCert>,
}

impl TrustBundle {
    /// The signing root plus `others` (previous and next roots), without duplicates.
    /// Expired others are left out and returned, so the caller can say so: they can no
    /// longer vouch for anything and only make the bundle larger.
    pub fn new(
        signing: &CaCert,
        others: impl IntoIterator<Item = CaCert>,
        now: SystemTime,
    ) -> (TrustBundle, Vec<CaCert>) {
        let mut roots = vec![signing.clone()];
        let mut expired = Vec::new();
        for cert in others {
            if cert.is_expired(now) {
                expired.push(cert);
            } else if !roots.iter().any(|r| r.der() == cert.der()) {
                roots.push(cert);
            }
        }
        (TrustBundle { roots }, expired)
    }

    pub fn roots(&self) -> &[CaCert] {
        &self.roots
    }

    pub fn pem(&self) -> String {
        self.roots.iter().map(CaCert::pem).collect()
    }
}

/// The ConfigMap publishing `bundle_pem`; it holds public certificates only.
pub fn config_map(namespace: &str, name: &str, bundle_pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/part-of".to_owned(), "aether".to_owned()),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "aether-operator".to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            BUNDLE_KEY.to_owned(),
            bundle_pem.to_owned(),
        )])),
        ..ConfigMap::default()
    }
}

/// Whether the published ConfigMap already carries `bundle_pem`: writes happen only on change.
pub fn is_published(existing: Option<&ConfigMap>, bundle_pem: &str) -> bool {
    existing
        .and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get(BUNDLE_KEY))
        .is_some_and(|pem| pem == bundle_pem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::cert::parse_ca_certs;
    use crate::ca::root::generate_root;
    use std::time::Duration;

    fn root(now: SystemTime, ttl: Duration) -> CaCert {
        let g = generate_root("cluster.local", now, ttl).unwrap();
        parse_ca_certs(&g.cert_pem).unwrap().remove(0)
    }

    #[test]
    fn unions_dedups_and_drops_expired() {
        let now = SystemTime::now();
        let day = Duration::from_secs(86400);
        let (current, next, old) = (root(now, day), root(now, day), root(now - 3 * day, day));
        let (bundle, expired) =
            TrustBundle::new(&current, [next.clone(), current.clone(), old.clone()], now);
        assert_eq!(bundle.roots(), &[current.clone(), next.clone()]);
        assert_eq!(expired, vec![old]);
        assert_eq!(bundle.pem(), format!("{}{}", current.pem(), next.pem()));
    }

    #[test]
    fn publishes_only_on_change() {
        let cm = config_map("aether-system", "aether-trust-bundle", "PEM");
        assert!(is_published(Some(&cm), "PEM"));
        assert!(!is_published(Some(&cm), "OTHER"));
        assert!(!is_published(None, "PEM"));
    }
}
