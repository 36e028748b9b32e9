//! `sl_stats`: per-CPU counters, one array slot per `Stat`. Every drop and
//! every unusual decision in the datapath has its own counter.

/// Index into `sl_stats`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stat {
    /// A new flow was assigned a backend and DNATed.
    NewFlow = 0,
    /// A packet of a tracked flow was DNATed to its recorded backend.
    Established = 1,
    /// A reply was reverse-NATed to the frontend address.
    ReplyNat = 2,
    /// A SYN hit a closing, non-active or stale entry and got a fresh pick.
    Reselected = 3,
    /// A TCP packet of a flow whose backend or service is gone got a RST.
    StaleReset = 4,
    /// A frontend had no selectable backend: ICMP port unreachable sent.
    NoBackend = 5,
    /// A TCP/UDP fragment (IPv4, or IPv6 with a fragment header) passed
    /// untouched: its ports are unknown, so it cannot be balanced.
    Fragment = 6,
    /// Recording a flow in conntrack failed; the packet was still NATed.
    CtInsertFailed = 7,
    /// A master entry covered a missing slot or backend (must stay 0).
    Dangling = 8,
    /// A checksum or store helper failed; the packet was dropped.
    NatFailed = 9,
    /// Building a RST or ICMP reply failed; the packet was dropped.
    RejectFailed = 10,
    /// A header was truncated; the packet passed untouched.
    Truncated = 11,
    /// A frontend marked drop-when-empty had no selectable backend: the
    /// new flow was dropped (kube-proxy's DROP for traffic policy Local).
    NoBackendDrop = 12,
    /// A new flow that needed SNAT got no route or no free port: dropped.
    SnatFailed = 13,
    /// A client outside the frontend's loadBalancerSourceRanges: dropped.
    SourceDenied = 14,
    /// A new flow followed its client's session affinity.
    AffinityHit = 15,
    /// A reply of an SNATed flow was reverse-translated on its way in.
    SnatReply = 16,
    /// A socket of the node itself was connected (or sent) to a backend.
    SockConnect = 17,
    /// A socket of the node itself asked for a service with no backend.
    SockRefused = 18,
    /// An ICMP error quoting a DNATed packet was translated back for the
    /// client (path MTU discovery).
    IcmpTranslated = 19,
    /// An IPv6 packet whose fixed header is followed by an extension
    /// header (other than a fragment header) passed untouched: the IPv6
    /// datapath balances only TCP/UDP directly after the fixed header.
    /// Counts every such packet arriving at the node, service or not (MLD
    /// reports carry a hop-by-hop header).
    Ipv6ExtHeader = 20,
    /// An IPv6 packet could not enter the IPv6 program (`sl_progs` slot
    /// empty: an agent that never finished loading): passed untouched.
    TailCallFailed = 21,
    /// A Maglev frontend's table named a backend that may not take new
    /// flows (or had no entry): the flow was balanced over the slots.
    MaglevFallback = 22,
}

/// Number of counters (the `max_entries` of `sl_stats`).
pub const STAT_COUNT: u32 = 23;

impl Stat {
    /// Every counter, in index order.
    pub const ALL: [Stat; STAT_COUNT as usize] = [
        Stat::NewFlow,
        Stat::Established,
        Stat::ReplyNat,
        Stat::Reselected,
        Stat::StaleReset,
        Stat::NoBackend,
        Stat::Fragment,
        Stat::CtInsertFailed,
        Stat::Dangling,
        Stat::NatFailed,
        Stat::RejectFailed,
        Stat::Truncated,
        Stat::NoBackendDrop,
        Stat::SnatFailed,
        Stat::SourceDenied,
        Stat::AffinityHit,
        Stat::SnatReply,
        Stat::SockConnect,
        Stat::SockRefused,
        Stat::IcmpTranslated,
        Stat::Ipv6ExtHeader,
        Stat::TailCallFailed,
        Stat::MaglevFallback,
    ];

    /// The name used in metrics and `sluice status`.
    pub const fn name(&self) -> &'static str {
        match self {
            Stat::NewFlow => "new_flow",
            Stat::Established => "established",
            Stat::ReplyNat => "reply_nat",
            Stat::Reselected => "reselected",
            Stat::StaleReset => "stale_reset",
            Stat::NoBackend => "no_backend",
            Stat::Fragment => "fragment",
            Stat::CtInsertFailed => "ct_insert_failed",
            Stat::Dangling => "dangling",
            Stat::NatFailed => "nat_failed",
            Stat::RejectFailed => "reject_failed",
            Stat::Truncated => "truncated",
            Stat::NoBackendDrop => "no_backend_drop",
            Stat::SnatFailed => "snat_failed",
            Stat::SourceDenied => "source_denied",
            Stat::AffinityHit => "affinity_hit",
            Stat::SnatReply => "snat_reply",
            Stat::SockConnect => "sock_connect",
            Stat::SockRefused => "sock_refused",
            Stat::IcmpTranslated => "icmp_translated",
            Stat::Ipv6ExtHeader => "ipv6_ext_header",
            Stat::TailCallFailed => "tail_call_failed",
            Stat::MaglevFallback => "maglev_fallback",
        }
    }
}
