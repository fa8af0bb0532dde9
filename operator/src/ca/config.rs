//! Settings of the certificate authority, with the defaults of a standard install.

use std::net::SocketAddr;
use std::time::Duration;

use aether_core::identity::ServiceAccount;
use aether_core::k8s_names::{is_dns1123_label, is_dns1123_subdomain, is_trust_domain};

/// Everything the certificate authority can be told. `Default` is a standard install.
#[derive(Debug, Clone)]
pub struct CaConfig {
    /// The install namespace: holds the root Secret, the trust-bundle ConfigMap and the
    /// operator's Service.
    pub namespace: String,
    /// The Secret holding the signing root and any other trusted roots (layout in `ca/mod.rs`).
    pub secret_name: String,
    /// The ConfigMap the trust bundle is published in (key `ca.crt`).
    pub bundle_config_map: String,
    /// SPIFFE trust domain of every issued identity.
    pub trust_domain: String,
    /// Lifetime of an issued SVID (capped at the signing root's expiry).
    pub svid_ttl: Duration,
    /// Lifetime of a root generated at first start.
    pub root_ttl: Duration,
    /// Lifetime of the endpoint's own serving certificate; renewed at two thirds of it.
    pub serving_cert_ttl: Duration,
    /// The only ServiceAccount allowed to request SVIDs: the node proxy's.
    pub proxy_service_account: ServiceAccount,
    /// The audience the caller's token must be issued for.
    pub token_audience: String,
    /// Where the HTTPS endpoint listens.
    pub bind: SocketAddr,
    /// The operator's Service: the serving certificate names `<service>.<namespace>.svc` etc.
    pub service_name: String,
    /// The cluster's DNS domain, for the fully qualified Service name.
    pub cluster_domain: String,
    /// More DNS names for the serving certificate (e.g. an external name).
    pub extra_server_names: Vec<String>,
    /// How often the root Secret is re-read (root rotation) and the ConfigMap repaired.
    pub reload_interval: Duration,
}

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

impl Default for CaConfig {
    fn default() -> Self {
        CaConfig {
            namespace: "aether-system".into(),
            secret_name: "aether-ca".into(),
            bundle_config_map: "aether-trust-bundle".into(),
            trust_domain: "cluster.local".into(),
            svid_ttl: 24 * HOUR,
            root_ttl: 10 * 365 * DAY,
            serving_cert_ttl: 30 * DAY,
            proxy_service_account: ServiceAccount::new("aether-system", "aether-proxy"),
            token_audience: "aether".into(),
            bind: SocketAddr::from(([0, 0, 0, 0], 8443)),
            service_name: "aether-operator".into(),
            cluster_domain: "cluster.local".into(),
            extra_server_names: Vec::new(),
            reload_interval: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{field} {value:?} is not a valid Kubernetes name")]
    InvalidName { field: &'static str, value: String },
    #[error("trust domain {0:?} is not valid (lowercase letters, digits, '.', '-', '_')")]
    InvalidTrustDomain(String),
    #[error("{field} must be longer than a minute, got {value:?}")]
    TooShort {
        field: &'static str,
        value: Duration,
    },
    #[error("SVID lifetime {svid:?} must be shorter than the root lifetime {root:?}")]
    SvidOutlivesRoot { svid: Duration, root: Duration },
    #[error("reload interval must not be zero")]
    ZeroReloadInterval,
}

impl CaConfig {
    /// Checks the settings once at start, so a typo fails fast instead of on the first request.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("namespace", &self.namespace),
            ("service name", &self.service_name),
        ] {
            if !is_dns1123_label(value) {
                return Err(ConfigError::InvalidName {
                    field,
                    value: value.clone(),
                });
            }
        }
        for (field, value) in [
            ("secret name", &self.secret_name),
            ("trust-bundle ConfigMap name", &self.bundle_config_map),
        ] {
            if !is_dns1123_subdomain(value) {
                return Err(ConfigError::InvalidName {
                    field,
                    value: value.clone(),
                });
            }
        }
        if !is_trust_domain(&self.trust_domain) {
            return Err(ConfigError::InvalidTrustDomain(self.trust_domain.clone()));
        }
        for (field, value) in [
            ("SVID lifetime", self.svid_ttl),
            ("root lifetime", self.root_ttl),
            ("serving certificate lifetime", self.serving_cert_ttl),
        ] {
            if value < Duration::from_secs(60) {
                return Err(ConfigError::TooShort { field, value });
            }
        }
        if self.svid_ttl >= self.root_ttl {
            return Err(ConfigError::SvidOutlivesRoot {
                svid: self.svid_ttl,
                root: self.root_ttl,
            });
        }
        if self.reload_interval.is_zero() {
            return Err(ConfigError::ZeroReloadInterval);
        }
        Ok(())
    }

    /// DNS names of the serving certificate: every way a pod can spell the operator's Service.
    pub fn server_names(&self) -> Vec<String> {
        let (svc, ns) = (&self.service_name, &self.namespace);
        let mut names = vec![
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.{}", self.cluster_domain),
            format!("{svc}.{ns}"),
            svc.clone(),
        ];
        names.extend(self.extra_server_names.iter().cloned());
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        assert_eq!(CaConfig::default().validate(), Ok(()));
    }

    #[test]
    fn rejects_bad_settings() {
        let bad = |f: fn(&mut CaConfig)| {
            let mut c = CaConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(
            bad(|c| c.namespace = "Aether".into()),
            ConfigError::InvalidName { .. }
        ));
        assert!(matches!(
            bad(|c| c.trust_domain = "Cluster.Local".into()),
            ConfigError::InvalidTrustDomain(_)
        ));
        assert!(matches!(
            bad(|c| c.svid_ttl = Duration::from_secs(5)),
            ConfigError::TooShort { .. }
        ));
        assert!(matches!(
            bad(|c| c.svid_ttl = c.root_ttl),
            ConfigError::SvidOutlivesRoot { .. }
        ));
    }

    #[test]
    fn service_account_refs() {
        let sa: ServiceAccount = "aether-system/aether-proxy".parse().unwrap();
        assert_eq!(sa, ServiceAccount::new("aether-system", "aether-proxy"));
        assert_eq!(
            ServiceAccount::from_username("system:serviceaccount:aether-system:aether-proxy"),
            Some(sa)
        );
        assert_eq!(ServiceAccount::from_username("system:node:node-1"), None);
        assert_eq!(
            ServiceAccount::from_username("system:serviceaccount:a"),
            None
        );
        assert!("no-slash".parse::<ServiceAccount>().is_err());
        assert!("ns/".parse::<ServiceAccount>().is_err());
    }

    #[test]
    fn server_names_cover_the_service() {
        let names = CaConfig::default().server_names();
        assert!(names.contains(&"aether-operator.aether-system.svc".to_string()));
        assert!(names.contains(&"aether-operator.aether-system.svc.cluster.local".to_string()));
    }
}
