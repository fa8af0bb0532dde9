//! The pods registered by the CNI plugin, kept on disk so a restarted proxy reopens their
//! listeners: a pod's table keeps redirecting to the capture port whether the proxy runs or not,
//! and nothing else would tell a new proxy process where the pods' network namespaces are.
//!
//! Plain data and its file format; the caller decides when to save.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use aether_cni::nft::Families;
use aether_cni::protocol::PodRef;
use serde::{Deserialize, Serialize};

use crate::inpod::capture_set::CaptureSet;

/// One registration: a meshed pod's attachment, as the plugin reported it at ADD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisteredPod {
    pub pod: PodRef,
    pub container_id: String,
    pub ifname: String,
    pub netns: PathBuf,
    pub ips: Vec<IpAddr>,
    /// The port the pod's table redirects to. Fixed when the table was installed, so listeners
    /// are reopened on it even if the proxy's own setting changed since.
    pub capture_port: u16,
    /// The capture set generation the pod's table holds.
    pub generation: u64,
    /// The inbound port, when the pod's table is in strict mTLS mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_inbound_port: Option<u16>,
}

impl RegisteredPod {
    /// The IP families of the pod's table (the same rule the plugin installed it with).
    pub fn families(&self) -> Families {
        Families::for_pod(&self.ips)
    }

    /// The elements of the pod's table under `capture`.
    pub fn elements(&self, capture: &CaptureSet) -> Vec<SocketAddr> {
        capture.for_pod(&self.pod.namespace, &self.ips)
    }
}

/// The container id under which the proxy registers a running pod it meshed itself (one
/// that started before its namespace was opted in, or before this proxy was installed): the
/// runtime never knew the pod by it, so the runtime's GC keeps it, and the proxy forgets the
/// pod itself when it goes.
pub fn enrolled_id(pod_uid: &str) -> String {
    format!("{ENROLLED_PREFIX}{pod_uid}")
}

const ENROLLED_PREFIX: &str = "aether-enrolled:";

impl RegisteredPod {
    /// Registered by the proxy itself rather than by the CNI plugin.
    pub fn enrolled(&self) -> bool {
        self.container_id.starts_with(ENROLLED_PREFIX)
    }

    /// Whether this registration is of `pod` (the same uid when both know it).
    pub fn is_of(&self, pod: &PodRef) -> bool {
        self.pod.namespace == pod.namespace
            && self.pod.name == pod.name
            && match (&self.pod.uid, &pod.uid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// Registrations by container id: the runtime's key for DEL and GC.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registry {
    pods: BTreeMap<String, RegisteredPod>,
}

/// Bumped when the file's shape changes, so an older proxy refuses a newer file instead of
/// misreading it.
const FILE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    version: u32,
    pods: Vec<RegisteredPod>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read pod registry {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "pod registry {} is unreadable ({reason}); move it away to start with an empty registry (the pods registered in it then need to be recreated to be captured by a listener again)",
        path.display()
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("cannot write pod registry {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

impl Registry {
    pub fn get(&self, container_id: &str) -> Option<&RegisteredPod> {
        self.pods.get(container_id)
    }

    pub fn pods(&self) -> impl Iterator<Item = &RegisteredPod> {
        self.pods.values()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Adds or replaces the registration of `pod.container_id`; returns the one it replaced.
    pub fn insert(&mut self, pod: RegisteredPod) -> Option<RegisteredPod> {
        self.pods.insert(pod.container_id.clone(), pod)
    }

    /// Removes the attachment `(container_id, ifname)`. A DEL for another interface of the same
    /// container (another network in a multi-network pod) leaves the registration alone.
    pub fn remove(&mut self, container_id: &str, ifname: &str) -> Option<RegisteredPod> {
        match self.pods.get(container_id) {
            Some(pod) if pod.ifname == ifname => self.pods.remove(container_id),
            _ => None,
        }
    }

    /// Keeps only the containers in `valid` (the runtime's GC list), and the pods the proxy
    /// enrolled itself; returns the others.
    pub fn retain_valid(&mut self, valid: &[String]) -> Vec<RegisteredPod> {
        let (kept, removed) = std::mem::take(&mut self.pods)
            .into_iter()
            .partition(|(id, pod)| pod.enrolled() || valid.contains(id));
        self.pods = kept;
        removed.into_values().collect()
    }

    /// Records that the table of `container_id` now holds capture set `generation`.
    pub fn set_generation(&mut self, container_id: &str, generation: u64) {
        if let Some(pod) = self.pods.get_mut(container_id) {
            pod.generation = generation;
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        let file = RegistryFile {
            version: FILE_VERSION,
            pods: self.pods.values().cloned().collect(),
        };
        serde_json::to_vec_pretty(&file).expect("the registry has string keys only")
    }

    /// Parses the file format; the error is the reason, for [`RegistryError::Corrupt`].
    pub fn from_json(bytes: &[u8]) -> Result<Registry, String> {
        #[derive(Deserialize)]
        struct VersionProbe {
            version: u64,
        }
        let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if probe.version != u64::from(FILE_VERSION) {
            return Err(format!(
                "file version {} is not {FILE_VERSION}, the version this proxy writes",
                probe.version
            ));
        }
        let file: RegistryFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let mut registry = Registry::default();
        for pod in file.pods {
            let id = pod.container_id.clone();
            if registry.insert(pod).is_some() {
                return Err(format!("container {id} is registered twice"));
            }
        }
        Ok(registry)
    }

    /// The registry at `path`; empty when there is no file yet (a new node).
    pub fn load(path: &Path) -> Result<Registry, RegistryError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Registry::default()),
            Err(source) => {
                return Err(RegistryError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Registry::from_json(&bytes).map_err(|reason| RegistryError::Corrupt {
            path: path.to_owned(),
            reason,
        })
    }

    /// Saves to `path`; a crash leaves either the old registry or the new one.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        crate::state::file::write_atomically(path, &self.to_json()).map_err(|source| {
            RegistryError::Write {
                path: path.to_owned(),
                source,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(container_id: &str) -> RegisteredPod {
        RegisteredPod {
            pod: PodRef {
                namespace: "shop".into(),
                name: format!("web-{container_id}"),
                uid: Some(format!("uid-{container_id}")),
            },
            container_id: container_id.into(),
            ifname: "eth0".into(),
            netns: format!("/var/run/netns/{container_id}").into(),
            ips: vec!["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            capture_port: 15001,
            generation: 3,
            strict_inbound_port: None,
        }
    }

    fn registry(ids: &[&str]) -> Registry {
        let mut registry = Registry::default();
        for id in ids {
            registry.insert(pod(id));
        }
        registry
    }

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "aether-proxy-registry-{name}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn json_round_trips() {
        let registry = registry(&["a", "b"]);
        assert_eq!(Registry::from_json(&registry.to_json()), Ok(registry));
    }

    #[test]
    fn the_file_format_is_stable() {
        let json: serde_json::Value = serde_json::from_slice(&registry(&["a"]).to_json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"version": 1, "pods": [{
                "pod": {"namespace": "shop", "name": "web-a", "uid": "uid-a"},
                "containerId": "a", "ifname": "eth0", "netns": "/var/run/netns/a",
                "ips": ["10.244.1.5", "fd00::5"], "capturePort": 15001, "generation": 3
            }]})
        );
    }

    #[test]
    fn other_versions_and_garbage_are_refused() {
        for bytes in [
            &b""[..],
            b"{}",
            b"[]",
            br#"{"version": 2, "pods": []}"#,
            br#"{"version": 1}"#,
            br#"{"version": 1, "pods": [{"containerId": "a"}]}"#,
        ] {
            assert!(Registry::from_json(bytes).is_err(), "{bytes:?}");
        }
        let twice = format!(
            r#"{{"version": 1, "pods": [{0}, {0}]}}"#,
            serde_json::to_string(&pod("a")).unwrap()
        );
        assert_eq!(
            Registry::from_json(twice.as_bytes()),
            Err("container a is registered twice".into())
        );
    }

    #[test]
    fn save_then_load_and_a_missing_file_is_empty() {
        let dir = TempDir::new("save");
        let path = dir.0.join("registry.json");
        assert_eq!(Registry::load(&path).unwrap(), Registry::default());

        let registry = registry(&["a", "b"]);
        registry.save(&path).unwrap();
        assert_eq!(Registry::load(&path).unwrap(), registry);
        let smaller = self::registry(&["b"]);
        smaller.save(&path).unwrap();
        assert_eq!(Registry::load(&path).unwrap(), smaller);

        let names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["registry.json"], "no temporary file is left");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_corrupt_file_is_named_with_a_way_out() {
        let dir = TempDir::new("corrupt");
        let path = dir.0.join("registry.json");
        std::fs::write(&path, b"{\"version\": 1, \"pods\": [").unwrap();
        let error = Registry::load(&path).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("pod registry {} is unreadable (", path.display())),
            "{error}"
        );
        assert!(error.contains("move it away"), "{error}");
    }

    #[test]
    fn save_into_a_missing_directory_fails_clearly() {
        let error = registry(&["a"])
            .save(Path::new("/nonexistent/aether/registry.json"))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot write pod registry /nonexistent/aether/registry.json: "),
            "{error}"
        );
    }

    #[test]
    fn remove_matches_the_interface_too() {
        let mut registry = registry(&["a"]);
        assert_eq!(registry.remove("a", "net1"), None);
        assert_eq!(registry.remove("b", "eth0"), None);
        assert_eq!(registry.remove("a", "eth0"), Some(pod("a")));
        assert!(registry.is_empty());
    }

    #[test]
    fn gc_keeps_only_valid_containers() {
        let mut registry = registry(&["a", "b", "c"]);
        let removed = registry.retain_valid(&["b".into(), "z".into()]);
        let removed: Vec<_> = removed.iter().map(|p| p.container_id.as_str()).collect();
        assert_eq!(removed, ["a", "c"]);
        assert_eq!(registry, self::registry(&["b"]));
        assert_eq!(registry.retain_valid(&[]).len(), 1);
        assert!(registry.is_empty());
    }

    #[test]
    fn generations_are_recorded_per_pod() {
        let mut registry = registry(&["a", "b"]);
        registry.set_generation("a", 9);
        registry.set_generation("unknown", 9);
        assert_eq!(registry.get("a").unwrap().generation, 9);
        assert_eq!(registry.get("b").unwrap().generation, 3);
        assert_eq!(registry.len(), 2);
    }

    #[test]
    fn families_follow_the_pod_ips() {
        let mut v4 = pod("a");
        v4.ips = vec!["10.244.1.5".parse().unwrap()];
        assert_eq!(
            v4.families(),
            Families {
                ipv4: true,
                ipv6: false
            }
        );
    }
}
