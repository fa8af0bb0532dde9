//! Workload identity: SPIFFE IDs of ServiceAccounts, the SVIDs this node's pods present, and
//! the TLS configurations of both mesh hops.
//!
//! - [`tls`]: rustls client and server configurations per ServiceAccount whose certificate and
//!   trust roots can change under them (rotation without dropping connections).
//! - [`svid`]: obtaining and renewing SVIDs from the operator's certificate authority.
//! - [`kept`]: the SVIDs kept in the proxy pod's memory for a restart of the proxy.

pub mod kept;
pub mod svid;
pub mod tls;

/// The mesh's one identity, defined in `aether_core`.
pub use aether_core::identity::ServiceAccount;

/// The SPIFFE IDs (URI SANs) of a DER certificate.
pub fn spiffe_ids(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}
