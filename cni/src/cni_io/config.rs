use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{CniError, ErrorCode};
use super::version::check_version;

/// The network configuration the runtime writes on stdin. `P` is the plugin's own settings,
/// read from the same object. `prevResult` stays raw JSON: a chained plugin passes it through
/// unchanged, and a typed result would reject fields a primary plugin leaves out.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf<P> {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    #[serde(default)]
    pub prev_result: Option<Value>,
    /// GC only: the attachments the runtime still uses.
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Option<Vec<ValidAttachment>>,
    #[serde(flatten)]
    pub plugin: P,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// Parses stdin. Codes: 6 when it is not JSON, 1 when its cniVersion is not one we implement,
/// 7 when a field is missing or has the wrong type.
pub fn parse_config<P: DeserializeOwned>(stdin: &[u8]) -> Result<NetConf<P>, CniError> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            ErrorCode::Decoding,
            "the network configuration on stdin is not valid JSON",
            e.to_string(),
        )
    })?;
    match value.get("cniVersion") {
        Some(Value::String(version)) => check_version(version)?,
        _ => {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                "the network configuration has no \"cniVersion\" string",
                "the runtime copies it from the network config list; set \"cniVersion\" there",
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| {
        CniError::new(
            ErrorCode::InvalidConfig,
            "the network configuration is not valid for aether-cni",
            e.to_string(),
        )
    })
}

/// The `cniVersion` of stdin, if it can be read at all: error replies carry it.
pub fn declared_version(stdin: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(rename = "cniVersion")]
        cni_version: String,
    }
    serde_json::from_slice::<Probe>(stdin)
        .ok()
        .map(|p| p.cni_version)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Settings {
        #[serde(default)]
        proxy_socket: Option<String>,
    }

    /// A bridge plugin's result: host-side interfaces have no `sandbox`, which broke cni-plugin.
    fn bridge_prev_result() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:00"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": "/var/run/netns/x"}
            ],
            "ips": [{"interface": 2, "address": "10.22.0.5/16", "gateway": "10.22.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    #[test]
    fn chained_config_keeps_prev_result_verbatim() {
        let stdin = json!({
            "cniVersion": "1.0.0", "name": "k8s", "type": "aether-cni",
            "proxySocket": "/run/x.sock", "prevResult": bridge_prev_result()
        });
        let conf: NetConf<Settings> = parse_config(stdin.to_string().as_bytes()).unwrap();
        assert_eq!(conf.prev_result, Some(bridge_prev_result()));
        assert_eq!(conf.plugin.proxy_socket.as_deref(), Some("/run/x.sock"));
        assert_eq!(conf.plugin_type, "aether-cni");
    }

    #[test]
    fn gc_config_lists_valid_attachments() {
        let stdin = json!({
            "cniVersion": "1.1.0", "name": "k8s", "type": "aether-cni",
            "cni.dev/valid-attachments": [{"containerID": "abc", "ifname": "eth0"}]
        });
        let conf: NetConf<Settings> = parse_config(stdin.to_string().as_bytes()).unwrap();
        assert_eq!(
            conf.valid_attachments,
            Some(vec![ValidAttachment {
                container_id: "abc".into(),
                ifname: "eth0".into()
            }])
        );
    }

    #[test]
    fn not_json_is_a_decoding_failure() {
        for stdin in [&b""[..], b"{", b"\xff\xfe", b"[1,2"] {
            let err = parse_config::<Settings>(stdin).unwrap_err();
            assert_eq!(err.code, ErrorCode::Decoding);
        }
    }

    #[test]
    fn wrong_version_is_incompatible() {
        let stdin = br#"{"cniVersion": "0.3.1", "name": "k8s", "type": "aether-cni"}"#;
        let err = parse_config::<Settings>(stdin).unwrap_err();
        assert_eq!(err.code, ErrorCode::IncompatibleVersion);
        assert!(err.details.contains("0.4.0, 1.0.0, 1.1.0"), "{err}");
    }

    #[test]
    fn missing_fields_are_invalid_config() {
        for stdin in [
            &br#"{"name": "k8s", "type": "aether-cni"}"#[..],
            br#"{"cniVersion": 1, "name": "k8s", "type": "aether-cni"}"#,
            br#"{"cniVersion": "1.0.0", "type": "aether-cni"}"#,
            br#"{"cniVersion": "1.0.0", "name": "k8s", "type": "aether-cni", "proxySocket": 3}"#,
            br#"[]"#,
        ] {
            let err = parse_config::<Settings>(stdin).unwrap_err();
            assert_eq!(
                err.code,
                ErrorCode::InvalidConfig,
                "{}",
                String::from_utf8_lossy(stdin)
            );
        }
    }

    #[test]
    fn declared_version_reads_what_it_can() {
        assert_eq!(declared_version(br#"{"cniVersion":"0.4.0","x":[}"#), None);
        assert_eq!(
            declared_version(br#"{"cniVersion":"0.4.0"}"#).as_deref(),
            Some("0.4.0")
        );
    }
}
