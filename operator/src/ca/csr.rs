//! Validation of the caller's PKCS#10 certificate signing request.
//!
//! Only two things are taken from a CSR: its public key, and the proof (its signature) that
//! the caller holds the matching private key. Its subject, SANs and extensions are never
//! read, so a CSR cannot ask for more than the identity the CA decides on.

use rcgen::{
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ED25519, PKCS_RSA_SHA256, PublicKeyData,
    SignatureAlgorithm, SubjectPublicKeyInfo,
};
use rustls::pki_types::CertificateSigningRequestDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

/// Smallest RSA modulus we sign for (NIST SP 800-57: 2048 bits until 2030).
const MIN_RSA_BITS: usize = 2048;

/// Key algorithms rustls/webpki verify on both sides of the mesh.
static ACCEPTED: [&SignatureAlgorithm; 4] = [
    &PKCS_ECDSA_P256_SHA256,
    &PKCS_ECDSA_P384_SHA384,
    &PKCS_ED25519,
    &PKCS_RSA_SHA256,
];

/// The public key of a CSR whose signature checked out.
#[derive(Debug)]
pub struct ValidCsr {
    key: SubjectPublicKeyInfo,
}

impl PublicKeyData for ValidCsr {
    fn der_bytes(&self) -> &[u8] {
        self.key.der_bytes()
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.key.algorithm()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CsrError {
    #[error("csr is not a PEM CERTIFICATE REQUEST: {0}")]
    Pem(String),
    #[error("csr is not a valid PKCS#10 request: {0}")]
    Der(String),
    #[error("csr signature does not verify: the request must be signed with the key it carries")]
    Signature,
    #[error("csr key type is not supported (use ECDSA P-256/P-384, Ed25519 or RSA >= 2048)")]
    UnsupportedKey,
    #[error("csr RSA key has {0} bits; at least {MIN_RSA_BITS} are required")]
    WeakRsaKey(usize),
}

/// Parses and verifies a PEM CSR.
pub fn parse_csr(pem: &str) -> Result<ValidCsr, CsrError> {
    let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| CsrError::Pem(e.to_string()))?;
    let (rest, csr) = X509CertificationRequest::from_der(der.as_ref())
        .map_err(|e| CsrError::Der(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::Der("trailing bytes after the request".into()));
    }
    // The key is checked first: a weak key deserves a clearer answer than a failed signature
    // (ring refuses to verify with RSA keys under 2048 bits).
    let spki = &csr.certification_request_info.subject_pki;
    if let Ok(PublicKey::RSA(rsa)) = spki.parsed() {
        let bits = rsa.key_size();
        if bits < MIN_RSA_BITS {
            return Err(CsrError::WeakRsaKey(bits));
        }
    }
    let key = SubjectPublicKeyInfo::from_der(spki.raw).map_err(|_| CsrError::UnsupportedKey)?;
    if !ACCEPTED.contains(&key.algorithm()) {
        return Err(CsrError::UnsupportedKey);
    }
    csr.verify_signature().map_err(|_| CsrError::Signature)?;
    Ok(ValidCsr { key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn csr_for(key: &KeyPair) -> String {
        CertificateParams::new(vec!["evil.example".to_string()])
            .unwrap()
            .serialize_request(key)
            .unwrap()
            .pem()
            .unwrap()
    }

    #[test]
    fn accepts_ecdsa_and_ed25519() {
        for alg in [
            &PKCS_ECDSA_P256_SHA256,
            &PKCS_ECDSA_P384_SHA384,
            &PKCS_ED25519,
        ] {
            let key = KeyPair::generate_for(alg).unwrap();
            let csr = parse_csr(&csr_for(&key)).unwrap();
            assert_eq!(csr.der_bytes(), key.der_bytes());
        }
    }

    /// `openssl req -new -newkey rsa:2048 -nodes -subj /CN=rsa`
    const RSA_2048_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\n\
MIICUzCCATsCAQAwDjEMMAoGA1UEAwwDcnNhMIIBIjANBgkqhkiG9w0BAQEFAAOC\n\
AQ8AMIIBCgKCAQEA2tcGdl01E0c8Jx1v9liYfwGHsxeiMwWIdnfcXvjXuJnCMHFY\n\
Oo/2bPdNIxIg8F/b6AgGJd7L9O1I/4lF0Mt2BzP6SLYjIz/HKKOprWcML6S4sd4z\n\
/JuW29MLH8ICqcCG6xdWTjJD5oa1w4ZDsEAbOnuXve9HXTJcUfAJUv8/W071iJfI\n\
Iiwg/wo07KTbsxTkgu8zQC9OEG+oqx772Vw6Suq3VTbIqjOqapOAHgMn2HPBGuyf\n\
QM8RVcStkzLirg74l4ToiHKvBXef3xOmzFUFlUiqg7aQLRZczmbqnr0fCJkZSgjK\n\
4uHaZwBS+TUisYckikhzs6HQnmHVDyoLvU+ltQIDAQABoAAwDQYJKoZIhvcNAQEL\n\
BQADggEBACC/hUVmw+WILCKdQQffIboRQjmGOEGfHWqQvCvWbrh+0edAoUQEX70Q\n\
0KXRmx40sfNy8P+S/8Dt5aQUeOq44ax7qk1Ez1kQ3Mg+mlMJ4p7mmUOUlIcoRMUx\n\
KdwrIhj844cDomrlcvKnPRel3ESQaQi7Wb0Jv9ig69b1LbUHwkdHVkJxNAzfGqUx\n\
wuOKeN3aKlkwsYWif2i4uMoADoCdh6A9SSS4RtG0gRQ+SwTyJX9kjGG/vNfpj7xB\n\
PKdt6AgchEQBvLZ0lOMkK/CbiF9B9PfBKhmn2Xmw+dg1ismwizS7bH/tC4cBvq1N\n\
mVZ88J4LRfxw1k5cOP4soFGmqxrICsk=\n\
-----END CERTIFICATE REQUEST-----\n\
";
    /// `openssl req -new -newkey rsa:1024 -nodes -subj /CN=weak`
    const RSA_1024_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\n\
MIIBTjCBuAIBADAPMQ0wCwYDVQQDDAR3ZWFrMIGfMA0GCSqGSIb3DQEBAQUAA4GN\n\
ADCBiQKBgQDEXv+jLBmaHof4Pr/N/4Bj8OZEs1XqhZdI0GHJ0aj5odeZ9HeEycCU\n\
jgXuok9ssYL0YodvMNTCb0egs3wZn4Woq8NQ+ED2yB5yRfO0nwyMDe6xwvWSrSy/\n\
DxeDHCYWFl7lr/H/2/Pak0KGB4cJbJ5jT+ZdUgITW0x4xxpOSG6L0QIDAQABoAAw\n\
DQYJKoZIhvcNAQELBQADgYEAeeohztrFXUdAVpncC03PTXM+uf1lp5VRYGS5jL1I\n\
Qw8Am+135EKCTAsI7ehcvlrgIG5cfLiuOL7UDmZnmbpXXUz5STy7/fU8vEGaeSKA\n\
AwWB/LbuqAD7qFnhVXGv8MRO7tBFli8M4lRTWnqAD4aLSWC9tBzuKuKjRBAhXsfa\n\
tbM=\n\
-----END CERTIFICATE REQUEST-----\n\
";

    #[test]
    fn rsa_needs_2048_bits() {
        assert!(parse_csr(RSA_2048_CSR).is_ok());
        assert_eq!(
            parse_csr(RSA_1024_CSR).unwrap_err(),
            CsrError::WeakRsaKey(1024)
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(parse_csr("not a csr"), Err(CsrError::Pem(_))));
        let junk = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
        assert!(matches!(parse_csr(junk), Err(CsrError::Der(_))));
        // A certificate is not a request.
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::default()
            .self_signed(&key)
            .unwrap()
            .pem();
        assert!(matches!(parse_csr(&cert), Err(CsrError::Pem(_))));
    }

    #[test]
    fn rejects_a_tampered_request() {
        let key = KeyPair::generate().unwrap();
        let pem = csr_for(&key);
        let mut der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec();
        // Flip one byte inside the signed subject: the DER stays well formed.
        let at = der
            .windows(b"evil".len())
            .position(|w| w == b"evil")
            .unwrap();
        der[at] = b'E';
        let tampered = super::super::pem::encode("CERTIFICATE REQUEST", &der);
        assert_eq!(parse_csr(&tampered).unwrap_err(), CsrError::Signature);
    }
}
