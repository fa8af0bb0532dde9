//! The test API of aether's local cluster.
//!
//! [`Cluster::get`] makes sure the cluster is up (starting it with `tests/cluster/up.sh`
//! once per test binary when it is not) and hands each test its own `kube::Client`.
//! Everything goes through the Kubernetes API, as a user's tools do: commands in pods with
//! `kubectl exec`, their output with `kubectl logs`, and a node's own view (its network
//! namespaces, nft tables, CNI config) from a privileged shell pod on that node
//! ([`Cluster::on_node`]). `tests/run.sh` takes the cluster down after the suite with
//! `tests/cluster/down.sh`, which checks that nothing of it is left on the machine.

pub mod echo;
pub mod mesh;
pub mod node;
pub mod process;
pub mod stream;
pub mod wire;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Paths of the running cluster (see `tests/cluster/lib.sh`).
#[derive(Debug, Clone)]
pub struct Paths {
    pub repo: PathBuf,
    pub state: PathBuf,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

impl Paths {
    /// The paths `tests/cluster/lib.sh` uses, honouring the same overrides. Needs no cluster.
    pub fn from_env() -> Self {
        let repo = aether_test_support::repo_root();
        let cache = std::env::var_os("AETHER_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/var/cache/aether".into());
        let state = std::env::var_os("AETHER_STATE")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/var/lib/aether-cluster".into());
        Paths {
            repo,
            kubeconfig: state.join("admin.kubeconfig"),
            kubectl: cache.join("bin/kubectl"),
            state,
        }
    }

    /// The `helm` that `tests/cluster/build.sh` builds beside kubectl.
    pub fn helm(&self) -> PathBuf {
        self.kubectl.with_file_name("helm")
    }

    /// The aether Helm chart.
    pub fn chart(&self) -> PathBuf {
        self.repo.join("charts/aether")
    }
}

/// The shared cluster, and a client for one test.
pub struct Cluster {
    pub paths: Paths,
    pub client: kube::Client,
}

static UP: OnceLock<Result<Paths, String>> = OnceLock::new();

/// The local cluster's own nodes (`node/node-1` ...); other Node objects (a benchmark's)
/// do not make the cluster unready.
fn cluster_nodes() -> Vec<String> {
    let count: usize = std::env::var("AETHER_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    (1..=count).map(|i| format!("node/node-{i}")).collect()
}

fn bring_up() -> Result<Paths, String> {
    let paths = Paths::from_env();
    let ready = Command::new(&paths.kubectl)
        .args(["--kubeconfig"])
        .arg(&paths.kubeconfig)
        .args(["get", "--raw", "/readyz", "--request-timeout=5s"])
        .output()
        .is_ok_and(|o| o.status.success());
    let nodes_ready = ready
        && Command::new(&paths.kubectl)
            .arg("--kubeconfig")
            .arg(&paths.kubeconfig)
            .args(["wait", "--for=condition=Ready", "--timeout=5s"])
            .args(cluster_nodes())
            .output()
            .is_ok_and(|o| o.status.success());
    if !nodes_ready {
        let status = Command::new(paths.repo.join("tests/cluster/up.sh"))
            .status()
            .map_err(|e| format!("cannot run tests/cluster/up.sh: {e}"))?;
        if !status.success() {
            return Err(format!("tests/cluster/up.sh failed ({status})"));
        }
    }
    Ok(paths)
}

impl Cluster {
    /// The running cluster, started if needed (once per test binary).
    pub async fn get() -> Result<Cluster> {
        let paths = tokio::task::spawn_blocking(|| UP.get_or_init(bring_up).clone())
            .await?
            .map_err(anyhow::Error::msg)?;
        let kubeconfig = Kubeconfig::read_from(&paths.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Cluster {
            client: kube::Client::try_from(config)?,
            paths,
        })
    }

    /// A client authenticated as a ServiceAccount (with a fresh token from the TokenRequest
    /// API), so a test runs a component with exactly the permissions its RBAC grants.
    pub async fn client_as(&self, namespace: &str, service_account: &str) -> Result<kube::Client> {
        let token = self.kubectl(&[
            "-n",
            namespace,
            "create",
            "token",
            service_account,
            "--duration=1h",
        ])?;
        self.client_with_token(token.trim()).await
    }

    /// A client that presents `token` alone (none of the admin's credentials).
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client> {
        let mut kubeconfig = Kubeconfig::read_from(&self.paths.kubeconfig)?;
        for user in &mut kubeconfig.auth_infos {
            if let Some(auth) = user.auth_info.as_mut() {
                *auth = kube::config::AuthInfo {
                    token: Some(token.to_owned().into()),
                    ..Default::default()
                };
            }
        }
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Renders one template of the aether chart for the install namespace `namespace`.
    pub fn chart_template(&self, namespace: &str, template: &str) -> Result<String> {
        let output = Command::new(self.paths.helm())
            .args(["template", "aether"])
            .arg(self.paths.chart())
            .args(["--namespace", namespace, "--show-only", template])
            .output()?;
        if !output.status.success() {
            bail!(
                "helm template {template} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Applies manifests given as text.
    pub fn apply_text(&self, manifests: &str) -> Result<()> {
        // One file per call: tests of a binary apply concurrently.
        static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let file = std::env::temp_dir().join(format!(
            "aether-e2e-{}-{}.yaml",
            std::process::id(),
            FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::write(&file, manifests)?;
        let result = self.apply(&file);
        std::fs::remove_file(&file)?;
        result
    }

    /// Runs kubectl against the cluster; fails with its output when it fails.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let output = Command::new(&self.paths.kubectl)
            .arg("--kubeconfig")
            .arg(&self.paths.kubeconfig)
            .args(args)
            .output()?;
        if !output.status.success() {
            bail!(
                "kubectl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The messages of the Events in `namespace` that `field_selector` picks (e.g.
    /// `involvedObject.name=web,reason=Failed`), one per line.
    pub fn event_messages(&self, namespace: &str, field_selector: &str) -> Result<String> {
        self.kubectl(&[
            "-n",
            namespace,
            "get",
            "events",
            "--field-selector",
            field_selector,
            "-o",
            "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
        ])
    }

    /// Deletes the namespaces `names` if they exist and waits until they are gone.
    pub fn delete_namespaces(&self, names: &[&str]) -> Result<()> {
        let mut args = vec!["delete", "namespace"];
        args.extend(names);
        args.extend(["--ignore-not-found", "--wait", "--timeout=180s"]);
        self.kubectl(&args).map(drop)
    }

    /// Sets `label` (`key=value`) on the namespace `name`, replacing its value.
    pub fn label_namespace(&self, name: &str, label: &str) -> Result<()> {
        self.kubectl(&["label", "namespace", name, label, "--overwrite"])
            .map(drop)
    }

    /// `kubectl patch` of `target` (`kind/name`) in `namespace` with a patch of `kind`
    /// (`merge` or `json`).
    pub fn patch(
        &self,
        namespace: &str,
        target: &str,
        kind: &str,
        patch: &serde_json::Value,
    ) -> Result<()> {
        let kind = format!("--type={kind}");
        self.kubectl(&[
            "-n",
            namespace,
            "patch",
            target,
            &kind,
            "-p",
            &patch.to_string(),
        ])
        .map(|_| ())
    }

    /// Waits (up to 2 minutes) until the rollout of `target` (`kind/name`) is complete.
    pub fn rollout_status(&self, namespace: &str, target: &str) -> Result<()> {
        self.kubectl(&[
            "-n",
            namespace,
            "rollout",
            "status",
            target,
            "--timeout=120s",
        ])
        .map(|_| ())
    }

    /// Applies a manifest file (server-side, so it can be re-applied).
    pub fn apply(&self, file: &Path) -> Result<()> {
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.to_string_lossy(),
        ])
        .map(|_| ())
    }

    /// Applies a kustomization directory (server-side), such as the Gateway API CRDs of one
    /// channel ([`aether_test_support::upstream::Release::crds`]).
    pub fn apply_kustomization(&self, dir: &Path) -> Result<()> {
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            &dir.to_string_lossy(),
        ])
        .map(|_| ())
    }

    /// Waits until `namespace` has at least `count` pods and all of them are Ready.
    pub async fn wait_ready(
        &self,
        namespace: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let deadline = Instant::now() + timeout;
        loop {
            let pods = api.list(&ListParams::default()).await?.items;
            let live: Vec<Pod> = pods
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            if live.len() >= count && live.iter().all(is_ready) {
                return Ok(live);
            }
            if Instant::now() > deadline {
                let names: Vec<_> = live
                    .iter()
                    .map(|p| {
                        format!(
                            "{}={}",
                            p.metadata.name.as_deref().unwrap_or(""),
                            is_ready(p)
                        )
                    })
                    .collect();
                bail!("pods in {namespace} not all Ready after {timeout:?}: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Runs `argv` in a container of a pod (`kubectl exec`); the output whatever its status.
    pub fn exec(&self, pod: &Pod, container: &str, argv: &[&str]) -> Result<Output> {
        let (namespace, name) = names(pod)?;
        let output = Command::new(&self.paths.kubectl)
            .arg("--kubeconfig")
            .arg(&self.paths.kubeconfig)
            .args(["-n", namespace, "exec", name, "-c", container, "--"])
            .args(argv)
            .output()?;
        Ok(output)
    }

    /// What a container of a pod wrote (`kubectl logs`).
    pub fn logs(&self, pod: &Pod, container: &str) -> Result<String> {
        let (namespace, name) = names(pod)?;
        self.kubectl(&["-n", namespace, "logs", name, "-c", container])
    }

    /// Runs `argv` on `node`, as root in the node's own namespaces and with its files (a
    /// privileged host-network shell pod on the node, chrooted into the node's root).
    pub fn on_node(&self, node: &str, argv: &[&str]) -> Result<Output> {
        let shell = node::shell(self, node)?;
        // The node's env finds the node's programs: busybox would run its own applets.
        let mut command = vec!["chroot", "/host", "/usr/bin/env"];
        command.extend(argv);
        self.exec(&shell, "shell", &command)
    }

    /// Starts whatever of the control plane is not running (`control-plane.sh up`), after a
    /// test stopped part of it. The controller manager and the scheduler exit when they cannot
    /// renew their leases (a supervisor restarts them in a real cluster); retried, as one may
    /// still be exiting during the first attempt.
    pub async fn start_control_plane(&self) -> Result<()> {
        let script = self.paths.repo.join("tests/cluster/control-plane.sh");
        for _ in 0..5 {
            let started = Command::new(&script)
                .arg("up")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?
                .success();
            if started {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        bail!("cannot start the control plane again")
    }

    /// A node's address (its `InternalIP`).
    pub fn node_ip(&self, node: &str) -> Result<String> {
        let object: serde_json::Value =
            serde_json::from_str(&self.kubectl(&["get", "node", node, "-o", "json"])?)?;
        object["status"]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == "InternalIP")
            .and_then(|a| a["address"].as_str())
            .map(str::to_owned)
            .with_context(|| format!("node {node} has no InternalIP"))
    }

    /// [`Cluster::on_node`] that must succeed; its stdout.
    pub fn on_node_ok(&self, node: &str, argv: &[&str]) -> Result<String> {
        let output = self.on_node(node, argv)?;
        if !output.status.success() {
            bail!(
                "on {node}: {} failed ({}): {}{}",
                argv.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The name of a pod's network namespace on its node (under the node's /run/netns, where
    /// containerd made it), found by the pod's address; `None` when no namespace has it.
    pub fn pod_netns(&self, pod: &Pod) -> Result<Option<String>> {
        let ip = pod_ip(pod)?;
        let script = format!(
            "for n in $(ip netns list | cut -d' ' -f1); do \
             ip -n \"$n\" -o addr show | grep -q ' {ip}/' && echo \"$n\"; done; true"
        );
        let found = self.on_node_ok(&node_of(pod)?, &["sh", "-c", &script])?;
        Ok(found.lines().next().map(str::to_owned))
    }

    /// The process of a container, as this machine numbers it (the nodes share its PID
    /// namespace), from the node's containerd. For benchmarks that put load into a pod's
    /// network from this machine ([`Cluster::netns_of`]) or read a process's resources; tests
    /// go through the API.
    pub fn container_pid(&self, pod: &Pod, container: &str) -> Result<u32> {
        let id = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.name == container)
            .and_then(|c| c.container_id.as_deref())
            .and_then(|id| id.strip_prefix("containerd://"))
            .with_context(|| format!("pod {:?} has no running {container}", pod.metadata.name))?
            .to_owned();
        let tasks = self.on_node_ok(
            &node_of(pod)?,
            &[
                "ctr",
                "--address",
                "/run/containerd/containerd.sock",
                "-n",
                "k8s.io",
                "tasks",
                "ls",
            ],
        )?;
        tasks
            .lines()
            .find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some(id.as_str())).then(|| words.next()?.parse().ok())?
            })
            .with_context(|| format!("containerd lists no task {id}"))
    }

    /// A pod's network namespace as this machine reaches it (through the process of its
    /// container `container`); see [`Cluster::container_pid`].
    pub fn netns_of(&self, pod: &Pod, container: &str) -> Result<PathBuf> {
        Ok(PathBuf::from(format!(
            "/proc/{}/ns/net",
            self.container_pid(pod, container)?
        )))
    }

    /// `nft ARGS` in a pod's network namespace, run on its node.
    pub fn nft_in_pod(&self, pod: &Pod, args: &[&str]) -> Result<Output> {
        let netns = self
            .pod_netns(pod)?
            .with_context(|| format!("no network namespace holds pod {:?}", pod.metadata.name))?;
        let mut argv = vec!["ip", "netns", "exec", &netns, "nft"];
        argv.extend(args);
        self.on_node(&node_of(pod)?, &argv)
    }
}

fn names(pod: &Pod) -> Result<(&str, &str)> {
    Ok((
        pod.metadata
            .namespace
            .as_deref()
            .context("pod without namespace")?,
        pod.metadata.name.as_deref().context("pod without name")?,
    ))
}

/// The node a pod is bound to.
pub fn node_of(pod: &Pod) -> Result<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .with_context(|| format!("pod {:?} is not bound to a node", pod.metadata.name))
}

/// A pod's address.
pub fn pod_ip(pod: &Pod) -> Result<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .with_context(|| format!("pod {:?} has no IP", pod.metadata.name))
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
