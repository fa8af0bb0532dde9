//! The certificate authority's wire format, spoken by the operator (server) and the proxy
//! (client).
//!
//! `POST /v1/svid` with `Authorization: Bearer <token>` and an [`SvidRequest`] answers an
//! [`SvidResponse`]; `GET /v1/trust-bundle` answers a [`TrustBundleResponse`]; a refusal
//! answers an [`ErrorBody`].

use serde::{Deserialize, Serialize};

pub const SVID_PATH: &str = "/v1/svid";
pub const TRUST_BUNDLE_PATH: &str = "/v1/trust-bundle";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SvidRequest {
    pub namespace: String,
    pub service_account: String,
    /// PEM PKCS#10, its one URI SAN the SPIFFE ID asked for.
    pub csr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SvidResponse {
    pub spiffe_id: String,
    /// PEM, leaf first.
    pub cert_chain: String,
    /// PEM roots of the mesh.
    pub trust_bundle: String,
    /// RFC 3339.
    pub expires_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustBundleResponse {
    pub trust_domain: String,
    pub trust_bundle: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// For people.
    pub error: String,
    /// A stable name for programs, such as `NoPodOnNode`.
    pub code: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_names_are_camel_case() {
        let request = SvidRequest {
            namespace: "shop".into(),
            service_account: "web".into(),
            csr: "PEM".into(),
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            serde_json::json!({"namespace": "shop", "serviceAccount": "web", "csr": "PEM"})
        );
        let answer: SvidResponse = serde_json::from_value(serde_json::json!({
            "spiffeId": "spiffe://cluster.local/ns/shop/sa/web",
            "certChain": "C", "trustBundle": "B", "expiresAt": "2026-12-06T00:00:00Z"
        }))
        .unwrap();
        assert_eq!(answer.cert_chain, "C");
    }
}
