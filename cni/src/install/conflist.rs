//! Editing the node's network config: pure functions over JSON.

use serde_json::{Map, Value, json};

use crate::plugin::Settings;

/// The plugin's `type`: the runtime runs the binary of this name from its CNI bin dir.
pub const PLUGIN_TYPE: &str = "aether-cni";

/// The file kinds a runtime reads (libcni's `ConfFiles`): a `.conflist` holds a chain, a
/// `.conf` or `.json` a single plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfKind {
    List,
    Single,
}

impl ConfKind {
    pub fn of(file_name: &str) -> Option<ConfKind> {
        if file_name.ends_with(".conflist") {
            Some(ConfKind::List)
        } else if file_name.ends_with(".conf") || file_name.ends_with(".json") {
            Some(ConfKind::Single)
        } else {
            None
        }
    }
}

/// The config file a runtime uses: the lexicographically first one it can read.
pub fn primary_config(file_names: &[String]) -> Option<&str> {
    file_names
        .iter()
        .filter(|name| ConfKind::of(name).is_some())
        .min()
        .map(String::as_str)
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("it is not a JSON object")]
    NotAnObject,
    #[error("its \"plugins\" is missing or not a list")]
    NoPluginList,
}

/// Our entry in the chain.
pub fn plugin_entry(settings: &Settings) -> Value {
    let mut entry = Map::new();
    entry.insert("type".into(), json!(PLUGIN_TYPE));
    if let Ok(Value::Object(fields)) = serde_json::to_value(settings) {
        entry.extend(fields);
    }
    Value::Object(entry)
}

/// The config with `entry` as the last plugin of its chain, replacing any earlier aether entry.
/// A single-plugin config becomes a list (its `cniVersion` and `name` move to the list).
/// Applying it twice gives the same result as once.
pub fn with_plugin(config: &Value, kind: ConfKind, entry: &Value) -> Result<Value, EditError> {
    let mut list = match kind {
        ConfKind::List => config.clone(),
        ConfKind::Single => single_to_list(config)?,
    };
    let plugins = plugin_list(&mut list)?;
    plugins.retain(|p| !is_ours(p));
    plugins.push(entry.clone());
    Ok(list)
}

/// The list without aether's entries; `None` when it had none.
pub fn without_plugin(config: &Value) -> Result<Option<Value>, EditError> {
    let mut list = config.clone();
    let plugins = plugin_list(&mut list)?;
    let before = plugins.len();
    plugins.retain(|p| !is_ours(p));
    Ok((plugins.len() != before).then_some(list))
}

fn single_to_list(config: &Value) -> Result<Value, EditError> {
    let Value::Object(plugin) = config else {
        return Err(EditError::NotAnObject);
    };
    let mut plugin = plugin.clone();
    let mut list = Map::new();
    for key in ["cniVersion", "name"] {
        if let Some(value) = plugin.remove(key) {
            list.insert(key.into(), value);
        }
    }
    list.insert("plugins".into(), json!([plugin]));
    Ok(Value::Object(list))
}

fn plugin_list(list: &mut Value) -> Result<&mut Vec<Value>, EditError> {
    list.as_object_mut()
        .ok_or(EditError::NotAnObject)?
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .ok_or(EditError::NoPluginList)
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn bridge_list() -> Value {
        json!({
            "cniVersion": "1.0.0", "name": "k8s-pod-network",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local"}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        })
    }

    fn entry() -> Value {
        plugin_entry(&Settings {
            kubeconfig: Some(PathBuf::from("/etc/cni/net.d/aether-cni.kubeconfig")),
            ..Settings::default()
        })
    }

    #[test]
    fn the_entry_carries_type_and_settings() {
        assert_eq!(
            entry(),
            json!({"type": "aether-cni", "proxySocket": "/var/run/aether/cni.sock",
                   "kubeconfig": "/etc/cni/net.d/aether-cni.kubeconfig"})
        );
    }

    #[test]
    fn the_runtime_picks_the_first_config_by_name() {
        let names: Vec<String> = [
            "99-loopback.conf",
            "10-calico.conflist",
            "05-x.txt",
            "20-b.json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(primary_config(&names), Some("10-calico.conflist"));
        assert_eq!(primary_config(&["README".to_string()]), None);
    }

    #[test]
    fn inserting_appends_at_the_end_and_is_idempotent() {
        let once = with_plugin(&bridge_list(), ConfKind::List, &entry()).unwrap();
        let plugins = once["plugins"].as_array().unwrap();
        assert_eq!(plugins.len(), 3);
        assert_eq!(plugins[2], entry());
        assert_eq!(with_plugin(&once, ConfKind::List, &entry()).unwrap(), once);
    }

    #[test]
    fn new_settings_replace_the_old_entry_and_it_moves_last() {
        let old = json!({"type": "aether-cni", "proxySocket": "/old.sock"});
        let mut config = bridge_list();
        config["plugins"].as_array_mut().unwrap().insert(0, old);
        let edited = with_plugin(&config, ConfKind::List, &entry()).unwrap();
        let types: Vec<&str> = edited["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["bridge", "portmap", "aether-cni"]);
        assert_eq!(edited["plugins"][2], entry());
    }

    #[test]
    fn a_single_plugin_config_becomes_a_list() {
        let single =
            json!({"cniVersion": "0.4.0", "name": "net", "type": "bridge", "bridge": "cni0"});
        let edited = with_plugin(&single, ConfKind::Single, &entry()).unwrap();
        assert_eq!(
            edited,
            json!({"cniVersion": "0.4.0", "name": "net",
                   "plugins": [{"type": "bridge", "bridge": "cni0"}, entry()]})
        );
    }

    #[test]
    fn removing_restores_the_original_list() {
        let installed = with_plugin(&bridge_list(), ConfKind::List, &entry()).unwrap();
        assert_eq!(without_plugin(&installed).unwrap(), Some(bridge_list()));
        assert_eq!(without_plugin(&bridge_list()).unwrap(), None);
    }

    #[test]
    fn configs_that_are_not_lists_are_refused() {
        assert_eq!(
            with_plugin(&json!([]), ConfKind::List, &entry()),
            Err(EditError::NotAnObject)
        );
        assert_eq!(
            with_plugin(&json!({"plugins": {}}), ConfKind::List, &entry()),
            Err(EditError::NoPluginList)
        );
        assert_eq!(
            with_plugin(&json!("x"), ConfKind::Single, &entry()),
            Err(EditError::NotAnObject)
        );
        assert_eq!(without_plugin(&json!({})), Err(EditError::NoPluginList));
    }
}
