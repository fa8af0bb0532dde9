//! The compiled route table of one route target: plain data, ordered and validated by the
//! route engine (`aether_routing`), carried typed in the per-node config, and turned into a
//! router by the proxy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The effective routing of one Service, per Service port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteTable {
    /// Only ports that have at least one accepted route; traffic to any other port of the
    /// Service passes through to the Service's own endpoints. Sorted by port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortRoutes>,
}

/// The rules for one Service port: producer rules (routes in the Service's namespace) for
/// every client, and consumer rules for clients of one namespace, which replace the
/// producer rules for those clients (GEP-1294).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PortRoutes {
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<RuleSet>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumers: BTreeMap<String, RuleSet>,
}

/// Rules of one kind (Gateway API forbids merging HTTPRoute and GRPCRoute rules) with
/// their matches flattened and sorted by precedence: the first entry that matches wins.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuleSet {
    pub protocol: Protocol,
    pub entries: Vec<Entry>,
    pub rules: Vec<Rule>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Http,
    Grpc,
}

/// One match of one rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Index into [`RuleSet::rules`].
    pub rule: u32,
    pub path: PathMatch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Header names are lower case.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<ValueMatch>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum PathMatch {
    Exact(String),
    /// Matches whole path segments: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, not `/foobar`.
    Prefix(String),
    /// The whole path must match.
    Regex(String),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatch {
    pub name: String,
    pub value: StringMatch,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum StringMatch {
    Exact(String),
    /// The whole value must match.
    Regex(String),
}

/// A regex that must match the whole value, as the Gateway API's RegularExpression does; the
/// route engine and authorization both build theirs here.
pub fn whole_value_regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
}

/// A [`StringMatch`] ready to test values.
#[derive(Debug, Clone)]
pub enum ValueMatcher {
    Exact(String),
    Regex(regex::Regex),
}

impl StringMatch {
    pub fn compile(&self) -> Result<ValueMatcher, regex::Error> {
        Ok(match self {
            StringMatch::Exact(v) => ValueMatcher::Exact(v.clone()),
            StringMatch::Regex(r) => ValueMatcher::Regex(whole_value_regex(r)?),
        })
    }
}

impl ValueMatcher {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatcher::Exact(expected) => expected == value,
            ValueMatcher::Regex(re) => re.is_match(value),
        }
    }
}

/// What happens to a request one of the rule's entries matched.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub route: RouteRef,
    /// Position of the rule in its route.
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Filters::is_empty")]
    pub filters: Filters,
    /// Empty means every request gets a 500 (unless the rule redirects).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<Backend>,
    #[serde(default, skip_serializing_if = "Timeouts::is_empty")]
    pub timeouts: Timeouts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct RouteRef {
    pub kind: RouteKind,
    pub namespace: String,
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    HTTPRoute,
    GRPCRoute,
    /// The inline rules of a hand-written RouteTarget.
    RouteTarget,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::HTTPRoute => "HTTPRoute",
            RouteKind::GRPCRoute => "GRPCRoute",
            RouteKind::RouteTarget => "RouteTarget",
        }
    }

    pub fn protocol(self) -> Protocol {
        match self {
            RouteKind::GRPCRoute => Protocol::Grpc,
            RouteKind::HTTPRoute | RouteKind::RouteTarget => Protocol::Http,
        }
    }
}

impl std::fmt::Display for RouteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Filters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEdits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEdits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<Mirror>,
}

impl Filters {
    pub fn is_empty(&self) -> bool {
        *self == Filters::default()
    }
}

/// Header edits, applied in the order set, add, remove.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeaderEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<Header>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<Header>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathRewrite>,
    pub status: u16,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum PathRewrite {
    Full(String),
    /// Replaces the prefix the matching `PathPrefix` entry matched.
    Prefix(String),
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Rewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathRewrite>,
}

/// Copies `numerator / denominator` of the requests to `target`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Mirror {
    pub target: BackendTarget,
    pub numerator: u32,
    pub denominator: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    pub target: BackendTarget,
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEdits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEdits>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum BackendTarget {
    Service(ServiceRef),
    /// A reference that did not resolve: requests given to it get a 500.
    Unresolved {
        reason: String,
        message: String,
    },
}

/// A port of a backend Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// Whole request, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_ms: Option<u64>,
    /// One attempt at a backend, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request_ms: Option<u64>,
}

/// A rule's retries of failed backend attempts: connection failures always, responses whose
/// status is in `codes`; at most `attempts` after the first, waiting `backoff_ms` before the
/// first retry and doubling it for each next one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    pub attempts: u32,
    pub backoff_ms: u64,
}

impl Timeouts {
    pub fn is_empty(&self) -> bool {
        self.request_ms.is_none() && self.backend_request_ms.is_none()
    }
}
