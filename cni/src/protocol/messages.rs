use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A Kubernetes pod, as the kubelet names it in `CNI_ARGS`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the plugin asks the node proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Request {
    /// Is the proxy there and speaking our version? (STATUS)
    Ping,
    /// Is this pod meshed, and if so what should its capture table hold? (ADD, before installing)
    Add {
        pod: PodRef,
        container_id: String,
        netns: PathBuf,
        ips: Vec<IpAddr>,
    },
    /// The table is installed: open the pod's listeners and keep its set up to date from now on.
    /// `generation` is the capture set the table was filled with, so the proxy knows whether it
    /// changed in between.
    Register {
        pod: PodRef,
        container_id: String,
        ifname: String,
        netns: PathBuf,
        ips: Vec<IpAddr>,
        generation: u64,
    },
    /// The pod's attachment is gone (DEL). Unknown attachments are not an error.
    Unregister {
        container_id: String,
        ifname: String,
    },
    /// Is this pod meshed and registered? (CHECK)
    Check { pod: PodRef, container_id: String },
    /// Forget every registration whose container id is not in the list (GC).
    Gc { valid_container_ids: Vec<String> },
}

/// What the proxy answers, one per request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Response {
    Pong,
    Decision(Decision),
    Registered,
    Unregistered { known: bool },
    Checked(CheckStatus),
    Collected { removed: Vec<String> },
    Error(ErrorReply),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Decision {
    /// Leave the pod alone. `reason` is for logs, e.g. "namespace shop is not aether.io/managed".
    Unmeshed {
        reason: String,
    },
    Meshed(CapturePlan),
}

/// What a meshed pod's capture table holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapturePlan {
    /// The proxy's outbound listener port inside the pod's netns; matching TCP is redirected here.
    pub capture_port: u16,
    /// Every address the pod captures (ClusterIP:ports, headless Services' pods), IPv4 and IPv6.
    pub targets: Vec<SocketAddr>,
    /// Changes whenever `targets` does.
    pub generation: u64,
    /// Strict mTLS mode (the pod's namespace is labelled `aether.io/mtls=strict`): plaintext
    /// TCP from other hosts is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<StrictPlan>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StrictPlan {
    /// The proxy's inbound mTLS port: the only one other hosts may open connections to.
    pub inbound_port: u16,
    /// The ports the pod's probes only connect to: the node's probes (from the probe source
    /// address, see `nft::probes`) may open connections to them and send no data.
    pub probe_ports: Vec<u16>,
    /// The ports the pod's probes send requests to: the node's connections to them go to the
    /// inbound port, whose proxy passes on the probes' requests.
    #[serde(default)]
    pub proxied_probe_ports: Vec<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum CheckStatus {
    Unmeshed {
        reason: String,
    },
    Meshed {
        registered: bool,
        capture_port: u16,
        /// The inbound port, when the pod's table is in strict mode.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict_inbound_port: Option<u16>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorKind {
    /// The frame could not be decoded.
    BadRequest,
    /// The frame's protocol version is not the proxy's.
    UnsupportedVersion,
    /// The proxy is starting and cannot answer yet (e.g. its caches are not synced): retry.
    NotReady,
    Internal,
}
