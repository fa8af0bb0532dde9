//! aether's echo app: a stand-in for the Istio echo app (`registry.k8s.io/gateway-api/echo-advanced`)
//! that the GAMMA conformance suite execs into. The binary serves HTTP, h2c, gRPC, TCP and TLS
//! ports and has a `client` mode; this library holds the two text formats they share, so the
//! project's Rust tests parse exactly what the binary prints:
//!
//! - [`body`]: the `Key=Value` body the server answers every request with;
//! - [`report`]: the client mode's stdout (`[i] StatusCode=200`, `[i body] Hostname=...`), and
//!   [`report::parse`] to read it back into one [`report::Exchange`] per request.

pub mod body;
pub mod report;
