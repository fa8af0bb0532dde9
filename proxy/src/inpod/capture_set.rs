//! The capture set: every address a meshed pod's table redirects to the proxy. Most are for
//! every pod (route targets' and meshed Services' ClusterIP:ports, the meshed pods behind
//! headless Services); the targets of consumer-only routes are for the pods of the routes'
//! namespaces alone. Its source is the node's NodeConfig (or a JSON file, for a proxy run without a
//! cluster); the set the pods' tables were last brought to is kept in the state directory, so
//! a proxy that restarts while the NodeConfig is missing keeps capturing what it did.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureSet {
    /// Changes whenever `targets` or `namespaces` does. Each registered pod records the
    /// generation its table holds, so an update only touches the pods that are behind.
    pub generation: u64,
    /// Captured for every pod. Sorted and free of duplicates (see [`CaptureSet::parse`]).
    pub targets: Vec<SocketAddr>,
    /// Captured for the pods of one namespace only, as the consumer routes of that namespace
    /// apply to them alone. Sorted and free of duplicates; never one of `targets`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<String, Vec<SocketAddr>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureSetError {
    #[error("cannot read capture set {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write capture set {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("capture set {}: {source}", path.display())]
    Invalid {
        path: PathBuf,
        source: InvalidCaptureSet,
    },
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCaptureSet {
    #[error(
        "not JSON of the form {{\"generation\": 1, \"targets\": [\"10.96.0.10:80\", \"[fd00::10]:80\"]}}: {0}"
    )]
    Syntax(String),
    /// nftables would accept it, but no Service port is 0: it is a mistake in the source.
    #[error("target {0} has port 0")]
    PortZero(SocketAddr),
}

/// The file in the proxy's state directory with the set the pods' tables were last brought to.
const SAVED_FILE: &str = "capture-set.json";

impl CaptureSet {
    /// Parses and normalises the JSON form.
    pub fn parse(text: &str) -> Result<CaptureSet, InvalidCaptureSet> {
        let mut set: CaptureSet =
            serde_json::from_str(text).map_err(|e| InvalidCaptureSet::Syntax(e.to_string()))?;
        let all = set.targets.iter().chain(set.namespaces.values().flatten());
        if let Some(target) = all.into_iter().find(|t| t.port() == 0) {
            return Err(InvalidCaptureSet::PortZero(*target));
        }
        set.normalise();
        Ok(set)
    }

    /// Sorts and dedups every list, and keeps out of `namespaces` what is in `targets`.
    pub fn normalise(&mut self) {
        self.targets.sort();
        self.targets.dedup();
        for scoped in self.namespaces.values_mut() {
            scoped.retain(|t| self.targets.binary_search(t).is_err());
            scoped.sort();
            scoped.dedup();
        }
        self.namespaces.retain(|_, scoped| !scoped.is_empty());
    }

    /// What the table of a pod of `namespace` with addresses `own` holds: never the pod's own
    /// addresses, as what a pod sends itself stays in the pod (and the inbound side delivers
    /// to the pod's own address from inside it: capturing that would loop).
    pub fn for_pod(&self, namespace: &str, own: &[IpAddr]) -> Vec<SocketAddr> {
        let scoped = self.namespaces.get(namespace).into_iter().flatten();
        let mut out: Vec<SocketAddr> = self
            .targets
            .iter()
            .chain(scoped)
            .filter(|t| !own.contains(&t.ip()))
            .copied()
            .collect();
        out.sort();
        out
    }

    /// Whether a pod of `namespace` has `address` captured.
    pub fn captures(&self, namespace: &str, address: &SocketAddr) -> bool {
        self.targets.binary_search(address).is_ok()
            || self
                .namespaces
                .get(namespace)
                .is_some_and(|scoped| scoped.binary_search(address).is_ok())
    }

    pub fn load(path: &Path) -> Result<CaptureSet, CaptureSetError> {
        let text = std::fs::read_to_string(path).map_err(|source| CaptureSetError::Read {
            path: path.to_owned(),
            source,
        })?;
        CaptureSet::parse(&text).map_err(|source| CaptureSetError::Invalid {
            path: path.to_owned(),
            source,
        })
    }

    /// The set last saved in `state_dir`, if any.
    pub fn load_saved(state_dir: &Path) -> Result<Option<CaptureSet>, CaptureSetError> {
        match CaptureSet::load(&state_dir.join(SAVED_FILE)) {
            Ok(set) => Ok(Some(set)),
            Err(CaptureSetError::Read { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, state_dir: &Path) -> Result<(), CaptureSetError> {
        let path = state_dir.join(SAVED_FILE);
        serde_json::to_vec(self)
            .map_err(io::Error::other)
            .and_then(|json| crate::state::file::write_atomically(&path, &json))
            .map_err(|source| CaptureSetError::Write { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises_targets() {
        let set = CaptureSet::parse(
            r#"{"generation": 4, "targets": ["10.96.0.11:80", "[fd00::10]:443", "10.96.0.10:80", "10.96.0.11:80"]}"#,
        )
        .unwrap();
        assert_eq!(set.generation, 4);
        assert_eq!(
            set.targets,
            vec![
                "10.96.0.10:80".parse::<SocketAddr>().unwrap(),
                "10.96.0.11:80".parse().unwrap(),
                "[fd00::10]:443".parse().unwrap(),
            ]
        );
    }

    #[test]
    fn a_pod_gets_the_common_targets_its_namespaces_and_never_its_own_addresses() {
        let set = CaptureSet::parse(
            r#"{"generation": 2, "targets": ["10.96.0.10:80", "10.244.1.5:8080", "10.244.1.6:8080"],
                "namespaces": {"shop": ["10.96.0.20:80", "10.96.0.10:80"], "empty": ["10.96.0.10:80"]}}"#,
        )
        .unwrap();
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(set.namespaces.len(), 1, "{set:?}");
        assert_eq!(set.namespaces["shop"], [addr("10.96.0.20:80")]);
        let own = ["10.244.1.5".parse().unwrap()];
        assert_eq!(
            set.for_pod("shop", &own),
            [
                addr("10.96.0.10:80"),
                addr("10.96.0.20:80"),
                addr("10.244.1.6:8080")
            ]
        );
        assert_eq!(
            set.for_pod("other", &[]),
            [
                addr("10.96.0.10:80"),
                addr("10.244.1.5:8080"),
                addr("10.244.1.6:8080")
            ]
        );
        assert!(set.captures("shop", &addr("10.96.0.20:80")));
        assert!(!set.captures("other", &addr("10.96.0.20:80")));
        assert!(set.captures("other", &addr("10.96.0.10:80")));
    }

    #[test]
    fn an_empty_set_is_valid() {
        assert_eq!(
            CaptureSet::parse(r#"{"generation": 0, "targets": []}"#).unwrap(),
            CaptureSet::default()
        );
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        for text in [
            "",
            "[]",
            r#"{"targets": []}"#,
            r#"{"generation": 1, "targets": ["10.96.0.10"]}"#,
            r#"{"generation": 1, "targets": ["not an address:80"]}"#,
            r#"{"generation": -1, "targets": []}"#,
            r#"{"generation": 1, "targets": [], "target": []}"#,
        ] {
            let error = CaptureSet::parse(text).unwrap_err();
            assert!(
                matches!(error, InvalidCaptureSet::Syntax(_)),
                "{text}: {error}"
            );
            assert!(error.to_string().contains("\"generation\": 1"), "{error}");
        }
        assert_eq!(
            CaptureSet::parse(r#"{"generation": 1, "targets": ["10.96.0.10:0"]}"#),
            Err(InvalidCaptureSet::PortZero("10.96.0.10:0".parse().unwrap()))
        );
        assert_eq!(
            CaptureSet::parse(
                r#"{"generation": 1, "targets": [], "namespaces": {"a": ["10.96.0.10:0"]}}"#
            ),
            Err(InvalidCaptureSet::PortZero("10.96.0.10:0".parse().unwrap()))
        );
    }

    #[test]
    fn load_names_the_file() {
        let missing = Path::new("/nonexistent/aether/capture.json");
        let error = CaptureSet::load(missing).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot read capture set /nonexistent/aether/capture.json: "),
            "{error}"
        );
    }
}
