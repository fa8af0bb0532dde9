//! The node's last NodeConfig, kept in the state directory: a proxy that starts while it cannot
//! read its NodeConfig (deleted while the operator is stopped, not written yet) routes from the
//! last one it saw instead of from nothing, which would fail every route target closed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aether_crds::node_config::NodeConfigSpec;
use serde::{Deserialize, Serialize};
use tracing::warn;

const FILE: &str = "node-config.json";

#[derive(Serialize, Deserialize)]
struct Saved {
    generation: i64,
    spec: NodeConfigSpec,
}

pub struct LastConfig {
    path: PathBuf,
    held: Mutex<Option<(i64, Arc<NodeConfigSpec>)>>,
}

impl LastConfig {
    /// The config saved in `state_dir`, if any. An unreadable file is reported and ignored:
    /// the next config read replaces it.
    pub fn load(state_dir: &Path) -> LastConfig {
        let path = state_dir.join(FILE);
        let held = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Saved>(&bytes) {
                Ok(saved) => Some((saved.generation, Arc::new(saved.spec))),
                Err(error) => {
                    warn!(path = %path.display(), %error, "ignoring the saved node config");
                    None
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                warn!(path = %path.display(), %error, "cannot read the saved node config");
                None
            }
        };
        LastConfig {
            path,
            held: Mutex::new(held),
        }
    }

    /// Keeps `spec` as the last config, on disk too when it changed.
    pub fn remember(&self, generation: i64, spec: &NodeConfigSpec) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held
            .as_ref()
            .is_some_and(|(g, s)| *g == generation && **s == *spec)
        {
            return;
        }
        let saved = Saved {
            generation,
            spec: spec.clone(),
        };
        let written = serde_json::to_vec(&saved)
            .map_err(std::io::Error::other)
            // The first config may come before the agent made the state directory.
            .and_then(|json| crate::state::file::write_in_private_dir(&self.path, &json));
        if let Err(error) = written {
            warn!(path = %self.path.display(), %error, "cannot save the node config");
        }
        *held = Some((generation, Arc::new(saved.spec)));
    }

    pub fn get(&self) -> Option<(i64, Arc<NodeConfigSpec>)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_config_survives_a_restart_and_a_bad_file_is_ignored() {
        let dir = std::env::temp_dir().join(format!("aether-last-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = NodeConfigSpec {
            capture_addresses: vec!["10.96.0.10:80".into()],
            capture_count: 1,
            ..NodeConfigSpec::default()
        };
        assert!(LastConfig::load(&dir).get().is_none());
        LastConfig::load(&dir).remember(7, &spec);
        let (generation, loaded) = LastConfig::load(&dir).get().unwrap();
        assert_eq!((generation, &*loaded), (7, &spec));
        std::fs::write(dir.join(FILE), b"{not json").unwrap();
        assert!(LastConfig::load(&dir).get().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
