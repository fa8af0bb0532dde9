//! A node as the CNI plugin's and the proxy's tests need it: real network namespaces, pods as a
//! container runtime makes them, TCP from inside them, and the real CNI chain (`loopback`,
//! `bridge` + `host-local`, then `aether-cni`) run the way containerd runs it. Every resource is
//! removed by a `Drop` guard, so a failing test leaves nothing behind, and named uniquely, so
//! tests run in parallel. Needs root.

pub mod netns;
pub mod runtime;
pub mod sockets;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

pub use netns::{Netns, in_netns, run_here, run_in};
pub use runtime::{PluginRun, Pod, TempDir, require_root, unique};

/// Where Debian's containernetworking-plugins are.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A node: its netns (the bridge lives there), host-local's state, and the network config
/// list `loopback` + `bridge`/`host-local` + `aether-cni`.
pub struct Node {
    pub netns: Netns,
    pub state: TempDir,
    pub ipv4_subnet: String,
    pub ipv6_subnet: Option<String>,
    /// aether-cni's entry in the list (its settings).
    pub aether: Value,
    /// The aether-cni binary under test.
    pub aether_cni: PathBuf,
}

impl Node {
    pub fn new(dual_stack: bool, aether: Value, aether_cni: impl Into<PathBuf>) -> Self {
        let netns = Netns::new("aen");
        netns.sysctl("net.ipv6.conf.default.accept_dad", "0");
        netns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        Node {
            netns,
            state: TempDir::new(),
            ipv4_subnet: "10.244.1.0/24".into(),
            ipv6_subnet: dual_stack.then(|| "fd00:244:1::/64".into()),
            aether,
            aether_cni: aether_cni.into(),
        }
    }

    pub fn bridge_conf(&self) -> Value {
        let mut ranges = vec![json!([{"subnet": self.ipv4_subnet}])];
        let mut routes = vec![json!({"dst": "0.0.0.0/0"})];
        if let Some(v6) = &self.ipv6_subnet {
            ranges.push(json!([{"subnet": v6}]));
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

    /// Runs `program` for `pod` from the node's netns, with the runtime's environment.
    pub fn invoke(
        &self,
        program: &str,
        command: &str,
        pod: &Pod,
        ifname: &str,
        stdin: &Value,
    ) -> PluginRun {
        let netns = pod.netns.path().to_string_lossy().into_owned();
        self.invoke_with(
            program,
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", &pod.container_id),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", ifname),
                ("CNI_ARGS", &pod.cni_args()),
                ("CNI_PATH", CNI_BIN_DIR),
            ],
            stdin.to_string().as_bytes(),
        )
    }

    /// The primary plugins run in the node's netns, so the bridge they build stays out of the
    /// host's. aether-cni runs where the test runs, the host's netns, as a runtime would run it:
    /// it joins the pod's netns itself, and reaches the API server from the host.
    pub fn invoke_with(&self, program: &str, env: &[(&str, &str)], stdin: &[u8]) -> PluginRun {
        if program == "aether-cni" {
            run_here(&self.aether_cni, env, stdin)
        } else {
            run_in(
                self.netns.path(),
                &Path::new(CNI_BIN_DIR).join(program),
                env,
                stdin,
            )
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

    /// aether-cni's ADD with `prev` as prevResult.
    pub fn add_aether(&self, pod: &Pod, prev: &Value) -> PluginRun {
        self.aether_command("ADD", pod, Some(prev))
    }

    pub fn aether_command(&self, command: &str, pod: &Pod, prev: Option<&Value>) -> PluginRun {
        let stdin = self.stdin(&self.aether, prev);
        self.invoke("aether-cni", command, pod, "eth0", &stdin)
    }

    /// The whole chain's ADD; returns aether-cni's run and the bridge's result.
    pub fn add(&self, pod: &Pod) -> (PluginRun, Value) {
        let prev = self.add_primary(pod);
        (self.add_aether(pod, &prev), prev)
    }

    /// aether-cni's DEL, as the first step of a runtime's DEL of the chain.
    pub fn del_aether(&self, pod: &Pod, prev: &Value) -> PluginRun {
        self.aether_command("DEL", pod, Some(prev))
    }

    /// The chain's DEL, in reverse order, as a runtime does it.
    pub fn del(&self, pod: &Pod, prev: &Value) -> PluginRun {
        let aether = self.del_aether(pod, prev);
        let bridge = self.bridge_conf();
        self.invoke(
            "bridge",
            "DEL",
            pod,
            "eth0",
            &self.stdin(&bridge, Some(prev)),
        );
        let lo = json!({"type": "loopback"});
        self.invoke("loopback", "DEL", pod, "lo", &self.stdin(&lo, None));
        aether
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
            &self.aether_cni,
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

/// The aether-cni entry of a node whose proxy listens on `socket`.
pub fn aether_entry(socket: &Path) -> Value {
    json!({"type": "aether-cni", "proxySocket": socket})
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

/// `nft list ruleset` inside `netns`, as text.
pub fn ruleset(netns: &Netns) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.path().display()))
        .args(["nft", "list", "ruleset"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}
