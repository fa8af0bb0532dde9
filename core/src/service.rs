//! Routing is keyed by Service: [`ServiceKey`], and the pod annotation that names the Services
//! a pod dials ([`depends_on`]).

use std::fmt;

use crate::k8s_names::is_dns1123_label;

/// A Service, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `namespace/name`, or a bare `name` in `default_namespace`. Names Kubernetes
    /// would refuse for a namespace or a Service are no key.
    pub fn parse(s: &str, default_namespace: &str) -> Option<Self> {
        let (namespace, name) = s.split_once('/').unwrap_or((default_namespace, s));
        (is_dns1123_label(namespace) && is_dns1123_label(name))
            .then(|| ServiceKey::new(namespace, name))
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Services named by a pod's `aether.io/depends-on` annotation: comma separated,
/// `namespace/service` or a `service` of the pod's own namespace. Entries that name no Service
/// are skipped; the rest still count.
pub fn depends_on(pod_namespace: &str, annotation: &str) -> Vec<ServiceKey> {
    annotation
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| ServiceKey::parse(entry, pod_namespace))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_with_the_pods_namespace_as_default() {
        assert_eq!(
            ServiceKey::parse("shop/echo", "web"),
            Some(ServiceKey::new("shop", "echo"))
        );
        assert_eq!(
            ServiceKey::parse("echo", "web"),
            Some(ServiceKey::new("web", "echo"))
        );
        for bad in [
            "",
            "/echo",
            "shop/",
            "shop/echo/x",
            "Shop/echo",
            "shop/e cho",
        ] {
            assert_eq!(ServiceKey::parse(bad, "web"), None, "{bad:?}");
        }
        assert_eq!(ServiceKey::new("shop", "echo").to_string(), "shop/echo");
    }

    #[test]
    fn depends_on_lists_each_named_service() {
        assert_eq!(
            depends_on("web", " shop/echo, db ,, bad/na/me, far/api"),
            vec![
                ServiceKey::new("shop", "echo"),
                ServiceKey::new("web", "db"),
                ServiceKey::new("far", "api"),
            ]
        );
        assert!(depends_on("web", "").is_empty());
    }
}
