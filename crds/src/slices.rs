//! What aether reads from an EndpointSlice, the same for the operator and the proxy.

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

/// The label that names the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The slice's Service, `(namespace, name)`: the slice's own namespace, as a slice can belong
/// to no Service of another.
pub fn service_of(slice: &EndpointSlice) -> Option<(&str, &str)> {
    let namespace = slice.metadata.namespace.as_deref()?;
    let labels = slice.metadata.labels.as_ref()?;
    Some((namespace, labels.get(SERVICE_NAME_LABEL)?))
}

/// The slice's TCP port numbers (a port without a protocol is TCP).
pub fn tcp_ports(slice: &EndpointSlice) -> Vec<u16> {
    slice
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| p.port.and_then(|n| u16::try_from(n).ok()))
        .collect()
}

/// Whether traffic may be sent to the endpoint: ready, or saying nothing (as the API defines).
pub fn is_ready(endpoint: &Endpoint) -> bool {
    endpoint
        .conditions
        .as_ref()
        .and_then(|c| c.ready)
        .unwrap_or(true)
}
