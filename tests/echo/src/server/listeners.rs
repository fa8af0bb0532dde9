//! Which ports to open with which protocol, from the Istio echo app's flags.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 and h2c on the same port.
    Http,
    /// gRPC over h2c.
    Grpc,
    /// Raw TCP echo.
    Tcp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
            Protocol::Tcp => "tcp",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub port: u16,
    pub protocol: Protocol,
    /// Served over TLS with the --crt/--key pair.
    pub tls: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port {port} is declared both as {first} and as {second}")]
pub struct PortConflict {
    pub port: u16,
    pub first: Protocol,
    pub second: Protocol,
}

/// The Istio echo app's ports when it is given none (the conformance consumer Deployment
/// passes no args at all).
const DEFAULT_HTTP: u16 = 8080;
const DEFAULT_GRPC: u16 = 7070;

/// One listener per declared port. `--tls` marks a port declared with another flag as TLS; a
/// port given only as `--tls` is HTTPS. A port declared twice with the same protocol is opened
/// once; with two protocols it is an error.
pub fn plan(
    http: &[u16],
    grpc: &[u16],
    tcp: &[u16],
    tls: &[u16],
) -> Result<Vec<Listener>, PortConflict> {
    if [http, grpc, tcp, tls].iter().all(|ports| ports.is_empty()) {
        return plan(&[DEFAULT_HTTP], &[DEFAULT_GRPC], &[], &[]);
    }
    let declared = http
        .iter()
        .map(|&p| (p, Protocol::Http))
        .chain(grpc.iter().map(|&p| (p, Protocol::Grpc)))
        .chain(tcp.iter().map(|&p| (p, Protocol::Tcp)));

    let mut listeners: Vec<Listener> = Vec::new();
    for (port, protocol) in declared {
        match listeners.iter().find(|l| l.port == port) {
            Some(existing) if existing.protocol == protocol => {}
            Some(existing) => {
                return Err(PortConflict {
                    port,
                    first: existing.protocol,
                    second: protocol,
                });
            }
            None => listeners.push(Listener {
                port,
                protocol,
                tls: tls.contains(&port),
            }),
        }
    }
    for &port in tls {
        if !listeners.iter().any(|l| l.port == port) {
            listeners.push(Listener {
                port,
                protocol: Protocol::Http,
                tls: true,
            });
        }
    }
    Ok(listeners)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(port: u16, protocol: Protocol, tls: bool) -> Listener {
        Listener {
            port,
            protocol,
            tls,
        }
    }

    #[test]
    fn conformance_deployment_ports() {
        // --tcp=9090 --port=8080 --grpc=7070 --port=8443 --tls=8443
        let listeners = plan(&[8080, 8443], &[7070], &[9090], &[8443]).unwrap();
        assert_eq!(
            listeners,
            vec![
                l(8080, Protocol::Http, false),
                l(8443, Protocol::Http, true),
                l(7070, Protocol::Grpc, false),
                l(9090, Protocol::Tcp, false),
            ]
        );
    }

    #[test]
    fn no_flags_means_istio_defaults() {
        assert_eq!(
            plan(&[], &[], &[], &[]).unwrap(),
            vec![
                l(8080, Protocol::Http, false),
                l(7070, Protocol::Grpc, false)
            ]
        );
    }

    #[test]
    fn tls_only_ports_are_https_and_tls_applies_to_any_protocol() {
        assert_eq!(
            plan(&[], &[7443], &[], &[7443, 9443]).unwrap(),
            vec![l(7443, Protocol::Grpc, true), l(9443, Protocol::Http, true)]
        );
    }

    #[test]
    fn duplicates_collapse_but_conflicts_fail() {
        assert_eq!(
            plan(&[8080, 8080], &[], &[], &[]).unwrap(),
            vec![l(8080, Protocol::Http, false)]
        );
        assert_eq!(
            plan(&[8080], &[8080], &[], &[]),
            Err(PortConflict {
                port: 8080,
                first: Protocol::Http,
                second: Protocol::Grpc
            })
        );
    }
}
