use serde_json::{Value, json};

use super::error::{CniError, ErrorCode};

/// The spec versions this plugin implements, exactly. 0.4.0 and 1.0.0 results look alike for a
/// chained plugin that passes `prevResult` through; 1.1.0 adds STATUS and GC.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];
pub const LATEST_VERSION: &str = "1.1.0";

/// Fails with code 1 unless `version` is one we implement.
pub fn check_version(version: &str) -> Result<(), CniError> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!("CNI version {version:?} is not supported by aether-cni"),
            format!(
                "aether-cni supports {}; set \"cniVersion\" in the network config list to one of them",
                SUPPORTED_VERSIONS.join(", ")
            ),
        ))
    }
}

/// The VERSION reply. It names the version the runtime asked about when we support it.
pub fn version_reply(requested: Option<&str>) -> Value {
    let version = requested
        .filter(|v| SUPPORTED_VERSIONS.contains(v))
        .unwrap_or(LATEST_VERSION);
    json!({ "cniVersion": version, "supportedVersions": SUPPORTED_VERSIONS })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_versions_pass() {
        for v in SUPPORTED_VERSIONS {
            assert!(check_version(v).is_ok());
        }
    }

    #[test]
    fn other_versions_fail_with_code_1() {
        for v in ["0.3.1", "1.2.0", "", "1.0"] {
            assert_eq!(
                check_version(v).unwrap_err().code,
                ErrorCode::IncompatibleVersion
            );
        }
    }

    #[test]
    fn version_reply_lists_exactly_what_we_support() {
        assert_eq!(
            version_reply(Some("1.0.0")),
            json!({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
        );
        assert_eq!(version_reply(Some("9.9.9"))["cniVersion"], "1.1.0");
        assert_eq!(version_reply(None)["cniVersion"], "1.1.0");
    }
}
