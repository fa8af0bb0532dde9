//! The per-pod capture table, `inet aether`, in the pod's own network namespace:
//!
//! ```text
//! table inet aether {
//!     set capture4 { type ipv4_addr . inet_service; }     # pods with an IPv4 address
//!     set capture6 { type ipv6_addr . inet_service; }     # pods with an IPv6 address
//!     chain output {
//!         type nat hook output priority -100; policy accept;
//!         ip daddr . tcp dport @capture4 redirect to :15001
//!         ip6 daddr . tcp dport @capture6 redirect to :15001
//!     }
//! }
//! ```
//!
//! In strict mTLS mode (namespace label `aether.io/mtls=strict`) the table also refuses
//! plaintext into the pod:
//!
//! ```text
//!     set probes { type inet_service; }          # ports the pod's probes only connect to
//!     set proxied_probes { type inet_service; }  # ports its probes send requests to
//!     chain prerouting {
//!         type nat hook prerouting priority -100; policy accept;
//!         # the node's requests to probe ports go to the inbound proxy, which passes on only
//!         # the probes' requests (ip6: from fd16:9254:7127::1)
//!         ip saddr 169.254.7.127 tcp dport @proxied_probes redirect to :15008
//!     }
//!     chain input {
//!         type filter hook input priority 0; policy accept;
//!         # connect-only probes: packets without data (one rule per TCP data offset 5..15)
//!         ip saddr 169.254.7.127 tcp dport @probes ip hdrlength 5 tcp doff 5 ip length 40 accept
//!         ip saddr 169.254.7.127 tcp dport @probes reject with tcp reset  # their data
//!         ct state established,related accept     # replies to the pod's connections
//!         iifname "lo" accept                     # the inbound proxy -> the app
//!         tcp dport 15008 accept                  # mTLS from other proxies, redirected probes
//!         meta l4proto icmp accept                # ping, errors (ipv6-icmp: also ND)
//!         meta l4proto tcp reject with tcp reset  # plaintext from anyone else
//!         reject with icmpx port-unreachable      # UDP, SCTP and the rest
//!     }
//! ```
//!
//! `redirect` sends a matching connection to the capture port on the pod's loopback, where the
//! node proxy listens (it opens that socket inside the pod's netns); `SO_ORIGINAL_DST` gives the
//! proxy the ClusterIP:port the app dialled. Everything else is left to kube-proxy as before.
//!
//! [`install`] and [`delete`] are for the CNI plugin, [`replace_elements`] for the proxy when
//! route targets change, [`release`] for a pod leaving the mesh while it runs, [`verify`] for
//! both (CHECK, and the proxy's drift repair).

mod exec;
mod libnftables;
mod probes;
mod ruleset;
mod verify;

pub use exec::{Nft, NftError};
pub use probes::{NODE_TABLE, node_batch, node_delete_batch, node_drift};
pub use ruleset::{
    CHAIN, Families, Family, PROBE_CHAIN, PROBE_SOURCE_V4, PROBE_SOURCE_V6, PROBES_SET,
    PROXIED_PROBES_SET, RuleKind, STRICT_CHAIN, Strict, TABLE, TableSpec, create_batch,
    delete_batch, install_batch, replace_elements_batch,
};
pub use verify::{Drift, diff, our_objects};

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// Installs the table with `targets` in its sets, replacing any table an earlier ADD left.
/// A new pod's netns has no table, so the cheap [`create_batch`] is tried first; if it fails for
/// any reason, [`install_batch`] replaces whatever is there, and its error is the one reported.
pub fn install(
    nft: &Nft,
    netns: &Path,
    spec: &TableSpec,
    targets: &[SocketAddr],
) -> Result<(), NftError> {
    match nft.apply(netns, &create_batch(spec, targets)) {
        Ok(()) => Ok(()),
        Err(e @ NftError::NetnsGone(_)) => Err(e),
        Err(_) => nft.apply(netns, &install_batch(spec, targets)),
    }
}

/// Replaces the set elements, atomically, without touching the rules. Fails if the table or a
/// set of `families` is missing: that is drift, to be repaired with [`install`].
pub fn replace_elements(
    nft: &Nft,
    netns: &Path,
    families: Families,
    targets: &[SocketAddr],
) -> Result<(), NftError> {
    nft.apply(netns, &replace_elements_batch(families, targets))
}

/// Makes the table capture nothing new and refuse nothing, in one transaction, while it keeps
/// the connections it redirected alive: a pod leaving the mesh. Deleting the table outright
/// would take the netns's last NAT rule with it, and the kernel would stop translating the
/// connections already redirected to the capture listener (they get reset). [`delete`] it
/// once those have ended.
pub fn release(nft: &Nft, netns: &Path, spec: &TableSpec) -> Result<(), NftError> {
    let released = TableSpec {
        strict: None,
        ..spec.clone()
    };
    nft.apply(netns, &install_batch(&released, &[]))
}

/// Gives the node's own TCP connections to `pods` (this node's strict pods) the probe source
/// address, replacing the node's table (`inet aether-node`, in the node's netns `netns`).
pub fn apply_node_probes(nft: &Nft, netns: &Path, pods: &[IpAddr]) -> Result<(), NftError> {
    nft.apply(netns, &node_batch(pods))
}

/// How the node's table differs from the one [`apply_node_probes`] makes for `pods`; `None`
/// when it is that table.
pub fn verify_node_probes(
    nft: &Nft,
    netns: &Path,
    pods: &[IpAddr],
) -> Result<Option<String>, NftError> {
    Ok(node_drift(&nft.list_table(netns, NODE_TABLE)?, pods))
}

/// Removes the node's table; idempotent.
pub fn delete_node_probes(nft: &Nft, netns: &Path) -> Result<(), NftError> {
    nft.apply(netns, &node_delete_batch())
}

/// Every difference between the pod's table and `spec`; empty when it is as installed.
pub fn verify(nft: &Nft, netns: &Path, spec: &TableSpec) -> Result<Vec<Drift>, NftError> {
    Ok(diff(spec, &nft.list_ours(netns)?))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The table is gone now (or never was).
    Table,
    /// The netns is gone, and the table with it.
    Netns,
}

/// Deletes the table. Idempotent, and succeeds when the netns no longer exists.
pub fn delete(nft: &Nft, netns: &Path) -> Result<Deleted, NftError> {
    match nft.apply(netns, &delete_batch()) {
        Ok(()) => Ok(Deleted::Table),
        Err(NftError::NetnsGone(_)) => Ok(Deleted::Netns),
        Err(e) => Err(e),
    }
}
