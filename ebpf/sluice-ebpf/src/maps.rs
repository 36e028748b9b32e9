//! The map definitions. Names and layouts come from `sluice_common`; the
//! sizes here are defaults that the agent overrides at load time.

use crate::{flow6::Flow6, headers::Ipv6Hdr};
use aya_ebpf::{
    bindings::{bpf_fib_lookup, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    btf_maps::{
        lpm_trie::Key, Array, DevMapHash, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray,
        RingBuf,
    },
    macros::btf_map,
};
use sluice_common::{
    config::{CFG_F_PODS_ON_SOCKETS, CFG_F_SOCK_PODS},
    events::EVENTS_RING_BYTES,
    filter, maps as names,
    maps::{
        DEFAULT_AFFINITY_MAX, DEFAULT_BACKENDS_MAX, DEFAULT_CONNTRACK_MAX, DEFAULT_SERVICES_MAX,
        FRAGMENTS_MAX, HANDOVER_MAX, LOCAL_IFS_MAX, LOCAL_MAX, MAGLEV_MAX, PROGS_MAX, SOCKETS_MAX,
        SOCK_MARK_SLOTS, SOCK_TABLE_SLOTS, SOURCE_RANGES_MAX, SVCNET_MAX,
    },
    socket::{SOCK_SLOT_BUSY, SOCK_SLOT_MOVING},
    stats::{STATS2_MAX, STAT_COUNT},
    Affinity4Key, Affinity6Key, AffinityValue, Backend, Config, Ct4Key, Ct6Key, CtEntry, Event,
    EventBucket, Frag4Key, Frag6Key, FragPorts, Hop4Key, Hop6Key, HopEntry, MaglevTable, SockEntry,
    SockPicks4, SockPicks6, SockRevKey, SockRevValue, SockSlot, SrcRange4, SrcRange6, Stat,
    Svc4Key, Svc6Key, SvcValue, SvcnetSummary4,
};

const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

/// The flags of the maps an operator may preallocate
/// (`sluice_common::abi::PREALLOCATABLE`): the object built with the
/// `prealloc` feature (`--preallocate-maps`) creates them preallocated.
const PREALLOCATABLE: usize = if cfg!(feature = "prealloc") {
    0
} else {
    NO_PREALLOC
};

#[btf_map(name = "sl_svc4")]
pub static SERVICES_V4: HashMap<
    Svc4Key,
    SvcValue,
    { DEFAULT_SERVICES_MAX as usize },
    PREALLOCATABLE,
> = HashMap::new();

#[btf_map(name = "sl_backends")]
pub static BACKENDS: HashMap<u32, Backend, { DEFAULT_BACKENDS_MAX as usize }, PREALLOCATABLE> =
    HashMap::new();

#[btf_map(name = "sl_ct4")]
pub static CONNTRACK_V4: LruHashMap<Ct4Key, CtEntry, { DEFAULT_CONNTRACK_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_svc6")]
pub static SERVICES_V6: HashMap<
    Svc6Key,
    SvcValue,
    { DEFAULT_SERVICES_MAX as usize },
    PREALLOCATABLE,
> = HashMap::new();

#[btf_map(name = "sl_ct6")]
pub static CONNTRACK_V6: LruHashMap<Ct6Key, CtEntry, { DEFAULT_CONNTRACK_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_stats")]
pub static STATS: PerCpuArray<u64, { STAT_COUNT as usize }> = PerCpuArray::new();

#[btf_map(name = "sl_stats2")]
pub static STATS2: PerCpuArray<u64, { STATS2_MAX as usize }> = PerCpuArray::new();

#[btf_map(name = "sl_config")]
pub static CONFIG: Array<Config, 1> = Array::new();

#[btf_map(name = "sl_aff4")]
pub static AFFINITY_V4: LruHashMap<Affinity4Key, AffinityValue, { DEFAULT_AFFINITY_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_aff6")]
pub static AFFINITY_V6: LruHashMap<Affinity6Key, AffinityValue, { DEFAULT_AFFINITY_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_srcrng6")]
pub static SOURCE_RANGES_V6: LpmTrie<SrcRange6, u8, { SOURCE_RANGES_MAX as usize }> =
    LpmTrie::new();

/// The IPv6 halves of the TC programs (`sluice_common::maps::PROG_*`),
/// entered by tail call so that they run with a stack of their own. Pinned:
/// the kernel empties a program array when its last user reference goes.
#[btf_map(name = "sl_progs")]
pub static PROGS: ProgramArray<{ PROGS_MAX as usize }> = ProgramArray::new();

/// The previous program generation while an upgrade hands over
/// (`sluice_common::maps::HANDOVER_*`); empty otherwise.
#[btf_map(name = "sl_handover")]
pub static HANDOVER: ProgramArray<{ HANDOVER_MAX as usize }> = ProgramArray::new();

/// Hands the packet to the previous program generation, which may know
/// its flow, while an upgrade that migrates conntrack is finishing. Returns
/// (and the caller carries on) when no handover is in progress.
#[inline(always)]
pub fn hand_over(ctx: &aya_ebpf::programs::TcContext, index: u32) {
    // SAFETY: the target is a TC program over the same context; on
    // success control never comes back here.
    unsafe { HANDOVER.tail_call(ctx, index) };
}

#[btf_map(name = "sl_maglev4")]
pub static MAGLEV_V4: HashMap<Svc4Key, MaglevTable, { MAGLEV_MAX as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "sl_maglev6")]
pub static MAGLEV_V6: HashMap<Svc6Key, MaglevTable, { MAGLEV_MAX as usize }, NO_PREALLOC> =
    HashMap::new();

/// A frontend's active backends for the socket programs, in one lookup
/// (`sluice_common::picks`).
#[btf_map(name = "sl_sockfe4")]
pub static SOCK_PICKS_V4: HashMap<
    Svc4Key,
    SockPicks4,
    { DEFAULT_SERVICES_MAX as usize },
    NO_PREALLOC,
> = HashMap::new();

#[btf_map(name = "sl_sockfe6")]
pub static SOCK_PICKS_V6: HashMap<
    Svc6Key,
    SockPicks6,
    { DEFAULT_SERVICES_MAX as usize },
    NO_PREALLOC,
> = HashMap::new();

#[btf_map(name = "sl_sock")]
pub static SOCKETS: LruHashMap<u64, SockEntry, { SOCKETS_MAX as usize }> = LruHashMap::new();

/// Counts of `sl_sock`'s TCP entries by cookie slot, and the validity
/// word (`sluice_common::socket`).
#[btf_map(name = "sl_sockmark")]
pub static SOCK_MARKS: Array<u64, { SOCK_MARK_SLOTS as usize + 1 }> = Array::new();

/// Balanced TCP sockets by cookie slot (`sluice_common::socket`),
/// memory-mappable for the agent.
#[btf_map(name = "sl_socktab")]
pub static SOCK_TABLE: Array<SockSlot, { SOCK_TABLE_SLOTS as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

#[btf_map(name = "sl_sockrev")]
pub static SOCK_REV: LruHashMap<SockRevKey, SockRevValue, { SOCKETS_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_srcrng4")]
pub static SOURCE_RANGES_V4: LpmTrie<SrcRange4, u8, { SOURCE_RANGES_MAX as usize }> =
    LpmTrie::new();

#[btf_map(name = "sl_local4")]
pub static LOCAL_V4: LpmTrie<[u8; 4], u8, { LOCAL_MAX as usize }> = LpmTrie::new();

#[btf_map(name = "sl_local6")]
pub static LOCAL_V6: LpmTrie<[u8; 16], u8, { LOCAL_MAX as usize }> = LpmTrie::new();

#[btf_map(name = "sl_localif")]
pub static LOCAL_IFS: HashMap<u32, u8, { LOCAL_IFS_MAX as usize }, NO_PREALLOC> = HashMap::new();

/// The ports of fragmented datagrams, by IP identity (`frag.rs`).
#[btf_map(name = "sl_frag4")]
pub static FRAGMENTS_V4: LruHashMap<Frag4Key, FragPorts, { FRAGMENTS_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_frag6")]
pub static FRAGMENTS_V6: LruHashMap<Frag6Key, FragPorts, { FRAGMENTS_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_svcnet4")]
pub static SVCNET_V4: LpmTrie<[u8; 4], u8, { SVCNET_MAX as usize }> = LpmTrie::new();

#[btf_map(name = "sl_svcnet6")]
pub static SVCNET_V6: LpmTrie<[u8; 16], u8, { SVCNET_MAX as usize }> = LpmTrie::new();

/// Datapath events for `sluice monitor` (`events.rs`).
#[btf_map(name = "sl_events")]
pub static EVENTS: RingBuf<Event, { EVENTS_RING_BYTES as usize }> = RingBuf::new();

/// The events' per-CPU rate limit (`events.rs`). Not pinned: each program
/// generation starts with a full bucket.
#[btf_map(name = "sl_evrate")]
pub static EVENT_RATE: PerCpuArray<EventBucket, 1> = PerCpuArray::new();

#[btf_map(name = "sl_svcnetsum4")]
pub static SVCNET_SUMMARY_V4: Array<SvcnetSummary4, 1> = Array::new();

/// Per-CPU room for temporaries too large for the 512-byte BPF stack: a
/// conntrack entry under construction, FIB lookup parameters, a reply
/// packet being built. One program run uses it at a time on a CPU (TC runs
/// with bottom halves off). Not pinned: each loaded program has its own.
#[repr(C)]
pub struct Scratch {
    pub ct: CtEntry,
    pub fib: bpf_fib_lookup,
    /// A hop to remember in `sl_hops4`/`sl_hops6` (`route.rs`).
    pub hop: HopEntry,
    /// The `sl_hops6` key of a packet (off the stack).
    pub hop6_key: Hop6Key,
    /// Large enough for an ICMPv6 error quoting an IPv6 UDP header (110).
    pub pkt: [u8; PKT_MAX],
}

/// Size of `Scratch::pkt`.
pub const PKT_MAX: usize = 112;

#[btf_map(name = "sl_scratch")]
pub static SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// The IPv6 path's working set: the packet's tuple and the map keys built
/// from it, all too large to keep on the stack after the IPv4 path's frame
/// (see `flow6::Flow6`). Separate from `Scratch` so that the IPv6 path can
/// hold a reference to its flow while the reject builders use `pkt`.
#[repr(C)]
pub struct Scratch6 {
    pub flow: Flow6,
    pub ct_key: Ct6Key,
    pub svc_key: Svc6Key,
    pub aff_key: Affinity6Key,
    pub range_key: Key<SrcRange6>,
    pub local_key: Key<[u8; 16]>,
    /// The node address an SNATed flow leaves with.
    pub snat_addr: [u8; 16],
    /// An ICMPv6 error's own IPv6 header and the one it quotes
    /// (`icmp6::ingress`).
    pub icmp_outer: Ipv6Hdr,
    pub icmp_inner: Ipv6Hdr,
    /// The `sl_frag6` key of a fragmented datagram (`frag::track6`).
    pub frag_key: Frag6Key,
    /// What `sl_xdp` rewrites an IPv6 packet to (`xdp6.rs`).
    pub out: crate::xdp6::Ends6,
}

#[btf_map(name = "sl_scratch6")]
pub static SCRATCH6: PerCpuArray<Scratch6, 1> = PerCpuArray::new();

/// This CPU's IPv6 scratch space.
#[inline(always)]
pub fn scratch6() -> Option<&'static mut Scratch6> {
    // SAFETY: a per-CPU slot that only the running program uses.
    SCRATCH6.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// This CPU's scratch space.
#[inline(always)]
pub fn scratch() -> Option<&'static mut Scratch> {
    // SAFETY: a per-CPU slot that only the running program uses.
    SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The devices `sl_xdp` may redirect a frame to (ifindex -> ifindex): the
/// node's XDP devices, written by the agent when it attaches. Not pinned
/// (each loaded program has its own, as `sl_scratch`): a frame for another
/// device (a pod's veth, whose peer may drop redirected frames) goes up
/// to TC instead.
#[btf_map(name = "sl_xdp_devs")]
pub static XDP_DEVS: DevMapHash<{ sluice_common::maps::XDP_DEVS_MAX as usize }> = DevMapHash::new();

/// The pods' devices host routing may take a packet from and hand one to
/// with `bpf_redirect_peer` (`route.rs`). Not pinned, as `sl_xdp_devs`: the
/// agent enters the veth and netkit devices among `--pod-devices` (or
/// `--detect-local-mode InterfaceNamePrefix`'s) as it
/// attaches them. A devmap: the kernel drops the entry of a device that
/// goes away, so an ifindex never names another device here.
#[btf_map(name = "sl_peer_devs")]
pub static PEER_DEVS: DevMapHash<{ sluice_common::maps::PEER_DEVS_MAX as usize }> =
    DevMapHash::new();

/// Host routing's route cache, IPv4 destinations (`sluice_common::hop`).
/// Not pinned: this generation's packets fill it.
#[btf_map(name = "sl_hops4")]
pub static HOPS_V4: LruHashMap<Hop4Key, HopEntry, { sluice_common::maps::HOPS_MAX as usize }> =
    LruHashMap::new();

/// `sl_hops4` for IPv6 destinations.
#[btf_map(name = "sl_hops6")]
pub static HOPS_V6: LruHashMap<Hop6Key, HopEntry, { sluice_common::maps::HOPS_MAX as usize }> =
    LruHashMap::new();

/// Whether `--host-routing` is on (`CFG_F_HOST_ROUTING`): one array slot,
/// one bit.
#[inline(always)]
pub fn host_routing() -> bool {
    // SAFETY: array slot 0 always exists; one field read at once.
    CONFIG
        .get_ptr(0)
        .is_some_and(|p| unsafe { (*p).flags() } & sluice_common::config::CFG_F_HOST_ROUTING != 0)
}

/// The frontend-address filter (`sluice_common::filter`). Not pinned:
/// each program generation has its own, which the agent fills before it
/// attaches the programs.
#[btf_map(name = "sl_fe_filter")]
pub static FE_FILTER: Array<u64, { filter::FE_FILTER_WORDS as usize }> = Array::new();

/// The backend-port filter (`sluice_common::filter`). Not pinned, as
/// `sl_fe_filter`.
#[btf_map(name = "sl_port_filter")]
pub static PORT_FILTER: Array<u64, { filter::PORT_FILTER_WORDS as usize }> = Array::new();

/// Whether filter `map` passes `(word, bit)` (`filter::passes`; a word
/// out of range passes too).
#[inline(always)]
fn filter_passes<const N: usize>(map: &Array<u64, N>, (word, bit): (u32, u32)) -> bool {
    map.get(word).is_none_or(|w| filter::passes(*w, bit))
}

/// Whether a frontend may have IPv4 address `dst` (false: no entry of
/// `sl_svc4` has it). One word of an array: no hash lookup.
#[inline(always)]
pub fn may_be_frontend_v4(dst: [u8; 4]) -> bool {
    filter_passes(&FE_FILTER, filter::addr4_slot(u32::from_ne_bytes(dst)))
}

/// `may_be_frontend_v4` for IPv6 (`sl_svc6`).
#[inline(always)]
pub fn may_be_frontend_v6(dst: &[u8; 16]) -> bool {
    filter_passes(&FE_FILTER, filter::addr6_slot(dst))
}

/// Whether a backend may listen on `port` (false: no conntrack entry can
/// be the reply entry of a packet from this port, so reverse NAT has
/// nothing to find).
#[inline(always)]
pub fn may_be_backend_port(port: u16) -> bool {
    filter_passes(&PORT_FILTER, filter::port_slot(port))
}

/// Whether IPv4 `dst` may be in `sl_svcnet4` (`sl_svcnetsum4`'s answer:
/// true while it is unwritten).
#[inline(always)]
pub fn may_be_service_net_v4(dst: [u8; 4]) -> bool {
    SVCNET_SUMMARY_V4
        .get(0)
        .is_none_or(|s| s.may_hold(u32::from_ne_bytes(dst)))
}

/// Whether IPv4 `dst` may concern the services at all: a frontend may
/// have it, or it may be in the service address space. False: a miss in
/// `sl_svc4` and 0 from `svcnet_v4`, known without either lookup.
#[inline(always)]
pub fn may_be_served_v4(dst: [u8; 4]) -> bool {
    may_be_frontend_v4(dst) || may_be_service_net_v4(dst)
}

// The literal names above must be the ABI's names.
use sluice_common::abi::same;
const _: () = assert!(same("sl_svc4", names::SERVICES_V4));
const _: () = assert!(same("sl_backends", names::BACKENDS));
const _: () = assert!(same("sl_ct4", names::CONNTRACK_V4));
const _: () = assert!(same("sl_svc6", names::SERVICES_V6));
const _: () = assert!(same("sl_ct6", names::CONNTRACK_V6));
const _: () = assert!(same("sl_stats", names::STATS));
const _: () = assert!(same("sl_stats2", names::STATS2));
const _: () = assert!(same("sl_localif", names::LOCAL_IFS));
const _: () = assert!(same("sl_config", names::CONFIG));
const _: () = assert!(same("sl_aff4", names::AFFINITY_V4));
const _: () = assert!(same("sl_srcrng4", names::SOURCE_RANGES_V4));
const _: () = assert!(same("sl_sock", names::SOCKETS));
const _: () = assert!(same("sl_sockrev", names::SOCK_REV));
const _: () = assert!(same("sl_sockmark", names::SOCK_MARKS));
const _: () = assert!(same("sl_socktab", names::SOCK_TABLE));
const _: () = assert!(same("sl_aff6", names::AFFINITY_V6));
const _: () = assert!(same("sl_srcrng6", names::SOURCE_RANGES_V6));
const _: () = assert!(same("sl_progs", names::PROGS));
const _: () = assert!(same("sl_maglev4", names::MAGLEV_V4));
const _: () = assert!(same("sl_maglev6", names::MAGLEV_V6));
const _: () = assert!(same("sl_frag4", names::FRAGMENTS_V4));
const _: () = assert!(same("sl_frag6", names::FRAGMENTS_V6));
const _: () = assert!(same("sl_svcnet4", names::SVCNET_V4));
const _: () = assert!(same("sl_svcnet6", names::SVCNET_V6));
const _: () = assert!(same("sl_events", names::EVENTS));
const _: () = assert!(same("sl_sockfe4", names::SOCK_PICKS_V4));
const _: () = assert!(same("sl_sockfe6", names::SOCK_PICKS_V6));
const _: () = assert!(same("sl_xdp_devs", names::XDP_DEVS));
const _: () = assert!(same("sl_peer_devs", names::PEER_DEVS));
const _: () = assert!(same("sl_svcnetsum4", names::SVCNET_SUMMARY_V4));
const _: () = assert!(same("sl_fe_filter", names::FE_FILTER));
const _: () = assert!(same("sl_port_filter", names::PORT_FILTER));
const _: () = assert!(same("sl_hops4", names::HOPS_V4));
const _: () = assert!(same("sl_hops6", names::HOPS_V6));

// Every pinned map above is in the declaration table (its layout is
// checked against it by agent/tests/abi_lock.rs).
const _: () = assert!(sluice_common::abi::declared(names::SERVICES_V4));
const _: () = assert!(sluice_common::abi::declared(names::SERVICES_V6));
const _: () = assert!(sluice_common::abi::declared(names::BACKENDS));
const _: () = assert!(sluice_common::abi::declared(names::CONNTRACK_V4));
const _: () = assert!(sluice_common::abi::declared(names::CONNTRACK_V6));
const _: () = assert!(sluice_common::abi::declared(names::STATS));
const _: () = assert!(sluice_common::abi::declared(names::STATS2));
const _: () = assert!(sluice_common::abi::declared(names::LOCAL_IFS));
const _: () = assert!(sluice_common::abi::declared(names::CONFIG));
const _: () = assert!(sluice_common::abi::declared(names::AFFINITY_V4));
const _: () = assert!(sluice_common::abi::declared(names::AFFINITY_V6));
const _: () = assert!(sluice_common::abi::declared(names::SOURCE_RANGES_V4));
const _: () = assert!(sluice_common::abi::declared(names::SOURCE_RANGES_V6));
const _: () = assert!(sluice_common::abi::declared(names::SOCKETS));
const _: () = assert!(sluice_common::abi::declared(names::SOCK_REV));
const _: () = assert!(sluice_common::abi::declared(names::SOCK_TABLE));
const _: () = assert!(sluice_common::abi::declared(names::PROGS));
const _: () = assert!(sluice_common::abi::declared(names::MAGLEV_V4));
const _: () = assert!(sluice_common::abi::declared(names::MAGLEV_V6));
const _: () = assert!(sluice_common::abi::declared(names::FRAGMENTS_V4));
const _: () = assert!(sluice_common::abi::declared(names::FRAGMENTS_V6));
const _: () = assert!(sluice_common::abi::declared(names::SVCNET_V4));
const _: () = assert!(sluice_common::abi::declared(names::SVCNET_V6));
const _: () = assert!(sluice_common::abi::declared(names::EVENTS));
const _: () = assert!(sluice_common::abi::declared(names::SVCNET_SUMMARY_V4));

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn count(stat: Stat) {
    // `stat` is a constant at every call site: the branch folds away.
    let p = match stat.slot() {
        (false, i) => STATS.get_ptr_mut(i),
        (true, i) => STATS2.get_ptr_mut(i),
    };
    if let Some(p) = p {
        // SAFETY: per-CPU slot, only this CPU writes it while we run.
        unsafe { *p += 1 };
    }
}

/// A frontend entry (master or slot). The agent replaces entries rather
/// than writing them in place (these maps are not preallocated), and a
/// replaced element is freed only after the program run: the reference is
/// a consistent snapshot for as long as the program runs.
#[inline(always)]
pub fn service(key: &Svc4Key) -> Option<&'static SvcValue> {
    // SAFETY: see above.
    SERVICES_V4.get_ptr(key).map(|p| unsafe { &*p })
}

/// An IPv6 frontend entry (a reference, as for `service`).
#[inline(always)]
pub fn service6(key: &Svc6Key) -> Option<&'static SvcValue> {
    // SAFETY: see `service`.
    SERVICES_V6.get_ptr(key).map(|p| unsafe { &*p })
}

/// An IPv4 frontend's picks for sockets (a reference, as for `service`).
#[inline(always)]
pub fn sock_picks4(key: &Svc4Key) -> Option<&'static SockPicks4> {
    // SAFETY: see `service`.
    SOCK_PICKS_V4.get_ptr(key).map(|p| unsafe { &*p })
}

/// An IPv6 frontend's picks for sockets (a reference, as for `service`).
#[inline(always)]
pub fn sock_picks6(key: &Svc6Key) -> Option<&'static SockPicks6> {
    // SAFETY: see `service`.
    SOCK_PICKS_V6.get_ptr(key).map(|p| unsafe { &*p })
}

/// A backend (a reference, as for `service`).
#[inline(always)]
pub fn backend(id: u32) -> Option<&'static Backend> {
    // SAFETY: see `service`.
    BACKENDS.get_ptr(id).map(|p| unsafe { &*p })
}

/// The node's configuration (all zero until the agent writes it).
#[inline(always)]
pub fn config() -> Config {
    // SAFETY: array slot 0 always exists; copied at once.
    CONFIG.get_ptr(0).map(|p| unsafe { *p }).unwrap_or_default()
}

/// Adds `delta` (1, or -1 as two's complement) to the count of `slot` in
/// `sl_sockmark`, atomically: sockets close on every CPU.
#[inline(always)]
pub fn add_sock_mark(slot: u32, delta: u64) {
    if let Some(p) = SOCK_MARKS.get_ptr_mut(slot) {
        // SAFETY: an array slot, valid for the program run; the atomic add
        // is the only access.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                p, delta,
            )
        };
    }
}

/// One word of `sl_sockmark` (a slot's count, or the validity word).
#[inline(always)]
fn mark_word(index: u32) -> Option<u64> {
    SOCK_MARKS
        .get_ptr(index)
        // SAFETY: an array slot, valid for the program run; one word.
        .map(|p| unsafe { core::ptr::read_volatile(p) })
}

/// The count of `slot` in `sl_sockmark` (a plain read: another CPU may
/// be changing it, but not by an entry of the caller's own socket).
#[inline(always)]
pub fn sock_mark(slot: u32) -> u64 {
    mark_word(slot).unwrap_or(0)
}

/// What `sl_sockmark` says about the TCP sockets counted in `slot`.
pub enum SockMarks {
    /// The counts are not valid: look the socket up.
    Unknown,
    /// Valid, and `slot` counts none: the socket has no entry.
    Unmarked,
    /// Valid, and `slot` counts some: every TCP entry is counted.
    Marked,
}

/// Whether `sl_sockmark`'s counts are valid (its validity word is 1).
#[inline(always)]
pub fn sock_marks_valid() -> bool {
    mark_word(sluice_common::socket::MARKS_VALID) == Some(1)
}

/// What taking the `sl_socktab` slot of a socket did.
pub enum Claim {
    /// The slot was free: the socket's entry is in it now (count it).
    Taken,
    /// The socket held it already (it connected again): entry rewritten,
    /// counted once already.
    Again,
    /// Another socket holds it.
    Busy,
}

/// One atomic compare-and-swap of a slot's cookie word: whether it held
/// `old` (and now holds `new`), and what it held.
#[inline(always)]
fn swap_cookie(slot: *mut SockSlot, old: u64, new: u64) -> (u64, bool) {
    // SAFETY: `slot` is an array element, valid for the program run; its
    // cookie word is only ever changed by compare-and-swap (here, and by
    // the agent through its mapping).
    unsafe {
        core::intrinsics::atomic_cxchg::<
            u64,
            { core::intrinsics::AtomicOrdering::SeqCst },
            { core::intrinsics::AtomicOrdering::SeqCst },
        >(core::ptr::addr_of_mut!((*slot).cookie), old, new)
    }
}

/// Takes `cookie`'s `sl_socktab` slot for `entry`. The cookie word goes
/// from 0 (or from `cookie`, a socket connecting again) to `cookie` with
/// `SOCK_SLOT_BUSY` set, atomically (two sockets with one slot on two
/// CPUs: one wins); then the entry is written and the busy bit cleared
/// by another compare-and-swap, so that the agent, which skips a busy
/// slot, never reads a cookie with another socket's entry.
#[inline(always)]
pub fn sock_table_claim(cookie: u64, entry: &SockEntry) -> Claim {
    let Some(p) = SOCK_TABLE.get_ptr_mut(sluice_common::socket::table_slot(cookie)) else {
        return Claim::Busy;
    };
    let busy = cookie | SOCK_SLOT_BUSY;
    let (old, won) = swap_cookie(p, 0, busy);
    let claim = if won {
        Claim::Taken
    } else if old == cookie && swap_cookie(p, cookie, busy).1 {
        Claim::Again
    } else {
        return Claim::Busy;
    };
    // SAFETY: as in `swap_cookie`; the slot is this socket's, busy.
    unsafe { (*p).entry = *entry };
    swap_cookie(p, busy, cookie);
    claim
}

/// Whether a socket held its `sl_socktab` slot when it gave it back.
#[derive(PartialEq, Eq)]
pub enum Held {
    /// It did not (or the agent moved it: the entry is in `sl_sock`).
    No,
    /// It did; the slot is free.
    Yes,
    /// The agent was moving it: the slot is free, and the caller deletes
    /// the `sl_sock` copy the agent may have made (the agent deletes one
    /// it makes later).
    Moving,
}

/// Gives `cookie`'s `sl_socktab` slot back if the socket holds it (its
/// cookie word goes to 0 atomically). Only a close may take a slot the
/// agent is moving (`moving`); a connect leaves such a slot to the agent.
/// The agent may hand a slot it could not move back to its socket while
/// a close reads it: read again, a few times.
#[inline(always)]
pub fn sock_table_release(cookie: u64, moving: bool) -> Held {
    let Some(p) = SOCK_TABLE.get_ptr_mut(sluice_common::socket::table_slot(cookie)) else {
        return Held::No;
    };
    for _ in 0..3 {
        // SAFETY: as in `swap_cookie`; one word read.
        let now = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*p).cookie)) };
        let held = if now == cookie {
            Held::Yes
        } else if moving && now == cookie | SOCK_SLOT_MOVING {
            Held::Moving
        } else {
            return Held::No;
        };
        if swap_cookie(p, now, 0).1 {
            return held;
        }
    }
    Held::No
}

/// The `sl_socktab` entry of the socket with `cookie`, if it holds its
/// slot (a copy; only the socket itself writes it, and not while it makes
/// this call), and whether the agent is moving it.
#[inline(always)]
pub fn sock_table_entry(cookie: u64) -> Option<(SockEntry, bool)> {
    let p = SOCK_TABLE.get_ptr(sluice_common::socket::table_slot(cookie))?;
    // SAFETY: an array element, valid for the program run; copied at once.
    unsafe {
        let now = core::ptr::read_volatile(core::ptr::addr_of!((*p).cookie));
        if now & !SOCK_SLOT_MOVING != cookie {
            return None;
        }
        Some(((*p).entry, now != cookie))
    }
}

/// `sl_sockmark`'s answer for `slot`.
#[inline(always)]
pub fn sock_marks(slot: u32) -> SockMarks {
    if !sock_marks_valid() {
        return SockMarks::Unknown;
    }
    match mark_word(slot) {
        Some(0) => SockMarks::Unmarked,
        Some(_) => SockMarks::Marked,
        None => SockMarks::Unknown,
    }
}

/// Whether every pod's flows are the socket programs' (see
/// `CFG_F_PODS_ON_SOCKETS`): one array slot, one bit.
#[inline(always)]
pub fn pods_on_sockets() -> bool {
    // SAFETY: array slot 0 always exists; one field read at once.
    CONFIG
        .get_ptr(0)
        .is_some_and(|p| unsafe { (*p).flags() } & CFG_F_PODS_ON_SOCKETS != 0)
}

/// Takes `CFG_F_PODS_ON_SOCKETS` away. Called when the TC path starts a
/// flow without SNAT from a pod (a socket connected before the socket
/// programs served it, whose conntrack entry expired; a socket left
/// unbalanced): its replies need reverse NAT on the pod's device, so
/// `sl_egress_pod` must look again from its first reply on. The agent sees
/// the bit clear at its next conntrack scan and waits for the flow to end
/// before it sets it again. A plain store of the flags word: every writer
/// on this side only clears the bit, and the agent checks after it sets
/// it that no flow began meanwhile.
#[inline(always)]
fn leave_sockets() {
    if let Some(p) = CONFIG.get_ptr_mut(0) {
        // SAFETY: array slot 0 always exists; one word read and written.
        unsafe {
            let flags = (*p).flags();
            (*p).set_flags(flags & !CFG_F_PODS_ON_SOCKETS);
        }
    }
}

/// Whether a new flow of the TC path without SNAT from `src` (entered
/// through `ifindex`) is a pod's, asked only while the socket programs
/// serve pods (`CFG_F_SOCK_PODS`): its entries are then marked `CT_F_POD`,
/// and once they are in, `pod_flow_recorded` takes the bit away. A
/// separate BPF function: its key stays off the caller's frame.
#[inline(never)]
pub fn new_flow_from_v4(src: u32, ifindex: u32) -> bool {
    config().flags() & CFG_F_SOCK_PODS != 0 && inside_v4(src, ifindex)
}

/// `new_flow_from_v4` for IPv6 (the key is built in `key`).
#[inline(always)]
pub fn new_flow_from_v6(key: &mut Key<[u8; 16]>, src: &[u8; 16], ifindex: u32) -> bool {
    config().flags() & CFG_F_SOCK_PODS != 0 && inside_v6(key, src, ifindex)
}

/// A pod's flow is recorded (marked `CT_F_POD`): the bit goes if set.
/// After the insert, so that an agent that sets the bit meanwhile either
/// finds the marked entry when it reads conntrack again, or has set it
/// before this read and sees it gone.
#[inline(always)]
pub fn pod_flow_recorded() {
    if pods_on_sockets() {
        leave_sockets();
    }
}

/// Whether `client` is within the source ranges of service port `svc_id`.
#[inline(always)]
pub fn source_allowed(svc_id: u32, client: [u8; 4]) -> bool {
    let key = Key {
        prefix_len: SrcRange4::prefix_len(32),
        data: SrcRange4::new(svc_id, client),
    };
    SOURCE_RANGES_V4.get(&key).is_some()
}

/// Whether `client` is within the source ranges of service port `svc_id`
/// (IPv6; the key is built in `key`, off the stack).
#[inline(always)]
pub fn source_allowed6(key: &mut Key<SrcRange6>, svc_id: u32, client: &[u8; 16]) -> bool {
    key.prefix_len = SrcRange6::prefix_len(128);
    key.data.svc_id = svc_id.to_be_bytes();
    key.data.addr = *client;
    SOURCE_RANGES_V6.get(&*key).is_some()
}

/// Whether a packet from IPv4 `src` that entered through device `ifindex`
/// comes from one of the cluster's own pods (local-traffic detection: the
/// device in `sl_localif`, or the source in `sl_local4`; both empty
/// without detection). A separate BPF function: its key stays off the
/// caller's frame.
#[inline(never)]
pub fn inside_v4(src: u32, ifindex: u32) -> bool {
    if LOCAL_IFS.get_ptr(ifindex).is_some() {
        return true;
    }
    let key = Key {
        prefix_len: 32,
        data: src.to_ne_bytes(),
    };
    LOCAL_V4.get(&key).is_some()
}

/// `inside_v4` for IPv6 (the key is built in `key`, off the stack).
#[inline(always)]
pub fn inside_v6(key: &mut Key<[u8; 16]>, src: &[u8; 16], ifindex: u32) -> bool {
    if LOCAL_IFS.get_ptr(ifindex).is_some() {
        return true;
    }
    key.prefix_len = 128;
    key.data = *src;
    LOCAL_V6.get(&*key).is_some()
}

/// What `sl_svcnet4` says of IPv4 address `dst` (`SVCNET_*`, 0: outside
/// the service address space). An address outside the prefixes of
/// `sl_svcnetsum4` (any pod's, on the way to another pod) is outside
/// without the LPM lookup. A separate BPF function: its key stays off the
/// caller's frame.
#[inline(never)]
pub fn svcnet_v4(dst: u32) -> u8 {
    if !may_be_service_net_v4(dst.to_ne_bytes()) {
        return 0;
    }
    let key = Key {
        prefix_len: 32,
        data: dst.to_ne_bytes(),
    };
    SVCNET_V4.get(&key).copied().unwrap_or(0)
}

/// `svcnet_v4` for IPv6 (the key is built in `key`, off the stack).
#[inline(always)]
pub fn svcnet_v6(key: &mut Key<[u8; 16]>, dst: &[u8; 16]) -> u8 {
    key.prefix_len = 128;
    key.data = *dst;
    SVCNET_V6.get(&*key).copied().unwrap_or(0)
}
