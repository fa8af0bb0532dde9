//! Who may get which SVID: pure decisions over a TokenReview result and the pods of a node.

use std::collections::BTreeMap;

use aether_core::identity::ServiceAccount;
use aether_core::meshing::namespace_is_managed;
use aether_crds::pods;
use k8s_openapi::api::authentication::v1::TokenReviewStatus;
use k8s_openapi::api::core::v1::Pod;

/// The TokenReview `extra` key carrying the node of the pod a token is bound to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// An authenticated node proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub service_account: ServiceAccount,
    pub node: String,
}

/// Why a request is refused (HTTP 403). The messages go back to the caller: they say what is
/// wrong without revealing anything the caller could not find out with its own token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Denial {
    #[error("token rejected by the API server: {0}")]
    NotAuthenticated(String),
    #[error("token is not valid for audience {0:?}")]
    WrongAudience(String),
    #[error("caller {0:?} is not a ServiceAccount")]
    NotServiceAccount(String),
    #[error("ServiceAccount {caller} may not request SVIDs (only {allowed} may)")]
    NotProxy {
        caller: ServiceAccount,
        allowed: ServiceAccount,
    },
    #[error("token is not bound to a pod on a node; use a projected ServiceAccount token")]
    NoNode,
    #[error("namespace {0} is not in the mesh (label aether.io/managed=true)")]
    NotManaged(String),
    #[error("no running meshed pod of ServiceAccount {requested} on node {node}")]
    NoPodOnNode {
        requested: ServiceAccount,
        node: String,
    },
}

impl Denial {
    /// A stable, machine-readable name for the JSON error and the log line.
    pub fn code(&self) -> &'static str {
        match self {
            Denial::NotAuthenticated(_) => "TokenRejected",
            Denial::WrongAudience(_) => "WrongAudience",
            Denial::NotServiceAccount(_) => "NotServiceAccount",
            Denial::NotProxy { .. } => "NotProxy",
            Denial::NoNode => "TokenNotNodeBound",
            Denial::NotManaged(_) => "NamespaceNotManaged",
            Denial::NoPodOnNode { .. } => "NoPodOnNode",
        }
    }
}

/// Reads the caller out of a TokenReview status and checks it is the node proxy.
pub fn identify_caller(
    status: &TokenReviewStatus,
    audience: &str,
    proxy: &ServiceAccount,
) -> Result<Caller, Denial> {
    if status.authenticated != Some(true) {
        return Err(Denial::NotAuthenticated(
            status
                .error
                .clone()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into()),
        ));
    }
    // The API server reports the audiences the token was accepted for; an authenticator that
    // ignores audiences would leave ours out, and such a token was meant for someone else.
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == audience))
    {
        return Err(Denial::WrongAudience(audience.to_owned()));
    }
    let user = status.user.as_ref();
    let username = user.and_then(|u| u.username.as_deref()).unwrap_or_default();
    let service_account = ServiceAccount::from_username(username)
        .ok_or_else(|| Denial::NotServiceAccount(username.to_owned()))?;
    if &service_account != proxy {
        return Err(Denial::NotProxy {
            caller: service_account,
            allowed: proxy.clone(),
        });
    }
    // Only the API server sets this: it comes from the pod the token is bound to, so a proxy
    // cannot claim another node.
    let node = user
        .and_then(|u| u.extra.as_ref())
        .and_then(|extra| extra.get(NODE_NAME_EXTRA))
        .and_then(|values| match values.as_slice() {
            [node] if !node.is_empty() => Some(node.clone()),
            _ => None,
        })
        .ok_or(Denial::NoNode)?;
    Ok(Caller {
        service_account,
        node,
    })
}

/// Whether `node` runs a meshed pod of `requested` that still needs an identity: not being
/// deleted and not finished. A pod the mesh does not capture (opted out, or on the host
/// network) never uses an SVID, so it earns none.
pub fn has_meshed_pod_on_node(pods: &[Pod], requested: &ServiceAccount, node: &str) -> bool {
    pods.iter().any(|pod| {
        let spec = pod.spec.as_ref();
        pod.metadata.namespace.as_deref() == Some(requested.namespace.as_str())
            && pod.metadata.deletion_timestamp.is_none()
            && !pods::is_finished(pod)
            && spec.and_then(|s| s.node_name.as_deref()) == Some(node)
            && pods::meshing(true, pod).is_meshed()
            && pods::service_account(pod) == *requested
    })
}

/// The full decision for one request.
pub fn authorize_workload(
    caller: &Caller,
    namespace_labels: &BTreeMap<String, String>,
    pods_on_node: &[Pod],
    requested: &ServiceAccount,
) -> Result<(), Denial> {
    if !namespace_is_managed(namespace_labels) {
        return Err(Denial::NotManaged(requested.namespace.clone()));
    }
    if has_meshed_pod_on_node(pods_on_node, requested, &caller.node) {
        Ok(())
    } else {
        Err(Denial::NoPodOnNode {
            requested: requested.clone(),
            node: caller.node.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn proxy() -> ServiceAccount {
        ServiceAccount::new("aether-system", "aether-proxy")
    }

    fn review(username: &str, node: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(vec!["aether".into()]),
            user: Some(UserInfo {
                username: Some(username.into()),
                extra: node.map(|n| BTreeMap::from([(NODE_NAME_EXTRA.into(), vec![n.into()])])),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        }
    }

    fn pod(ns: &str, sa: Option<&str>, node: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                service_account_name: sa.map(Into::into),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn accepts_the_proxy_with_its_node() {
        let caller = identify_caller(
            &review(
                "system:serviceaccount:aether-system:aether-proxy",
                Some("node-1"),
            ),
            "aether",
            &proxy(),
        )
        .unwrap();
        assert_eq!(caller.node, "node-1");
    }

    #[test]
    fn refuses_other_callers_and_unbound_tokens() {
        let deny =
            |status: TokenReviewStatus| identify_caller(&status, "aether", &proxy()).unwrap_err();
        let mut expired = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("service account token has expired".into()),
            ..TokenReviewStatus::default()
        };
        assert_eq!(deny(expired.clone()).code(), "TokenRejected");
        expired.error = None;
        assert_eq!(
            deny(expired),
            Denial::NotAuthenticated("not authenticated".into())
        );

        let mut other_audience = review(
            "system:serviceaccount:aether-system:aether-proxy",
            Some("n"),
        );
        other_audience.audiences = Some(vec!["https://kubernetes.default.svc".into()]);
        assert_eq!(deny(other_audience).code(), "WrongAudience");

        assert_eq!(
            deny(review("system:node:node-1", Some("n"))).code(),
            "NotServiceAccount"
        );
        assert_eq!(
            deny(review("system:serviceaccount:shop:web", Some("n"))).code(),
            "NotProxy"
        );
        assert_eq!(
            deny(review(
                "system:serviceaccount:aether-system:aether-proxy",
                None
            )),
            Denial::NoNode
        );
    }

    #[test]
    fn requires_a_live_meshed_pod_of_the_service_account_on_the_node() {
        let caller = Caller {
            service_account: proxy(),
            node: "node-1".into(),
        };
        let managed = BTreeMap::from([("aether.io/managed".to_string(), "true".to_string())]);
        let allow =
            |pods: &[Pod], sa: &ServiceAccount| authorize_workload(&caller, &managed, pods, sa);
        let web = ServiceAccount::new("shop", "web");
        assert!(allow(&[pod("shop", Some("web"), "node-1")], &web).is_ok());
        let default = ServiceAccount::new("shop", "default");
        assert!(allow(&[pod("shop", None, "node-1")], &default).is_ok());

        let mut opted_out = pod("shop", Some("web"), "node-1");
        opted_out.metadata.annotations = Some(BTreeMap::from([(
            "aether.io/capture".into(),
            "disabled".into(),
        )]));
        let mut host_network = pod("shop", Some("web"), "node-1");
        if let Some(spec) = host_network.spec.as_mut() {
            spec.host_network = Some(true);
        }
        for pods in [
            vec![],
            vec![pod("shop", Some("web"), "node-2")],
            vec![pod("other", Some("web"), "node-1")],
            vec![pod("shop", Some("api"), "node-1")],
            vec![opted_out],
            vec![host_network],
        ] {
            assert_eq!(
                allow(&pods, &web).unwrap_err().code(),
                "NoPodOnNode",
                "{pods:?}"
            );
        }

        let mut deleting = pod("shop", Some("web"), "node-1");
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let mut finished = pod("shop", Some("web"), "node-1");
        finished.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        assert!(allow(&[deleting, finished], &web).is_err());
    }

    #[test]
    fn refuses_service_accounts_of_namespaces_outside_the_mesh() {
        let caller = Caller {
            service_account: proxy(),
            node: "node-1".into(),
        };
        let web = ServiceAccount::new("shop", "web");
        let pods = [pod("shop", Some("web"), "node-1")];
        for labels in [
            BTreeMap::new(),
            BTreeMap::from([("aether.io/managed".to_string(), "false".to_string())]),
        ] {
            assert_eq!(
                authorize_workload(&caller, &labels, &pods, &web).unwrap_err(),
                Denial::NotManaged("shop".into())
            );
        }
    }
}
