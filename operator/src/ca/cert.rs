//! CA certificates read from PEM: the roots we sign with or trust.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::pem;

/// A parsed CA certificate: self-contained, so the rest of the CA never re-parses DER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaCert {
    der: CertificateDer<'static>,
    subject: String,
    not_after: SystemTime,
    spki: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("no PEM CERTIFICATE block found")]
    NoCertificate,
    #[error("invalid PEM: {0}")]
    Pem(String),
    #[error("not an X.509 certificate: {0}")]
    X509(String),
    #[error("certificate {0:?} is not a CA (basicConstraints CA:TRUE is required)")]
    NotCa(String),
    #[error("certificate {0:?} may not sign certificates (keyUsage lacks keyCertSign)")]
    NoCertSign(String),
}

impl CaCert {
    pub fn from_der(der: CertificateDer<'static>) -> Result<Self, CertError> {
        let (rest, x509) =
            X509Certificate::from_der(&der).map_err(|e| CertError::X509(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CertError::X509(
                "trailing bytes after the certificate".into(),
            ));
        }
        let subject = x509.subject().to_string();
        let is_ca = x509
            .basic_constraints()
            .map_err(|e| CertError::X509(e.to_string()))?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(CertError::NotCa(subject));
        }
        let key_usage = x509
            .key_usage()
            .map_err(|e| CertError::X509(e.to_string()))?;
        // RFC 5280 4.2.1.3: without the extension every usage is allowed.
        if key_usage.is_some_and(|ku| !ku.value.key_cert_sign()) {
            return Err(CertError::NoCertSign(subject));
        }
        let validity = x509.validity();
        let not_after = to_system_time(validity.not_after.timestamp());
        let spki = x509.public_key().raw.to_vec();
        Ok(CaCert {
            der,
            subject,
            not_after,
            spki,
        })
    }

    pub fn der(&self) -> &CertificateDer<'static> {
        &self.der
    }

    pub fn pem(&self) -> String {
        pem::encode("CERTIFICATE", &self.der)
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    pub fn is_expired(&self, now: SystemTime) -> bool {
        now > self.not_after
    }

    /// DER SubjectPublicKeyInfo, to check a private key belongs to this certificate.
    pub fn spki(&self) -> &[u8] {
        &self.spki
    }
}

/// Every CERTIFICATE block of `pem`, each required to be a CA; other block kinds are ignored.
pub fn parse_ca_certs(pem: &str) -> Result<Vec<CaCert>, CertError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|der| {
            der.map_err(|e| CertError::Pem(e.to_string()))
                .and_then(CaCert::from_der)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate);
    }
    Ok(certs)
}

/// x509 times before 1970 only occur in broken certificates; clamping them to the epoch
/// keeps the comparison logic total.
fn to_system_time(unix: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(unix).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};

    fn self_signed(params: CertificateParams) -> String {
        params
            .self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .pem()
    }

    #[test]
    fn accepts_ca_and_round_trips_pem() {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let pem = self_signed(params);
        let certs = parse_ca_certs(&pem).unwrap();
        assert_eq!(certs.len(), 1);
        assert_eq!(certs[0].pem().replace('\r', ""), pem.replace('\r', ""));
        assert!(!certs[0].is_expired(SystemTime::now()));
    }

    #[test]
    fn rejects_leaf_and_non_signing_ca_and_garbage() {
        let leaf = self_signed(CertificateParams::default());
        assert!(matches!(parse_ca_certs(&leaf), Err(CertError::NotCa(_))));

        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        assert!(matches!(
            parse_ca_certs(&self_signed(params)),
            Err(CertError::NoCertSign(_))
        ));

        assert!(matches!(
            parse_ca_certs("hello"),
            Err(CertError::NoCertificate)
        ));
        assert!(
            parse_ca_certs("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                .is_err()
        );
    }
}
