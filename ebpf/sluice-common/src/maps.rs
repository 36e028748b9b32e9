//! Names and default sizes of the pinned maps.
//!
//! Names are at most 15 characters (the kernel's `BPF_OBJ_NAME_LEN` - 1) and
//! start with `sl_`, so `bpftool map list` shows them whole and grouped. The
//! agent pins each map under its bpffs directory (default
//! `/sys/fs/bpf/sluice`) with exactly this name.

/// Service frontends and their backend slots: `Svc4Key` -> `SvcValue`.
pub const SERVICES_V4: &str = "sl_svc4";
/// IPv6 service frontends and their slots: `Svc6Key` -> `SvcValue` (same
/// service-port ids and backends as `sl_svc4`).
pub const SERVICES_V6: &str = "sl_svc6";
/// Backends by id: `u32` -> `Backend`.
pub const BACKENDS: &str = "sl_backends";
/// Connection tracking for IPv4 flows: `Ct4Key` -> `CtEntry` (LRU).
pub const CONNTRACK_V4: &str = "sl_ct4";
/// Connection tracking for IPv6 flows: `Ct6Key` -> `CtEntry` (LRU).
pub const CONNTRACK_V6: &str = "sl_ct6";
/// Per-CPU counters indexed by `Stat` (the first `STAT_COUNT` of them).
pub const STATS: &str = "sl_stats";
/// Per-CPU counters added after release 0.1.0 (`Stat` index minus
/// `STAT_COUNT`). A map of its own so that new counters never change the
/// layout of `sl_stats`, which 0.1.0 checks on a rollback; it has room for
/// `STATS2_MAX` of them.
pub const STATS2: &str = "sl_stats2";
/// Single-entry array holding `Config`.
pub const CONFIG: &str = "sl_config";
/// Session affinity: `Affinity4Key` -> `AffinityValue` (LRU).
pub const AFFINITY_V4: &str = "sl_aff4";
/// Session affinity of IPv6 clients: `Affinity6Key` -> `AffinityValue` (LRU).
pub const AFFINITY_V6: &str = "sl_aff6";
/// loadBalancerSourceRanges: LPM trie of `SrcRange4` -> `u8`.
pub const SOURCE_RANGES_V4: &str = "sl_srcrng4";
/// Maglev tables of IPv4 frontends: master `Svc4Key` -> `MaglevTable`.
pub const MAGLEV_V4: &str = "sl_maglev4";
/// Maglev tables of IPv6 frontends: master `Svc6Key` -> `MaglevTable`.
pub const MAGLEV_V6: &str = "sl_maglev6";
/// IPv6 loadBalancerSourceRanges: LPM trie of `SrcRange6` -> `u8`.
pub const SOURCE_RANGES_V6: &str = "sl_srcrng6";
/// Tail-call targets of the TC programs (`PROG_*` index -> program): the
/// IPv6 path runs as a program of its own, with a whole stack.
pub const PROGS: &str = "sl_progs";
/// Socket-level balancing, both families: socket cookie -> `SockEntry`
/// (LRU).
pub const SOCKETS: &str = "sl_sock";
/// Socket-level reverse translation, both families: `SockRevKey` ->
/// `SockRevValue` (LRU).
pub const SOCK_REV: &str = "sl_sockrev";
/// How many counted (`SockEntry::counted`) TCP entries of `sl_sock` hash
/// to each slot (`socket::mark_slot`), and in its last slot whether the
/// counts are complete (`socket::MARKS_VALID`): array of `u64`. With it,
/// `sock_release` skips the `sl_sock` lookup for a TCP socket whose slot
/// counts none, which was never balanced.
pub const SOCK_MARKS: &str = "sl_sockmark";
/// Balanced TCP sockets by cookie slot (`socket::table_slot`), while
/// `sl_sockmark`'s counts are valid: array of `SockSlot`, memory-mappable
/// (the agent reads it in place and hands slots back with an atomic
/// compare-and-swap). A socket whose slot is taken goes to `sl_sock`.
pub const SOCK_TABLE: &str = "sl_socktab";
/// A frontend's active backends for the socket programs, in one lookup
/// (`picks`): master `Svc4Key` -> `SockPicks4`, for the frontends that
/// qualify (`picks::takes_picks`).
pub const SOCK_PICKS_V4: &str = "sl_sockfe4";
/// The same for IPv6 frontends: master `Svc6Key` -> `SockPicks6`.
pub const SOCK_PICKS_V6: &str = "sl_sockfe6";
/// The cluster's own sources (local-traffic detection: `--cluster-cidr`,
/// or this node's pod CIDRs): LPM trie of an IPv4 network (`[u8; 4]`) ->
/// `u8` (1).
pub const LOCAL_V4: &str = "sl_local4";
/// The cluster's own IPv6 sources: LPM trie of `[u8; 16]` -> `u8` (1).
pub const LOCAL_V6: &str = "sl_local6";
/// Capacity of `sl_local4` and of `sl_local6` (CIDRs).
pub const LOCAL_MAX: u32 = 256;
/// The devices whose packets come from the cluster's own pods
/// (`--detect-local-mode` BridgeInterface / InterfaceNamePrefix): ifindex
/// `u32` -> `u8` (1).
pub const LOCAL_IFS: &str = "sl_localif";
/// Capacity of `sl_localif` (devices).
pub const LOCAL_IFS_MAX: u32 = 16_384;
/// The ports of fragmented IPv4 datagrams: `Frag4Key` -> `FragPorts`
/// (LRU), so that later fragments follow their first one's flow.
pub const FRAGMENTS_V4: &str = "sl_frag4";
/// The ports of fragmented IPv6 datagrams: `Frag6Key` -> `FragPorts` (LRU).
pub const FRAGMENTS_V6: &str = "sl_frag6";
/// Capacity of `sl_frag4` and of `sl_frag6`: datagrams in flight (as
/// Cilium's default). Preallocated (LRU).
pub const FRAGMENTS_MAX: u32 = 8_192;
/// The service address space (`--service-cluster-ip-range`, ServiceCIDR
/// objects) and the cluster IPs in use: LPM trie of an IPv4 network
/// (`[u8; 4]`) -> `SVCNET_*` (a cluster IP is a /32 `SVCNET_CLUSTER_IP`
/// entry, a service CIDR a `SVCNET_CIDR` one). A new flow that misses
/// `sl_svc4` is rejected when its destination's longest match is a
/// cluster IP (unserved port) and dropped when it is a CIDR (unallocated
/// address), as kube-proxy's nftables `cluster-ips-check` chain does.
pub const SVCNET_V4: &str = "sl_svcnet4";
/// Datapath events for `sluice monitor`: a BPF ring buffer of `Event`s
/// (`events::EVENTS_RING_BYTES`).
pub const EVENTS: &str = "sl_events";
/// The devices `sl_xdp` may redirect frames to (a devmap hash, ifindex ->
/// ifindex): the node's XDP devices. Not pinned: the agent fills the map
/// of the programs it loads.
pub const XDP_DEVS: &str = "sl_xdp_devs";
/// Capacity of `sl_xdp_devs`.
pub const XDP_DEVS_MAX: u32 = 64;
/// The pods' devices host routing takes packets from and hands them to
/// (`--host-routing`): a devmap hash, ifindex -> ifindex, the veth and
/// netkit devices among `--pod-devices` or the devices of
/// `--detect-local-mode InterfaceNamePrefix` (`bpf_redirect_peer` targets).
/// Not pinned: the agent fills the map of the programs it loads.
pub const PEER_DEVS: &str = "sl_peer_devs";
/// Capacity of `sl_peer_devs`.
pub const PEER_DEVS_MAX: u32 = 16_384;
/// Host routing's route cache for IPv4 destinations (`hop.rs`): LRU hash,
/// `Hop4Key` (destination, ingress device) -> `HopEntry`. Not pinned:
/// each program generation's packets fill their own.
pub const HOPS_V4: &str = "sl_hops4";
/// `sl_hops4` for IPv6 destinations (`Hop6Key` -> `HopEntry`).
pub const HOPS_V6: &str = "sl_hops6";
/// Capacity of `sl_hops4` and `sl_hops6` (pairs of a pod talking to a
/// pod on the node through a service, each way; the LRU evicts the least
/// recently used beyond it, which then costs a FIB lookup again).
pub const HOPS_MAX: u32 = 16_384;
/// Array of `u64` words: the frontend-address filter (`filter.rs`). Not
/// pinned: the agent fills the map of the programs it loads.
pub const FE_FILTER: &str = "sl_fe_filter";
/// Array of `u64` words: the backend-port filter (`filter.rs`). Not
/// pinned, as `sl_fe_filter`.
pub const PORT_FILTER: &str = "sl_port_filter";
/// The IPv6 twin of `sl_svcnet4`: LPM trie of `[u8; 16]` -> `SVCNET_*`.
pub const SVCNET_V6: &str = "sl_svcnet6";
/// One-entry array: `SvcnetSummary4`, prefixes covering `sl_svcnet4`.
pub const SVCNET_SUMMARY_V4: &str = "sl_svcnetsum4";
/// Capacity of `sl_svcnet4` and of `sl_svcnet6` (cluster IPs and CIDRs):
/// as many as the default service map has entries, so every cluster IP
/// of a service map's worth of frontends fits (an LPM trie allocates per
/// entry: the size costs nothing unused). The maps came after 0.1.0, which
/// ignores them, so their size was free to grow (it was 65,536, which
/// 100,000 services overflowed).
pub const SVCNET_MAX: u32 = 262_144;
/// `sl_svcnet*` value: an address range of the service CIDRs.
pub const SVCNET_CIDR: u8 = 1;
/// `sl_svcnet*` value: a cluster IP some service holds (a host route).
pub const SVCNET_CLUSTER_IP: u8 = 2;

// Every pinned map, with its layout and capacity, is declared once in
// `crate::abi::MAPS`.

/// The previous program generation during an upgrade that migrates
/// conntrack (`HANDOVER_*` index -> program), not pinned: a packet (IPv4
/// or IPv6) whose flow the new generation's conntrack does not know (yet) is handed
/// to the old generation's program, which does. Empty otherwise.
pub const HANDOVER: &str = "sl_handover";
/// `sl_handover` index of the previous generation's `sl_ingress`.
pub const HANDOVER_INGRESS: u32 = 0;
/// `sl_handover` index of the previous generation's `sl_egress`.
pub const HANDOVER_EGRESS: u32 = 1;
/// Entries of `sl_handover`.
pub const HANDOVER_MAX: u32 = 2;

/// `sl_progs` index of the IPv6 half of `sl_ingress`.
pub const PROG_INGRESS6: u32 = 0;
/// `sl_progs` index of the IPv6 half of `sl_egress`.
pub const PROG_EGRESS6: u32 = 1;
/// Entries of `sl_progs`.
pub const PROGS_MAX: u32 = 2;

/// Default capacity of `sl_svc4` (and of `sl_svc6`): one entry per frontend plus one per
/// backend slot (a frontend with 10 backends uses 11). Not preallocated.
pub const DEFAULT_SERVICES_MAX: u32 = 262_144;
/// Default capacity of `sl_backends`. Not preallocated.
pub const DEFAULT_BACKENDS_MAX: u32 = 131_072;
/// Default capacity of `sl_ct4` (and of `sl_ct6`): two entries per flow (forward and reply),
/// so 131,072 flows, kube-proxy's default `conntrack-min`. Preallocated (LRU).
pub const DEFAULT_CONNTRACK_MAX: u32 = 262_144;

/// Default capacity of `sl_aff4` (and of `sl_aff6`): (client, frontend) pairs. Preallocated
/// (LRU).
pub const DEFAULT_AFFINITY_MAX: u32 = 65_536;
/// Capacity of `sl_srcrng4` and of `sl_srcrng6` (ranges over all service ports). Not
/// preallocated.
pub const SOURCE_RANGES_MAX: u32 = 16_384;

/// Capacity of `sl_maglev4` and of `sl_maglev6`: frontends using Maglev
/// (64 KiB each, allocated as used).
pub const MAGLEV_MAX: u32 = 4_096;

/// Capacity of `sl_sock` and `sl_sockrev` (sockets of the node itself
/// talking to services). Preallocated (LRU).
pub const SOCKETS_MAX: u32 = 65_536;

/// Slots of `sl_socktab` (56 bytes each: 3.5 MiB, preallocated).
pub const SOCK_TABLE_SLOTS: u32 = 65_536;

/// Counting slots of `sl_sockmark` (8 pages of `u64`); the map has one
/// more, the validity word.
pub const SOCK_MARK_SLOTS: u32 = 4_096;

/// Largest number of backend slots one frontend may have (slot is a `u16`
/// and slot 0 is the master entry).
pub const MAX_SLOTS: u32 = 65_534;
