//! Starting a container's process: its program (from the image table), environment,
//! volumes, hostname and network namespace.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::Api;

use crate::images;
use crate::mounts::{Namespaces, NodeView};
use crate::volumes::{self, Source, Volumes};

/// What a container needs from its pod and node.
pub struct Launch<'a> {
    pub client: &'a kube::Client,
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub volumes: &'a Volumes,
    pub view: &'a NodeView,
    pub bin_dirs: &'a [PathBuf],
    /// The pod's (or, with hostNetwork, the node's) network namespace.
    pub netns: &'a Path,
    pub hostname: &'a str,
    /// The pod's resolv.conf, bound over /etc/resolv.conf.
    pub resolv_conf: Option<&'a Path>,
    /// Variables every container gets (KUBERNETES_SERVICE_HOST, ...).
    pub base_env: &'a [(String, String)],
    pub log: &'a Path,
}

/// The container's environment: the base variables, then its own `env`.
async fn environment(launch: &Launch<'_>) -> Result<Vec<(String, String)>> {
    let namespace = launch
        .pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    let mut env: Vec<(String, String)> = vec![(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    )];
    env.push(("HOSTNAME".into(), launch.hostname.to_owned()));
    env.extend(launch.base_env.iter().cloned());
    for var in launch.container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    volumes::field_value(launch.pod, field)?
                } else if let Some(key) = &from.config_map_key_ref {
                    let cm = Api::<ConfigMap>::namespaced(launch.client.clone(), namespace)
                        .get(&key.name)
                        .await?;
                    cm.data
                        .and_then(|d| d.get(&key.key).cloned())
                        .unwrap_or_default()
                } else if let Some(key) = &from.secret_key_ref {
                    let secret = Api::<Secret>::namespaced(launch.client.clone(), namespace)
                        .get(&key.name)
                        .await?;
                    let bytes = secret
                        .data
                        .and_then(|d| d.get(&key.key).cloned())
                        .map(|b| b.0)
                        .unwrap_or_default();
                    String::from_utf8_lossy(&bytes).into_owned()
                } else {
                    bail!(
                        "env {}: only fieldRef, configMapKeyRef and secretKeyRef are supported",
                        var.name
                    )
                }
            }
            (None, None) => String::new(),
        };
        env.push((var.name.clone(), value));
    }
    Ok(env)
}

/// Expands `$(NAME)` with the variable's value (kept as is when undefined); `$$` is a `$`.
fn expand(word: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(name_end) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=name_end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, value)) => out.push_str(value),
                None => out.push_str(&rest[at..at + name_end + 3]),
            }
            rest = &after[name_end + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Makes sure a bind target exists, as a file when the source is one.
fn mount_point(view: &NodeView, source_on_host: &Path, target: &Path) -> Result<()> {
    let target = view.host_path(target);
    if target.exists() {
        return Ok(());
    }
    if source_on_host.is_file() {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, b"")?;
    } else {
        std::fs::create_dir_all(&target)?;
    }
    Ok(())
}

/// Spawns the container's process.
pub async fn start(launch: &Launch<'_>) -> Result<tokio::process::Child> {
    let c = launch.container;
    let image = c.image.as_deref().unwrap_or_default();
    let env = environment(launch)
        .await
        .with_context(|| format!("environment of container {}", c.name))?;
    // As the kubelet does, `$(VAR)` in command and args is the container's variable.
    let expand_all = |words: Option<&Vec<String>>| -> Vec<String> {
        words
            .into_iter()
            .flatten()
            .map(|w| expand(w, &env))
            .collect()
    };
    let program = images::resolve(
        image,
        &expand_all(c.command.as_ref()),
        &expand_all(c.args.as_ref()),
        launch.bin_dirs,
    )?;

    let mut namespaces = Namespaces::node(launch.view);
    for mount in c.volume_mounts.iter().flatten() {
        let source = match launch.volumes.sources.get(&mount.name) {
            Some(Source::Pod(dir)) => dir.clone(),
            Some(Source::Host(path)) => path.clone(),
            None => bail!(
                "container {} mounts unknown volume {:?}",
                c.name,
                mount.name
            ),
        };
        let source = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => source.join(sub),
            None => source,
        };
        let source_on_host = match launch.volumes.sources.get(&mount.name) {
            Some(Source::Host(_)) => launch.view.host_path(&source),
            _ => source.clone(),
        };
        if !source_on_host.exists() {
            std::fs::create_dir_all(&source_on_host)
                .with_context(|| format!("hostPath {}", source.display()))?;
        }
        let target = Path::new(&mount.mount_path);
        mount_point(launch.view, &source_on_host, target)?;
        namespaces.bind(&source, target, mount.read_only.unwrap_or(false));
        if matches!(
            mount.mount_propagation.as_deref(),
            Some("HostToContainer" | "Bidirectional")
        ) {
            namespaces.receive_host_mounts();
        }
    }
    if let Some(resolv) = launch.resolv_conf {
        namespaces.bind(resolv, Path::new("/etc/resolv.conf"), true);
    }
    namespaces.hostname(launch.hostname);
    namespaces
        .netns(launch.netns)
        .with_context(|| format!("network namespace {}", launch.netns.display()))?;

    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.log)?;
    let mut command = tokio::process::Command::new(&program.path);
    command
        .args(&program.args)
        .env_clear()
        .envs(env)
        .current_dir(c.working_dir.as_deref().unwrap_or("/"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    // SAFETY: `enter` only makes system calls on data prepared before the fork.
    unsafe {
        command.pre_exec(move || namespaces.enter());
    }
    command.spawn().with_context(|| {
        format!(
            "starting {} for container {}",
            program.path.display(),
            c.name
        )
    })
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn variables_in_arguments_expand_as_the_kubelet_does() {
        let env = [("NODE_NAME".to_string(), "node-1".to_string())];
        assert_eq!(expand("$(NODE_NAME)", &env), "node-1");
        assert_eq!(expand("--node=$(NODE_NAME)!", &env), "--node=node-1!");
        assert_eq!(expand("$(UNSET)", &env), "$(UNSET)");
        assert_eq!(expand("$$(NODE_NAME)", &env), "$(NODE_NAME)");
        assert_eq!(expand("cost $5 $(", &env), "cost $5 $(");
    }
}
