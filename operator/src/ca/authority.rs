//! The CA's in-memory state, built from one version of the root Secret: who signs, what is
//! trusted, and the endpoint's serving certificate. Replaced as a whole when roots change.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::PublicKeyData;
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::bundle::TrustBundle;
use super::cert::{CaCert, CertError, parse_ca_certs};
use super::config::CaConfig;
use super::issue::{self, RandomError};
use super::root::{RootError, SigningRoot};
use super::secret::{NEXT_KEY, PREVIOUS_KEY, RootMaterial};
use aether_core::identity::SpiffeId;

pub struct Authority {
    material: RootMaterial,
    root: SigningRoot,
    bundle: TrustBundle,
    bundle_pem: String,
    serving: Arc<CertifiedKey>,
    serving_renew_at: SystemTime,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("root", &self.root)
            .field("trusted_roots", &self.bundle.roots().len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("signing root (tls.crt/tls.key): {0}")]
    Root(#[from] RootError),
    #[error("{key}: {source}")]
    Trusted {
        key: &'static str,
        source: CertError,
    },
    #[error("cannot issue the serving certificate: {0}")]
    Serving(String),
    #[error(transparent)]
    Random(#[from] RandomError),
}

#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error(transparent)]
    Random(#[from] RandomError),
    #[error("cannot sign: {0}")]
    Sign(#[from] rcgen::Error),
}

/// A signed SVID.
#[derive(Debug, Clone)]
pub struct IssuedSvid {
    pub cert_pem: String,
    pub not_after: SystemTime,
}

/// What building an authority noticed without failing: expired extra roots it left out.
pub type Skipped = Vec<CaCert>;

impl Authority {
    pub fn build(
        material: RootMaterial,
        config: &CaConfig,
        now: SystemTime,
    ) -> Result<(Authority, Skipped), AuthorityError> {
        let root = SigningRoot::from_pem(&material.cert_pem, &material.key_pem, now)?;
        let mut others = Vec::new();
        for (key, pem) in [
            (PREVIOUS_KEY, &material.previous_pem),
            (NEXT_KEY, &material.next_pem),
        ] {
            if let Some(pem) = pem {
                others.extend(
                    parse_ca_certs(pem)
                        .map_err(|source| AuthorityError::Trusted { key, source })?,
                );
            }
        }
        let (bundle, skipped) = TrustBundle::new(root.cert(), others, now);
        let (serving, serving_renew_at) = serving_cert(&root, config, now)?;
        Ok((
            Authority {
                bundle_pem: bundle.pem(),
                material,
                root,
                bundle,
                serving,
                serving_renew_at,
            },
            skipped,
        ))
    }

    pub fn material(&self) -> &RootMaterial {
        &self.material
    }

    pub fn signing_root(&self) -> &CaCert {
        self.root.cert()
    }

    pub fn bundle(&self) -> &TrustBundle {
        &self.bundle
    }

    pub fn bundle_pem(&self) -> &str {
        &self.bundle_pem
    }

    pub fn serving_key(&self) -> Arc<CertifiedKey> {
        self.serving.clone()
    }

    pub fn serving_needs_renewal(&self, now: SystemTime) -> bool {
        now >= self.serving_renew_at
    }

    /// Signs `key` (from a verified CSR) for `id` and nothing else.
    pub fn issue_svid(
        &self,
        key: &impl PublicKeyData,
        id: &SpiffeId,
        ttl: Duration,
        now: SystemTime,
    ) -> Result<IssuedSvid, IssueError> {
        let validity = issue::validity(now, ttl, self.root.cert().not_after());
        let cert = issue::svid_params(id, validity, issue::random_serial()?)?
            .signed_by(key, self.root.issuer())?;
        Ok(IssuedSvid {
            cert_pem: cert.pem(),
            not_after: validity.not_after,
        })
    }
}

/// A fresh serving key and certificate from `root`, and when to replace it (at two thirds of
/// its life, so a slow reload loop still renews it in time).
fn serving_cert(
    root: &SigningRoot,
    config: &CaConfig,
    now: SystemTime,
) -> Result<(Arc<CertifiedKey>, SystemTime), AuthorityError> {
    let failed = |e: &dyn std::fmt::Display| AuthorityError::Serving(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
    let validity = issue::validity(now, config.serving_cert_ttl, root.cert().not_after());
    let cert = issue::serving_params(&config.server_names(), validity, issue::random_serial()?)
        .and_then(|params| params.signed_by(&key, root.issuer()))
        .map_err(|e| failed(&e))?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signer = any_supported_type(&der).map_err(|e| failed(&e))?;
    let lifetime = validity
        .not_after
        .duration_since(now)
        .unwrap_or(Duration::ZERO);
    Ok((
        Arc::new(CertifiedKey::new(vec![cert.der().clone()], signer)),
        now + lifetime * 2 / 3,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::csr::parse_csr;
    use crate::ca::root::generate_root;
    use rcgen::{CertificateParams, KeyPair, SanType};
    use rustls::RootCertStore;
    use rustls::pki_types::{CertificateDer, UnixTime};
    use rustls::server::WebPkiClientVerifier;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};

    const DAY: Duration = Duration::from_secs(86400);

    fn material(now: SystemTime) -> RootMaterial {
        let g = generate_root("cluster.local", now, 3650 * DAY).unwrap();
        RootMaterial {
            cert_pem: g.cert_pem,
            key_pem: g.key_pem,
            previous_pem: None,
            next_pem: None,
        }
    }

    fn der_of(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn issues_an_svid_that_verifies_against_the_bundle_whatever_the_csr_asked() {
        let now = SystemTime::now();
        let (ca, skipped) = Authority::build(material(now), &CaConfig::default(), now).unwrap();
        assert!(skipped.is_empty());

        let key = KeyPair::generate().unwrap();
        let mut asked = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
        asked.subject_alt_names.push(SanType::URI(
            "spiffe://cluster.local/ns/kube-system/sa/admin"
                .try_into()
                .unwrap(),
        ));
        asked.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let csr = parse_csr(&asked.serialize_request(&key).unwrap().pem().unwrap()).unwrap();

        let id = SpiffeId::new(
            "cluster.local",
            &aether_core::identity::ServiceAccount::new("shop", "web"),
        )
        .unwrap();
        let svid = ca.issue_svid(&csr, &id, DAY, now).unwrap();
        let der = der_of(&svid.cert_pem);

        let mut roots = RootCertStore::empty();
        for root in ca.bundle().roots() {
            roots.add(root.der().clone()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        verifier
            .verify_client_cert(&der, &[], UnixTime::now())
            .unwrap();

        let (_, x509) = X509Certificate::from_der(&der).unwrap();
        let sans = x509.subject_alternative_name().unwrap().unwrap().value;
        assert_eq!(
            sans.general_names,
            vec![GeneralName::URI("spiffe://cluster.local/ns/shop/sa/web")]
        );
        assert!(!x509.is_ca());
        assert_eq!(x509.public_key().raw, key.subject_public_key_info());
    }

    #[test]
    fn bundle_holds_previous_and_next_roots() {
        let now = SystemTime::now();
        let mut m = material(now);
        let (prev, next) = (material(now).cert_pem, material(now).cert_pem);
        m.previous_pem = Some(prev.clone());
        m.next_pem = Some(next.clone());
        let (ca, _) = Authority::build(m.clone(), &CaConfig::default(), now).unwrap();
        assert_eq!(ca.bundle().roots().len(), 3);
        assert_eq!(
            ca.bundle_pem().replace('\r', ""),
            format!("{}{prev}{next}", m.cert_pem).replace('\r', "")
        );

        m.next_pem = Some("junk".into());
        assert!(matches!(
            Authority::build(m, &CaConfig::default(), now),
            Err(AuthorityError::Trusted { key: NEXT_KEY, .. })
        ));
    }

    #[test]
    fn svid_never_outlives_the_root() {
        let now = SystemTime::now();
        let g = generate_root("cluster.local", now, 2 * DAY).unwrap();
        let m = RootMaterial {
            cert_pem: g.cert_pem,
            key_pem: g.key_pem,
            previous_pem: None,
            next_pem: None,
        };
        let config = CaConfig {
            serving_cert_ttl: DAY,
            ..CaConfig::default()
        };
        let (ca, _) = Authority::build(m, &config, now).unwrap();
        let key = KeyPair::generate().unwrap();
        let csr = parse_csr(
            &CertificateParams::default()
                .serialize_request(&key)
                .unwrap()
                .pem()
                .unwrap(),
        )
        .unwrap();
        let id = SpiffeId::new(
            "cluster.local",
            &aether_core::identity::ServiceAccount::new("a", "b"),
        )
        .unwrap();
        let svid = ca.issue_svid(&csr, &id, 30 * DAY, now).unwrap();
        assert!(svid.not_after <= ca.signing_root().not_after());
        assert!(!ca.serving_needs_renewal(now));
        assert!(ca.serving_needs_renewal(now + DAY));
    }
}
