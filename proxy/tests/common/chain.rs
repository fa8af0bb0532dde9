//! Pods and a node as a container runtime sees them, and the real CNI chain run for them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};

use super::{CNI_BIN_DIR, Netns, PluginRun, Pod, TempDir, run_here, run_in};

/// The `aether-cni` binary of this workspace, built once per test binary. Cargo offers
/// `CARGO_BIN_EXE_*` only for the package's own binaries, so it is built here into the same
/// target directory the tests were built in (a no-op when `cargo build --workspace` ran first,
/// as tests/run.sh does).
pub fn aether_cni() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Test binaries live in <target>/<profile>/deps.
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap();
        let target_dir = profile_dir.parent().unwrap();
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
        // What cargo sets for running this test (the package's CARGO_PKG_* and manifest
        // variables, the build scripts' LD_LIBRARY_PATH) would change dependencies' build
        // fingerprints and make every run rebuild the plugin.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_MANIFEST_")
                || key == "LD_LIBRARY_PATH"
            {
                cargo.env_remove(&*key);
            }
        }
        cargo
            .args([
                "build",
                "--quiet",
                "-p",
                "aether-cni",
                "--bin",
                "aether-cni",
            ])
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            cargo.arg("--release");
        }
        let status = cargo.status().unwrap();
        assert!(status.success(), "cargo build -p aether-cni failed");
        let binary = profile_dir.join("aether-cni");
        assert!(binary.exists(), "{} was not built", binary.display());
        binary
    })
}

/// The pod's IPs from the bridge plugin's result.
pub fn pod_ips(prev: &Value) -> Vec<IpAddr> {
    prev["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| {
            let cidr = ip["address"].as_str().unwrap();
            cidr.split('/').next().unwrap().parse().unwrap()
        })
        .collect()
}

/// A node: its netns (the bridge lives there), host-local's state, and the network config
/// list `loopback` + `bridge`/`host-local` + `aether-cni`, run the way containerd runs it.
pub struct Node {
    pub netns: Netns,
    pub state: TempDir,
    pub dual_stack: bool,
    pub aether: Value,
}

impl Node {
    /// A node whose aether-cni talks to the proxy at `socket`.
    pub fn new(dual_stack: bool, socket: &Path) -> Self {
        let netns = Netns::new("aepn");
        netns.sysctl("net.ipv6.conf.default.accept_dad", "0");
        netns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        Node {
            netns,
            state: TempDir::new(),
            dual_stack,
            aether: json!({"type": "aether-cni", "proxySocket": socket}),
        }
    }

    pub fn bridge_conf(&self) -> Value {
        let mut ranges = vec![json!([{"subnet": "10.244.1.0/24"}])];
        let mut routes = vec![json!({"dst": "0.0.0.0/0"})];
        if self.dual_stack {
            ranges.push(json!([{"subnet": "fd00:244:1::/64"}]));
            routes.push(json!({"dst": "::/0"}));
        }
        json!({
            "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
            "ipam": {"type": "host-local", "ranges": ranges, "routes": routes,
                     "dataDir": self.state.path().join("ipam")}
        })
    }

    fn stdin(&self, plugin: &Value, prev: Option<&Value>) -> Value {
        let mut conf = plugin.clone();
        conf["cniVersion"] = json!("1.0.0");
        conf["name"] = json!("k8s-pod-network");
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    /// Runs `program` for `pod` with the runtime's environment: the primary plugins in the
    /// node's netns (so the bridge stays out of the host's), aether-cni where the test runs, as
    /// a runtime runs it (it joins the pod's netns itself).
    fn invoke(
        &self,
        program: &str,
        command: &str,
        pod: &Pod,
        ifname: &str,
        stdin: &Value,
    ) -> PluginRun {
        let netns = pod.netns.path().to_string_lossy().into_owned();
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", &pod.container_id),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", ifname),
            ("CNI_ARGS", &pod.cni_args()),
            ("CNI_PATH", CNI_BIN_DIR),
        ];
        let stdin = stdin.to_string();
        if program == "aether-cni" {
            run_here(aether_cni(), &env, stdin.as_bytes())
        } else {
            let program = Path::new(CNI_BIN_DIR).join(program);
            run_in(self.netns.path(), &program, &env, stdin.as_bytes())
        }
    }

    /// The primary part of the chain: `loopback` on `lo`, then `bridge` on `eth0`.
    pub fn add_primary(&self, pod: &Pod) -> Value {
        let lo = json!({"type": "loopback"});
        self.invoke("loopback", "ADD", pod, "lo", &self.stdin(&lo, None))
            .ok();
        let bridge = self.bridge_conf();
        self.invoke("bridge", "ADD", pod, "eth0", &self.stdin(&bridge, None))
            .ok()
            .json()
    }

    pub fn aether_command(&self, command: &str, pod: &Pod, prev: Option<&Value>) -> PluginRun {
        let stdin = self.stdin(&self.aether, prev);
        self.invoke("aether-cni", command, pod, "eth0", &stdin)
    }

    /// The whole chain's ADD; returns aether-cni's run and the bridge's result.
    pub fn add(&self, pod: &Pod) -> (PluginRun, Value) {
        let prev = self.add_primary(pod);
        (self.aether_command("ADD", pod, Some(&prev)), prev)
    }

    /// aether-cni's DEL, as the first step of a runtime's DEL of the chain.
    pub fn del_aether(&self, pod: &Pod, prev: &Value) -> PluginRun {
        self.aether_command("DEL", pod, Some(prev))
    }

    /// aether-cni's GC with the runtime's list of attachments still in use.
    pub fn gc(&self, valid: &[&Pod]) -> PluginRun {
        let valid: Vec<Value> = valid
            .iter()
            .map(|pod| json!({"containerID": pod.container_id, "ifname": "eth0"}))
            .collect();
        let mut conf = self.aether.clone();
        conf["cniVersion"] = json!("1.1.0");
        conf["name"] = json!("k8s-pod-network");
        conf["cni.dev/valid-attachments"] = json!(valid);
        run_here(
            aether_cni(),
            &[("CNI_COMMAND", "GC")],
            conf.to_string().as_bytes(),
        )
    }

    /// Puts `ips` on the node netns's loopback, standing in for ClusterIPs served by
    /// kube-proxy: an uncaptured connection to one of them lands on the node.
    pub fn add_service_ips(&self, ips: &[&str]) {
        for ip in ips {
            let prefix = if ip.contains(':') { "128" } else { "32" };
            self.netns.ip(&[
                "addr",
                "add",
                &format!("{ip}/{prefix}"),
                "dev",
                "lo",
                "nodad",
            ]);
        }
    }
}
