//! Authorization: who may call a workload. A policy, compiled by the operator from an
//! `AuthorizationPolicy`, is plain data carried in the node's config; [`PolicySet`] is the
//! node's policies made ready to decide, and [`PolicySet::decide`] is the one decision, a pure
//! function of the policies that select the pod, the caller's verified identity, the pod's
//! port and the request head.
//!
//! The semantics: no policy allows every caller. A workload any enforced ALLOW policy selects
//! (or one of a namespace that denies by default) admits only what an ALLOW rule matches. A
//! matching DENY rule wins over every ALLOW. An audit policy decides nothing: what it would
//! have refused is reported.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::identity::ServiceAccount;
use crate::route_table::{PathMatch, ValueMatch, ValueMatcher, whole_value_regex};

/// What one node enforces: the policies of the namespaces with meshed pods on it, and which of
/// those namespaces deny what no ALLOW policy admits.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeAuthorization {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<Policy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_by_default: Vec<String>,
}

/// Whether a namespace with these labels denies by default ([`crate::names::AUTHORIZATION_LABEL`]).
pub fn namespace_denies_by_default(labels: &BTreeMap<String, String>) -> bool {
    labels
        .get(crate::names::AUTHORIZATION_LABEL)
        .map(String::as_str)
        == Some(crate::names::AUTHORIZATION_DENY)
}

impl NodeAuthorization {
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.deny_by_default.is_empty()
    }
}

/// One compiled policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub action: Action,
    #[serde(default)]
    pub mode: Mode,
    /// The pods of `namespace` it applies to: those carrying every label of one selector. An
    /// empty selector is every pod of the namespace; no selector, none.
    pub selectors: Vec<BTreeMap<String, String>>,
    /// An ALLOW policy without rules admits nothing (a deny-all); a DENY one refuses nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Deny,
}

/// Enforce decides; Audit only reports what it would have refused.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    #[default]
    Enforce,
    Audit,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

/// A rule matches a caller that is one of its sources, on one of its ports, with (when it has
/// HTTP matches) a request one of them matches.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub sources: Vec<Source>,
    /// The pod's ports; empty is every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Empty is every request and every opaque connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpMatch>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    ServiceAccount(ServiceAccountName),
    /// Every ServiceAccount of the namespace.
    Namespace(String),
    /// A SPIFFE ID, compared whole.
    SpiffeId(String),
    /// A caller with no mesh identity (an unmeshed pod, a host process).
    Unauthenticated,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountName {
    pub namespace: String,
    pub name: String,
}

/// An HTTP request match, with the Gateway API's match types. Every field given must match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Header names are lower case.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<ValueMatch>,
}

/// The caller, as mTLS proved it: a ServiceAccount and its SPIFFE ID. `None` is a caller
/// without a mesh identity.
#[derive(Clone, Copy, Debug)]
pub struct Peer<'a> {
    pub service_account: &'a ServiceAccount,
    pub spiffe_id: &'a str,
}

/// What is asked of the pod: a port, and for HTTP the request head.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub port: u16,
    pub http: Option<&'a dyn HttpHead>,
}

/// The parts of an HTTP request head a match reads.
pub trait HttpHead {
    fn method(&self) -> &str;
    fn path(&self) -> &str;
    fn query(&self) -> Option<&str>;
    /// Every value of the header `name` (lower case).
    fn header_values(&self, name: &str) -> Vec<&str>;
}

/// A policy by name, `<namespace>/<name>`.
pub type PolicyName = std::sync::Arc<str>;

/// Why a caller is refused, or would be in audit mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A DENY rule of this policy matched.
    Denied(PolicyName),
    /// ALLOW policies select the pod and none admits the request; the first one is named.
    NotAllowed(PolicyName),
    /// The namespace denies by default and no ALLOW policy selects the pod.
    NamespaceDefault(String),
}

impl Refusal {
    /// The policy named in the 403 and the metrics (`namespace/name`, or the namespace's
    /// default as `namespace/*`).
    pub fn policy(&self) -> String {
        match self {
            Refusal::Denied(name) | Refusal::NotAllowed(name) => name.to_string(),
            Refusal::NamespaceDefault(namespace) => format!("{namespace}/*"),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Denied(name) => write!(f, "denied by AuthorizationPolicy {name}"),
            Refusal::NotAllowed(name) => write!(
                f,
                "not allowed by AuthorizationPolicy {name} (nor by any other ALLOW policy of the workload)"
            ),
            Refusal::NamespaceDefault(namespace) => write!(
                f,
                "namespace {namespace} denies by default and no AuthorizationPolicy allows this caller"
            ),
        }
    }
}

/// A decision: whether the caller passes, and what audit policies would have refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `None` lets the caller through.
    pub refused: Option<Refusal>,
    /// Set when the caller passes but would not have with the audit policies enforced.
    pub audit: Option<Refusal>,
    /// The policy that decided, when one did: the DENY or the ALLOW that matched, or the
    /// refusal's. `None` when no policy applies.
    pub policy: Option<PolicyName>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.refused.is_none()
    }
}

/// The node's policies, indexed by namespace, their regexes compiled.
#[derive(Debug, Default)]
pub struct PolicySet {
    by_namespace: HashMap<String, Vec<Arc<Compiled>>>,
    deny_by_default: std::collections::HashSet<String>,
}

/// The policies that select one pod: found once for a connection (a pod's labels and the
/// node's policies change far less often than requests come).
#[derive(Debug, Default, Clone)]
pub struct Applicable {
    policies: Vec<Arc<Compiled>>,
    namespace_denies: Option<String>,
}

impl Applicable {
    /// Whether no policy applies and the namespace does not deny by default: every caller passes.
    pub fn is_open(&self) -> bool {
        self.policies.is_empty() && self.namespace_denies.is_none()
    }

    /// Whether a caller with no mesh identity is refused on some port: such callers never reach
    /// the proxy (plaintext goes straight to the pod), so the pod must refuse plaintext from
    /// other hosts. Unless an enforced ALLOW rule admits them on every port and request.
    pub fn refuses_unauthenticated(&self) -> bool {
        let enforced = || self.policies.iter().filter(|p| p.mode == Mode::Enforce);
        let opens_all = enforced().filter(|p| p.action == Action::Allow).any(|p| {
            p.rules.iter().any(|r| {
                r.ports.is_empty()
                    && r.http.is_empty()
                    && r.sources
                        .iter()
                        .any(|s| matches!(s, Source::Unauthenticated))
            })
        });
        let denied = enforced().filter(|p| p.action == Action::Deny).any(|p| {
            p.rules.iter().any(|r| {
                r.sources
                    .iter()
                    .any(|s| matches!(s, Source::Unauthenticated))
            })
        });
        let default_deny =
            self.namespace_denies.is_some() || enforced().any(|p| p.action == Action::Allow);
        denied || (default_deny && !opens_all)
    }
}

#[derive(Debug)]
struct Compiled {
    name: PolicyName,
    action: Action,
    mode: Mode,
    selectors: Vec<BTreeMap<String, String>>,
    rules: Vec<CompiledRule>,
}

#[derive(Debug)]
struct CompiledRule {
    sources: Vec<Source>,
    ports: Vec<u16>,
    http: Vec<CompiledMatch>,
}

#[derive(Debug)]
struct CompiledMatch {
    path: Option<CompiledPath>,
    method: Option<String>,
    headers: Vec<(String, ValueMatcher)>,
    query: Vec<(String, ValueMatcher)>,
}

#[derive(Debug)]
enum CompiledPath {
    Exact(String),
    Prefix(String),
    Regex(Regex),
}

/// A rule the proxy cannot compile (a regex the operator let through): it fails closed, and
/// the policy's other rules and the other policies are kept.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("AuthorizationPolicy {policy}: {reason}")]
pub struct PolicyError {
    pub policy: String,
    pub reason: String,
}

impl PolicySet {
    /// Compiles the node's policies; a rule that does not compile fails closed and is named in
    /// the errors, for the caller to report.
    pub fn new(config: &NodeAuthorization) -> (PolicySet, Vec<PolicyError>) {
        let mut set = PolicySet {
            by_namespace: HashMap::new(),
            deny_by_default: config.deny_by_default.iter().cloned().collect(),
        };
        let mut errors = Vec::new();
        for policy in &config.policies {
            let (compiled, failed) = compile(policy);
            errors.extend(failed.into_iter().map(|reason| PolicyError {
                policy: format!("{}/{}", policy.namespace, policy.name),
                reason,
            }));
            set.by_namespace
                .entry(policy.namespace.clone())
                .or_default()
                .push(Arc::new(compiled));
        }
        (set, errors)
    }

    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty() && self.deny_by_default.is_empty()
    }

    /// The policies that select a pod of `namespace` with `labels`.
    pub fn applicable(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Applicable {
        let policies = self
            .by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|p| p.selectors.iter().any(|s| selects(s, labels)))
            .cloned()
            .collect();
        Applicable {
            policies,
            namespace_denies: self
                .deny_by_default
                .contains(namespace)
                .then(|| namespace.to_owned()),
        }
    }

    /// The decision for `peer` asking `request` of a pod the `applicable` policies select.
    pub fn decide(
        applicable: &Applicable,
        peer: Option<Peer<'_>>,
        request: Request<'_>,
    ) -> Verdict {
        let enforced = decide_mode(applicable, peer, request, false);
        let audit = match &enforced.refused {
            None if applicable.policies.iter().any(|p| p.mode == Mode::Audit) => {
                decide_mode(applicable, peer, request, true).refused
            }
            _ => None,
        };
        Verdict { audit, ..enforced }
    }
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The decision with the enforced policies, and with `audit` the audit ones as if enforced.
fn decide_mode(
    applicable: &Applicable,
    peer: Option<Peer<'_>>,
    request: Request<'_>,
    audit: bool,
) -> Verdict {
    let counted = |p: &&Arc<Compiled>| p.mode == Mode::Enforce || audit;
    let deciding = || applicable.policies.iter().filter(counted);
    let matched = |p: &Compiled| p.rules.iter().any(|r| r.matches(p.action, peer, request));
    let verdict = |refused: Option<Refusal>, policy: Option<PolicyName>| Verdict {
        refused,
        audit: None,
        policy,
    };
    if let Some(deny) = deciding()
        .filter(|p| p.action == Action::Deny)
        .find(|p| matched(p))
    {
        return verdict(
            Some(Refusal::Denied(deny.name.clone())),
            Some(deny.name.clone()),
        );
    }
    let mut allows = deciding().filter(|p| p.action == Action::Allow).peekable();
    let Some(first) = allows.peek().map(|p| p.name.clone()) else {
        return match &applicable.namespace_denies {
            Some(namespace) => verdict(Some(Refusal::NamespaceDefault(namespace.clone())), None),
            None => verdict(None, None),
        };
    };
    match allows.find(|p| matched(p)) {
        Some(allow) => verdict(None, Some(allow.name.clone())),
        None => verdict(Some(Refusal::NotAllowed(first.clone())), Some(first)),
    }
}

impl CompiledRule {
    fn matches(&self, action: Action, peer: Option<Peer<'_>>, request: Request<'_>) -> bool {
        if !self.ports.is_empty() && !self.ports.contains(&request.port) {
            return false;
        }
        if !self.sources.iter().any(|s| source_matches(s, peer)) {
            return false;
        }
        if self.http.is_empty() {
            return true;
        }
        match request.http {
            Some(head) => self.http.iter().any(|m| m.matches(head)),
            // An opaque connection has no request to match: an ALLOW rule about requests does
            // not admit it, a DENY rule about requests refuses it (the safe reading of both).
            None => action == Action::Deny,
        }
    }
}

fn source_matches(source: &Source, peer: Option<Peer<'_>>) -> bool {
    match (source, peer) {
        (Source::Unauthenticated, None) => true,
        (Source::Unauthenticated, Some(_)) | (_, None) => false,
        (Source::ServiceAccount(sa), Some(peer)) => {
            peer.service_account.namespace == sa.namespace && peer.service_account.name == sa.name
        }
        (Source::Namespace(namespace), Some(peer)) => peer.service_account.namespace == *namespace,
        (Source::SpiffeId(id), Some(peer)) => peer.spiffe_id == id,
    }
}

impl CompiledMatch {
    fn matches(&self, head: &dyn HttpHead) -> bool {
        if let Some(method) = &self.method
            && method != head.method()
        {
            return false;
        }
        if let Some(path) = &self.path
            && !path.matches(head.path())
        {
            return false;
        }
        let header = |(name, m): &(String, ValueMatcher)| {
            head.header_values(name).iter().any(|v| m.matches(v))
        };
        if !self.headers.iter().all(header) {
            return false;
        }
        self.query.is_empty() || {
            let query = head.query().unwrap_or("");
            self.query
                .iter()
                .all(|(name, m)| query_values(query, name).any(|v| m.matches(v)))
        }
    }
}

fn query_values<'a>(query: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl CompiledPath {
    fn matches(&self, path: &str) -> bool {
        match self {
            CompiledPath::Exact(exact) => path == exact,
            CompiledPath::Prefix(prefix) => {
                let prefix = prefix.trim_end_matches('/');
                prefix.is_empty()
                    || path
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            CompiledPath::Regex(re) => re.is_match(path),
        }
    }
}

fn compile(policy: &Policy) -> (Compiled, Vec<String>) {
    let values = |vs: &[ValueMatch]| -> Result<Vec<(String, ValueMatcher)>, String> {
        vs.iter()
            .map(|v| {
                let matcher = v.value.compile().map_err(|e| e.to_string())?;
                Ok((v.name.to_ascii_lowercase(), matcher))
            })
            .collect()
    };
    let http = |m: &HttpMatch| -> Result<CompiledMatch, String> {
        Ok(CompiledMatch {
            path: match &m.path {
                None => None,
                Some(PathMatch::Exact(p)) => Some(CompiledPath::Exact(p.clone())),
                Some(PathMatch::Prefix(p)) => Some(CompiledPath::Prefix(p.clone())),
                Some(PathMatch::Regex(r)) => Some(CompiledPath::Regex(
                    whole_value_regex(r).map_err(|e| e.to_string())?,
                )),
            },
            method: m.method.clone(),
            headers: values(&m.headers)?,
            query: values(&m.query)?,
        })
    };
    // A rule that does not compile fails closed: an ALLOW rule admits nothing, a DENY rule
    // refuses its sources whatever they ask.
    let mut errors = Vec::new();
    let mut rules = Vec::new();
    for rule in &policy.rules {
        let compiled = rule
            .http
            .iter()
            .map(http)
            .collect::<Result<Vec<_>, String>>();
        let http = match (compiled, policy.action) {
            (Ok(http), _) => http,
            (Err(e), Action::Allow) => {
                errors.push(e);
                continue;
            }
            (Err(e), Action::Deny) => {
                errors.push(e);
                Vec::new()
            }
        };
        rules.push(CompiledRule {
            sources: rule.sources.clone(),
            ports: rule.ports.clone(),
            http,
        });
    }
    let compiled = Compiled {
        name: format!("{}/{}", policy.namespace, policy.name).into(),
        action: policy.action,
        mode: policy.mode,
        selectors: policy.selectors.clone(),
        rules,
    };
    (compiled, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route_table::StringMatch;

    struct Head {
        method: &'static str,
        path: &'static str,
        query: Option<&'static str>,
        headers: Vec<(&'static str, &'static str)>,
    }

    impl HttpHead for Head {
        fn method(&self) -> &str {
            self.method
        }
        fn path(&self) -> &str {
            self.path
        }
        fn query(&self) -> Option<&str> {
            self.query
        }
        fn header_values(&self, name: &str) -> Vec<&str> {
            self.headers
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .collect()
        }
    }

    fn get(path: &'static str) -> Head {
        Head {
            method: "GET",
            path,
            query: None,
            headers: Vec::new(),
        }
    }

    fn sa(ns: &str, name: &str) -> Source {
        Source::ServiceAccount(ServiceAccountName {
            namespace: ns.into(),
            name: name.into(),
        })
    }

    fn policy(name: &str, action: Action, rules: Vec<Rule>) -> Policy {
        Policy {
            namespace: "shop".into(),
            name: name.into(),
            action,
            mode: Mode::Enforce,
            selectors: vec![BTreeMap::from([("app".into(), "checkout".into())])],
            rules,
        }
    }

    fn rule(sources: Vec<Source>) -> Rule {
        Rule {
            sources,
            ports: Vec::new(),
            http: Vec::new(),
        }
    }

    fn labels(app: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("app".into(), app.into())])
    }

    struct Caller {
        sa: ServiceAccount,
        id: String,
    }

    fn caller(ns: &str, name: &str) -> Caller {
        let sa = ServiceAccount::new(ns, name);
        let id = sa.spiffe_id("cluster.local");
        Caller { sa, id }
    }

    impl Caller {
        fn peer(&self) -> Option<Peer<'_>> {
            Some(Peer {
                service_account: &self.sa,
                spiffe_id: &self.id,
            })
        }
    }

    fn decide(
        config: &NodeAuthorization,
        pod: &str,
        peer: Option<Peer<'_>>,
        port: u16,
        http: Option<&dyn HttpHead>,
    ) -> Verdict {
        let (set, errors) = PolicySet::new(config);
        assert_eq!(errors, []);
        let applicable = set.applicable("shop", &labels(pod));
        PolicySet::decide(&applicable, peer, Request { port, http })
    }

    fn config(policies: Vec<Policy>) -> NodeAuthorization {
        NodeAuthorization {
            policies,
            deny_by_default: Vec::new(),
        }
    }

    #[test]
    fn no_policy_allows_every_caller_even_unauthenticated() {
        let v = decide(&config(vec![]), "checkout", None, 80, None);
        assert!(v.allowed());
        assert_eq!(v.policy, None);
    }

    #[test]
    fn an_allow_policy_makes_its_workload_default_deny_and_leaves_others_open() {
        let c = config(vec![policy(
            "frontend",
            Action::Allow,
            vec![rule(vec![sa("shop", "frontend")])],
        )]);
        let frontend = caller("shop", "frontend");
        let other = caller("shop", "batch");
        assert!(decide(&c, "checkout", frontend.peer(), 80, None).allowed());
        let refused = decide(&c, "checkout", other.peer(), 80, None);
        assert_eq!(
            refused.refused,
            Some(Refusal::NotAllowed("shop/frontend".into()))
        );
        assert!(
            !decide(&c, "checkout", None, 80, None).allowed(),
            "unauthenticated"
        );
        assert!(
            decide(&c, "cart", other.peer(), 80, None).allowed(),
            "a pod the policy does not select"
        );
    }

    #[test]
    fn namespaces_spiffe_ids_and_unauthenticated_sources() {
        let c = config(vec![policy(
            "mixed",
            Action::Allow,
            vec![rule(vec![
                Source::Namespace("ops".into()),
                Source::SpiffeId("spiffe://cluster.local/ns/shop/sa/cron".into()),
                Source::Unauthenticated,
            ])],
        )]);
        assert!(decide(&c, "checkout", caller("ops", "any").peer(), 80, None).allowed());
        assert!(decide(&c, "checkout", caller("shop", "cron").peer(), 80, None).allowed());
        assert!(decide(&c, "checkout", None, 80, None).allowed());
        assert!(!decide(&c, "checkout", caller("shop", "web").peer(), 80, None).allowed());
    }

    #[test]
    fn deny_wins_over_allow() {
        let c = config(vec![
            policy(
                "all",
                Action::Allow,
                vec![rule(vec![Source::Namespace("shop".into())])],
            ),
            policy(
                "no-batch",
                Action::Deny,
                vec![rule(vec![sa("shop", "batch")])],
            ),
        ]);
        let v = decide(&c, "checkout", caller("shop", "batch").peer(), 80, None);
        assert_eq!(v.refused, Some(Refusal::Denied("shop/no-batch".into())));
        assert!(decide(&c, "checkout", caller("shop", "web").peer(), 80, None).allowed());
    }

    #[test]
    fn http_matches_and_ports() {
        let c = config(vec![policy(
            "reads",
            Action::Allow,
            vec![Rule {
                sources: vec![sa("shop", "web")],
                ports: vec![8080],
                http: vec![HttpMatch {
                    path: Some(PathMatch::Prefix("/api".into())),
                    method: Some("GET".into()),
                    headers: vec![ValueMatch {
                        name: "x-tenant".into(),
                        value: StringMatch::Regex("a|b".into()),
                    }],
                    query: Vec::new(),
                }],
            }],
        )]);
        let web = caller("shop", "web");
        let mut head = get("/api/items");
        head.headers.push(("x-tenant", "b"));
        assert!(decide(&c, "checkout", web.peer(), 8080, Some(&head)).allowed());
        assert!(
            !decide(&c, "checkout", web.peer(), 9090, Some(&head)).allowed(),
            "port"
        );
        let mut wrong = get("/apis");
        wrong.headers.push(("x-tenant", "b"));
        assert!(
            !decide(&c, "checkout", web.peer(), 8080, Some(&wrong)).allowed(),
            "segment"
        );
        head.method = "POST";
        assert!(
            !decide(&c, "checkout", web.peer(), 8080, Some(&head)).allowed(),
            "method"
        );
        let no_header = get("/api");
        assert!(!decide(&c, "checkout", web.peer(), 8080, Some(&no_header)).allowed());
        assert!(
            !decide(&c, "checkout", web.peer(), 8080, None).allowed(),
            "an opaque connection is not admitted by a rule about requests"
        );
    }

    #[test]
    fn a_deny_rule_about_requests_refuses_opaque_connections() {
        let c = config(vec![policy(
            "no-admin",
            Action::Deny,
            vec![Rule {
                sources: vec![Source::Namespace("shop".into())],
                ports: Vec::new(),
                http: vec![HttpMatch {
                    path: Some(PathMatch::Exact("/admin".into())),
                    ..HttpMatch::default()
                }],
            }],
        )]);
        let web = caller("shop", "web");
        assert!(!decide(&c, "checkout", web.peer(), 80, Some(&get("/admin"))).allowed());
        assert!(decide(&c, "checkout", web.peer(), 80, Some(&get("/admin/x"))).allowed());
        assert!(!decide(&c, "checkout", web.peer(), 80, None).allowed());
    }

    #[test]
    fn query_matches_read_each_pair() {
        let c = config(vec![policy(
            "q",
            Action::Allow,
            vec![Rule {
                sources: vec![Source::Namespace("shop".into())],
                ports: Vec::new(),
                http: vec![HttpMatch {
                    query: vec![ValueMatch {
                        name: "debug".into(),
                        value: StringMatch::Exact("1".into()),
                    }],
                    ..HttpMatch::default()
                }],
            }],
        )]);
        let web = caller("shop", "web");
        let mut head = get("/");
        head.query = Some("a=2&debug=1");
        assert!(decide(&c, "checkout", web.peer(), 80, Some(&head)).allowed());
        head.query = Some("debug=10");
        assert!(!decide(&c, "checkout", web.peer(), 80, Some(&head)).allowed());
    }

    #[test]
    fn audit_policies_report_and_never_refuse() {
        let mut audited = policy(
            "only-web",
            Action::Allow,
            vec![rule(vec![sa("shop", "web")])],
        );
        audited.mode = Mode::Audit;
        let c = config(vec![audited]);
        let v = decide(&c, "checkout", caller("shop", "batch").peer(), 80, None);
        assert!(v.allowed());
        assert_eq!(v.audit, Some(Refusal::NotAllowed("shop/only-web".into())));
        let v = decide(&c, "checkout", caller("shop", "web").peer(), 80, None);
        assert_eq!((v.allowed(), v.audit), (true, None));

        let mut audit_deny = policy("no-web", Action::Deny, vec![rule(vec![sa("shop", "web")])]);
        audit_deny.mode = Mode::Audit;
        let c = config(vec![audit_deny]);
        let v = decide(&c, "checkout", caller("shop", "web").peer(), 80, None);
        assert_eq!(v.audit, Some(Refusal::Denied("shop/no-web".into())));
        assert!(v.allowed());
    }

    #[test]
    fn a_namespace_denying_by_default_admits_only_what_an_allow_admits() {
        let mut c = config(vec![]);
        c.deny_by_default.push("shop".into());
        let web = caller("shop", "web");
        assert_eq!(
            decide(&c, "checkout", web.peer(), 80, None).refused,
            Some(Refusal::NamespaceDefault("shop".into()))
        );
        c.policies.push(policy(
            "web",
            Action::Allow,
            vec![rule(vec![sa("shop", "web")])],
        ));
        assert!(decide(&c, "checkout", web.peer(), 80, None).allowed());
        assert!(
            !decide(&c, "cart", web.peer(), 80, None).allowed(),
            "not selected"
        );
    }

    #[test]
    fn an_allow_without_rules_admits_nothing_and_a_deny_without_rules_refuses_nothing() {
        let c = config(vec![policy("deny-all", Action::Allow, vec![])]);
        assert!(!decide(&c, "checkout", caller("shop", "web").peer(), 80, None).allowed());
        let c = config(vec![policy("nothing", Action::Deny, vec![])]);
        assert!(decide(&c, "checkout", caller("shop", "web").peer(), 80, None).allowed());
    }

    #[test]
    fn which_pods_must_refuse_plaintext() {
        let refuses = |c: NodeAuthorization| {
            let (set, _) = PolicySet::new(&c);
            set.applicable("shop", &labels("checkout"))
                .refuses_unauthenticated()
        };
        assert!(!refuses(config(vec![])));
        assert!(refuses(config(vec![policy(
            "a",
            Action::Allow,
            vec![rule(vec![sa("shop", "web")])]
        )])));
        assert!(!refuses(config(vec![policy(
            "a",
            Action::Allow,
            vec![rule(vec![Source::Unauthenticated])]
        )])));
        assert!(!refuses(config(vec![policy(
            "d",
            Action::Deny,
            vec![rule(vec![sa("shop", "web")])]
        )])));
        assert!(refuses(config(vec![policy(
            "d",
            Action::Deny,
            vec![rule(vec![Source::Unauthenticated])]
        )])));
        let mut audit = policy("a", Action::Allow, vec![rule(vec![sa("shop", "web")])]);
        audit.mode = Mode::Audit;
        assert!(!refuses(config(vec![audit])), "audit refuses nothing");
    }

    #[test]
    fn a_rule_that_does_not_compile_fails_closed_and_is_named() {
        let bad_match = || HttpMatch {
            path: Some(PathMatch::Regex("(".into())),
            ..HttpMatch::default()
        };
        let mut allow = policy(
            "bad-allow",
            Action::Allow,
            vec![rule(vec![sa("shop", "web")])],
        );
        allow.rules[0].http.push(bad_match());
        let mut deny = policy(
            "bad-deny",
            Action::Deny,
            vec![rule(vec![sa("shop", "batch")])],
        );
        deny.rules[0].http.push(bad_match());
        let c = config(vec![allow, deny]);
        let (set, errors) = PolicySet::new(&c);
        let named: Vec<&str> = errors.iter().map(|e| e.policy.as_str()).collect();
        assert_eq!(named, ["shop/bad-allow", "shop/bad-deny"]);
        let applicable = set.applicable("shop", &labels("checkout"));
        let web = caller("shop", "web");
        let batch = caller("shop", "batch");
        let ask = |peer| {
            PolicySet::decide(
                &applicable,
                peer,
                Request {
                    port: 80,
                    http: Some(&get("/x")),
                },
            )
        };
        assert!(!ask(web.peer()).allowed(), "the ALLOW rule admits nothing");
        assert_eq!(
            ask(batch.peer()).refused,
            Some(Refusal::Denied("shop/bad-deny".into()))
        );
    }

    #[test]
    fn the_wire_format_is_camel_case_and_round_trips() {
        let p = policy(
            "x",
            Action::Allow,
            vec![rule(vec![sa("shop", "web"), Source::Unauthenticated])],
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["rules"][0]["sources"][0]["serviceAccount"]["name"],
            "web"
        );
        assert_eq!(json["rules"][0]["sources"][1], "unauthenticated");
        let back: Policy = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
    }
}
