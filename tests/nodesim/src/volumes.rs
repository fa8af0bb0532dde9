//! Materialises a pod's volumes in its directory, as the kubelet does: ConfigMaps, Secrets,
//! downward API files and projected ServiceAccount tokens are written as files; emptyDirs
//! are directories; hostPaths are paths of the node view, bound as they are.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, ObjectFieldSelector, Pod, Secret, ServiceAccount,
    Volume,
};
use kube::api::{Api, PostParams};

/// Where a volume's content is, for binding into containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A directory or file under the pod's directory.
    Pod(PathBuf),
    /// A hostPath: a path of the node view.
    Host(PathBuf),
}

/// A token written into a projected volume, to refresh before it expires.
#[derive(Debug, Clone)]
pub struct TokenFile {
    pub path: PathBuf,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

#[derive(Debug, Default)]
pub struct Volumes {
    pub sources: BTreeMap<String, Source>,
    pub tokens: Vec<TokenFile>,
}

/// Reads what pods reference: ConfigMaps, Secrets, ServiceAccount tokens.
pub struct Fetcher {
    pub client: kube::Client,
}

impl Fetcher {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<BTreeMap<String, String>> {
        let cm = Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .with_context(|| format!("ConfigMap {namespace}/{name}"))?;
        Ok(cm.data.unwrap_or_default())
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .with_context(|| format!("Secret {namespace}/{name}"))?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }

    /// A token for the pod's ServiceAccount, bound to the pod, as kubelet requests it.
    pub async fn token(
        &self,
        pod: &Pod,
        audience: Option<&str>,
        expiration_seconds: i64,
    ) -> Result<String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .unwrap_or("default");
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: audience.map(|a| vec![a.to_owned()]),
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            }),
            ..Default::default()
        };
        let answer: TokenRequest =
            Api::<ServiceAccount>::namespaced(self.client.clone(), namespace)
                .create_subresource("token", sa, &PostParams::default(), &request)
                .await
                .with_context(|| format!("token for ServiceAccount {namespace}/{sa}"))?;
        answer
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| anyhow!("token request for {namespace}/{sa} returned no token"))
    }
}

/// The value of a downward API field of the pod.
pub fn field_value(pod: &Pod, field: &ObjectFieldSelector) -> Result<String> {
    let meta = &pod.metadata;
    let map = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let path = field.field_path.as_str();
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => map(&meta.labels),
        "metadata.annotations" => map(&meta.annotations),
        "spec.nodeName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default(),
        "status.hostIP" => pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .unwrap_or_default(),
        _ => {
            if let Some(key) = path
                .strip_prefix("metadata.labels['")
                .and_then(|k| k.strip_suffix("']"))
            {
                return Ok(meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(key))
                    .cloned()
                    .unwrap_or_default());
            }
            if let Some(key) = path
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
            {
                return Ok(meta
                    .annotations
                    .as_ref()
                    .and_then(|l| l.get(key))
                    .cloned()
                    .unwrap_or_default());
            }
            bail!("downward API field {path:?} is not supported by the node simulator")
        }
    })
}

fn write_file(dir: &Path, relative: &str, content: &[u8], mode: Option<i32>) -> Result<()> {
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Write then rename, so a process never reads half a file (tokens are rewritten live).
    let tmp = path.with_extension("tmp-nodesim");
    std::fs::write(&tmp, content).with_context(|| format!("writing {}", tmp.display()))?;
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode as u32))?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// Writes `items` (or every key) of a key/value source.
fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    what: &str,
) -> Result<()> {
    match items {
        Some(items) => {
            for item in items {
                let value = data
                    .get(&item.key)
                    .ok_or_else(|| anyhow!("{what} has no key {:?}", item.key))?;
                write_file(dir, &item.path, value, item.mode)?;
            }
        }
        None => {
            for (key, value) in data {
                write_file(dir, key, value, None)?;
            }
        }
    }
    Ok(())
}

fn downward_files(dir: &Path, pod: &Pod, items: &[DownwardAPIVolumeFile]) -> Result<()> {
    for item in items {
        let Some(field) = &item.field_ref else {
            bail!(
                "downward API item {:?}: only fieldRef is supported",
                item.path
            )
        };
        write_file(
            dir,
            &item.path,
            field_value(pod, field)?.as_bytes(),
            item.mode,
        )?;
    }
    Ok(())
}

/// Writes a ConfigMap's `items` (or every key) into `dir`.
async fn write_config_map(
    fetcher: &Fetcher,
    namespace: &str,
    name: &str,
    items: Option<&Vec<KeyToPath>>,
    dir: &Path,
) -> Result<()> {
    let data = fetcher.config_map(namespace, name).await?;
    let data = data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
    write_keys(dir, &data, items, &format!("ConfigMap {name}"))
}

/// Writes every volume of `pod` under `dir` (one subdirectory per volume).
pub async fn materialise(fetcher: &Fetcher, pod: &Pod, dir: &Path) -> Result<Volumes> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = Volumes::default();
    let volumes: &[Volume] = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    for volume in volumes {
        let vdir = dir.join(&volume.name);
        let context = || format!("volume {:?}", volume.name);
        if let Some(host) = &volume.host_path {
            out.sources
                .insert(volume.name.clone(), Source::Host(PathBuf::from(&host.path)));
            continue;
        }
        std::fs::create_dir_all(&vdir)?;
        if let Some(cm) = &volume.config_map {
            write_config_map(fetcher, namespace, &cm.name, cm.items.as_ref(), &vdir)
                .await
                .with_context(context)?;
        } else if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let data = fetcher
                .secret(namespace, &name)
                .await
                .with_context(context)?;
            write_keys(
                &vdir,
                &data,
                secret.items.as_ref(),
                &format!("Secret {name}"),
            )
            .with_context(context)?;
        } else if let Some(downward) = &volume.downward_api {
            downward_files(&vdir, pod, downward.items.as_deref().unwrap_or_default())
                .with_context(context)?;
        } else if let Some(projected) = &volume.projected {
            for source in projected.sources.iter().flatten() {
                if let Some(token) = &source.service_account_token {
                    let expiration_seconds = token.expiration_seconds.unwrap_or(3600);
                    let value = fetcher
                        .token(pod, token.audience.as_deref(), expiration_seconds)
                        .await
                        .with_context(context)?;
                    write_file(&vdir, &token.path, value.as_bytes(), None)?;
                    out.tokens.push(TokenFile {
                        path: vdir.join(&token.path),
                        audience: token.audience.clone(),
                        expiration_seconds,
                    });
                } else if let Some(cm) = &source.config_map {
                    write_config_map(fetcher, namespace, &cm.name, cm.items.as_ref(), &vdir)
                        .await
                        .with_context(context)?;
                } else if let Some(secret) = &source.secret {
                    let data = fetcher
                        .secret(namespace, &secret.name)
                        .await
                        .with_context(context)?;
                    write_keys(
                        &vdir,
                        &data,
                        secret.items.as_ref(),
                        &format!("Secret {}", secret.name),
                    )
                    .with_context(context)?;
                } else if let Some(downward) = &source.downward_api {
                    downward_files(&vdir, pod, downward.items.as_deref().unwrap_or_default())
                        .with_context(context)?;
                }
            }
        } else if volume.empty_dir.is_none() {
            bail!(
                "volume {:?}: only hostPath, emptyDir, configMap, secret, downwardAPI and projected volumes are supported",
                volume.name
            );
        }
        out.sources.insert(volume.name.clone(), Source::Pod(vdir));
    }
    Ok(out)
}

/// Rewrites a token, as the kubelet does once 80% of its lifetime has passed.
pub async fn refresh_token(fetcher: &Fetcher, pod: &Pod, token: &TokenFile) -> Result<()> {
    let value = fetcher
        .token(pod, token.audience.as_deref(), token.expiration_seconds)
        .await?;
    let dir = token.path.parent().unwrap_or(Path::new("/"));
    let name = token
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("token");
    write_file(dir, name, value.as_bytes(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downward_fields() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "labels": {"app": "echo"}},
            "spec": {"containers": [], "nodeName": "node-1"},
        }))
        .unwrap();
        let field = |path: &str| {
            field_value(
                &pod,
                &ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                },
            )
        };
        assert_eq!(field("metadata.name").unwrap(), "p");
        assert_eq!(field("spec.nodeName").unwrap(), "node-1");
        assert_eq!(field("metadata.labels['app']").unwrap(), "echo");
        assert_eq!(field("metadata.labels").unwrap(), "app=\"echo\"");
        assert!(field("spec.unknown").is_err());
    }
}
