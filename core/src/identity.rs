//! The mesh's one identity: a ServiceAccount, named on the wire by its SPIFFE ID
//! `spiffe://<trust-domain>/ns/<namespace>/sa/<name>`.

use std::fmt;
use std::str::FromStr;

use crate::k8s_names::{is_dns1123_label, is_dns1123_subdomain, is_trust_domain};

/// The ServiceAccount every pod without `serviceAccountName` runs as.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// A ServiceAccount, `<namespace>/<name>`.
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

    /// The ServiceAccount a pod of `namespace` runs as: the API server defaults a missing or
    /// empty `serviceAccountName` to `default`.
    pub fn of_pod(namespace: &str, service_account_name: Option<&str>) -> Self {
        let name = service_account_name
            .filter(|name| !name.is_empty())
            .unwrap_or(DEFAULT_SERVICE_ACCOUNT);
        ServiceAccount::new(namespace, name)
    }

    /// The ServiceAccount a Kubernetes user name (`system:serviceaccount:<ns>:<name>`) stands
    /// for, if it is one.
    pub fn from_username(username: &str) -> Option<Self> {
        let rest = username.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        valid(namespace, name).then(|| ServiceAccount::new(namespace, name))
    }

    /// The ServiceAccount a SPIFFE ID of `trust_domain` names; `None` for any other URI.
    pub fn from_spiffe_id(trust_domain: &str, uri: &str) -> Option<Self> {
        let path = uri.strip_prefix("spiffe://")?.strip_prefix(trust_domain)?;
        let mut parts = path.strip_prefix('/')?.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("ns"), Some(ns), Some("sa"), Some(sa))
                if valid(ns, sa) && parts.next().is_none() =>
            {
                Some(ServiceAccount::new(ns, sa))
            }
            _ => None,
        }
    }

    /// Its SPIFFE ID in `trust_domain`, as text. [`SpiffeId::new`] is the checked form.
    pub fn spiffe_id(&self, trust_domain: &str) -> String {
        format!(
            "spiffe://{trust_domain}/ns/{}/sa/{}",
            self.namespace, self.name
        )
    }
}

fn valid(namespace: &str, name: &str) -> bool {
    is_dns1123_label(namespace) && is_dns1123_subdomain(name)
}

impl fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a ServiceAccount reference of the form <namespace>/<name>")]
pub struct ParseServiceAccountError(String);

impl FromStr for ServiceAccount {
    type Err = ParseServiceAccountError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if valid(ns, name) => Ok(ServiceAccount::new(ns, name)),
            _ => Err(ParseServiceAccountError(s.to_owned())),
        }
    }
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

/// A SPIFFE ID built only from valid parts, so the URI needs no escaping and cannot name a
/// different path: what the certificate authority signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeId {
    trust_domain: String,
    service_account: ServiceAccount,
}

impl SpiffeId {
    pub fn new(
        trust_domain: &str,
        service_account: &ServiceAccount,
    ) -> Result<Self, IdentityError> {
        if !is_trust_domain(trust_domain) {
            return Err(IdentityError::TrustDomain(trust_domain.to_owned()));
        }
        if !is_dns1123_label(&service_account.namespace) {
            return Err(IdentityError::Namespace(service_account.namespace.clone()));
        }
        if !is_dns1123_subdomain(&service_account.name) {
            return Err(IdentityError::ServiceAccount(service_account.name.clone()));
        }
        Ok(SpiffeId {
            trust_domain: trust_domain.to_owned(),
            service_account: service_account.clone(),
        })
    }

    pub fn service_account(&self) -> &ServiceAccount {
        &self.service_account
    }

    pub fn uri(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.service_account.spiffe_id(&self.trust_domain))
    }
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
        for other in [
            "spiffe://other.domain/ns/shop/sa/web",
            "spiffe://cluster.local.evil/ns/shop/sa/web",
            "spiffe://cluster.local/ns/shop/sa/web/extra",
            "spiffe://cluster.local/ns//sa/web",
            "spiffe://cluster.local/sa/web/ns/shop",
            "spiffe://cluster.local/ns/Shop/sa/web",
            "https://cluster.local/ns/shop/sa/web",
        ] {
            assert_eq!(
                ServiceAccount::from_spiffe_id("cluster.local", other),
                None,
                "{other}"
            );
        }
    }

    #[test]
    fn a_pod_without_a_service_account_runs_as_default() {
        assert_eq!(ServiceAccount::of_pod("shop", None).name, "default");
        assert_eq!(ServiceAccount::of_pod("shop", Some("")).name, "default");
        assert_eq!(ServiceAccount::of_pod("shop", Some("web")).name, "web");
    }

    #[test]
    fn user_names_and_references() {
        assert_eq!(
            ServiceAccount::from_username("system:serviceaccount:shop:web"),
            Some(ServiceAccount::new("shop", "web"))
        );
        for bad in [
            "system:node:n1",
            "system:serviceaccount:shop",
            "system:serviceaccount:Shop:web",
        ] {
            assert_eq!(ServiceAccount::from_username(bad), None, "{bad}");
        }
        assert_eq!("shop/web".parse(), Ok(ServiceAccount::new("shop", "web")));
        for bad in ["shop", "shop/", "/web", "a/b/c", "Shop/web"] {
            assert!(bad.parse::<ServiceAccount>().is_err(), "{bad}");
        }
    }

    #[test]
    fn spiffe_ids_are_built_only_from_valid_names() {
        let id = SpiffeId::new("cluster.local", &ServiceAccount::new("default", "frontend"));
        assert_eq!(
            id.unwrap().uri(),
            "spiffe://cluster.local/ns/default/sa/frontend"
        );
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
            let sa = ServiceAccount::new(ns, sa);
            assert!(SpiffeId::new("cluster.local", &sa).is_err(), "{sa}");
        }
        let ok = ServiceAccount::new("a", "b.c-d");
        assert!(SpiffeId::new("Cluster.Local", &ok).is_err());
        assert!(SpiffeId::new("cluster.local", &ok).is_ok());
    }
}
