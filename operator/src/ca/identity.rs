//! SPIFFE identities of workloads and the Kubernetes name rules they are built from.

use std::fmt;

/// `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`, built only from valid parts,
/// so the URI needs no escaping and cannot name a different path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("namespace {0:?} is not a valid namespace name (RFC 1123 label)")]
    Namespace(String),
    #[error("serviceAccount {0:?} is not a valid ServiceAccount name (RFC 1123 subdomain)")]
    ServiceAccount(String),
    #[error("trust domain {0:?} is not valid")]
    TrustDomain(String),
}

impl SpiffeId {
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, IdentityError> {
        if !is_trust_domain(trust_domain) {
            return Err(IdentityError::TrustDomain(trust_domain.to_owned()));
        }
        if !is_dns1123_label(namespace) {
            return Err(IdentityError::Namespace(namespace.to_owned()));
        }
        if !is_dns1123_subdomain(service_account) {
            return Err(IdentityError::ServiceAccount(service_account.to_owned()));
        }
        Ok(SpiffeId {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        })
    }

    pub fn uri(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// RFC 1123 label, as Kubernetes requires of namespace names.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain, as Kubernetes requires of ServiceAccount and most object names.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A SPIFFE trust domain: lowercase letters, digits, '.', '-' and '_' (SPIFFE-ID spec 2.1).
pub fn is_trust_domain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_uri() {
        let id = SpiffeId::new("cluster.local", "default", "frontend").unwrap();
        assert_eq!(id.uri(), "spiffe://cluster.local/ns/default/sa/frontend");
    }

    #[test]
    fn rejects_names_that_could_change_the_path() {
        for (ns, sa) in [
            ("", "a"),
            ("a/b", "c"),
            ("Default", "a"),
            ("-a", "b"),
            ("a", ""),
            ("a", "b/../c"),
            ("a", "b?x"),
            ("a", "b..c"),
            (&"x".repeat(64), "a"),
        ] {
            assert!(SpiffeId::new("cluster.local", ns, sa).is_err(), "{ns}/{sa}");
        }
        assert!(SpiffeId::new("Cluster.Local", "a", "b").is_err());
        assert!(SpiffeId::new("cluster.local", "a", "b.c-d").is_ok());
    }
}
