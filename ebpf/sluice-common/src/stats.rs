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
    /// The first fragment of a fragmented TCP/UDP datagram (IPv4, or IPv6
    /// with a fragment header) was seen: its ports were recorded in
    /// `sl_frag4`/`sl_frag6` for the datagram's later fragments (any
    /// datagram, service or not; the first fragment itself then takes the
    /// path of any packet of its flow).
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
    /// An IPv6 packet whose extension headers the datapath does not walk
    /// to an L4 header passed untouched: ESP or No Next Header in the
    /// chain, HIP or Shim6, a routing header with segments left (the
    /// destination is not final), a chain longer than the walk's limit,
    /// or extension headers behind a fragment header. Counts every such
    /// packet arriving at the node, service or not.
    Ipv6ExtHeader = 20,
    /// An IPv6 packet could not enter the IPv6 program (`sl_progs` slot
    /// empty: an agent that never finished loading): passed untouched.
    TailCallFailed = 21,
    /// A Maglev frontend's table named a backend that may not take new
    /// flows (or had no entry): the flow was balanced over the slots.
    MaglevFallback = 22,
    // From here on the counters live in `sl_stats2` (index - STAT_COUNT).
    // Each piece of work that adds counters takes the next free numbers.
    /// An ICMP error quoting a packet of an SNATed flow (sent from the
    /// node's SNAT port) was translated back for the client.
    IcmpSnatTranslated = 23,
    /// A non-first IP fragment followed the conntrack entry of the flow
    /// its first fragment belongs to (DNAT, SNAT, or a reply's reverse
    /// NAT), found by the datagram's IP identity in `sl_frag4`/`sl_frag6`.
    FragmentTracked = 24,
    /// A non-first TCP/UDP IP fragment whose first fragment was not seen
    /// here (out of order, or its entry evicted): its ports are unknown,
    /// so it passed untouched (any datagram, service or not).
    FragmentUnknown = 25,
    /// A packet to a cluster IP on a port or protocol the service does not
    /// serve: rejected, as kube-proxy does.
    UnservedPort = 26,
    /// A packet to an address inside the service CIDRs that no service
    /// holds: dropped, as kube-proxy does.
    UnallocatedIp = 27,
    // 28-31: taken by other issue 13 work.
    /// A non-first IP fragment to a frontend whose flow is not followed
    /// (its first fragment was dropped or rejected, or the flow's backend
    /// changed between fragments): dropped like its first fragment, as a
    /// fragment cannot start a flow.
    FragmentDropped = 32,
    // 33-39: taken by other issue 13 work.
    /// An IPv6 TCP/UDP/SCTP/ICMPv6 packet whose L4 header was found by
    /// walking extension headers (hop-by-hop, destination options, a
    /// routing header with no segments left, AH, mobility) before it:
    /// handled like any (service or not).
    Ipv6ExtWalked = 40,
    /// XDP (`sl_xdp`) rewrote a service packet (a new or tracked flow
    /// SNATed to a remote backend, or the reply of one) and sent it back
    /// out of the device it came in on (`XDP_TX`).
    XdpTx = 41,
    /// XDP rewrote a service packet and redirected it to another XDP
    /// device of the node (`XDP_REDIRECT` through `sl_xdp_devs`).
    XdpRedirect = 42,
    /// XDP dropped a packet at the driver: a source outside the
    /// frontend's loadBalancerSourceRanges, a drop-when-empty frontend
    /// without backends, or an unallocated service address (the reason
    /// is also counted under its own name, as on the TC path).
    XdpDrop = 43,
    /// XDP handed a service packet to the TC path undecided (a local or
    /// unroutable backend, a policy Local frontend, a reject, an unknown
    /// neighbour, ...): TC takes the decision, once.
    XdpPass = 44,
    /// XDP rewrote a packet but could not send it (redirect refused): the
    /// packet was dropped. Must stay 0.
    XdpAborted = 45,
    /// A datapath event (`sl_events`, `sluice monitor`) was not written:
    /// its CPU had spent its rate limit (`EVENTS_PER_SEC`).
    EventsSuppressed = 51,
    /// A datapath event was not written: the ring buffer was full (no
    /// `sluice monitor` reading it, or one reading too slowly).
    EventsLost = 52,
    /// A packet the datapath forwards itself (SNAT, an SNAT reply, an ICMP
    /// error about an SNATed flow) arrived with a TTL (hop limit) of 1 or
    /// less: dropped, as a router drops it.
    TtlExpired = 53,
    // 54-56: taken by the monitor work.
    /// A socket of a pod (`--socket-lb=all`) was connected (or sent) to a
    /// backend; also counted in `sock_connect`.
    SockPodConnect = 57,
    /// A pod's socket call to a frontend was left to the TC path: the
    /// frontend checks source ranges (the source address is not chosen
    /// yet), or the datagram belongs to a flow the TC path tracks.
    SockLeftToTc = 58,
    /// A new flow's tuple after DNAT was a live flow's of another frontend
    /// (one client port shared by connections to two services on one
    /// backend): the new flow was masqueraded, the live one kept.
    TupleClash = 59,
    /// A DNATed packet was handed straight into its backend's pod
    /// (`--host-routing`, `bpf_redirect_peer`), past the node's IP stack.
    HostRouted = 60,
    /// A socket's backend came from its frontend's entry in
    /// `sl_sockfe4`/`sl_sockfe6` (one lookup instead of three); also
    /// counted in `sock_connect`.
    SockPicked = 61,
    /// A SYN reusing the tuple of a finished flow went to the same
    /// backend: the flow's own conntrack entries were rewritten in place
    /// instead of inserting new ones; also counted in `reselected`.
    CtReused = 62,
}

/// Number of counters in `sl_stats` (its `max_entries`, fixed since ABI 4:
/// release 0.1.0 checks it).
pub const STAT_COUNT: u32 = 23;

/// Capacity of `sl_stats2`: counters `STAT_COUNT ..` go there.
pub const STATS2_MAX: u32 = 64;

/// Number of counters in all.
pub const STAT_TOTAL: usize = 44;

const _: () = assert!(STAT_TOTAL <= (STAT_COUNT + STATS2_MAX) as usize);

impl Stat {
    /// Where the counter lives: `(false, i)` is slot `i` of `sl_stats`,
    /// `(true, i)` slot `i` of `sl_stats2`.
    #[inline(always)]
    pub const fn slot(self) -> (bool, u32) {
        let i = self as u32;
        if i < STAT_COUNT {
            (false, i)
        } else {
            (true, i - STAT_COUNT)
        }
    }

    /// Every counter, in index order.
    pub const ALL: [Stat; STAT_TOTAL] = [
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
        Stat::IcmpSnatTranslated,
        Stat::FragmentTracked,
        Stat::FragmentUnknown,
        Stat::UnservedPort,
        Stat::UnallocatedIp,
        Stat::FragmentDropped,
        Stat::Ipv6ExtWalked,
        Stat::XdpTx,
        Stat::XdpRedirect,
        Stat::XdpDrop,
        Stat::XdpPass,
        Stat::XdpAborted,
        Stat::EventsSuppressed,
        Stat::EventsLost,
        Stat::TtlExpired,
        Stat::SockPodConnect,
        Stat::SockLeftToTc,
        Stat::TupleClash,
        Stat::HostRouted,
        Stat::SockPicked,
        Stat::CtReused,
    ];

    /// The counter with index `i`, if any.
    pub fn from_index(i: u32) -> Option<Stat> {
        Stat::ALL.iter().copied().find(|s| *s as u32 == i)
    }

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
            Stat::IcmpSnatTranslated => "icmp_snat_translated",
            Stat::FragmentTracked => "fragment_tracked",
            Stat::FragmentUnknown => "fragment_unknown",
            Stat::UnservedPort => "unserved_port",
            Stat::UnallocatedIp => "unallocated_ip",
            Stat::FragmentDropped => "fragment_dropped",
            Stat::Ipv6ExtWalked => "ipv6_ext_walked",
            Stat::XdpTx => "xdp_tx",
            Stat::XdpRedirect => "xdp_redirect",
            Stat::XdpDrop => "xdp_drop",
            Stat::XdpPass => "xdp_pass",
            Stat::XdpAborted => "xdp_aborted",
            Stat::EventsSuppressed => "events_suppressed",
            Stat::EventsLost => "events_lost",
            Stat::TtlExpired => "ttl_expired",
            Stat::SockPodConnect => "sock_pod_connect",
            Stat::SockLeftToTc => "sock_left_to_tc",
            Stat::TupleClash => "tuple_clash",
            Stat::HostRouted => "host_routed",
            Stat::SockPicked => "sock_picked",
            Stat::CtReused => "ct_reused",
        }
    }
}
