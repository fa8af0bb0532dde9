use std::net::IpAddr;

use serde_json::Value;

use crate::cni_io::{CniError, ErrorCode};

/// The pod's addresses from the previous plugin's result (`ips[].address`, in CIDR notation in
/// both the 0.4.0 and 1.x formats). A result without `ips` gives none.
pub fn pod_ips(prev_result: &Value) -> Result<Vec<IpAddr>, CniError> {
    let Some(ips) = prev_result.get("ips") else {
        return Ok(Vec::new());
    };
    let Some(ips) = ips.as_array() else {
        return Err(invalid("prevResult.ips is not a list".into()));
    };
    ips.iter()
        .enumerate()
        .map(|(i, entry)| {
            let address = entry
                .get("address")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("prevResult.ips[{i}] has no \"address\" string")))?;
            let ip = address.split_once('/').map_or(address, |(ip, _)| ip);
            ip.parse().map_err(|_| {
                invalid(format!(
                    "prevResult.ips[{i}].address {address:?} is not an IP address"
                ))
            })
        })
        .collect()
}

fn invalid(msg: String) -> CniError {
    CniError::new(
        ErrorCode::InvalidConfig,
        msg,
        "the previous plugin in the chain returned a result aether-cni cannot read",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn dual_stack_bridge_result() {
        let prev = json!({"ips": [
            {"interface": 2, "address": "10.22.0.5/16", "gateway": "10.22.0.1"},
            {"interface": 2, "address": "fd00:22::5/64"}
        ]});
        assert_eq!(
            pod_ips(&prev).unwrap(),
            [
                "10.22.0.5".parse::<IpAddr>().unwrap(),
                "fd00:22::5".parse().unwrap()
            ]
        );
    }

    #[test]
    fn version_0_4_0_entries_and_missing_ips() {
        let prev = json!({"ips": [{"version": "4", "address": "10.1.0.2/24"}]});
        assert_eq!(pod_ips(&prev).unwrap().len(), 1);
        assert!(pod_ips(&json!({"interfaces": []})).unwrap().is_empty());
    }

    #[test]
    fn unreadable_addresses_are_invalid_config() {
        for prev in [
            json!({"ips": {}}),
            json!({"ips": [{"gateway": "10.0.0.1"}]}),
            json!({"ips": [{"address": "not-an-ip/24"}]}),
            json!({"ips": [{"address": 7}]}),
        ] {
            assert_eq!(
                pod_ips(&prev).unwrap_err().code,
                ErrorCode::InvalidConfig,
                "{prev}"
            );
        }
    }
}
