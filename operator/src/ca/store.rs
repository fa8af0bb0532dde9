//! Reading and writing the root Secret and the trust-bundle ConfigMap.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::bundle;
use super::config::CaConfig;
use super::root::{RootError, generate_root};
use super::secret::{self, RootMaterial, SecretError};

const FIELD_MANAGER: &str = "aether-operator";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} {kind} {namespace}/{name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        // Boxed: kube::Error is large, and this error travels through every Result here.
        source: Box<kube::Error>,
    },
    #[error("Secret {namespace}/{name} is not a usable root Secret: {source}")]
    Layout {
        namespace: String,
        name: String,
        source: SecretError,
    },
    #[error("cannot generate the root: {0}")]
    Generate(#[from] RootError),
}

/// Where the root in use came from, for the startup log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootOrigin {
    /// The Secret existed (supplied by the user, or made by an earlier start).
    Existing,
    /// This start generated it.
    Generated,
}

/// The root material, creating the Secret with a new root if there is none. Never updates an
/// existing Secret: a user-supplied root is used exactly as given.
pub async fn load_or_create_root(
    client: &kube::Client,
    config: &CaConfig,
) -> Result<(RootMaterial, RootOrigin), StoreError> {
    if let Some(material) = read_root(client, config).await? {
        return Ok((material, RootOrigin::Existing));
    }
    let generated = generate_root(&config.trust_domain, SystemTime::now(), config.root_ttl)?;
    let api: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let secret = secret::encode(&config.namespace, &config.secret_name, &generated);
    match api.create(&PostParams::default(), &secret).await {
        Ok(created) => Ok((decode(config, &created)?, RootOrigin::Generated)),
        // Another replica created it first: its root wins, ours is dropped unused.
        Err(kube::Error::Api(status)) if status.is_already_exists() => read_root(client, config)
            .await?
            .map(|material| (material, RootOrigin::Existing))
            .ok_or_else(|| {
                kube_error(
                    "read",
                    "Secret",
                    config,
                    &config.secret_name,
                    kube::Error::Api(status),
                )
            }),
        Err(e) => Err(kube_error(
            "create",
            "Secret",
            config,
            &config.secret_name,
            e,
        )),
    }
}

/// The root material in the Secret, or `None` if the Secret does not exist.
pub async fn read_root(
    client: &kube::Client,
    config: &CaConfig,
) -> Result<Option<RootMaterial>, StoreError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let secret = api
        .get_opt(&config.secret_name)
        .await
        .map_err(|e| kube_error("read", "Secret", config, &config.secret_name, e))?;
    secret.map(|s| decode(config, &s)).transpose()
}

/// Publishes the bundle unless the ConfigMap already holds it. Returns whether it wrote.
pub async fn publish_bundle(
    client: &kube::Client,
    config: &CaConfig,
    bundle_pem: &str,
) -> Result<bool, StoreError> {
    let name = &config.bundle_config_map;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &config.namespace);
    let existing = api
        .get_opt(name)
        .await
        .map_err(|e| kube_error("read", "ConfigMap", config, name, e))?;
    if bundle::is_published(existing.as_ref(), bundle_pem) {
        return Ok(false);
    }
    // Server-side apply: creates or updates in one call, and several replicas publishing the
    // same bundle do not conflict.
    let desired = bundle::config_map(&config.namespace, name, bundle_pem);
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&desired),
    )
    .await
    .map_err(|e| kube_error("apply", "ConfigMap", config, name, e))?;
    Ok(true)
}

fn decode(config: &CaConfig, secret: &Secret) -> Result<RootMaterial, StoreError> {
    secret::decode(secret).map_err(|source| StoreError::Layout {
        namespace: config.namespace.clone(),
        name: config.secret_name.clone(),
        source,
    })
}

fn kube_error(
    action: &'static str,
    kind: &'static str,
    config: &CaConfig,
    name: &str,
    source: kube::Error,
) -> StoreError {
    StoreError::Kube {
        action,
        kind,
        namespace: config.namespace.clone(),
        name: name.to_owned(),
        source: Box::new(source),
    }
}
