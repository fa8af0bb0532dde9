//! `tests/gateway-conformance/cases.yaml`: the GAMMA mesh conformance tests of the Gateway API
//! release the project pins, as data (what each client sends, what must be observed). Read by
//! the route engine's table test and by the end-to-end harness.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Cases {
    /// Profiles by name, beside notes about them (see [`Cases::profiles`]).
    #[serde(rename = "profiles")]
    profiles_section: BTreeMap<String, serde_json::Value>,
    pub tests: Vec<Test>,
}

#[derive(Debug, Deserialize)]
pub struct Profile {
    pub core_features: Vec<String>,
    pub extended_features: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Test {
    pub short_name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub features: Vec<String>,
    #[serde(default)]
    pub provisional: bool,
    /// Profile name → `core`, `extended` or `not-counted`.
    #[serde(default)]
    pub profile_membership: BTreeMap<String, String>,
    pub manifests: Vec<String>,
    #[serde(default)]
    pub routes: Vec<RouteRef>,
    #[serde(default)]
    pub client: Option<Client>,
    pub cases: Vec<Case>,
    #[serde(default)]
    pub weighted: Option<Weighted>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct RouteRef {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    #[serde(rename = "parentRef", default)]
    pub parent_ref: Option<ParentRef>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct ParentRef {
    /// The Service the route attaches to.
    pub name: String,
}

#[derive(Debug, Deserialize, Clone)]
pub struct Client {
    pub namespace: String,
    #[serde(default)]
    pub pod_selector: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Case {
    pub go_subtest_name: String,
    #[serde(default)]
    pub client: Option<Client>,
    pub request: Request,
    pub expect: Expect,
}

#[derive(Debug, Deserialize)]
pub struct Request {
    pub protocol: String,
    pub url: String,
    pub dial_host: String,
    pub dial_port: u16,
    #[serde(default)]
    pub host_header: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// gRPC metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub struct Expect {
    pub status: Vec<u16>,
    pub backend_pod_prefix: Option<String>,
    #[serde(default)]
    pub backend_request_headers: BTreeMap<String, String>,
    #[serde(default)]
    pub backend_absent_request_headers: Vec<String>,
    #[serde(default)]
    pub response_headers: BTreeMap<String, String>,
    #[serde(default)]
    pub response_absent_headers: Vec<String>,
    #[serde(default)]
    pub intended_redirect_not_asserted: Option<IntendedRedirect>,
    #[serde(default)]
    pub intended_backend_path_not_asserted: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct IntendedRedirect {
    pub location: String,
}

#[derive(Debug, Deserialize)]
pub struct Weighted {
    pub request: WeightedRequest,
    pub total_requests: usize,
    pub expected_fractions: BTreeMap<String, f64>,
    pub tolerance_abs: f64,
}

#[derive(Debug, Deserialize)]
pub struct WeightedRequest {
    pub url: String,
    #[serde(default)]
    pub method: Option<String>,
}

impl Cases {
    /// The conformance profiles (MESH-HTTP, MESH-GRPC) and their feature sets.
    pub fn profiles(&self) -> BTreeMap<String, Profile> {
        self.profiles_section
            .iter()
            .filter_map(|(name, v)| Some((name.clone(), serde_json::from_value(v.clone()).ok()?)))
            .collect()
    }

    pub fn load() -> anyhow::Result<Cases> {
        let path = crate::upstream::cases_file();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        serde_saphyr::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
}

impl Test {
    /// Whether a request dialled to `host` goes to a Service one of the test's routes attaches
    /// to (a route target, so through the mesh).
    pub fn targets(&self, host: &str) -> bool {
        let service = host.split(['.', ':']).next().unwrap_or_default();
        self.routes
            .iter()
            .filter_map(|r| r.parent_ref.as_ref())
            .any(|p| p.name == service)
    }

    /// The client of a case: its own, else the test's, else the suite's default.
    pub fn client_of<'a>(&'a self, case: &'a Case) -> Client {
        case.client
            .clone()
            .or_else(|| self.client.clone())
            .unwrap_or(Client {
                namespace: "gateway-conformance-mesh".into(),
                pod_selector: None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_cases_load() {
        let cases = Cases::load().unwrap();
        assert_eq!(cases.tests.len(), 22);
        assert_eq!(cases.profiles().len(), 2);
    }
}
