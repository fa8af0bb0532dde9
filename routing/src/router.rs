//! Matching requests against a loaded [`RouteTable`].
//!
//! Entries are stored in precedence order, so the answer is the matching entry with the
//! lowest index. Instead of scanning every entry, a request looks up only the entries its
//! path can match: an exact-path map, a map of path prefixes (one lookup per path segment
//! boundary), and the regex entries. Each candidate list is in precedence order, so a scan
//! stops at its first full match, or as soon as it cannot beat the best entry found so far.

use std::collections::HashMap as StdHashMap;
use std::hash::{BuildHasherDefault, Hasher};

use http::{HeaderMap, HeaderName, Method};
use regex::Regex;

use crate::error::TableError;
use crate::filters::{Edits, redirect_location, rewritten_path};
use crate::request::RequestView;
use crate::table::{
    BackendTarget, Entry, PathMatch, RouteTable, Rule, RuleSet, ServiceRef, StringMatch, Timeouts,
    ValueMatcher, whole_value_regex,
};

/// Maps keyed by configuration strings (paths, namespaces) and looked up by request
/// strings. The keys are chosen by the operator, not by clients, so a fast non-keyed hash
/// is safe: a client can pick what it looks up but cannot fill a bucket.
type HashMap<K, V> = StdHashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The multiply-rotate hash rustc uses (FxHash), a few times faster than SipHash on paths.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0xf135_7aea_2e62_a9c5;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The route table of one route target, ready to match requests.
#[derive(Debug, Clone, Default)]
pub struct Router {
    ports: Vec<PortRouter>,
}

#[derive(Debug, Clone)]
struct PortRouter {
    port: u16,
    producer: Option<RuleSetRouter>,
    consumers: HashMap<String, RuleSetRouter>,
}

/// One rule set, indexed for matching.
#[derive(Debug, Clone)]
pub struct RuleSetRouter {
    rules: Vec<PreparedRule>,
    entries: Vec<PreparedEntry>,
    exact: HashMap<String, Vec<u32>>,
    /// Keyed by the prefix without its trailing `/` (`/` itself is the empty key).
    prefix: HashMap<String, Vec<u32>>,
    /// Regex entries whose pattern starts with a literal `/<segment>/`, keyed by that segment.
    regex_by_segment: HashMap<String, Vec<u32>>,
    /// Regex entries that can match any first segment.
    regex_any: Vec<u32>,
}

#[derive(Debug, Clone)]
struct PreparedEntry {
    entry: Entry,
    path_regex: Option<Regex>,
    method: Option<Method>,
    headers: Vec<(HeaderName, ValueMatcher)>,
    query: Vec<(String, ValueMatcher)>,
}

#[derive(Debug, Clone)]
struct PreparedRule {
    rule: Rule,
    request_edits: Option<Edits>,
    response_edits: Option<Edits>,
    backend_request_edits: Vec<Option<Edits>>,
    backend_response_edits: Vec<Option<Edits>>,
    total_weight: u64,
}

/// What the route table says about a request.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// No route applies to this port and client: pass through to the Service's own endpoints.
    NoRoutes,
    /// Routes apply, but none matches: answer 404.
    NotFound,
    Redirect {
        rule: &'a Rule,
        status: u16,
        location: String,
    },
    Forward(Forward<'a>),
    /// The chosen backend does not exist (or the rule has none): answer 500.
    NoBackend {
        rule: &'a Rule,
    },
}

/// A request to forward to `backend`, and the changes to make on the way.
#[derive(Debug)]
pub struct Forward<'a> {
    pub rule: &'a Rule,
    pub backend: &'a ServiceRef,
    /// The new `path?query` when the rule rewrites the path.
    pub path_and_query: Option<String>,
    /// The new Host when the rule rewrites it.
    pub authority: Option<&'a str>,
    /// Backends that get a copy of this request.
    pub mirrors: Vec<&'a ServiceRef>,
    prepared: &'a PreparedRule,
    backend_index: usize,
}

impl Forward<'_> {
    /// Applies the rule's and then the backend's request header edits.
    pub fn edit_request_headers(&self, headers: &mut HeaderMap) {
        if let Some(edits) = &self.prepared.request_edits {
            edits.apply(headers);
        }
        if let Some(edits) = &self.prepared.backend_request_edits[self.backend_index] {
            edits.apply(headers);
        }
    }

    /// Applies the rule's and then the backend's response header edits.
    pub fn edit_response_headers(&self, headers: &mut HeaderMap) {
        if let Some(edits) = &self.prepared.response_edits {
            edits.apply(headers);
        }
        if let Some(edits) = &self.prepared.backend_response_edits[self.backend_index] {
            edits.apply(headers);
        }
    }

    pub fn timeouts(&self) -> Timeouts {
        self.rule.timeouts
    }
}

impl Router {
    pub fn new(table: &RouteTable) -> Result<Self, TableError> {
        let ports = table
            .ports
            .iter()
            .map(|p| {
                Ok(PortRouter {
                    port: p.port,
                    producer: p
                        .producer
                        .as_ref()
                        .map(|s| RuleSetRouter::new(p.port, s))
                        .transpose()?,
                    consumers: p
                        .consumers
                        .iter()
                        .map(|(ns, s)| Ok((ns.clone(), RuleSetRouter::new(p.port, s)?)))
                        .collect::<Result<_, TableError>>()?,
                })
            })
            .collect::<Result<_, TableError>>()?;
        Ok(Router { ports })
    }

    /// The rules that apply to a client in `client_namespace` dialing `port`: its
    /// namespace's consumer rules if there are any, else the producer rules.
    pub fn rules_for(&self, port: u16, client_namespace: &str) -> Option<&RuleSetRouter> {
        let port = self.ports.iter().find(|p| p.port == port)?;
        port.consumers
            .get(client_namespace)
            .or(port.producer.as_ref())
    }

    /// Routes one request. `random` drives the weighted backend choice and mirroring; give
    /// a fresh uniformly random number per request.
    pub fn route<'a>(
        &'a self,
        port: u16,
        client_namespace: &str,
        req: &RequestView<'_>,
        random: u64,
    ) -> Outcome<'a> {
        match self.rules_for(port, client_namespace) {
            None => Outcome::NoRoutes,
            Some(rules) => match rules.find(req) {
                None => Outcome::NotFound,
                Some(index) => rules.decide(index, req, port, random),
            },
        }
    }
}

impl RuleSetRouter {
    fn new(port: u16, set: &RuleSet) -> Result<Self, TableError> {
        let invalid = |pattern: &str, e: regex::Error| TableError::InvalidRegex {
            port,
            pattern: pattern.to_owned(),
            message: e.to_string(),
        };
        let regex = |pattern: &str| whole_value_regex(pattern).map_err(|e| invalid(pattern, e));
        let matcher = |m: &StringMatch| {
            m.compile().map_err(|e| match m {
                StringMatch::Regex(r) | StringMatch::Exact(r) => invalid(r, e),
            })
        };
        let mut router = RuleSetRouter {
            rules: Vec::with_capacity(set.rules.len()),
            entries: Vec::with_capacity(set.entries.len()),
            exact: HashMap::default(),
            prefix: HashMap::default(),
            regex_by_segment: HashMap::default(),
            regex_any: Vec::new(),
        };
        for (index, entry) in set.entries.iter().enumerate() {
            if entry.rule as usize >= set.rules.len() {
                return Err(TableError::DanglingRule {
                    port,
                    rule: entry.rule,
                    rules: set.rules.len(),
                });
            }
            let index = index as u32;
            let path_regex = match &entry.path {
                PathMatch::Exact(path) => {
                    router.exact.entry(path.clone()).or_default().push(index);
                    None
                }
                PathMatch::Prefix(prefix) => {
                    router
                        .prefix
                        .entry(prefix.trim_end_matches('/').to_owned())
                        .or_default()
                        .push(index);
                    None
                }
                PathMatch::Regex(pattern) => {
                    let compiled = regex(pattern)?;
                    match literal_first_segment(pattern) {
                        Some(segment) => router
                            .regex_by_segment
                            .entry(segment.to_owned())
                            .or_default()
                            .push(index),
                        None => router.regex_any.push(index),
                    }
                    Some(compiled)
                }
            };
            let method = entry
                .method
                .as_deref()
                .map(|m| {
                    Method::from_bytes(m.as_bytes()).map_err(|_| TableError::InvalidMethod {
                        port,
                        method: m.to_owned(),
                    })
                })
                .transpose()?;
            let headers = entry
                .headers
                .iter()
                .map(|h| {
                    let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
                        TableError::InvalidHeader {
                            port,
                            what: "name",
                            value: h.name.clone(),
                        }
                    })?;
                    Ok((name, matcher(&h.value)?))
                })
                .collect::<Result<_, TableError>>()?;
            let query = entry
                .query
                .iter()
                .map(|q| Ok((q.name.clone(), matcher(&q.value)?)))
                .collect::<Result<_, TableError>>()?;
            router.entries.push(PreparedEntry {
                entry: entry.clone(),
                path_regex,
                method,
                headers,
                query,
            });
        }
        for rule in &set.rules {
            let edits = |e: &Option<crate::table::HeaderEdits>| {
                e.as_ref().map(|e| Edits::new(port, e)).transpose()
            };
            router.rules.push(PreparedRule {
                request_edits: edits(&rule.filters.request_headers)?,
                response_edits: edits(&rule.filters.response_headers)?,
                backend_request_edits: rule
                    .backends
                    .iter()
                    .map(|b| edits(&b.request_headers))
                    .collect::<Result<_, _>>()?,
                backend_response_edits: rule
                    .backends
                    .iter()
                    .map(|b| edits(&b.response_headers))
                    .collect::<Result<_, _>>()?,
                total_weight: rule.backends.iter().map(|b| u64::from(b.weight)).sum(),
                rule: rule.clone(),
            });
        }
        Ok(router)
    }

    /// The index of the highest-precedence entry matching the request.
    pub fn find(&self, req: &RequestView<'_>) -> Option<usize> {
        let mut best = u32::MAX;
        let mut scan = |candidates: &[u32]| {
            for &index in candidates {
                if index >= best {
                    return;
                }
                if self.entries[index as usize].matches(req) {
                    best = index;
                    return;
                }
            }
        };
        if let Some(candidates) = self.exact.get(req.path) {
            scan(candidates);
        }
        for prefix in path_prefixes(req.path) {
            if let Some(candidates) = self.prefix.get(prefix) {
                scan(candidates);
            }
        }
        if !self.regex_by_segment.is_empty()
            && let Some(candidates) = self.regex_by_segment.get(first_segment(req.path))
        {
            scan(candidates);
        }
        scan(&self.regex_any);
        (best != u32::MAX).then_some(best as usize)
    }

    /// Applies the rule of entry `index` to the request: redirect, or choose a backend by
    /// weight and prepare the forward.
    pub fn decide<'a>(
        &'a self,
        index: usize,
        req: &RequestView<'_>,
        port: u16,
        random: u64,
    ) -> Outcome<'a> {
        let entry = &self.entries[index].entry;
        let prepared = &self.rules[entry.rule as usize];
        let rule = &prepared.rule;
        let matched_prefix = match &entry.path {
            PathMatch::Prefix(prefix) => Some(prefix.as_str()),
            _ => None,
        };
        if let Some(redirect) = &rule.filters.redirect {
            return Outcome::Redirect {
                rule,
                status: redirect.status,
                location: redirect_location(redirect, req, port, matched_prefix),
            };
        }
        if prepared.total_weight == 0 {
            return Outcome::NoBackend { rule };
        }
        let mut pick = mix(random, 0) % prepared.total_weight;
        let mut chosen = 0;
        for (i, backend) in rule.backends.iter().enumerate() {
            if pick < u64::from(backend.weight) {
                chosen = i;
                break;
            }
            pick -= u64::from(backend.weight);
        }
        let BackendTarget::Service(backend) = &rule.backends[chosen].target else {
            return Outcome::NoBackend { rule };
        };
        let rewrite = rule.filters.rewrite.as_ref();
        let path_and_query = rewrite.and_then(|r| r.path.as_ref()).map(|path| {
            let mut out = rewritten_path(path, req.path, matched_prefix);
            if let Some(query) = req.query {
                out.push('?');
                out.push_str(query);
            }
            out
        });
        let mirrors = rule
            .filters
            .mirrors
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                mix(random, *i as u64 + 1) % u64::from(m.denominator) < u64::from(m.numerator)
            })
            .filter_map(|(_, m)| match &m.target {
                BackendTarget::Service(s) => Some(s),
                BackendTarget::Unresolved { .. } => None,
            })
            .collect();
        Outcome::Forward(Forward {
            rule,
            backend,
            path_and_query,
            authority: rewrite.and_then(|r| r.hostname.as_deref()),
            mirrors,
            prepared,
            backend_index: chosen,
        })
    }
}

impl PreparedEntry {
    /// Whether every condition holds. For exact and prefix entries the index already
    /// checked the path.
    fn matches(&self, req: &RequestView<'_>) -> bool {
        if let Some(re) = &self.path_regex
            && !re.is_match(req.path)
        {
            return false;
        }
        if let Some(method) = &self.method
            && method != req.method
        {
            return false;
        }
        for (name, matcher) in &self.headers {
            let mut values = req.headers.get_all(name).iter();
            let Some(first) = values.next() else {
                return false;
            };
            let matched = match values.next() {
                None => first.to_str().is_ok_and(|v| matcher.matches(v)),
                // Several field lines are one comma-separated value (RFC 9110 §5.3).
                Some(_) => {
                    let joined: Result<Vec<&str>, _> = req
                        .headers
                        .get_all(name)
                        .iter()
                        .map(|v| v.to_str())
                        .collect();
                    joined.is_ok_and(|parts| matcher.matches(&parts.join(",")))
                }
            };
            if !matched {
                return false;
            }
        }
        self.query.iter().all(|(name, matcher)| {
            req.query_param(name)
                .is_some_and(|value| matcher.matches(&value))
        })
    }
}

/// The keys under which prefix entries that can match `path` are stored: the empty key
/// (prefix `/`), then every leading run of whole segments. For `/a/b/` that is
/// `""`, `/a`, `/a/b`.
fn path_prefixes(path: &str) -> impl Iterator<Item = &str> {
    let trimmed = path.trim_end_matches('/');
    let boundaries = trimmed
        .match_indices('/')
        .map(|(i, _)| i)
        .filter(|i| *i > 0);
    std::iter::once("")
        .chain(boundaries.map(move |i| &trimmed[..i]))
        .chain((!trimmed.is_empty()).then_some(trimmed))
}

/// The first segment of a path: `a` for `/a/b` and `/a`.
fn first_segment(path: &str) -> &str {
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest.split('/').next().unwrap_or("")
}

/// The first path segment every match of `pattern` must have, when the pattern starts
/// with it literally (`/re4/[0-9]+` gives `re4`), so that only requests with that first
/// segment need to run the regex.
fn literal_first_segment(pattern: &str) -> Option<&str> {
    let rest = pattern.strip_prefix('/')?;
    let end = rest.find('/')?;
    let segment = &rest[..end];
    let literal = !segment.is_empty()
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    // An alternation anywhere could make the literal optional.
    (literal && !pattern.contains('|')).then_some(segment)
}

/// Derives independent pseudo-random values from one random number (SplitMix64 finaliser).
fn mix(random: u64, stream: u64) -> u64 {
    let mut z = random.wrapping_add(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::{literal_first_segment, path_prefixes};

    #[test]
    fn regexes_are_indexed_by_a_literal_first_segment_only() {
        assert_eq!(literal_first_segment("/re4/[0-9]+"), Some("re4"));
        assert_eq!(literal_first_segment("/api-v2/.*"), Some("api-v2"));
        assert_eq!(
            literal_first_segment("/api.v2/.*"),
            None,
            "a dot is a wildcard"
        );
        assert_eq!(literal_first_segment("/ab?/x"), None);
        assert_eq!(literal_first_segment("/a/x|/b/y"), None);
        assert_eq!(literal_first_segment("/[a-z]+/x"), None);
        assert_eq!(literal_first_segment("/only"), None);
    }

    #[test]
    fn prefixes_are_whole_segments() {
        assert_eq!(
            path_prefixes("/a/b/c").collect::<Vec<_>>(),
            ["", "/a", "/a/b", "/a/b/c"]
        );
        assert_eq!(
            path_prefixes("/a/b/").collect::<Vec<_>>(),
            ["", "/a", "/a/b"]
        );
        assert_eq!(path_prefixes("/").collect::<Vec<_>>(), [""]);
        assert_eq!(
            path_prefixes("/foobar").collect::<Vec<_>>(),
            ["", "/foobar"]
        );
    }
}
