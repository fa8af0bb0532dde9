//! The API server lookup behind [`super::decide`]: one metadata-only GET, of the namespace.
//! The plugin's identity reads no pod (its token is on every node), so a pod of a managed
//! namespace is judged meshed here even if it opts out: it waits for the proxy, which can tell.
//!
//! Uses kube's client (already in the workspace, so no extra build) because it reads any
//! kubeconfig the installer may write (token file, client certificate, CA data) and speaks TLS
//! with ring. It only runs when the proxy cannot answer, so its start-up cost (a tokio runtime
//! and a TLS handshake) is off the common ADD path.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Api, Client, Config};

use super::{Meshing, decide};
use crate::protocol::PodRef;

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("cannot read kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        source: KubeconfigError,
    },
    #[error("cannot build an API client from kubeconfig {}: {}", path.display(), crate::error_chain(.source))]
    Client {
        path: PathBuf,
        source: Box<kube::Error>,
    },
    #[error("cannot start the API client's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("reading {what} from the API server failed: {}", crate::error_chain(.source))]
    Api {
        what: String,
        source: Box<kube::Error>,
    },
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// Reads the namespace's labels, then decides. Bounded by `timeout`.
pub fn lookup(kubeconfig: &Path, pod: &PodRef, timeout: Duration) -> Result<Meshing, LookupError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LookupError::Runtime)?;
    runtime.block_on(async {
        tokio::time::timeout(timeout, lookup_async(kubeconfig, pod, timeout))
            .await
            .unwrap_or(Err(LookupError::Timeout(timeout)))
    })
}

async fn lookup_async(
    kubeconfig: &Path,
    pod: &PodRef,
    timeout: Duration,
) -> Result<Meshing, LookupError> {
    let kubeconfig_error = |source| LookupError::Kubeconfig {
        path: kubeconfig.to_owned(),
        source,
    };
    let file = Kubeconfig::read_from(kubeconfig).map_err(kubeconfig_error)?;
    let mut config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_error)?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    let client = Client::try_from(config).map_err(|source| LookupError::Client {
        path: kubeconfig.to_owned(),
        source: Box::new(source),
    })?;
    let namespace = Api::<Namespace>::all(client)
        .get_metadata(&pod.namespace)
        .await
        .map_err(|source| LookupError::Api {
            what: format!("namespace {}", pod.namespace),
            source: Box::new(source),
        })?;
    Ok(decide(
        pod,
        &namespace.metadata.labels.unwrap_or_default(),
        &Default::default(),
    ))
}
