//! The Kubernetes and SPIFFE name rules that identities and keys are checked against, so that
//! a name from a request or an annotation cannot carry a path separator or an escape.

/// RFC 1123 label, as Kubernetes requires of namespace and Service names.
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
    fn labels_and_subdomains() {
        assert!(is_dns1123_label("shop-1"));
        for bad in ["", "-a", "a-", "A", "a.b", "a/b", &"x".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain("b.c-d"));
        for bad in ["", "b..c", "b/../c", "b?x", ".b"] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        assert!(is_trust_domain("cluster.local"));
        assert!(!is_trust_domain("Cluster.Local"));
        assert!(!is_trust_domain(""));
    }
}
