//! Runs a node's CNI configuration the way a container runtime does (containerd's go-cni):
//! the `loopback` plugin for `lo`, then every plugin of the node's first network config
//! list for `eth0`, each given the previous plugin's result, with the environment and
//! stdin the CNI spec defines. ADD results are cached for DEL, which runs the list in
//! reverse with that result as `prevResult`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::mounts::{Namespaces, NodeView};

const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("no network config (*.conflist or *.conf) in {0}")]
    NoConfig(PathBuf),
    #[error("cannot read network config {path}: {message}")]
    BadConfig { path: PathBuf, message: String },
    #[error("plugin {0:?} not found in the CNI bin dirs")]
    PluginNotFound(String),
    #[error("plugin {plugin} {command} failed: {message}")]
    PluginFailed {
        plugin: String,
        command: &'static str,
        message: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One pod's network attachment.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub container_id: String,
    pub netns: PathBuf,
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
}

/// The CNI set-up of one node.
#[derive(Debug, Clone)]
pub struct Cni {
    /// Plugins run in the node's filesystem view, as they would on a real node; the two
    /// directories below are paths of that view.
    pub view: NodeView,
    /// The node's network namespace: the bridge plugin builds the node's bridge there.
    pub node_netns: PathBuf,
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    /// Where ADD results are kept for DEL (a path on this machine).
    pub cache_dir: PathBuf,
}

/// A network config list: name, version and plugin configs.
#[derive(Debug, Clone)]
struct NetworkList {
    name: String,
    version: String,
    plugins: Vec<Value>,
}

impl Cni {
    /// Sets up the pod's network; returns the pod's IP addresses.
    pub async fn add(&self, pod: &Attachment) -> Result<Vec<String>, CniError> {
        let loopback = NetworkList {
            name: "cni-loopback".into(),
            version: "1.0.0".into(),
            plugins: vec![json!({"type": "loopback"})],
        };
        self.run_add(&loopback, pod, "lo").await?;
        let list = self.network_list()?;
        let result = match self.run_add(&list, pod, "eth0").await {
            Ok(result) => result,
            Err(error) => {
                // As runtimes do, undo whatever part of the ADD succeeded.
                let _ = self.run_del(&list, pod, "eth0", None).await;
                return Err(error);
            }
        };
        std::fs::create_dir_all(&self.cache_dir)?;
        std::fs::write(
            self.cache_path(pod),
            serde_json::to_vec(&result).unwrap_or_default(),
        )?;
        Ok(pod_ips(&result))
    }

    /// Tears the pod's network down. Idempotent, as the spec requires of plugins.
    pub async fn del(&self, pod: &Attachment) -> Result<(), CniError> {
        let cached = std::fs::read(self.cache_path(pod))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let list = self.network_list()?;
        self.run_del(&list, pod, "eth0", cached).await?;
        let _ = std::fs::remove_file(self.cache_path(pod));
        Ok(())
    }

    /// The pod IPs of an earlier ADD, from the cached result.
    pub fn cached_ips(&self, pod: &Attachment) -> Option<Vec<String>> {
        let bytes = std::fs::read(self.cache_path(pod)).ok()?;
        let result: Value = serde_json::from_slice(&bytes).ok()?;
        Some(pod_ips(&result)).filter(|ips| !ips.is_empty())
    }

    fn cache_path(&self, pod: &Attachment) -> PathBuf {
        self.cache_dir.join(format!("{}.json", pod.container_id))
    }

    /// The lexicographically first `*.conflist` or `*.conf`, as runtimes choose.
    fn network_list(&self) -> Result<NetworkList, CniError> {
        let conf_dir = self.view.host_path(&self.conf_dir);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&conf_dir)
            .map_err(|_| CniError::NoConfig(conf_dir.clone()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conflist" | "conf")
                )
            })
            .collect();
        files.sort();
        let path = files
            .into_iter()
            .next()
            .ok_or_else(|| CniError::NoConfig(conf_dir.clone()))?;
        let bad = |message: String| CniError::BadConfig {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        let config: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let name = config["name"]
            .as_str()
            .ok_or_else(|| bad("missing \"name\"".into()))?
            .to_owned();
        let version = config["cniVersion"].as_str().unwrap_or("1.0.0").to_owned();
        let plugins = match config.get("plugins") {
            Some(Value::Array(plugins)) => plugins.clone(),
            Some(_) => return Err(bad("\"plugins\" is not a list".into())),
            None => vec![config.clone()],
        };
        Ok(NetworkList {
            name,
            version,
            plugins,
        })
    }

    async fn run_add(
        &self,
        list: &NetworkList,
        pod: &Attachment,
        ifname: &str,
    ) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            prev = Some(
                self.invoke("ADD", list, plugin, pod, ifname, prev.as_ref())
                    .await?,
            );
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    async fn run_del(
        &self,
        list: &NetworkList,
        pod: &Attachment,
        ifname: &str,
        prev: Option<Value>,
    ) -> Result<(), CniError> {
        let mut first_error = None;
        for plugin in list.plugins.iter().rev() {
            if let Err(e) = self
                .invoke("DEL", list, plugin, pod, ifname, prev.as_ref())
                .await
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn find_plugin(&self, kind: &str) -> Result<PathBuf, CniError> {
        self.bin_dirs
            .iter()
            .map(|d| self.view.host_path(&d.join(kind)))
            .find(|p| p.is_file())
            .ok_or_else(|| CniError::PluginNotFound(kind.to_owned()))
    }

    async fn invoke(
        &self,
        command: &'static str,
        list: &NetworkList,
        plugin: &Value,
        pod: &Attachment,
        ifname: &str,
        prev: Option<&Value>,
    ) -> Result<Value, CniError> {
        let kind = plugin["type"].as_str().unwrap_or_default().to_owned();
        let path = self.find_plugin(&kind)?;
        let stdin = plugin_stdin(list, plugin, prev);
        let cni_path = std::env::join_paths(&self.bin_dirs)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut namespaces = Namespaces::node(&self.view);
        namespaces.netns(&self.node_netns)?;
        let mut command_line = tokio::process::Command::new(&path);
        // SAFETY: `enter` only makes system calls on data prepared before the fork.
        unsafe {
            command_line.pre_exec(move || namespaces.enter());
        }
        let mut child = command_line
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", &pod.netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_ARGS", cni_args(pod))
            .env("CNI_PATH", cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut input = child.stdin.take().expect("piped stdin");
        input.write_all(stdin.to_string().as_bytes()).await?;
        drop(input);
        let output = tokio::time::timeout(PLUGIN_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| CniError::PluginFailed {
                plugin: kind.clone(),
                command,
                message: format!("timed out after {PLUGIN_TIMEOUT:?}"),
            })??;
        if !output.status.success() {
            return Err(CniError::PluginFailed {
                plugin: kind,
                command,
                message: plugin_error(&output.stdout, &output.stderr),
            });
        }
        if command == "DEL" || output.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(prev.cloned().unwrap_or(Value::Null));
        }
        serde_json::from_slice(&output.stdout).map_err(|e| CniError::PluginFailed {
            plugin: kind,
            command,
            message: format!("result is not JSON: {e}"),
        })
    }
}

/// The stdin of one plugin in a list: its own config plus the list's name and version, and
/// the previous result.
fn plugin_stdin(list: &NetworkList, plugin: &Value, prev: Option<&Value>) -> Value {
    let mut config = plugin.clone();
    if let Value::Object(map) = &mut config {
        map.insert("name".into(), Value::String(list.name.clone()));
        map.insert("cniVersion".into(), Value::String(list.version.clone()));
        if let Some(prev) = prev.filter(|p| !p.is_null()) {
            map.insert("prevResult".into(), prev.clone());
        }
    }
    config
}

/// The `CNI_ARGS` the kubelet's runtime passes.
fn cni_args(pod: &Attachment) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
        pod.pod_namespace, pod.pod_name, pod.container_id, pod.pod_uid
    )
}

fn plugin_error(stdout: &[u8], stderr: &[u8]) -> String {
    match serde_json::from_slice::<Value>(stdout) {
        Ok(error) => {
            let msg = error["msg"].as_str().unwrap_or("(no msg)");
            match error["details"].as_str().filter(|d| !d.is_empty()) {
                Some(details) => format!("code {}: {msg}: {details}", error["code"]),
                None => format!("code {}: {msg}", error["code"]),
            }
        }
        Err(_) => format!(
            "{} {}",
            String::from_utf8_lossy(stdout).trim(),
            String::from_utf8_lossy(stderr).trim()
        ),
    }
}

/// The addresses (without prefix length) of a CNI result.
fn pod_ips(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .map(|a| a.split('/').next().unwrap_or(a).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_get_the_list_name_version_and_previous_result() {
        let list = NetworkList {
            name: "net".into(),
            version: "1.0.0".into(),
            plugins: vec![],
        };
        let stdin = plugin_stdin(
            &list,
            &json!({"type": "aether-cni", "x": 1}),
            Some(&json!({"ips": []})),
        );
        assert_eq!(
            stdin,
            json!({"type": "aether-cni", "x": 1, "name": "net", "cniVersion": "1.0.0", "prevResult": {"ips": []}})
        );
        assert!(
            plugin_stdin(&list, &json!({"type": "bridge"}), None)
                .get("prevResult")
                .is_none()
        );
    }

    #[test]
    fn results_give_pod_ips() {
        let result = json!({"ips": [{"address": "10.244.1.5/24", "interface": 2}, {"address": "fd00::5/64"}]});
        assert_eq!(pod_ips(&result), ["10.244.1.5", "fd00::5"]);
    }

    #[test]
    fn plugin_errors_show_code_message_and_details() {
        let out = br#"{"cniVersion":"1.0.0","code":11,"msg":"proxy down","details":"retry later"}"#;
        assert_eq!(plugin_error(out, b""), "code 11: proxy down: retry later");
        assert_eq!(plugin_error(b"boom", b"stack"), "boom stack");
    }
}
