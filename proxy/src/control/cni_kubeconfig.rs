//! The kubeconfig aether-cni falls back to when the proxy cannot answer (it decides from the
//! API server whether a pod's namespace is managed, so other pods start while the proxy is down).
//! It holds a token of the `aether-cni` ServiceAccount, which may only read namespaces; the
//! proxy requests it with the TokenRequest API and renews it long before it expires, so the
//! fallback keeps working through a proxy outage of up to a day.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// Lifetime of the token written for the plugin.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How often it is renewed.
const RENEW_EVERY: Duration = Duration::from_secs(3600);
/// Where an in-cluster process finds the API server's CA.
const CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

#[derive(Debug, thiserror::Error)]
pub enum CniKubeconfigError {
    #[error("not running in a cluster: {0} is not set")]
    NoApiServer(&'static str),
    #[error("cannot read the cluster CA {CLUSTER_CA}: {0}")]
    Ca(std::io::Error),
    #[error("cannot request a token for ServiceAccount {service_account}: {source}")]
    Token {
        service_account: String,
        source: Box<kube::Error>,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The kubeconfig text: one cluster, one token user.
pub fn render(server: &str, ca_pem: &[u8], token: &str) -> String {
    let ca = serde_json::to_value(ByteString(ca_pem.to_vec())).unwrap_or_default();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "aether-cni", "user": {"token": token}}],
        "contexts": [{"name": "aether-cni", "context": {"cluster": "cluster", "user": "aether-cni"}}],
        "current-context": "aether-cni",
    })
    .to_string()
}

/// Requests a token and writes the kubeconfig at `path`, atomically and readable by root only.
pub async fn write_once(
    client: &kube::Client,
    namespace: &str,
    service_account: &str,
    path: &Path,
) -> Result<(), CniKubeconfigError> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .map_err(|_| CniKubeconfigError::NoApiServer("KUBERNETES_SERVICE_HOST"))?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT")
        .map_err(|_| CniKubeconfigError::NoApiServer("KUBERNETES_SERVICE_PORT"))?;
    let server = if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    };
    let ca = std::fs::read(CLUSTER_CA).map_err(CniKubeconfigError::Ca)?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .map_err(|source| CniKubeconfigError::Token {
            service_account: format!("{namespace}/{service_account}"),
            source: Box::new(source),
        })?;
    let token = answer.status.and_then(|s| s.token).unwrap_or_default();
    let text = render(&server, &ca, &token);
    let write_error = |source| CniKubeconfigError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(write_error)?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(write_error)?;
    std::fs::rename(&tmp, path).map_err(write_error)
}

/// Keeps the kubeconfig fresh forever; failures are retried every minute.
pub async fn maintain(
    client: kube::Client,
    namespace: String,
    service_account: String,
    path: PathBuf,
) {
    loop {
        let next = match write_once(&client, &namespace, &service_account, &path).await {
            Ok(()) => {
                info!(path = %path.display(), "wrote the CNI plugin's fallback kubeconfig");
                RENEW_EVERY
            }
            Err(e) => {
                warn!(error = %e, "cannot write the CNI plugin's fallback kubeconfig; retrying");
                Duration::from_secs(60)
            }
        };
        tokio::time::sleep(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_kubeconfig_kube_can_read() {
        let text = render(
            "https://10.96.0.1:443",
            b"-----BEGIN CERTIFICATE-----\n",
            "tok",
        );
        let config = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(config.current_context.as_deref(), Some("aether-cni"));
        let cluster = config.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
        assert!(cluster.certificate_authority_data.is_some());
        let user = config.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
    }
}
