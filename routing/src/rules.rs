//! Compiles the rules of one route into table rules and ranked match entries.

use std::str::FromStr;

use aether_crds::conditions::reason;
use aether_crds::http::{
    HeaderModifier, HttpBackendRef, HttpFilterType, HttpPathModifier, HttpRouteFilter,
    HttpRouteMatch, HttpRouteRule, HttpRouteTimeouts, PathMatchType, PathModifierType,
    StringMatchType,
};

use crate::error::RuleError;
use crate::source::{GrpcMatch, GrpcRule, RouteRules, RouteSource, ServiceKind, ServiceLookup};
use crate::table::{
    Backend, BackendTarget, Entry, Filters, Header, HeaderEdits, Mirror, PathMatch, PathRewrite,
    Redirect, Rewrite, Rule, ServiceRef, StringMatch, Timeouts, ValueMatch,
};

/// One route's rules, compiled. Entries refer to rules by their index in `rules`.
#[derive(Debug, Clone)]
pub(crate) struct CompiledRoute {
    pub rules: Vec<Rule>,
    pub entries: Vec<RankedEntry>,
}

/// An entry with what the precedence order needs from it.
#[derive(Debug, Clone)]
pub(crate) struct RankedEntry {
    pub entry: Entry,
    /// Compared in descending order: the more specific match wins.
    pub specificity: [u32; 5],
    pub match_index: u32,
}

pub(crate) fn compile_route(
    source: &RouteSource,
    services: &(impl ServiceLookup + ?Sized),
) -> Result<CompiledRoute, RuleError> {
    let mut compiled = CompiledRoute {
        rules: Vec::new(),
        entries: Vec::new(),
    };
    match &source.rules {
        RouteRules::Unsupported(why) => return Err(RuleError::Unsupported(why.clone())),
        RouteRules::Http(rules) => {
            for (index, rule) in rules.iter().enumerate() {
                let entries = http_entries(index, rule)?;
                let table_rule = http_rule(source, index, rule, services)?;
                check_prefix_replacement(index, &table_rule.filters, &entries)?;
                push(&mut compiled, table_rule, entries);
            }
        }
        RouteRules::Grpc(rules) => {
            for (index, rule) in rules.iter().enumerate() {
                let entries = grpc_entries(index, rule)?;
                let table_rule = grpc_rule(source, index, rule, services)?;
                push(&mut compiled, table_rule, entries);
            }
        }
    }
    Ok(compiled)
}

fn push(compiled: &mut CompiledRoute, rule: Rule, mut entries: Vec<RankedEntry>) {
    let index = compiled.rules.len() as u32;
    for entry in &mut entries {
        entry.entry.rule = index;
    }
    compiled.rules.push(rule);
    compiled.entries.extend(entries);
}

fn anchored_regex(rule: usize, pattern: &str) -> Result<String, RuleError> {
    aether_core::route_table::whole_value_regex(pattern).map_err(|e| RuleError::InvalidRegex {
        rule,
        pattern: pattern.to_owned(),
        message: e.to_string(),
    })?;
    Ok(pattern.to_owned())
}

fn header_name(rule: usize, name: &str) -> Result<String, RuleError> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|n| n.as_str().to_owned())
        .map_err(|_| RuleError::InvalidHeader {
            rule,
            what: "name",
            value: name.to_owned(),
        })
}

fn header_value(rule: usize, value: &str) -> Result<String, RuleError> {
    http::HeaderValue::from_str(value)
        .map(|_| value.to_owned())
        .map_err(|_| RuleError::InvalidHeader {
            rule,
            what: "value",
            value: value.to_owned(),
        })
}

fn string_match(
    rule: usize,
    kind: Option<StringMatchType>,
    value: &str,
) -> Result<StringMatch, RuleError> {
    Ok(match kind.unwrap_or(StringMatchType::Exact) {
        StringMatchType::Exact => StringMatch::Exact(value.to_owned()),
        StringMatchType::RegularExpression => StringMatch::Regex(anchored_regex(rule, value)?),
    })
}

/// Header matches with names lower-cased; of several with the same name only the first
/// counts, as Gateway API says.
fn header_matches<'a>(
    rule: usize,
    matches: impl Iterator<Item = (&'a str, Option<StringMatchType>, &'a str)>,
) -> Result<Vec<ValueMatch>, RuleError> {
    let mut out: Vec<ValueMatch> = Vec::new();
    for (name, kind, value) in matches {
        let name = header_name(rule, name)?;
        if out.iter().any(|m| m.name == name) {
            continue;
        }
        let value = string_match(rule, kind, value)?;
        out.push(ValueMatch { name, value });
    }
    Ok(out)
}

/// The request matches of HTTPRoute-shaped matches, checked as a route's are (none is every
/// request): what an authorization rule admits or refuses. Errors name rule 0.
pub fn request_matches(matches: &[HttpRouteMatch]) -> Result<Vec<Entry>, RuleError> {
    let spec = HttpRouteRule {
        matches: Some(matches.to_vec()),
        ..HttpRouteRule::default()
    };
    Ok(http_entries(0, &spec)?
        .into_iter()
        .map(|e| e.entry)
        .collect())
}

fn http_entries(rule: usize, spec: &HttpRouteRule) -> Result<Vec<RankedEntry>, RuleError> {
    let default_match = [HttpRouteMatch::default()];
    let matches = match spec.matches.as_deref() {
        Some(m) if !m.is_empty() => m,
        _ => &default_match[..],
    };
    matches
        .iter()
        .enumerate()
        .map(|(match_index, m)| {
            let kind = m
                .path
                .as_ref()
                .and_then(|p| p.r#type)
                .unwrap_or(PathMatchType::PathPrefix);
            let value = m
                .path
                .as_ref()
                .and_then(|p| p.value.clone())
                .unwrap_or_else(|| "/".to_owned());
            let (path, path_class) = match kind {
                PathMatchType::Exact => (PathMatch::Exact(value.clone()), 3),
                PathMatchType::RegularExpression => {
                    (PathMatch::Regex(anchored_regex(rule, &value)?), 2)
                }
                PathMatchType::PathPrefix => (PathMatch::Prefix(value.clone()), 1),
            };
            if !matches!(path, PathMatch::Regex(_)) && !value.starts_with('/') {
                return Err(RuleError::InvalidValue {
                    rule,
                    message: format!("path {value:?} must start with '/'"),
                });
            }
            let headers = header_matches(
                rule,
                m.headers
                    .iter()
                    .flatten()
                    .map(|h| (h.name.as_str(), h.r#type, h.value.as_str())),
            )?;
            let mut query: Vec<ValueMatch> = Vec::new();
            for q in m.query_params.iter().flatten() {
                if query.iter().any(|existing| existing.name == q.name) {
                    continue;
                }
                query.push(ValueMatch {
                    name: q.name.clone(),
                    value: string_match(rule, q.r#type, &q.value)?,
                });
            }
            let specificity = [
                path_class,
                value.len() as u32,
                u32::from(m.method.is_some()),
                headers.len() as u32,
                query.len() as u32,
            ];
            Ok(RankedEntry {
                entry: Entry {
                    rule: 0,
                    path,
                    method: m.method.map(|method| method.as_str().to_owned()),
                    headers,
                    query,
                },
                specificity,
                match_index: match_index as u32,
            })
        })
        .collect()
}

/// A gRPC method match becomes a path match on `/<service>/<method>`.
fn grpc_entries(rule: usize, spec: &GrpcRule) -> Result<Vec<RankedEntry>, RuleError> {
    let default_match = [GrpcMatch::default()];
    let matches = if spec.matches.is_empty() {
        &default_match[..]
    } else {
        &spec.matches[..]
    };
    matches
        .iter()
        .enumerate()
        .map(|(match_index, m)| {
            let (service, method) = (m.service.as_deref(), m.method.as_deref());
            let regex = m.regex;
            let path = match (regex, service, method) {
                (_, None, None) => PathMatch::Prefix("/".into()),
                (false, Some(s), Some(m)) => PathMatch::Exact(format!("/{s}/{m}")),
                (false, Some(s), None) => PathMatch::Prefix(format!("/{s}")),
                (false, None, Some(m)) => PathMatch::Regex(format!("/[^/]+/{}", regex::escape(m))),
                (true, s, m) => {
                    let s = s
                        .map(|s| anchored_regex(rule, s))
                        .transpose()?
                        .unwrap_or_else(|| "[^/]+".into());
                    let m = m
                        .map(|m| anchored_regex(rule, m))
                        .transpose()?
                        .unwrap_or_else(|| "[^/]+".into());
                    PathMatch::Regex(format!("/(?:{s})/(?:{m})"))
                }
            };
            let headers = header_matches(
                rule,
                m.headers.iter().map(|h| {
                    let kind = if h.regex {
                        StringMatchType::RegularExpression
                    } else {
                        StringMatchType::Exact
                    };
                    (h.name.as_str(), Some(kind), h.value.as_str())
                }),
            )?;
            let specificity = [
                0,
                service.map_or(0, str::len) as u32,
                method.map_or(0, str::len) as u32,
                headers.len() as u32,
                0,
            ];
            Ok(RankedEntry {
                entry: Entry {
                    rule: 0,
                    path,
                    method: None,
                    headers,
                    query: Vec::new(),
                },
                specificity,
                match_index: match_index as u32,
            })
        })
        .collect()
}

fn http_rule(
    source: &RouteSource,
    index: usize,
    spec: &HttpRouteRule,
    services: &(impl ServiceLookup + ?Sized),
) -> Result<Rule, RuleError> {
    let namespace = &source.route.namespace;
    Ok(Rule {
        route: source.route.clone(),
        index: index as u32,
        name: spec.name.clone(),
        filters: rule_filters(
            index,
            spec.filters.as_deref().unwrap_or_default(),
            namespace,
            services,
        )?,
        backends: backends(
            index,
            spec.backend_refs.as_deref().unwrap_or_default(),
            namespace,
            services,
        )?,
        timeouts: timeouts(index, spec.timeouts.as_ref())?,
        retry: crate::retry::compile_retry(index, spec.retry.as_ref())?,
    })
}

fn grpc_rule(
    source: &RouteSource,
    index: usize,
    spec: &GrpcRule,
    services: &(impl ServiceLookup + ?Sized),
) -> Result<Rule, RuleError> {
    let namespace = &source.route.namespace;
    let filters = rule_filters(index, &spec.filters, namespace, services)?;
    if filters.redirect.is_some() || filters.rewrite.is_some() {
        return Err(RuleError::InvalidValue {
            rule: index,
            message: "GRPCRoute rules cannot redirect or rewrite".into(),
        });
    }
    Ok(Rule {
        route: source.route.clone(),
        index: index as u32,
        name: spec.name.clone(),
        filters,
        backends: backends(index, &spec.backend_refs, namespace, services)?,
        timeouts: Timeouts::default(),
        retry: None,
    })
}

fn filter_name(kind: HttpFilterType) -> &'static str {
    match kind {
        HttpFilterType::RequestHeaderModifier => "RequestHeaderModifier",
        HttpFilterType::ResponseHeaderModifier => "ResponseHeaderModifier",
        HttpFilterType::RequestRedirect => "RequestRedirect",
        HttpFilterType::UrlRewrite => "URLRewrite",
        HttpFilterType::RequestMirror => "RequestMirror",
    }
}

/// Sets `slot` once; a second filter of the same type is an error.
fn set_once<T>(
    slot: &mut Option<T>,
    value: T,
    rule: usize,
    kind: HttpFilterType,
) -> Result<(), RuleError> {
    if slot.is_some() {
        return Err(RuleError::DuplicateFilter {
            rule,
            filter: filter_name(kind),
        });
    }
    *slot = Some(value);
    Ok(())
}

fn config<T>(
    value: Option<&T>,
    rule: usize,
    kind: HttpFilterType,
    field: &'static str,
) -> Result<T, RuleError>
where
    T: Clone,
{
    value.cloned().ok_or(RuleError::MissingFilterConfig {
        rule,
        filter: filter_name(kind),
        field,
    })
}

fn rule_filters(
    rule: usize,
    filters: &[HttpRouteFilter],
    namespace: &str,
    services: &(impl ServiceLookup + ?Sized),
) -> Result<Filters, RuleError> {
    let mut out = Filters::default();
    for filter in filters {
        let kind = filter.r#type;
        match kind {
            HttpFilterType::RequestHeaderModifier => {
                let edits = header_edits(
                    rule,
                    &config(
                        filter.request_header_modifier.as_ref(),
                        rule,
                        kind,
                        "requestHeaderModifier",
                    )?,
                )?;
                set_once(&mut out.request_headers, edits, rule, kind)?;
            }
            HttpFilterType::ResponseHeaderModifier => {
                let edits = header_edits(
                    rule,
                    &config(
                        filter.response_header_modifier.as_ref(),
                        rule,
                        kind,
                        "responseHeaderModifier",
                    )?,
                )?;
                set_once(&mut out.response_headers, edits, rule, kind)?;
            }
            HttpFilterType::RequestRedirect => {
                let spec = config(
                    filter.request_redirect.as_ref(),
                    rule,
                    kind,
                    "requestRedirect",
                )?;
                let status = match spec.status_code.unwrap_or(302) {
                    s @ (301 | 302 | 303 | 307 | 308) => s as u16,
                    other => {
                        return Err(RuleError::InvalidValue {
                            rule,
                            message: format!(
                                "redirect status {other} is not one of 301, 302, 303, 307, 308"
                            ),
                        });
                    }
                };
                let port = spec
                    .port
                    .map(|p| u16::try_from(p).ok().filter(|p| *p != 0))
                    .map(|p| {
                        p.ok_or(RuleError::InvalidValue {
                            rule,
                            message: "redirect port must be 1-65535".into(),
                        })
                    })
                    .transpose()?;
                let redirect = Redirect {
                    scheme: spec.scheme.map(|s| s.as_str().to_owned()),
                    hostname: spec.hostname.clone(),
                    port,
                    path: spec
                        .path
                        .as_ref()
                        .map(|p| path_rewrite(rule, p))
                        .transpose()?,
                    status,
                };
                set_once(&mut out.redirect, redirect, rule, kind)?;
            }
            HttpFilterType::UrlRewrite => {
                let spec = config(filter.url_rewrite.as_ref(), rule, kind, "urlRewrite")?;
                let rewrite = Rewrite {
                    hostname: spec.hostname.clone(),
                    path: spec
                        .path
                        .as_ref()
                        .map(|p| path_rewrite(rule, p))
                        .transpose()?,
                };
                set_once(&mut out.rewrite, rewrite, rule, kind)?;
            }
            HttpFilterType::RequestMirror => {
                let spec = config(filter.request_mirror.as_ref(), rule, kind, "requestMirror")?;
                let (numerator, denominator) = match (spec.percent, spec.fraction.as_ref()) {
                    (Some(p), None) => (p, 100),
                    (None, Some(f)) => (f.numerator, f.denominator.unwrap_or(100)),
                    (None, None) => (1, 1),
                    (Some(_), Some(_)) => {
                        return Err(RuleError::InvalidValue {
                            rule,
                            message: "a mirror takes percent or fraction, not both".into(),
                        });
                    }
                };
                if numerator < 0 || denominator <= 0 || numerator > denominator {
                    return Err(RuleError::InvalidValue {
                        rule,
                        message: format!(
                            "mirror fraction {numerator}/{denominator} is not between 0 and 1"
                        ),
                    });
                }
                let r = &spec.backend_ref;
                let target = resolve_backend(
                    r.group.as_deref(),
                    r.kind.as_deref(),
                    &r.name,
                    r.namespace.as_deref().unwrap_or(namespace),
                    r.port,
                    services,
                );
                out.mirrors.push(Mirror {
                    target,
                    numerator: numerator as u32,
                    denominator: denominator as u32,
                });
            }
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err(RuleError::RedirectWithRewrite { rule });
    }
    Ok(out)
}

fn path_rewrite(rule: usize, spec: &HttpPathModifier) -> Result<PathRewrite, RuleError> {
    let (value, field) = match spec.r#type {
        PathModifierType::ReplaceFullPath => (spec.replace_full_path.clone(), "replaceFullPath"),
        PathModifierType::ReplacePrefixMatch => {
            (spec.replace_prefix_match.clone(), "replacePrefixMatch")
        }
    };
    let value = value.ok_or(RuleError::InvalidValue {
        rule,
        message: format!("path modifier needs {field}"),
    })?;
    if !value.is_empty() && !value.starts_with('/') {
        return Err(RuleError::InvalidValue {
            rule,
            message: format!("replacement path {value:?} must start with '/'"),
        });
    }
    Ok(match spec.r#type {
        PathModifierType::ReplaceFullPath => PathRewrite::Full(value),
        PathModifierType::ReplacePrefixMatch => PathRewrite::Prefix(value),
    })
}

/// A prefix replacement needs to know which prefix matched, so every entry of the rule
/// must be a prefix match.
fn check_prefix_replacement(
    rule: usize,
    filters: &Filters,
    entries: &[RankedEntry],
) -> Result<(), RuleError> {
    let replaces_prefix = |p: Option<&PathRewrite>| matches!(p, Some(PathRewrite::Prefix(_)));
    let uses_prefix = replaces_prefix(filters.redirect.as_ref().and_then(|r| r.path.as_ref()))
        || replaces_prefix(filters.rewrite.as_ref().and_then(|r| r.path.as_ref()));
    if uses_prefix
        && entries
            .iter()
            .any(|e| !matches!(e.entry.path, PathMatch::Prefix(_)))
    {
        return Err(RuleError::PrefixReplaceWithoutPrefixMatch { rule });
    }
    Ok(())
}

fn header_edits(rule: usize, spec: &HeaderModifier) -> Result<HeaderEdits, RuleError> {
    let headers =
        |list: &Option<Vec<aether_crds::http::HttpHeader>>| -> Result<Vec<Header>, RuleError> {
            list.iter()
                .flatten()
                .map(|h| {
                    Ok(Header {
                        name: header_name(rule, &h.name)?,
                        value: header_value(rule, &h.value)?,
                    })
                })
                .collect()
        };
    Ok(HeaderEdits {
        set: headers(&spec.set)?,
        add: headers(&spec.add)?,
        remove: spec
            .remove
            .iter()
            .flatten()
            .map(|n| header_name(rule, n))
            .collect::<Result<_, _>>()?,
    })
}

fn backends(
    rule: usize,
    refs: &[HttpBackendRef],
    namespace: &str,
    services: &(impl ServiceLookup + ?Sized),
) -> Result<Vec<Backend>, RuleError> {
    refs.iter()
        .map(|r| {
            let weight = r.weight.unwrap_or(1);
            let weight = u32::try_from(weight).map_err(|_| RuleError::InvalidValue {
                rule,
                message: format!("backend weight {weight} is negative"),
            })?;
            let mut backend = Backend {
                target: resolve_backend(
                    r.group.as_deref(),
                    r.kind.as_deref(),
                    &r.name,
                    r.namespace.as_deref().unwrap_or(namespace),
                    r.port,
                    services,
                ),
                weight,
                request_headers: None,
                response_headers: None,
            };
            for filter in r.filters.iter().flatten() {
                let kind = filter.r#type;
                match kind {
                    HttpFilterType::RequestHeaderModifier => {
                        let spec = config(
                            filter.request_header_modifier.as_ref(),
                            rule,
                            kind,
                            "requestHeaderModifier",
                        )?;
                        set_once(
                            &mut backend.request_headers,
                            header_edits(rule, &spec)?,
                            rule,
                            kind,
                        )?;
                    }
                    HttpFilterType::ResponseHeaderModifier => {
                        let spec = config(
                            filter.response_header_modifier.as_ref(),
                            rule,
                            kind,
                            "responseHeaderModifier",
                        )?;
                        set_once(
                            &mut backend.response_headers,
                            header_edits(rule, &spec)?,
                            rule,
                            kind,
                        )?;
                    }
                    other => {
                        return Err(RuleError::UnsupportedBackendFilter {
                            rule,
                            filter: filter_name(other),
                        });
                    }
                }
            }
            Ok(backend)
        })
        .collect()
}

/// Resolves a backend reference to a Service port. Mesh routes may name a Service in any
/// namespace without a ReferenceGrant (GEP-1294), so only kind and existence are checked.
pub(crate) fn resolve_backend(
    group: Option<&str>,
    kind: Option<&str>,
    name: &str,
    namespace: &str,
    port: Option<i32>,
    services: &(impl ServiceLookup + ?Sized),
) -> BackendTarget {
    let unresolved = |reason: &str, message: String| BackendTarget::Unresolved {
        reason: reason.to_owned(),
        message,
    };
    let group = group.unwrap_or("");
    let kind = kind.unwrap_or("Service");
    if !(group.is_empty() || group == "core") || kind != "Service" {
        let shown = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        return unresolved(
            reason::INVALID_KIND,
            format!("backend {namespace}/{name} is a {shown}; only Services are supported"),
        );
    }
    let Some(service) = services.service(namespace, name) else {
        return unresolved(
            reason::BACKEND_NOT_FOUND,
            format!("Service {namespace}/{name} not found"),
        );
    };
    if service.kind == ServiceKind::ExternalName {
        return unresolved(
            reason::BACKEND_NOT_FOUND,
            format!(
                "Service {namespace}/{name} is an ExternalName Service, which has no endpoints to route to"
            ),
        );
    }
    let Some(port) = port else {
        return unresolved(
            reason::BACKEND_NOT_FOUND,
            format!("backend Service {namespace}/{name} needs a port"),
        );
    };
    if !service.ports.iter().any(|p| i32::from(p.port) == port) {
        return unresolved(
            reason::BACKEND_NOT_FOUND,
            format!("Service {namespace}/{name} has no port {port}"),
        );
    }
    BackendTarget::Service(ServiceRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        port: port as u16,
    })
}

fn duration_ms(rule: usize, field: &str, value: Option<&str>) -> Result<Option<u64>, RuleError> {
    value
        .map(|v| {
            gateway_api::Duration::from_str(v)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .map_err(|e| RuleError::InvalidValue {
                    rule,
                    message: format!("timeouts.{field} {v:?}: {e}"),
                })
        })
        .transpose()
}

/// Zero disables a timeout, as Gateway API says.
fn timeouts(rule: usize, spec: Option<&HttpRouteTimeouts>) -> Result<Timeouts, RuleError> {
    let Some(spec) = spec else {
        return Ok(Timeouts::default());
    };
    let request_ms = duration_ms(rule, "request", spec.request.as_deref())?.filter(|ms| *ms > 0);
    let backend_request_ms =
        duration_ms(rule, "backendRequest", spec.backend_request.as_deref())?.filter(|ms| *ms > 0);
    if let (Some(request), Some(backend)) = (request_ms, backend_request_ms)
        && backend > request
    {
        return Err(RuleError::InvalidValue {
            rule,
            message: format!(
                "timeouts.backendRequest ({backend} ms) is longer than timeouts.request ({request} ms)"
            ),
        });
    }
    Ok(Timeouts {
        request_ms,
        backend_request_ms,
    })
}
