//! The API server lookup behind [`super::decide`]: two metadata-only GETs.
//!
//! Uses kube's client (already in the workspace, so no extra build) because it reads any
//! kubeconfig the installer may write (token file, client certificate, CA data) and speaks TLS
//! with ring. It only runs when the proxy cannot answer, so its start-up cost (a tokio runtime
//! and a TLS handshake) is off the common ADD path.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
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

/// Reads the namespace's labels and the pod's annotations, then decides. Bounded by `timeout`.
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
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
    let (namespace, found) = tokio::try_join!(
        async {
            namespaces
                .get_metadata(&pod.namespace)
                .await
                .map_err(|source| LookupError::Api {
                    what: format!("namespace {}", pod.namespace),
                    source: Box::new(source),
                })
        },
        async {
            pods.get_metadata(&pod.name)
                .await
                .map_err(|source| LookupError::Api {
                    what: format!("pod {pod}"),
                    source: Box::new(source),
                })
        },
    )?;
    Ok(decide(
        pod,
        &namespace.metadata.labels.unwrap_or_default(),
        &found.metadata.annotations.unwrap_or_default(),
    ))
}
