//! Client mode: send `--count` requests one after the other and print each exchange in the
//! [`aether_echo::report`] format. Redirects are never followed: a 3xx is what gets printed.
//! The first failed request (connection error, timeout, protocol error) ends the run with a
//! `[i error]` line and a non-zero exit.

mod grpc_call;
mod http_call;
mod target;
mod transport;

use std::io::Write;
use std::time::Duration;

use aether_echo::report::{Entry, Line};
use anyhow::Context;
use http::header::HOST;
use http::{HeaderMap, HeaderValue, Method};
use tokio::time::Instant;

use crate::cli::ClientArgs;
use target::{Scheme, Target};

/// One request, as every repetition sends it.
pub struct Call {
    pub target: Target,
    pub method: Method,
    /// Headers (gRPC metadata) from `-H`, without Host.
    pub headers: HeaderMap,
    /// `-H Host:...`: the Host header / :authority instead of the URL's.
    pub host: Option<HeaderValue>,
    /// h2c for http:// URLs.
    pub http2: bool,
    /// The gRPC EchoRequest message.
    pub message: String,
}

impl Call {
    fn new(args: &ClientArgs) -> anyhow::Result<Call> {
        let target = target::parse(&args.url)?;
        let mut headers = HeaderMap::new();
        let mut host = None;
        for (name, value) in &args.headers {
            if name == HOST {
                host = Some(value.clone());
            } else {
                headers.append(name.clone(), value.clone());
            }
        }
        Ok(Call {
            target,
            method: args.method.clone(),
            headers,
            host,
            http2: args.http2,
            message: args.msg.clone(),
        })
    }

    /// The authority to send: the `-H Host` override, else the URL's.
    fn authority(&self) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
        match &self.host {
            Some(host) => Ok(host.clone()),
            None => HeaderValue::from_str(&self.target.authority),
        }
    }

    async fn exchange(&self) -> anyhow::Result<Vec<Entry>> {
        match self.target.scheme {
            Scheme::Http => http_call::exchange(self).await,
            Scheme::Grpc => grpc_call::exchange(self).await,
        }
    }
}

pub async fn run(args: ClientArgs) -> anyhow::Result<()> {
    let call = Call::new(&args)?;
    // Spacing for --qps: request i starts no earlier than i/qps seconds after the first.
    let spacing = (args.qps > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(args.qps)));
    let start = Instant::now();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());

    for index in 0..args.count {
        if let Some(spacing) = spacing {
            tokio::time::sleep_until(start + spacing.mul_f64(index as f64)).await;
        }
        let print = |out: &mut dyn Write, entry: Entry| writeln!(out, "{}", Line { index, entry });
        print(&mut out, Entry::Url(args.url.clone()))?;
        let outcome = match tokio::time::timeout(args.timeout, call.exchange()).await {
            Ok(Ok(entries)) => Ok(entries),
            Ok(Err(error)) => Err(format!("{error:#}")),
            Err(_) => Err(format!("timed out after {:?}", args.timeout)),
        };
        match outcome {
            Ok(entries) => {
                for entry in entries {
                    print(&mut out, entry)?;
                }
                // The blank line between blocks is how the upstream harness splits a batch.
                writeln!(out)?;
            }
            Err(message) => {
                print(&mut out, Entry::Error(message.clone()))?;
                out.flush()?;
                anyhow::bail!("request {index} to {} failed: {message}", args.url);
            }
        }
    }
    out.flush().context("writing to stdout")
}

/// Each non-empty body line, as the Istio echo client prints them.
fn body_entries(body: &[u8]) -> Vec<Entry> {
    String::from_utf8_lossy(body)
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| Entry::Body(line.to_string()))
        .collect()
}

/// Response headers in the order hyper keeps them (values of one name together).
fn header_entries(headers: &HeaderMap) -> impl Iterator<Item = Entry> + '_ {
    headers.iter().map(|(name, value)| {
        Entry::ResponseHeader(
            name.as_str().to_string(),
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_lines_skip_blanks() {
        assert_eq!(
            body_entries(b"A=1\n\nB=2\r\n"),
            vec![Entry::Body("A=1".into()), Entry::Body("B=2".into())]
        );
        assert_eq!(body_entries(b""), vec![]);
        assert_eq!(
            body_entries(b"\xffx"),
            vec![Entry::Body("\u{fffd}x".into())]
        );
    }

    #[test]
    fn host_header_becomes_the_authority() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "aether-echo",
            "client",
            "http://echo/",
            "-H",
            "Host: example.org",
            "-H",
            "x-a:1",
        ])
        .unwrap();
        let Some(crate::cli::Command::Client(args)) = cli.command else {
            panic!("not client mode");
        };
        let call = Call::new(&args).unwrap();
        assert_eq!(call.authority().unwrap(), "example.org");
        assert_eq!(call.headers.len(), 1);
        assert!(call.headers.get(HOST).is_none());
    }
}
