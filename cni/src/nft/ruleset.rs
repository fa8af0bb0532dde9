//! The table, as typed nftables JSON. Pure: building batches touches no system.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use nftables::batch::Batch;
use nftables::expr::{CT, Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField};
use nftables::schema::{
    Chain, Element, FlushObject, NfCmd, NfListObject, Nftables, Rule, Set, SetType, SetTypeValue,
    Table,
};
use nftables::stmt::{Match, NAT, Operator, Reject, RejectType, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook, RejectCode};

pub const TABLE: &str = "aether";
/// The capture chain, on the pod's outgoing packets. It exempts no socket, not even the node
/// proxy's: any exemption an app could not forge would need the socket's cgroup, and a socket
/// mark is forged with CAP_NET_RAW (a default container capability; SO_MARK needs no more
/// since Linux 5.17). Instead the proxy never connects, from a pod, to a captured address.
pub const CHAIN: &str = "output";
/// The chain of strict mTLS mode, on the pod's incoming packets.
pub const STRICT_CHAIN: &str = "input";
/// Strict mode's chain that sends the node's probes of [`PROXIED_PROBES_SET`] to the node
/// proxy, before routing.
pub const PROBE_CHAIN: &str = "prerouting";
/// The set of the ports a strict pod's probes only connect to (`tcpSocket`): the node may open
/// connections there, and send no data on them.
pub const PROBES_SET: &str = "probes";
/// The set of the ports a strict pod's probes send requests to (`httpGet`, `grpc`): the node's
/// connections to them go to the node proxy's inbound listener, which passes on the probes'
/// requests only, without any caller identity. Other host processes get the probe source too
/// ([`super::probes`]), so plaintext straight to the app would let them claim any identity.
pub const PROXIED_PROBES_SET: &str = "proxied_probes";
/// The source address the node gives its own connections to strict pods
/// ([`super::probes`]), i.e. the kubelet's probes: link-local, so no other host can have it.
pub const PROBE_SOURCE_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
/// The same for IPv6: a unique local address no cluster assigns.
pub const PROBE_SOURCE_V6: Ipv6Addr = Ipv6Addr::new(0xfd16, 0x9254, 0x7127, 0, 0, 0, 0, 1);
/// NF_IP_PRI_NAT_DST, where `nft` puts `type nat hook output` chains by default.
const DSTNAT_PRIORITY: i32 = -100;
/// The TCP header's data offsets (in 32-bit words): 5 without options, 15 at most.
const TCP_DATA_OFFSETS: std::ops::RangeInclusive<u8> = 5..=15;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn set_name(self) -> &'static str {
        match self {
            Family::V4 => "capture4",
            Family::V6 => "capture6",
        }
    }

    /// The source of the node's probes ([`PROBE_SOURCE_V4`], [`PROBE_SOURCE_V6`]).
    pub fn probe_source(self) -> IpAddr {
        match self {
            Family::V4 => PROBE_SOURCE_V4.into(),
            Family::V6 => PROBE_SOURCE_V6.into(),
        }
    }

    pub(super) fn addr_type(self) -> SetType {
        match self {
            Family::V4 => SetType::Ipv4Addr,
            Family::V6 => SetType::Ipv6Addr,
        }
    }

    /// The length field of a TCP packet of data offset `doff` carrying no data, in this
    /// family's header: IPv4's counts its (option-less) 20-byte header, IPv6's does not.
    fn empty_tcp_length(self, doff: u8) -> u16 {
        let tcp = 4 * u16::from(doff);
        match self {
            Family::V4 => 20 + tcp,
            Family::V6 => tcp,
        }
    }

    /// This family's ICMP, as `meta l4proto` names it.
    fn icmp(self) -> &'static str {
        match self {
            Family::V4 => "icmp",
            Family::V6 => "ipv6-icmp",
        }
    }

    /// The payload protocol whose `daddr` this family's rule matches.
    pub(super) fn protocol(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
}

/// The IP families a pod has, hence the sets and rules its table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Families {
    /// From the pod's addresses. With none known (a primary plugin that reports no IPs), both:
    /// a set the pod cannot use costs nothing, a missing one would leave it uncaptured.
    pub fn for_pod(ips: &[IpAddr]) -> Families {
        let ipv4 = ips.iter().any(IpAddr::is_ipv4);
        let ipv6 = ips.iter().any(IpAddr::is_ipv6);
        if ipv4 || ipv6 {
            Families { ipv4, ipv6 }
        } else {
            Families {
                ipv4: true,
                ipv6: true,
            }
        }
    }

    pub fn iter(self) -> impl Iterator<Item = Family> {
        [(self.ipv4, Family::V4), (self.ipv6, Family::V6)]
            .into_iter()
            .filter_map(|(on, family)| on.then_some(family))
    }
}

/// Everything that fixes the table's shape. The set elements are not part of it: they change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    pub capture_port: u16,
    pub families: Families,
    /// Strict mTLS mode: new TCP connections from other hosts reach only the inbound port.
    pub strict: Option<Strict>,
}

/// What strict mode lets in besides the mesh: loopback (the inbound proxy hands requests to
/// the app there), replies to the pod's own connections, and the node's probes: TCP from the
/// probe source address, to the ports the pod's probes name, data-less where the probes only
/// connect, through the node proxy where they send requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strict {
    /// The node proxy's inbound mTLS port in the pod.
    pub inbound_port: u16,
    /// The ports the pod's probes only connect to, the elements of `probes`. Not part of the
    /// shape: like the capture set's, they are not compared by CHECK.
    pub probe_ports: Vec<u16>,
    /// The ports the pod's probes send requests to, the elements of `proxied_probes` (not
    /// compared either).
    pub proxied_probe_ports: Vec<u16>,
}

/// The rules of the table's chains, in order: the output chain's, then strict mode's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// `ip daddr . tcp dport @capture4 redirect to :PORT` (and `ip6 … @capture6`). The `tcp
    /// dport` match implies `meta l4proto tcp`, which is how `nft` lists it back.
    Capture(Family),
    /// Strict mode, before routing: `ip saddr 169.254.7.127 tcp dport @proxied_probes redirect
    /// to :INBOUND` (and `ip6 …`): the node's probes that send requests go to the node proxy.
    ProbeRedirect(Family),
    /// Strict mode: `ip saddr 169.254.7.127 tcp dport @probes ip hdrlength 5 tcp doff D ip
    /// length L accept` (and `ip6 … ip6 length L`) for every data offset D, L being the length
    /// of a packet without data: the handshake, acknowledgements and the close of a
    /// connect-only probe. Before `StrictReplies`, which would admit data once established.
    ProbeHandshake(Family, u8),
    /// Strict mode: `ip saddr 169.254.7.127 tcp dport @probes reject with tcp reset`: data
    /// sent to a port whose probes only connect.
    ProbeData(Family),
    /// Strict mode: `ct state established,related accept`.
    StrictReplies,
    /// Strict mode: `iifname "lo" accept`.
    StrictLoopback,
    /// Strict mode: `tcp dport PORT accept`, the inbound mTLS port (and the node's probes
    /// redirected to it).
    StrictInbound(u16),
    /// Strict mode: `meta l4proto icmp accept` (and `ipv6-icmp`): pings and errors carry no
    /// data, and IPv6 needs neighbour discovery.
    StrictIcmp(Family),
    /// Strict mode: `meta l4proto tcp reject with tcp reset`: plaintext is refused.
    StrictRefuse,
    /// Strict mode: `reject with icmpx port-unreachable`: UDP, SCTP and the rest, which the
    /// mesh never carries.
    StrictRefuseOther,
}

impl RuleKind {
    /// The output chain's rules.
    pub fn all(spec: &TableSpec) -> Vec<RuleKind> {
        spec.families.iter().map(RuleKind::Capture).collect()
    }

    /// Strict mode's prerouting chain's rules; none without strict mode.
    pub fn probe_redirects(spec: &TableSpec) -> Vec<RuleKind> {
        match spec.strict {
            Some(_) => spec.families.iter().map(RuleKind::ProbeRedirect).collect(),
            None => Vec::new(),
        }
    }

    /// Strict mode's input chain's rules; none without strict mode.
    pub fn strict(spec: &TableSpec) -> Vec<RuleKind> {
        let Some(strict) = &spec.strict else {
            return Vec::new();
        };
        let families = spec.families;
        families
            .iter()
            .flat_map(|f| TCP_DATA_OFFSETS.map(move |doff| RuleKind::ProbeHandshake(f, doff)))
            .chain(families.iter().map(RuleKind::ProbeData))
            .chain([
                RuleKind::StrictReplies,
                RuleKind::StrictLoopback,
                RuleKind::StrictInbound(strict.inbound_port),
            ])
            .chain(families.iter().map(RuleKind::StrictIcmp))
            .chain([RuleKind::StrictRefuse, RuleKind::StrictRefuseOther])
            .collect()
    }

    pub fn chain(self) -> &'static str {
        match self {
            RuleKind::Capture(_) => CHAIN,
            RuleKind::ProbeRedirect(_) => PROBE_CHAIN,
            _ => STRICT_CHAIN,
        }
    }

    pub fn statements(self, spec: &TableSpec) -> Vec<Statement<'static>> {
        match self {
            RuleKind::Capture(family) => vec![
                Statement::Match(Match {
                    left: Expression::Named(NamedExpression::Concat(vec![
                        payload(family.protocol(), "daddr"),
                        payload("tcp", "dport"),
                    ])),
                    right: Expression::String(format!("@{}", family.set_name()).into()),
                    op: Operator::EQ,
                }),
                Statement::Redirect(Some(NAT {
                    addr: None,
                    family: None,
                    port: Some(Expression::Number(spec.capture_port.into())),
                    flags: None,
                })),
            ],
            RuleKind::StrictReplies => accept(Match {
                left: Expression::Named(NamedExpression::CT(CT {
                    key: "state".into(),
                    family: None,
                    dir: None,
                })),
                right: Expression::List(vec![
                    Expression::String("established".into()),
                    Expression::String("related".into()),
                ]),
                op: Operator::IN,
            }),
            RuleKind::StrictLoopback => accept(Match {
                left: Expression::Named(NamedExpression::Meta(Meta {
                    key: MetaKey::Iifname,
                })),
                right: Expression::String("lo".into()),
                op: Operator::EQ,
            }),
            RuleKind::StrictInbound(port) => accept(Match {
                left: payload("tcp", "dport"),
                right: Expression::Number(port.into()),
                op: Operator::EQ,
            }),
            RuleKind::ProbeRedirect(family) => {
                let mut statements = from_probe_source(family, PROXIED_PROBES_SET);
                statements.push(Statement::Redirect(Some(NAT {
                    addr: None,
                    family: None,
                    port: spec
                        .strict
                        .as_ref()
                        .map(|s| Expression::Number(s.inbound_port.into())),
                    flags: None,
                })));
                statements
            }
            RuleKind::ProbeHandshake(family, doff) => {
                let mut statements = from_probe_source(family, PROBES_SET);
                if family == Family::V4 {
                    statements.push(Statement::Match(equals(payload("ip", "hdrlength"), 5)));
                }
                statements.push(Statement::Match(equals(
                    payload("tcp", "doff"),
                    doff.into(),
                )));
                statements.push(Statement::Match(equals(
                    payload(family.protocol(), "length"),
                    family.empty_tcp_length(doff).into(),
                )));
                statements.push(Statement::Accept(None));
                statements
            }
            RuleKind::ProbeData(family) => {
                let mut statements = from_probe_source(family, PROBES_SET);
                statements.push(tcp_reset());
                statements
            }
            RuleKind::StrictIcmp(family) => accept(l4proto(family.icmp())),
            RuleKind::StrictRefuse => vec![Statement::Match(l4proto("tcp")), tcp_reset()],
            // `reject` as `nft` lists it back.
            RuleKind::StrictRefuseOther => vec![Statement::Reject(Some(Reject {
                _type: Some(RejectType::ICMPX),
                expr: Some(RejectCode::PortUnreach),
            }))],
        }
    }

    /// The rule in `nft` syntax, for messages.
    pub fn describe(self, spec: &TableSpec) -> String {
        match self {
            RuleKind::Capture(family) => format!(
                "{} daddr . tcp dport @{} redirect to :{}",
                family.protocol(),
                family.set_name(),
                spec.capture_port
            ),
            RuleKind::StrictReplies => "ct state established,related accept".into(),
            RuleKind::StrictLoopback => "iifname \"lo\" accept".into(),
            RuleKind::StrictInbound(port) => format!("tcp dport {port} accept"),
            RuleKind::ProbeRedirect(family) => format!(
                "{} saddr {} tcp dport @{PROXIED_PROBES_SET} redirect to :{}",
                family.protocol(),
                family.probe_source(),
                spec.strict.as_ref().map_or(0, |s| s.inbound_port)
            ),
            RuleKind::ProbeHandshake(family, doff) => format!(
                "{} saddr {} tcp dport @{PROBES_SET} {}tcp doff {doff} {} length {} accept",
                family.protocol(),
                family.probe_source(),
                if family == Family::V4 {
                    "ip hdrlength 5 "
                } else {
                    ""
                },
                family.protocol(),
                family.empty_tcp_length(doff)
            ),
            RuleKind::ProbeData(family) => format!(
                "{} saddr {} tcp dport @{PROBES_SET} reject with tcp reset",
                family.protocol(),
                family.probe_source()
            ),
            RuleKind::StrictIcmp(family) => format!("meta l4proto {} accept", family.icmp()),
            RuleKind::StrictRefuse => "meta l4proto tcp reject with tcp reset".into(),
            RuleKind::StrictRefuseOther => "reject with icmpx port-unreachable".into(),
        }
    }
}

/// `ip saddr 169.254.7.127 tcp dport @SET` (or `ip6 …`): the node's probes of the set's ports.
fn from_probe_source(family: Family, set: &str) -> Vec<Statement<'static>> {
    vec![
        Statement::Match(Match {
            left: payload(family.protocol(), "saddr"),
            right: Expression::String(family.probe_source().to_string().into()),
            op: Operator::EQ,
        }),
        Statement::Match(Match {
            left: payload("tcp", "dport"),
            right: Expression::String(format!("@{set}").into()),
            op: Operator::EQ,
        }),
    ]
}

/// `LEFT == VALUE`.
fn equals(left: Expression<'static>, value: u32) -> Match<'static> {
    Match {
        left,
        right: Expression::Number(value),
        op: Operator::EQ,
    }
}

/// `reject with tcp reset`.
fn tcp_reset() -> Statement<'static> {
    Statement::Reject(Some(Reject {
        _type: Some(RejectType::TCPReset),
        expr: None,
    }))
}

/// `meta l4proto PROTOCOL`.
pub(super) fn l4proto(protocol: &'static str) -> Match<'static> {
    Match {
        left: Expression::Named(NamedExpression::Meta(Meta {
            key: MetaKey::L4proto,
        })),
        right: Expression::String(protocol.into()),
        op: Operator::EQ,
    }
}

/// A match, then `accept`.
fn accept(condition: Match<'static>) -> Vec<Statement<'static>> {
    vec![Statement::Match(condition), Statement::Accept(None)]
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

pub(super) fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

pub(super) fn table() -> Table<'static> {
    Table {
        family: NfFamily::INet,
        name: TABLE.into(),
        handle: None,
    }
}

/// `set captureN { type ipvN_addr . inet_service; }`
pub(super) fn set(family: Family) -> Set<'static> {
    Set {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: family.set_name().into(),
        set_type: SetTypeValue::Concatenated(Cow::Owned(vec![
            family.addr_type(),
            SetType::InetService,
        ])),
        handle: None,
        policy: None,
        flags: None,
        elem: None,
        timeout: None,
        gc_interval: None,
        size: None,
        comment: None,
    }
}

/// `set NAME { type inet_service; }`: one of strict mode's sets of probe ports
/// ([`PROBES_SET`], [`PROXIED_PROBES_SET`]).
pub(super) fn probes_set(name: &'static str) -> Set<'static> {
    Set {
        name: name.into(),
        set_type: SetTypeValue::Single(SetType::InetService),
        ..set(Family::V4)
    }
}

/// `chain prerouting { type nat hook prerouting priority -100; policy accept; }`: strict
/// mode's redirect of the node's probes, before the input chain sees them.
pub(super) fn probe_chain() -> Chain<'static> {
    Chain {
        name: PROBE_CHAIN.into(),
        hook: Some(NfHook::Prerouting),
        ..chain()
    }
}

/// `chain input { type filter hook input priority 0; policy accept; }`: strict mode's
/// checks of the packets coming into the pod.
pub(super) fn strict_chain() -> Chain<'static> {
    Chain {
        name: STRICT_CHAIN.into(),
        _type: Some(NfChainType::Filter),
        hook: Some(NfHook::Input),
        prio: Some(0),
        ..chain()
    }
}

/// `chain output { type nat hook output priority -100; policy accept; }`: only locally
/// generated packets, i.e. the pod's own outgoing connections, pass this hook.
pub(super) fn chain() -> Chain<'static> {
    Chain {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: CHAIN.into(),
        _type: Some(NfChainType::NAT),
        hook: Some(NfHook::Output),
        prio: Some(DSTNAT_PRIORITY),
        policy: Some(NfChainPolicy::Accept),
        newname: None,
        handle: None,
        dev: None,
    }
}

fn rule(spec: &TableSpec, kind: RuleKind) -> Rule<'static> {
    Rule {
        family: NfFamily::INet,
        table: TABLE.into(),
        chain: kind.chain().into(),
        expr: Cow::Owned(kind.statements(spec)),
        handle: None,
        index: None,
        comment: None,
    }
}

/// `add element inet aether captureN { ADDR . PORT, … }`, or `None` when there are none:
/// an empty element list is a syntax error to `nft`.
fn elements(family: Family, targets: &[SocketAddr]) -> Option<Element<'static>> {
    let unique: BTreeSet<SocketAddr> = targets
        .iter()
        .filter(|t| Family::of(t.ip()) == family)
        .copied()
        .collect();
    if unique.is_empty() {
        return None;
    }
    let elem = unique
        .into_iter()
        .map(|t| {
            Expression::Named(NamedExpression::Concat(vec![
                Expression::String(t.ip().to_string().into()),
                Expression::Number(t.port().into()),
            ]))
        })
        .collect::<Vec<_>>();
    Some(Element {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: family.set_name().into(),
        elem: Cow::Owned(elem),
    })
}

/// The whole table in one transaction, failing if the table exists: what a new pod gets.
/// Cheaper than [`install_batch`], whose `delete table` makes the kernel wait for an RCU grace
/// period (about 10 ms here).
pub fn create_batch(spec: &TableSpec, targets: &[SocketAddr]) -> Nftables<'static> {
    let mut batch = Batch::new();
    batch.add_cmd(NfCmd::Create(NfListObject::Table(table())));
    add_contents(&mut batch, spec, targets);
    batch.to_nftables()
}

/// The whole table in one transaction. `add table` then `delete table` first makes it
/// idempotent: a table left by an earlier ADD (or changed by hand) is replaced, atomically.
pub fn install_batch(spec: &TableSpec, targets: &[SocketAddr]) -> Nftables<'static> {
    let mut batch = Batch::new();
    batch.add(NfListObject::Table(table()));
    batch.delete(NfListObject::Table(table()));
    batch.add(NfListObject::Table(table()));
    add_contents(&mut batch, spec, targets);
    batch.to_nftables()
}

/// Sets, chains, rules and elements. Targets of a family the pod does not have are left out:
/// it cannot reach them.
fn add_contents(batch: &mut Batch<'static>, spec: &TableSpec, targets: &[SocketAddr]) {
    for family in spec.families.iter() {
        batch.add(NfListObject::Set(Box::new(set(family))));
    }
    if spec.strict.is_some() {
        batch.add(NfListObject::Set(Box::new(probes_set(PROBES_SET))));
        batch.add(NfListObject::Set(Box::new(probes_set(PROXIED_PROBES_SET))));
    }
    batch.add(NfListObject::Chain(chain()));
    if spec.strict.is_some() {
        batch.add(NfListObject::Chain(probe_chain()));
        batch.add(NfListObject::Chain(strict_chain()));
    }
    for kind in RuleKind::all(spec)
        .into_iter()
        .chain(RuleKind::probe_redirects(spec))
        .chain(RuleKind::strict(spec))
    {
        batch.add(NfListObject::Rule(rule(spec, kind)));
    }
    for family in spec.families.iter() {
        if let Some(elements) = elements(family, targets) {
            batch.add(NfListObject::Element(elements));
        }
    }
    if let Some(strict) = &spec.strict {
        for (set, ports) in [
            (PROBES_SET, &strict.probe_ports),
            (PROXIED_PROBES_SET, &strict.proxied_probe_ports),
        ] {
            if let Some(elements) = probe_elements(set, ports) {
                batch.add(NfListObject::Element(elements));
            }
        }
    }
}

/// `add element inet aether SET { PORT, … }`, or `None` when there are none.
fn probe_elements(set: &'static str, ports: &[u16]) -> Option<Element<'static>> {
    let unique: BTreeSet<u16> = ports.iter().copied().collect();
    (!unique.is_empty()).then(|| Element {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: set.into(),
        elem: Cow::Owned(
            unique
                .into_iter()
                .map(|port| Expression::Number(port.into()))
                .collect(),
        ),
    })
}

/// `flush set inet aether captureN` + `add element …` per family, in one transaction: a new
/// connection sees either the old set or the new one. Rules are not touched.
pub fn replace_elements_batch(families: Families, targets: &[SocketAddr]) -> Nftables<'static> {
    let mut batch = Batch::new();
    for family in families.iter() {
        batch.add_cmd(NfCmd::Flush(FlushObject::Set(Box::new(set(family)))));
        if let Some(elements) = elements(family, targets) {
            batch.add(NfListObject::Element(elements));
        }
    }
    batch.to_nftables()
}

/// `add table inet aether; delete table inet aether`: deletes whether or not it exists
/// (nft 1.0.6 has no `destroy`).
pub fn delete_batch() -> Nftables<'static> {
    let mut batch = Batch::new();
    batch.add(NfListObject::Table(table()));
    batch.delete(NfListObject::Table(table()));
    batch.to_nftables()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const DUAL: TableSpec = TableSpec {
        capture_port: 15001,
        families: Families {
            ipv4: true,
            ipv6: true,
        },
        strict: None,
    };

    fn json(n: &Nftables) -> Value {
        serde_json::to_value(n).unwrap()
    }

    fn targets() -> Vec<SocketAddr> {
        [
            "10.96.0.10:80",
            "10.96.0.10:80",
            "[fd00::a]:443",
            "10.96.0.11:8080",
        ]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect()
    }

    #[test]
    fn families_follow_the_pod_ips() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            Families::for_pod(&[v4]).iter().collect::<Vec<_>>(),
            [Family::V4]
        );
        assert_eq!(
            Families::for_pod(&[v6]).iter().collect::<Vec<_>>(),
            [Family::V6]
        );
        assert_eq!(Families::for_pod(&[v6, v4]).iter().count(), 2);
        assert_eq!(Families::for_pod(&[]).iter().count(), 2);
    }

    #[test]
    fn install_batch_is_the_whole_table_in_one_transaction() {
        let batch = json(&install_batch(&DUAL, &targets()));
        let cmds = batch["nftables"].as_array().unwrap();
        let verbs: Vec<String> = cmds
            .iter()
            .map(|c| {
                let (verb, obj) = c.as_object().unwrap().iter().next().unwrap();
                format!("{verb} {}", obj.as_object().unwrap().keys().next().unwrap())
            })
            .collect();
        assert_eq!(
            verbs,
            [
                "add table",
                "delete table",
                "add table",
                "add set",
                "add set",
                "add chain",
                "add rule",
                "add rule",
                "add element",
                "add element"
            ]
        );
        assert_eq!(
            cmds[5],
            json!({"add": {"chain": {"family": "inet", "table": "aether", "name": "output",
                "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}}})
        );
        assert_eq!(
            cmds[3]["add"]["set"]["type"],
            json!(["ipv4_addr", "inet_service"])
        );
    }

    #[test]
    fn create_batch_is_the_same_table_but_fails_if_it_exists() {
        let create = json(&create_batch(&DUAL, &targets()));
        let install = json(&install_batch(&DUAL, &targets()));
        let create = create["nftables"].as_array().unwrap();
        let install = install["nftables"].as_array().unwrap();
        assert_eq!(
            create[0],
            json!({"create": {"table": {"family": "inet", "name": "aether"}}})
        );
        assert_eq!(create[1..], install[3..]);
    }

    #[test]
    fn rules_are_the_documented_ones() {
        let batch = json(&install_batch(&DUAL, &[]));
        let rules: Vec<&Value> = batch["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["add"].get("rule"))
            .collect();
        assert_eq!(
            rules[1]["expr"],
            json!([
                {"match": {"op": "==", "left": {"concat": [
                    {"payload": {"protocol": "ip6", "field": "daddr"}},
                    {"payload": {"protocol": "tcp", "field": "dport"}}]}, "right": "@capture6"}},
                {"redirect": {"port": 15001}}
            ])
        );
        assert_eq!(
            RuleKind::all(&DUAL)
                .iter()
                .map(|k| k.describe(&DUAL))
                .collect::<Vec<_>>(),
            [
                "ip daddr . tcp dport @capture4 redirect to :15001",
                "ip6 daddr . tcp dport @capture6 redirect to :15001",
            ]
        );
    }

    #[test]
    fn elements_are_split_by_family_and_deduplicated() {
        let batch = json(&install_batch(&DUAL, &targets()));
        let elements: Vec<&Value> = batch["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["add"].get("element"))
            .collect();
        assert_eq!(elements[0]["name"], "capture4");
        assert_eq!(
            elements[0]["elem"],
            json!([{"concat": ["10.96.0.10", 80]}, {"concat": ["10.96.0.11", 8080]}])
        );
        assert_eq!(elements[1]["name"], "capture6");
        assert_eq!(elements[1]["elem"], json!([{"concat": ["fd00::a", 443]}]));
    }

    #[test]
    fn an_ipv4_pod_gets_no_ipv6_set_rule_or_elements() {
        let spec = TableSpec {
            families: Families {
                ipv4: true,
                ipv6: false,
            },
            ..DUAL
        };
        let text = json(&install_batch(&spec, &targets())).to_string();
        assert!(
            !text.contains("capture6") && !text.contains("fd00::a"),
            "{text}"
        );
    }

    #[test]
    fn replacing_elements_flushes_then_adds_and_leaves_rules_alone() {
        let batch = json(&replace_elements_batch(DUAL.families, &targets()));
        let text = batch.to_string();
        assert!(
            !text.contains("\"rule\"") && !text.contains("\"chain\""),
            "{text}"
        );
        let cmds = batch["nftables"].as_array().unwrap();
        assert_eq!(cmds[0]["flush"]["set"]["name"], "capture4");
        assert_eq!(cmds[1]["add"]["element"]["name"], "capture4");
        assert_eq!(cmds[2]["flush"]["set"]["name"], "capture6");
        // An empty capture set only flushes.
        let batch = json(&replace_elements_batch(DUAL.families, &[]));
        assert_eq!(batch["nftables"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn delete_batch_tolerates_a_missing_table() {
        assert_eq!(
            json(&delete_batch()),
            json!({"nftables": [
                {"add": {"table": {"family": "inet", "name": "aether"}}},
                {"delete": {"table": {"family": "inet", "name": "aether"}}}
            ]})
        );
    }
}
