use serde_json::{Value, json};

/// The error codes of the CNI spec (section "Error"), plus aether's own codes from 100 up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    IncompatibleVersion = 1,
    InvalidEnv = 4,
    Io = 5,
    Decoding = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADD requests.
    NotAvailable = 50,
    /// aether: the pod's nftables capture table could not be installed, read or removed.
    CaptureTable = 100,
    /// aether: CHECK found the capture table or the proxy registration not as installed.
    CaptureDrift = 101,
    /// aether: the node proxy answered, but refused or failed the request.
    ProxyRefused = 102,
}

/// A CNI error: printed as JSON on stdout, with a non-zero exit status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    pub code: ErrorCode,
    /// What went wrong, in one line.
    pub msg: String,
    /// What the operator can do about it, or the underlying cause.
    pub details: String,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The spec's error object. `cni_version` is the config's version when it was readable.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code as u32,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_spec_fields() {
        let e = CniError::new(
            ErrorCode::InvalidEnv,
            "CNI_COMMAND is not set",
            "run by the runtime",
        );
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 4, "msg": "CNI_COMMAND is not set", "details": "run by the runtime"})
        );
    }

    #[test]
    fn plugin_codes_are_at_least_100() {
        for code in [
            ErrorCode::CaptureTable,
            ErrorCode::CaptureDrift,
            ErrorCode::ProxyRefused,
        ] {
            assert!(code as u32 >= 100);
        }
    }
}
