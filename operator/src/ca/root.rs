//! The signing root: generated at first start, or loaded from what the user supplied.

use std::time::{Duration, SystemTime};

use rcgen::{Issuer, KeyPair, PKCS_ECDSA_P256_SHA256, PublicKeyData};

use super::cert::{CaCert, CertError, parse_ca_certs};
use super::issue::{self, RandomError};

/// A root the CA signs with: its certificate and an rcgen issuer holding its key.
pub struct SigningRoot {
    cert: CaCert,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for SigningRoot {
    // The issuer holds the private key: never let it reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningRoot")
            .field("subject", &self.cert.subject())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("certificate: {0}")]
    Cert(#[from] CertError),
    #[error("expected exactly one certificate (the signing root), found {0}")]
    NotOneCertificate(usize),
    #[error(
        "private key is not a PKCS#8 (\"BEGIN PRIVATE KEY\") ECDSA, Ed25519 or RSA key: {0} \
         (convert with `openssl pkcs8 -topk8 -nocrypt`)"
    )]
    Key(rcgen::Error),
    #[error("private key does not belong to the certificate {0:?}")]
    KeyMismatch(String),
    #[error("root {0:?} has expired")]
    Expired(String),
    #[error("cannot build an issuer from the root: {0}")]
    Issuer(rcgen::Error),
    #[error("cannot generate a root: {0}")]
    Generate(rcgen::Error),
    #[error(transparent)]
    Random(#[from] RandomError),
}

impl SigningRoot {
    /// Loads a root from PEM, checking it can actually sign: a CA, matching key, not expired.
    pub fn from_pem(cert_pem: &str, key_pem: &str, now: SystemTime) -> Result<Self, RootError> {
        let mut certs = parse_ca_certs(cert_pem)?;
        if certs.len() != 1 {
            return Err(RootError::NotOneCertificate(certs.len()));
        }
        let cert = certs.remove(0);
        if cert.is_expired(now) {
            return Err(RootError::Expired(cert.subject().to_owned()));
        }
        let key = KeyPair::from_pem(key_pem).map_err(RootError::Key)?;
        if key.subject_public_key_info() != cert.spki() {
            return Err(RootError::KeyMismatch(cert.subject().to_owned()));
        }
        // From the certificate, not fresh params: issued certificates must name the issuer
        // exactly as the root's subject and use its key identifier.
        let issuer = Issuer::from_ca_cert_der(cert.der(), key).map_err(RootError::Issuer)?;
        Ok(SigningRoot { cert, issuer })
    }

    pub fn cert(&self) -> &CaCert {
        &self.cert
    }

    pub fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

/// A freshly generated root, as PEM, ready to be stored.
pub struct GeneratedRoot {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A new ECDSA P-256 self-signed root for `trust_domain`, valid for `ttl`.
pub fn generate_root(
    trust_domain: &str,
    now: SystemTime,
    ttl: Duration,
) -> Result<GeneratedRoot, RootError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(RootError::Generate)?;
    let validity = issue::validity(now, ttl, now + ttl);
    let cert = issue::root_params(trust_domain, validity, issue::random_serial()?)
        .self_signed(&key)
        .map_err(RootError::Generate)?;
    Ok(GeneratedRoot {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

    #[test]
    fn generated_root_loads_back() {
        let now = SystemTime::now();
        let root = generate_root("cluster.local", now, YEAR).unwrap();
        let loaded = SigningRoot::from_pem(&root.cert_pem, &root.key_pem, now).unwrap();
        assert_eq!(
            loaded.cert().subject(),
            "O=aether, CN=aether root CA cluster.local"
        );
        assert!(!format!("{loaded:?}").contains("PRIVATE"));
    }

    #[test]
    fn rejects_mismatched_key_expired_root_and_bad_key() {
        let now = SystemTime::now();
        let a = generate_root("cluster.local", now, YEAR).unwrap();
        let b = generate_root("cluster.local", now, YEAR).unwrap();
        assert!(matches!(
            SigningRoot::from_pem(&a.cert_pem, &b.key_pem, now),
            Err(RootError::KeyMismatch(_))
        ));
        assert!(matches!(
            SigningRoot::from_pem(&a.cert_pem, &a.key_pem, now + 2 * YEAR),
            Err(RootError::Expired(_))
        ));
        assert!(matches!(
            SigningRoot::from_pem(&a.cert_pem, "garbage", now),
            Err(RootError::Key(_))
        ));
        let two = format!("{}{}", a.cert_pem, b.cert_pem);
        assert!(matches!(
            SigningRoot::from_pem(&two, &a.key_pem, now),
            Err(RootError::NotOneCertificate(2))
        ));
    }
}
