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

use std::fmt;

/// A ServiceAccount, the unit of identity: `spiffe://<trust domain>/ns/<namespace>/sa/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccount {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ServiceAccount {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn spiffe_id(&self, trust_domain: &str) -> String {
        aether_crds::well_known::spiffe_id(trust_domain, &self.namespace, &self.name)
    }

    /// The ServiceAccount a SPIFFE ID of `trust_domain` names; `None` for any other URI.
    pub fn from_spiffe_id(trust_domain: &str, uri: &str) -> Option<Self> {
        let path = uri.strip_prefix("spiffe://")?.strip_prefix(trust_domain)?;
        let mut parts = path.strip_prefix('/')?.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("ns"), Some(ns), Some("sa"), Some(sa))
                if !ns.is_empty() && !sa.is_empty() && parts.next().is_none() =>
            {
                Some(ServiceAccount::new(ns, sa))
            }
            _ => None,
        }
    }
}

impl fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_round_trip() {
        let sa = ServiceAccount::new("shop", "web");
        let id = sa.spiffe_id("cluster.local");
        assert_eq!(id, "spiffe://cluster.local/ns/shop/sa/web");
        assert_eq!(
            ServiceAccount::from_spiffe_id("cluster.local", &id),
            Some(sa)
        );
    }

    #[test]
    fn foreign_or_malformed_ids_name_no_service_account() {
        for bad in [
            "spiffe://other.domain/ns/shop/sa/web",
            "spiffe://cluster.local.evil/ns/shop/sa/web",
            "spiffe://cluster.local/ns/shop/sa/web/extra",
            "spiffe://cluster.local/ns//sa/web",
            "spiffe://cluster.local/sa/web/ns/shop",
            "https://cluster.local/ns/shop/sa/web",
        ] {
            assert_eq!(
                ServiceAccount::from_spiffe_id("cluster.local", bad),
                None,
                "{bad}"
            );
        }
    }
}
