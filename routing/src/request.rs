//! The parts of an HTTP request that routing reads.

use std::borrow::Cow;

use http::{HeaderMap, Method};

/// A borrowed view of a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub method: &'a Method,
    /// `http` or `https`, as the client sent it (captured traffic is plain `http`).
    pub scheme: &'a str,
    /// The Host header (HTTP/1.1) or `:authority` (HTTP/2), possibly with a port.
    pub authority: Option<&'a str>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

impl<'a> RequestView<'a> {
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        let authority = parts.uri.authority().map(|a| a.as_str()).or_else(|| {
            parts
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        });
        RequestView {
            method: &parts.method,
            scheme: parts.uri.scheme_str().unwrap_or("http"),
            authority,
            path: if parts.uri.path().is_empty() {
                "/"
            } else {
                parts.uri.path()
            },
            query: parts.uri.query(),
            headers: &parts.headers,
        }
    }

    /// The host part of the authority: no port, IPv6 literals keep their brackets.
    pub fn host(&self) -> Option<&'a str> {
        let authority = self.authority?;
        if authority.starts_with('[') {
            return authority.find(']').map(|end| &authority[..=end]);
        }
        Some(
            authority
                .rsplit_once(':')
                .map_or(authority, |(host, _)| host),
        )
    }

    /// The first value of query parameter `name`, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<Cow<'a, str>> {
        self.query?.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key) == name).then(|| percent_decode(value))
        })
    }
}

/// Decodes `%XX` escapes; malformed escapes are kept as they are.
fn percent_decode(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(parts: &'a http::request::Parts) -> RequestView<'a> {
        RequestView::from_parts(parts)
    }

    #[test]
    fn host_drops_the_port_and_keeps_ipv6_brackets() {
        let (parts, ()) = http::Request::get("/x")
            .header("host", "echo:8080")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(view(&parts).host(), Some("echo"));
        let (parts, ()) = http::Request::get("/x")
            .header("host", "[fd00::1]:8080")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(view(&parts).host(), Some("[fd00::1]"));
        let (parts, ()) = http::Request::get("http://example.org/x")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(view(&parts).host(), Some("example.org"));
    }

    #[test]
    fn query_params_take_the_first_value_and_decode_it() {
        let (parts, ()) = http::Request::get("/p?a=1&b=x%20y&a=2&c&bad=%zz%4")
            .body(())
            .unwrap()
            .into_parts();
        let v = view(&parts);
        assert_eq!(v.query_param("a").as_deref(), Some("1"));
        assert_eq!(v.query_param("b").as_deref(), Some("x y"));
        assert_eq!(v.query_param("c").as_deref(), Some(""));
        assert_eq!(v.query_param("bad").as_deref(), Some("%zz%4"));
        assert_eq!(v.query_param("A"), None);
    }
}
