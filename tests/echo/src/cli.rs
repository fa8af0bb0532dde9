//! Command line: the Istio echo app's server flags (as the conformance Deployments pass them)
//! and its `client` subcommand's flags (as the conformance harness passes them).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use http::{HeaderName, HeaderValue, Method};

#[derive(Debug, Parser)]
#[command(
    name = "aether-echo",
    about = "Echo server (default) and client for aether's tests, compatible with the Istio echo app",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send requests and print what came back, one `[i] ...` block per request.
    Client(ClientArgs),
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// HTTP port (HTTP/1.1 and h2c on the same port). Repeatable.
    #[arg(long = "port", value_name = "PORT", value_delimiter = ',')]
    pub http: Vec<u16>,
    /// gRPC port (h2c), serving /proto.EchoTestService/Echo. Repeatable.
    #[arg(long = "grpc", value_name = "PORT", value_delimiter = ',')]
    pub grpc: Vec<u16>,
    /// TCP port: echoes bytes back after an identity preamble. Repeatable.
    #[arg(long = "tcp", value_name = "PORT", value_delimiter = ',')]
    pub tcp: Vec<u16>,
    /// Port (also given as --port, --grpc or --tcp) served over TLS with --crt/--key.
    /// Not opened at all when the certificate cannot be loaded.
    #[arg(long = "tls", value_name = "PORT", value_delimiter = ',')]
    pub tls: Vec<u16>,
    /// PEM certificate chain for the TLS ports.
    #[arg(long = "crt", value_name = "FILE")]
    pub crt: Option<PathBuf>,
    /// PEM private key for the TLS ports.
    #[arg(long = "key", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Reported as ServiceVersion.
    #[arg(long = "version", value_name = "VERSION", default_value = "")]
    pub version: String,
    /// Where the pod's service-account token and namespace files are mounted.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount"
    )]
    pub service_account_dir: PathBuf,
    /// How long in-flight HTTP requests get to finish after SIGTERM.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// `http://host[:port]/path?query` or `grpc://host:port` (no scheme means http).
    pub url: String,
    /// HTTP method (ignored for gRPC, which is always a POST).
    #[arg(long, default_value = "GET", value_parser = parse_method)]
    pub method: Method,
    /// Request header or gRPC metadata, `Name:value` (a space after the colon is dropped).
    /// `Host:name` sets the Host header (the :authority for gRPC). Repeatable.
    #[arg(short = 'H', long = "header", value_name = "NAME:VALUE", value_parser = parse_header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Number of requests, sent one after the other.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Per-request timeout (connect, response and body), e.g. 5s, 500ms.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Requests per second; 0 sends as fast as responses come back.
    #[arg(long, default_value_t = 0)]
    pub qps: u32,
    /// Send http:// requests as HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    #[arg(long)]
    pub http2: bool,
    /// The gRPC EchoRequest message.
    #[arg(long, default_value = "HelloWorld")]
    pub msg: String,
}

/// The Istio echo image runs its client as a separate `client` binary (`kubectl exec ... client
/// URL`), so when this program is started under that name (a symlink) it is the client.
pub fn normalize_args(args: Vec<OsString>) -> Vec<OsString> {
    let invoked_as_client = args
        .first()
        .and_then(|argv0| Path::new(argv0).file_name())
        .is_some_and(|name| name == "client");
    if !invoked_as_client {
        return args;
    }
    let mut normalized = args;
    normalized.insert(1, OsString::from("client"));
    normalized
}

/// `Name:value` or `Name: value`, as the Istio echo client and curl take it.
pub fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not Name:value"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{name:?} is not a valid header name"))?;
    let value = HeaderValue::from_str(value.trim_start_matches(' '))
        .map_err(|_| format!("{value:?} is not a valid header value"))?;
    Ok((name, value))
}

pub fn parse_method(text: &str) -> Result<Method, String> {
    Method::from_bytes(text.as_bytes()).map_err(|_| format!("{text:?} is not an HTTP method"))
}

/// Go-style durations as the Istio client takes them: `5s`, `500ms`, `1m`, `1.5s`, `2h`;
/// a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 5s, 500ms, 1m)");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds_per_unit = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "us" | "µs" => 0.000_001,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(number * seconds_per_unit).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn client_symlink_means_client_mode() {
        assert_eq!(
            normalize_args(os(&["/usr/local/bin/client", "http://echo"])),
            os(&["/usr/local/bin/client", "client", "http://echo"])
        );
        assert_eq!(
            normalize_args(os(&["aether-echo", "--port=8080"])),
            os(&["aether-echo", "--port=8080"])
        );
        assert_eq!(normalize_args(vec![]), Vec::<OsString>::new());
    }

    #[test]
    fn headers_take_both_spellings() {
        let (name, value) = parse_header("X-Header-Set: set-value").unwrap();
        assert_eq!(name, "x-header-set");
        assert_eq!(value, "set-value");
        let (name, value) = parse_header("x-time:12:30").unwrap();
        assert_eq!(name, "x-time");
        assert_eq!(value, "12:30");
        let (_, value) = parse_header("x-empty:").unwrap();
        assert_eq!(value, "");
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        assert!(parse_header("no-colon").is_err());
        assert!(parse_header("bad name:v").is_err());
        assert!(parse_header("x:line\nbreak").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        for bad in ["", "s", "5x", "-1s", "1e400s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_the_conformance_deployment_args() {
        let cli = Cli::try_parse_from([
            "aether-echo",
            "--tcp=9090",
            "--port=8080",
            "--grpc=7070",
            "--port=8443",
            "--tls=8443",
            "--crt=/cert.crt",
            "--key=/cert.key",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.server.http, vec![8080, 8443]);
        assert_eq!(cli.server.grpc, vec![7070]);
        assert_eq!(cli.server.tcp, vec![9090]);
        assert_eq!(cli.server.tls, vec![8443]);
        assert_eq!(cli.server.crt.as_deref(), Some(Path::new("/cert.crt")));
    }

    #[test]
    fn parses_the_harness_client_args() {
        let cli = Cli::try_parse_from([
            "aether-echo",
            "client",
            "grpc://echo:7070",
            "--method=GET",
            "-H",
            "x-test-case:set",
            "-H",
            "Host: other",
            "--count=500",
        ])
        .unwrap();
        let Some(Command::Client(args)) = cli.command else {
            panic!("not client mode");
        };
        assert_eq!(args.url, "grpc://echo:7070");
        assert_eq!(args.method, Method::GET);
        assert_eq!(args.count, 500);
        assert_eq!(args.headers.len(), 2);
        assert_eq!(args.headers[1].0, http::header::HOST);
        assert_eq!(args.timeout, Duration::from_secs(5));
    }
}
