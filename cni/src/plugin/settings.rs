use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::nft::Nft;
use crate::protocol::DEFAULT_SOCKET;

/// aether-cni's own keys in its entry of the network config list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Settings {
    /// The node proxy's socket.
    pub proxy_socket: PathBuf,
    /// Lets the plugin decide "meshed or not" from the API server while the proxy is down, so
    /// unmeshed pods still start. Without it, every ADD fails while the proxy is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Run this `nft` program instead of libnftables in-process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nft_path: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            proxy_socket: PathBuf::from(DEFAULT_SOCKET),
            kubeconfig: None,
            nft_path: None,
        }
    }
}

impl Settings {
    pub fn nft(&self) -> Nft {
        self.nft_path.as_ref().map(Nft::program).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_apply_to_missing_keys() {
        let s: Settings = serde_json::from_value(json!({})).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.proxy_socket, PathBuf::from("/var/run/aether/cni.sock"));
    }

    #[test]
    fn keys_are_camel_case_and_unset_ones_are_not_written() {
        let s: Settings = serde_json::from_value(
            json!({"proxySocket": "/run/a.sock", "kubeconfig": "/etc/cni/net.d/aether.kubeconfig"}),
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"proxySocket": "/run/a.sock", "kubeconfig": "/etc/cni/net.d/aether.kubeconfig"})
        );
    }
}
