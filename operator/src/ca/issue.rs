//! What goes into the certificates the CA makes: the root, the SVIDs and the endpoint's own
//! serving certificate. Pure parameter builders; the signing itself is one rcgen call.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyUsagePurpose, SanType, SerialNumber,
};

use aether_core::identity::SpiffeId;

/// Issued certificates start this far in the past, so a peer whose clock is a little behind
/// ours does not reject a certificate as not yet valid.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// `ttl` from `now`, never past `cap` (the issuer's expiry: a certificate cannot usefully
/// outlive the root that vouches for it).
pub fn validity(now: SystemTime, ttl: Duration, cap: SystemTime) -> Validity {
    Validity {
        not_before: now.checked_sub(BACKDATE).unwrap_or(now),
        not_after: (now + ttl).min(cap),
    }
}

/// A self-signed root: CA:true with path length 0, because the CA signs leaves directly and
/// no intermediate should ever chain to it.
pub fn root_params(
    trust_domain: &str,
    validity: Validity,
    serial: SerialNumber,
) -> CertificateParams {
    let mut params = base(validity, serial);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "aether");
    dn.push(DnType::CommonName, format!("aether root CA {trust_domain}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// An X509-SVID: exactly one URI SAN (the SPIFFE ID), usable as both TLS server and client
/// (webpki checks the EKU on both sides of the mesh's mTLS), and never a CA.
/// Whatever the CSR asked for is deliberately not an input here.
pub fn svid_params(
    id: &SpiffeId,
    validity: Validity,
    serial: SerialNumber,
) -> Result<CertificateParams, rcgen::Error> {
    let mut params = leaf(validity, serial);
    params.subject_alt_names = vec![SanType::URI(id.uri().try_into()?)];
    Ok(params)
}

/// The CA endpoint's own certificate, for the DNS names of the operator's Service.
pub fn serving_params(
    dns_names: &[String],
    validity: Validity,
    serial: SerialNumber,
) -> Result<CertificateParams, rcgen::Error> {
    let mut params = leaf(validity, serial);
    params.subject_alt_names = dns_names
        .iter()
        .map(|name| Ok(SanType::DnsName(name.clone().try_into()?)))
        .collect::<Result<_, rcgen::Error>>()?;
    Ok(params)
}

fn leaf(validity: Validity, serial: SerialNumber) -> CertificateParams {
    let mut params = base(validity, serial);
    let mut dn = DistinguishedName::new();
    // SPIFFE leaves carry their identity in the SAN; the subject only helps humans reading
    // `openssl x509 -text`.
    dn.push(DnType::OrganizationName, "aether");
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    // digitalSignature only: the SPIFFE X509-SVID spec requires it, and every TLS handshake
    // rustls does is (EC)DHE, so an SVID key never enciphers.
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params
}

fn base(validity: Validity, serial: SerialNumber) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.not_before = validity.not_before.into();
    params.not_after = validity.not_after.into();
    params.serial_number = Some(serial);
    params
}

#[derive(Debug, thiserror::Error)]
#[error("the system random number generator failed")]
pub struct RandomError;

/// A random positive 128-bit serial (RFC 5280 allows up to 20 octets), so two certificates
/// for the same key and name are still distinguishable.
pub fn random_serial() -> Result<SerialNumber, RandomError> {
    let mut bytes = [0u8; 16];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| RandomError)?;
    // A clear top bit keeps the DER INTEGER positive without a padding byte; a set second
    // bit keeps it exactly 16 octets long.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::KeyPair;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};

    const NOW: Duration = Duration::from_secs(1_800_000_000);

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + NOW
    }

    #[test]
    fn validity_is_backdated_and_capped() {
        let v = validity(
            now(),
            Duration::from_secs(3600),
            now() + Duration::from_secs(60),
        );
        assert_eq!(v.not_before, now() - BACKDATE);
        assert_eq!(v.not_after, now() + Duration::from_secs(60));
        let v = validity(
            now(),
            Duration::from_secs(3600),
            now() + Duration::from_secs(7200),
        );
        assert_eq!(v.not_after, now() + Duration::from_secs(3600));
    }

    #[test]
    fn svid_has_one_spiffe_san_and_both_ekus() {
        let id = SpiffeId::new(
            "cluster.local",
            &aether_core::identity::ServiceAccount::new("ns1", "web"),
        )
        .unwrap();
        let v = validity(
            now(),
            Duration::from_secs(86400),
            now() + Duration::from_secs(86400 * 10),
        );
        let params = svid_params(&id, v, random_serial().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (_, x509) = X509Certificate::from_der(cert.der()).unwrap();
        let san = x509.subject_alternative_name().unwrap().unwrap();
        assert_eq!(
            san.value.general_names,
            vec![GeneralName::URI("spiffe://cluster.local/ns/ns1/sa/web")]
        );
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth && !eku.any);
        assert!(!x509.is_ca());
        assert_eq!(
            x509.validity().not_after.timestamp(),
            (NOW.as_secs() + 86400) as i64
        );
    }

    #[test]
    fn root_is_a_path_len_zero_ca() {
        let v = validity(
            now(),
            Duration::from_secs(86400),
            now() + Duration::from_secs(86400),
        );
        let cert = root_params("cluster.local", v, random_serial().unwrap())
            .self_signed(&KeyPair::generate().unwrap())
            .unwrap();
        let (_, x509) = X509Certificate::from_der(cert.der()).unwrap();
        let bc = x509.basic_constraints().unwrap().unwrap().value;
        assert!(bc.ca);
        assert_eq!(bc.path_len_constraint, Some(0));
        assert!(x509.key_usage().unwrap().unwrap().value.key_cert_sign());
    }

    #[test]
    fn serials_are_positive_and_distinct() {
        let (a, b) = (random_serial().unwrap(), random_serial().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.to_bytes()[0] & 0xc0, 0x40);
    }
}
