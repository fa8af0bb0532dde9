//! How the kubelet probes a pod, read from its spec: what strict mode lets the node send in
//! plaintext. A port probed by connecting admits a data-less connection; a port probed with
//! requests is reached through the inbound proxy, which passes on the probes' requests only.
//! Pure.

use k8s_openapi::api::core::v1::{Container, PodSpec, Probe as ProbeSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The path of the gRPC health service's `Check`, which the kubelet's `grpc` probes call.
const GRPC_HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// One probe of a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Probe {
    /// `tcpSocket`: a connection that sends nothing.
    Connect,
    /// `httpGet` over plain HTTP: a `GET` of this path.
    Http { path: String },
    /// `httpGet` with `scheme: HTTPS`: TLS between the kubelet and the app, which the proxy
    /// cannot read, only carry.
    Https,
    /// `grpc`: the health service's `Check`, over h2c.
    Grpc,
}

impl Probe {
    /// Whether a plaintext request is one this probe sends. Only the path is compared (not the
    /// query): the kubelet re-encodes what the spec says, the path's bytes survive that.
    pub fn sends(&self, method: &http::Method, path: &str) -> bool {
        match self {
            Probe::Http { path: probed } => *method == http::Method::GET && path == probed,
            Probe::Grpc => *method == http::Method::POST && path == GRPC_HEALTH_CHECK,
            Probe::Connect | Probe::Https => false,
        }
    }
}

/// Every probe of a pod's containers, by port, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probes(Vec<(u16, Probe)>);

impl Probes {
    /// The liveness, readiness and startup probes of every container (init containers too:
    /// sidecars are probed), named ports resolved against their container's ports. A probe
    /// whose port resolves to nothing is left out: the kubelet cannot send it either.
    pub fn of(spec: &PodSpec) -> Probes {
        let containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        let mut probes: Vec<(u16, Probe)> = containers
            .flat_map(|c| {
                [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
                    .into_iter()
                    .flatten()
                    .filter_map(move |probe| probe_of(c, probe))
            })
            .collect();
        probes.sort();
        probes.dedup();
        Probes(probes)
    }

    /// The probes of `port`.
    pub fn on(&self, port: u16) -> impl Iterator<Item = &Probe> {
        self.0
            .iter()
            .filter(move |(p, _)| *p == port)
            .map(|(_, probe)| probe)
    }

    /// The ports whose every probe only connects: the table admits the node's data-less
    /// connections there.
    pub fn connect_only(&self) -> Vec<u16> {
        self.ports(|port| self.on(port).all(|probe| *probe == Probe::Connect))
    }

    /// The ports some probe sends data to: the table sends the node's connections there to
    /// the inbound proxy. A connect probe of such a port is then answered by the proxy.
    pub fn proxied(&self) -> Vec<u16> {
        self.ports(|port| self.on(port).any(|probe| *probe != Probe::Connect))
    }

    fn ports(&self, keep: impl Fn(u16) -> bool) -> Vec<u16> {
        let mut ports: Vec<u16> = self.0.iter().map(|(port, _)| *port).collect();
        ports.dedup();
        ports.retain(|port| keep(*port));
        ports
    }
}

fn probe_of(container: &Container, probe: &ProbeSpec) -> Option<(u16, Probe)> {
    let named = |port: &IntOrString| match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    };
    if let Some(http) = &probe.http_get {
        let kind = if http.scheme.as_deref() == Some("HTTPS") {
            Probe::Https
        } else {
            Probe::Http {
                path: request_path(http.path.as_deref().unwrap_or_default()),
            }
        };
        return Some((named(&http.port)?, kind));
    }
    if let Some(tcp) = &probe.tcp_socket {
        return Some((named(&tcp.port)?, Probe::Connect));
    }
    let grpc = probe.grpc.as_ref()?;
    Some((u16::try_from(grpc.port).ok()?, Probe::Grpc))
}

/// The path the kubelet requests for a probe's `path`: without its query, with a leading `/`
/// (an empty path is `/`).
fn request_path(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn every_probe_kind_is_read_with_named_ports_resolved() {
        let spec = spec(serde_json::json!({
            "containers": [{
                "name": "app",
                "ports": [{"name": "http", "containerPort": 8080}],
                "livenessProbe": {"httpGet": {"port": "http", "path": "healthz?full=1"}},
                "readinessProbe": {"tcpSocket": {"port": 8080}},
                "startupProbe": {"grpc": {"port": 9090}},
            }, {
                "name": "sidecar",
                "readinessProbe": {"exec": {"command": ["true"]}},
                "livenessProbe": {"httpGet": {"port": "missing"}},
                "startupProbe": {"httpGet": {"port": 8443, "scheme": "HTTPS"}},
            }],
            "initContainers": [{"name": "init", "startupProbe": {"tcpSocket": {"port": 7000}}}],
        }));
        let probes = Probes::of(&spec);
        assert_eq!(
            probes.on(8080).collect::<Vec<_>>(),
            [
                &Probe::Connect,
                &Probe::Http {
                    path: "/healthz".into()
                }
            ]
        );
        assert_eq!(probes.on(9090).collect::<Vec<_>>(), [&Probe::Grpc]);
        assert_eq!(probes.on(8443).collect::<Vec<_>>(), [&Probe::Https]);
        assert_eq!(probes.connect_only(), [7000]);
        assert_eq!(probes.proxied(), [8080, 8443, 9090]);
        assert_eq!(Probes::of(&PodSpec::default()), Probes::default());
    }

    #[test]
    fn a_probe_sends_only_its_own_request() {
        let get = http::Method::GET;
        let health = Probe::Http { path: "/".into() };
        assert!(health.sends(&get, "/"));
        assert!(!health.sends(&get, "/admin"));
        assert!(!health.sends(&http::Method::POST, "/"));
        assert!(Probe::Grpc.sends(&http::Method::POST, GRPC_HEALTH_CHECK));
        assert!(!Probe::Grpc.sends(&http::Method::POST, "/other.Service/Call"));
        assert!(!Probe::Connect.sends(&get, "/"));
        assert!(!Probe::Https.sends(&get, "/"));
        assert_eq!(request_path(""), "/");
        assert_eq!(request_path("/ready#x"), "/ready");
    }
}
