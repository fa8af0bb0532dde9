//! The client's URL: `http://host[:port]/path?query` or `grpc://host:port`, taken apart by hand
//! so the path goes on the wire exactly as given.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Grpc,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub scheme: Scheme,
    /// What to resolve and dial: a name (resolved with the system resolver, so resolv.conf
    /// search domains apply) or an IP literal, without brackets.
    pub host: String,
    pub port: u16,
    /// `host[:port]` as given: the Host header / :authority.
    pub authority: String,
    /// Path and query as given; `/` when the URL has none. Fragments are dropped.
    pub path_and_query: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("unsupported scheme {0:?}: use http:// or grpc://")]
    Scheme(String),
    #[error("no host in {0:?}")]
    NoHost(String),
    #[error("bad port in {0:?}")]
    Port(String),
    #[error("user info in {0:?} is not supported")]
    UserInfo(String),
    #[error("grpc:// URLs take no path (the method is always /proto.EchoTestService/Echo): {0:?}")]
    GrpcPath(String),
}

/// Port 80 when the URL names none, as for http:// in Go's client.
const DEFAULT_PORT: u16 = 80;

pub fn parse(url: &str) -> Result<Target, TargetError> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        // Like the Istio client (and curl): no scheme means http.
        None => ("http".to_string(), url),
    };
    let scheme = match scheme.as_str() {
        "http" => Scheme::Http,
        "grpc" => Scheme::Grpc,
        _ => return Err(TargetError::Scheme(scheme)),
    };
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return Err(TargetError::UserInfo(url.to_string()));
    }
    let path_and_query = match path {
        "" => "/".to_string(),
        query if query.starts_with('?') => format!("/{query}"),
        path => path.to_string(),
    };
    if scheme == Scheme::Grpc && path_and_query != "/" {
        return Err(TargetError::GrpcPath(url.to_string()));
    }
    let (host, port) =
        split_host_port(authority).ok_or_else(|| TargetError::Port(url.to_string()))?;
    if host.is_empty() {
        return Err(TargetError::NoHost(url.to_string()));
    }
    Ok(Target {
        scheme,
        host: host.to_string(),
        port: port.unwrap_or(DEFAULT_PORT),
        authority: authority.to_string(),
        path_and_query,
    })
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`; `None` for a port that is not a number.
fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']')?;
            match after {
                "" => (host, None),
                after => (host, Some(after.strip_prefix(':')?)),
            }
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    match port {
        None | Some("") => Some((host, None)),
        Some(port) => Some((host, Some(port.parse().ok()?))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(scheme: Scheme, host: &str, port: u16, authority: &str, path: &str) -> Target {
        Target {
            scheme,
            host: host.into(),
            port,
            authority: authority.into(),
            path_and_query: path.into(),
        }
    }

    #[test]
    fn conformance_urls() {
        assert_eq!(
            parse("http://echo"),
            Ok(target(Scheme::Http, "echo", 80, "echo", "/"))
        );
        assert_eq!(
            parse("http://echo-v1:8080/v2/example?a=b&c=d"),
            Ok(target(
                Scheme::Http,
                "echo-v1",
                8080,
                "echo-v1:8080",
                "/v2/example?a=b&c=d"
            ))
        );
        assert_eq!(
            parse("grpc://echo:7070"),
            Ok(target(Scheme::Grpc, "echo", 7070, "echo:7070", "/"))
        );
    }

    #[test]
    fn odd_but_valid_urls() {
        assert_eq!(
            parse("echo/x"),
            Ok(target(Scheme::Http, "echo", 80, "echo", "/x"))
        );
        assert_eq!(
            parse("HTTP://echo?q=1#frag"),
            Ok(target(Scheme::Http, "echo", 80, "echo", "/?q=1"))
        );
        assert_eq!(
            parse("http://[fd00::1]:8080/p"),
            Ok(target(
                Scheme::Http,
                "fd00::1",
                8080,
                "[fd00::1]:8080",
                "/p"
            ))
        );
        assert_eq!(
            parse("http://[::1]/"),
            Ok(target(Scheme::Http, "::1", 80, "[::1]", "/"))
        );
        assert_eq!(
            parse("http://echo:/"),
            Ok(target(Scheme::Http, "echo", 80, "echo:", "/"))
        );
        assert_eq!(
            parse("grpc://echo:7070/"),
            Ok(target(Scheme::Grpc, "echo", 7070, "echo:7070", "/"))
        );
    }

    #[test]
    fn bad_urls_are_errors() {
        assert!(matches!(parse("https://echo"), Err(TargetError::Scheme(_))));
        assert!(matches!(parse("http:///path"), Err(TargetError::NoHost(_))));
        assert!(matches!(parse("http://:80/"), Err(TargetError::NoHost(_))));
        assert!(matches!(
            parse("http://echo:99999/"),
            Err(TargetError::Port(_))
        ));
        assert!(matches!(
            parse("http://echo:abc/"),
            Err(TargetError::Port(_))
        ));
        assert!(matches!(parse("http://[::1/"), Err(TargetError::Port(_))));
        assert!(matches!(parse("http://[::1]x/"), Err(TargetError::Port(_))));
        assert!(matches!(
            parse("http://u@echo/"),
            Err(TargetError::UserInfo(_))
        ));
        assert!(matches!(
            parse("grpc://echo:7070/svc/Method"),
            Err(TargetError::GrpcPath(_))
        ));
    }
}
