//! Filter semantics: header edits, path replacement and redirect `Location`s.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::error::TableError;
use crate::request::RequestView;
use crate::table::{HeaderEdits, PathRewrite, Redirect};

/// Header edits with names and values parsed once, when the table is loaded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Edits {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl Edits {
    pub(crate) fn new(port: u16, edits: &HeaderEdits) -> Result<Self, TableError> {
        let name = |n: &str| {
            HeaderName::from_bytes(n.as_bytes()).map_err(|_| TableError::InvalidHeader {
                port,
                what: "name",
                value: n.to_owned(),
            })
        };
        let pair = |h: &crate::table::Header| {
            let value = HeaderValue::from_str(&h.value).map_err(|_| TableError::InvalidHeader {
                port,
                what: "value",
                value: h.value.clone(),
            })?;
            Ok((name(&h.name)?, value))
        };
        Ok(Edits {
            set: edits
                .set
                .iter()
                .map(pair)
                .collect::<Result<_, TableError>>()?,
            add: edits
                .add
                .iter()
                .map(pair)
                .collect::<Result<_, TableError>>()?,
            remove: edits
                .remove
                .iter()
                .map(|n| name(n))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Set replaces every value of a header, add appends after the existing values,
    /// remove deletes the header. Names are case-insensitive.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

/// Replaces the matched `prefix` of `path` with `replacement`, on path segment boundaries:
/// `/prefix/one/two` with prefix `/prefix/one` and replacement `/one` gives `/one/two`;
/// a replacement of `/` or the empty string strips the prefix, and the result is never empty.
pub fn replace_prefix(path: &str, prefix: &str, replacement: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let rest = path.strip_prefix(prefix).unwrap_or(path);
    let mut out = String::with_capacity(replacement.len() + rest.len());
    out.push_str(replacement.trim_end_matches('/'));
    out.push_str(rest);
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// The path a path modifier produces; `matched_prefix` is the prefix of the entry that matched.
pub fn rewritten_path(rewrite: &PathRewrite, path: &str, matched_prefix: Option<&str>) -> String {
    match rewrite {
        PathRewrite::Full(full) => {
            if full.is_empty() {
                "/".to_owned()
            } else {
                full.clone()
            }
        }
        PathRewrite::Prefix(replacement) => {
            replace_prefix(path, matched_prefix.unwrap_or("/"), replacement)
        }
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// The `Location` of a redirect. Unset parts keep the request's; an unset port is the
/// well-known port of the redirect's scheme when it sets one, else `listener_port` (the
/// Service port the client dialed); the port is left out when it is the scheme's default.
pub fn redirect_location(
    redirect: &Redirect,
    req: &RequestView<'_>,
    listener_port: u16,
    matched_prefix: Option<&str>,
) -> String {
    let scheme = redirect.scheme.as_deref().unwrap_or(req.scheme);
    let host = redirect
        .hostname
        .as_deref()
        .or_else(|| req.host())
        .unwrap_or("");
    let port = redirect
        .port
        .or_else(|| redirect.scheme.as_deref().and_then(default_port))
        .unwrap_or(listener_port);
    let path = match &redirect.path {
        Some(rewrite) => rewritten_path(rewrite, req.path, matched_prefix),
        None => req.path.to_owned(),
    };
    let mut location = format!("{scheme}://{host}");
    if default_port(scheme) != Some(port) {
        location.push(':');
        location.push_str(&port.to_string());
    }
    location.push_str(&path);
    if let Some(query) = req.query {
        location.push('?');
        location.push_str(query);
    }
    location
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_replacement_follows_the_gateway_api_table() {
        let cases = [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "", "/bar"),
            ("/foo/", "/foo", "", "/"),
            ("/foo", "/foo", "", "/"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
            ("/prefix/one/two", "/prefix/one", "/one", "/one/two"),
            ("/strip-prefix/three", "/strip-prefix", "/", "/three"),
            ("/anything", "/", "/api", "/api/anything"),
        ];
        for (path, prefix, replacement, want) in cases {
            assert_eq!(
                replace_prefix(path, prefix, replacement),
                want,
                "{path} {prefix} {replacement}"
            );
        }
    }

    fn request<'a>(parts: &'a http::request::Parts) -> RequestView<'a> {
        RequestView::from_parts(parts)
    }

    fn redirect(
        scheme: Option<&str>,
        hostname: Option<&str>,
        port: Option<u16>,
        path: Option<PathRewrite>,
    ) -> Redirect {
        Redirect {
            scheme: scheme.map(Into::into),
            hostname: hostname.map(Into::into),
            port,
            path,
            status: 302,
        }
    }

    #[test]
    fn redirect_ports_follow_the_scheme_rules() {
        let (parts, ()) = http::Request::get("/p?q=1")
            .header("host", "echo")
            .body(())
            .unwrap()
            .into_parts();
        let req = request(&parts);
        assert_eq!(
            redirect_location(&redirect(None, None, None, None), &req, 80, None),
            "http://echo/p?q=1"
        );
        assert_eq!(
            redirect_location(&redirect(None, None, None, None), &req, 8080, None),
            "http://echo:8080/p?q=1"
        );
        assert_eq!(
            redirect_location(&redirect(Some("https"), None, None, None), &req, 8080, None),
            "https://echo/p?q=1"
        );
        assert_eq!(
            redirect_location(&redirect(Some("http"), None, None, None), &req, 8080, None),
            "http://echo/p?q=1"
        );
        assert_eq!(
            redirect_location(
                &redirect(Some("https"), None, Some(8443), None),
                &req,
                80,
                None
            ),
            "https://echo:8443/p?q=1"
        );
        assert_eq!(
            redirect_location(
                &redirect(None, Some("example.org"), Some(443), None),
                &req,
                80,
                None
            ),
            "http://example.org:443/p?q=1"
        );
        assert_eq!(
            redirect_location(
                &redirect(None, None, None, Some(PathRewrite::Full("/new".into()))),
                &req,
                80,
                None
            ),
            "http://echo/new?q=1"
        );
    }

    #[test]
    fn header_edits_set_add_and_remove_case_insensitively() {
        let edits = HeaderEdits {
            set: vec![crate::table::Header {
                name: "x-set".into(),
                value: "new".into(),
            }],
            add: vec![crate::table::Header {
                name: "x-add".into(),
                value: "two".into(),
            }],
            remove: vec!["x-gone".into()],
        };
        let edits = Edits::new(80, &edits).unwrap();
        let mut headers = HeaderMap::new();
        headers.append("X-Set", HeaderValue::from_static("a"));
        headers.append("X-Set", HeaderValue::from_static("b"));
        headers.append("X-Add", HeaderValue::from_static("one"));
        headers.append("X-Gone", HeaderValue::from_static("bye"));
        edits.apply(&mut headers);
        assert_eq!(headers.get_all("x-set").iter().collect::<Vec<_>>(), ["new"]);
        assert_eq!(
            headers.get_all("x-add").iter().collect::<Vec<_>>(),
            ["one", "two"]
        );
        assert!(headers.get("x-gone").is_none());
    }

    #[test]
    fn invalid_header_values_in_a_table_are_errors() {
        let edits = HeaderEdits {
            set: vec![crate::table::Header {
                name: "x".into(),
                value: "bad\nvalue".into(),
            }],
            ..Default::default()
        };
        assert!(matches!(
            Edits::new(80, &edits),
            Err(TableError::InvalidHeader { what: "value", .. })
        ));
    }
}
