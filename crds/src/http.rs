//! HTTP routing rules in the shape of Gateway API `HTTPRouteRule` (v1).
//!
//! A hand-written RouteTarget carries these inline, and the route engine reads an
//! HTTPRoute's rules into the same types, so one compiler serves both. Only the filters
//! aether implements are part of the API: a `CORS` or `ExtensionRef` filter in an
//! HTTPRoute is refused with a clear reason instead of being silently ignored.
//!
//! The schema mirrors the Gateway API validation (lengths, patterns, and CEL rules where a
//! constraint spans fields) so the API server refuses a bad rule before aether sees it.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Header names as RFC 7230 tokens, as Gateway API defines them.
pub const HEADER_NAME_PATTERN: &str = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$";
/// An RFC 1123 hostname without a wildcard.
pub const HOSTNAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// An RFC 1123 label (namespaces, rule names).
pub const LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// GEP-2257 durations: up to four `<1-5 digits><h|m|s|ms>` parts.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$";

/// One routing rule: when any of `matches` matches a request, apply `filters` and send it
/// to one of `backendRefs`, chosen by weight.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.filters) || !(self.filters.exists(f, f.type == 'RequestRedirect') && self.filters.exists(f, f.type == 'URLRewrite'))")
        .message("a rule may not have both a RequestRedirect and a URLRewrite filter"),
    validation = Rule::new("!has(self.filters) || ['RequestHeaderModifier', 'ResponseHeaderModifier', 'RequestRedirect', 'URLRewrite'].all(t, self.filters.filter(f, f.type == t).size() <= 1)")
        .message("RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect and URLRewrite may each appear at most once in a rule"),
    validation = Rule::new("!has(self.filters) || !self.filters.exists(f, (has(f.requestRedirect) && has(f.requestRedirect.path) && f.requestRedirect.path.type == 'ReplacePrefixMatch') || (has(f.urlRewrite) && has(f.urlRewrite.path) && f.urlRewrite.path.type == 'ReplacePrefixMatch')) || !has(self.matches) || self.matches.all(m, !has(m.path) || !has(m.path.type) || m.path.type == 'PathPrefix')")
        .message("ReplacePrefixMatch needs every match of the rule to be a PathPrefix match"),
)]
pub struct HttpRouteRule {
    /// Optional name of the rule, unique within the route; shown in metrics and status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(LABEL_PATTERN))]
    pub name: Option<String>,

    /// Conditions a request must meet; any one match suffices. No matches means
    /// `PathPrefix /`, i.e. every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub matches: Option<Vec<HttpRouteMatch>>,

    /// Filters applied to every request this rule matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub filters: Option<Vec<HttpRouteFilter>>,

    /// Backend Services, with weights. A rule without backends answers 500 unless it
    /// redirects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub backend_refs: Option<Vec<HttpBackendRef>>,

    /// Request and per-backend-attempt timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HttpRouteTimeouts>,

    /// Retries of failed backend attempts (Gateway API experimental channel, GEP-1731).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HttpRouteRetry>,
}

/// All conditions of one match must hold (they are ANDed).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// Path match; `PathPrefix /` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathMatch>,
    /// Header matches (names are case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub headers: Option<Vec<HttpHeaderMatch>>,
    /// Query parameter matches (names are case-sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub query_params: Option<Vec<HttpQueryParamMatch>>,
    /// HTTP method to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HttpMethod>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(
    validation = Rule::new("(has(self.type) && self.type == 'RegularExpression') || !has(self.value) || self.value.startsWith('/')")
        .message("an Exact or PathPrefix path must start with '/'"),
    validation = Rule::new("(has(self.type) && self.type == 'RegularExpression') || !has(self.value) || !['//', '/./', '/../', '%2f', '%2F', '#'].exists(s, self.value.contains(s))")
        .message("an Exact or PathPrefix path must not contain '//', '/./', '/../', '%2f' or '#'"),
)]
pub struct HttpPathMatch {
    /// `Exact`, `PathPrefix` (default; matches whole path segments) or `RegularExpression`
    /// (the whole path must match).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub r#type: Option<PathMatchType>,
    /// The path or pattern; `/` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub value: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathMatchType {
    Exact,
    PathPrefix,
    RegularExpression,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StringMatchType {
    Exact,
    RegularExpression,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpHeaderMatch {
    /// `Exact` (default) or `RegularExpression` (the whole value must match).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub r#type: Option<StringMatchType>,
    #[schemars(length(min = 1, max = 256), pattern(HEADER_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 4096))]
    pub value: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpQueryParamMatch {
    /// `Exact` (default) or `RegularExpression` (the whole value must match).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub r#type: Option<StringMatchType>,
    #[schemars(length(min = 1, max = 256), pattern(HEADER_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 1024))]
    pub value: String,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Connect,
    Options,
    Trace,
    Patch,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Head => "HEAD",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Connect => "CONNECT",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Trace => "TRACE",
            HttpMethod::Patch => "PATCH",
        }
    }
}

/// A filter: `type` names it, and exactly the field of that type is set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.requestHeaderModifier) == (self.type == 'RequestHeaderModifier')")
        .message("requestHeaderModifier must be set exactly when type is RequestHeaderModifier"),
    validation = Rule::new("has(self.responseHeaderModifier) == (self.type == 'ResponseHeaderModifier')")
        .message("responseHeaderModifier must be set exactly when type is ResponseHeaderModifier"),
    validation = Rule::new("has(self.requestRedirect) == (self.type == 'RequestRedirect')")
        .message("requestRedirect must be set exactly when type is RequestRedirect"),
    validation = Rule::new("has(self.urlRewrite) == (self.type == 'URLRewrite')")
        .message("urlRewrite must be set exactly when type is URLRewrite"),
    validation = Rule::new("has(self.requestMirror) == (self.type == 'RequestMirror')")
        .message("requestMirror must be set exactly when type is RequestMirror"),
)]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub r#type: HttpFilterType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<RequestRedirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<RequestMirror>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HttpFilterType {
    RequestHeaderModifier,
    ResponseHeaderModifier,
    RequestRedirect,
    #[serde(rename = "URLRewrite")]
    UrlRewrite,
    RequestMirror,
}

/// Set replaces a header, add appends a value after any existing ones, remove deletes it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HeaderModifier {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub set: Option<Vec<HttpHeader>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub add: Option<Vec<HttpHeader>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub remove: Option<Vec<String>>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HttpHeader {
    #[schemars(length(min = 1, max = 256), pattern(HEADER_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 4096))]
    pub value: String,
}

/// Answers with a redirect instead of forwarding. Unset parts keep the request's value;
/// an unset port becomes the scheme's well-known port when `scheme` is set, else the
/// Service port the client dialed, and is left out of `Location` when it is the default
/// port of the scheme.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RequestRedirect {
    /// `http` or `https`; the request's scheme when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<RedirectScheme>,
    /// The host of `Location`; the request's host when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(HOSTNAME_PATTERN))]
    pub hostname: Option<String>,
    /// How the path of `Location` is made; the request's path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
    /// The port of `Location`; when absent, the scheme's well-known port if `scheme` is set,
    /// else the Service port the client dialed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// 301, 302 (default), 303, 307 or 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in [301, 302, 303, 307, 308]").message("statusCode must be one of 301, 302, 303, 307, 308"))]
    pub status_code: Option<i32>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum RedirectScheme {
    Http,
    Https,
}

impl RedirectScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            RedirectScheme::Http => "http",
            RedirectScheme::Https => "https",
        }
    }
}

/// Rewrites the request before it is forwarded.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct UrlRewrite {
    /// The Host the backend sees; the request's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(HOSTNAME_PATTERN))]
    pub hostname: Option<String>,
    /// How the path the backend sees is made; the request's path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.replaceFullPath) == (self.type == 'ReplaceFullPath')")
        .message("replaceFullPath must be set exactly when type is ReplaceFullPath"),
    validation = Rule::new("has(self.replacePrefixMatch) == (self.type == 'ReplacePrefixMatch')")
        .message("replacePrefixMatch must be set exactly when type is ReplacePrefixMatch"),
)]
pub struct HttpPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`; required.
    #[serde(rename = "type")]
    pub r#type: PathModifierType,
    /// The whole new path (with `type: ReplaceFullPath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub replace_full_path: Option<String>,
    /// Replaces the part of the path the rule's PathPrefix matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub replace_prefix_match: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathModifierType {
    ReplaceFullPath,
    ReplacePrefixMatch,
}

/// Sends a copy of the request to another backend and ignores its answer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.percent) && has(self.fraction))")
    .message("only one of percent or fraction may be set"))]
pub struct RequestMirror {
    pub backend_ref: BackendObjectRef,
    /// Share of requests mirrored, in percent (all when neither this nor fraction is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.denominator) || self.numerator <= self.denominator")
    .message("numerator must not exceed denominator"))]
pub struct Fraction {
    #[schemars(range(min = 0))]
    pub numerator: i32,
    /// 100 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub denominator: Option<i32>,
}

/// A reference to a backend object; only core `Service` is supported.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("(has(self.group) && self.group != '' && self.group != 'core') || (has(self.kind) && self.kind != 'Service') || has(self.port)")
    .message("port is required when the backend is a Service"))]
pub struct BackendObjectRef {
    /// API group; empty (core) for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub group: Option<String>,
    /// Kind; `Service` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the backend; the route's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(LABEL_PATTERN))]
    pub namespace: Option<String>,
    /// A port of the Service (not a target port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// A weighted backend, with filters applied only when this backend is chosen.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("(has(self.group) && self.group != '' && self.group != 'core') || (has(self.kind) && self.kind != 'Service') || has(self.port)")
    .message("port is required when the backend is a Service"))]
pub struct HttpBackendRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: Option<String>,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(LABEL_PATTERN))]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Relative share of the rule's traffic; 1 when absent, 0 sends it nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub weight: Option<i32>,
    /// Filters applied when this backend is chosen (RequestHeaderModifier and
    /// ResponseHeaderModifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub filters: Option<Vec<HttpRouteFilter>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.request) && has(self.backendRequest) && duration(self.request) != duration('0s')) || duration(self.backendRequest) <= duration(self.request)")
    .message("backendRequest must not be longer than request"))]
pub struct HttpRouteTimeouts {
    /// Time for the whole request, retries included; no limit when absent, and `0s`
    /// disables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub request: Option<String>,
    /// Time for one attempt at a backend; the `request` timeout when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub backend_request: Option<String>,
}

/// When and how often a failed backend attempt is tried again. A connection failure (refused,
/// reset, or an attempt past `timeouts.backendRequest`) is retried whenever a rule has a
/// `retry`; a response only when its status is in `codes`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRetry {
    /// Response statuses to retry (400-599).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), inner(range(min = 400, max = 599)))]
    pub codes: Option<Vec<i64>>,
    /// Retries after the first attempt (at most 10); 2 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub attempts: Option<i64>,
    /// The least wait before a retry, doubling with each one; 25ms when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub backoff: Option<String>,
}
