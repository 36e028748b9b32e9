//! `sl_hops4` and `sl_hops6`: host routing's route cache (`--host-routing`,
//! `route.rs`). A service packet that host routing hands into a pod, and a
//! backend's reply it hands back into the client's pod, need the pod's
//! device and the two MAC addresses of that hop: the answer of
//! `bpf_fib_lookup`, which cost more than the rest of the hand-over
//! together (the FIB walk, the neighbour lookup, and the 64-byte request
//! to clear and fill). The programs remember it (LRU hashes) per
//! destination address and device the packet came in through (an input
//! lookup: forwarding settings, VRFs and policy rules may depend on the
//! device; a pod's source address goes with its device), and ask the FIB
//! again when the entry is older than `HOP_TTL_NS` (or stamped ahead of
//! the clock), when its device is no longer one of the pods'
//! (`sl_peer_devs`: the kernel drops a device that goes away from it), or
//! when it is the device the packet came in through. The agent deletes
//! the entries that name a device before it enters that device in
//! `sl_peer_devs` (`Datapath::route_into`), so a device that reuses a
//! gone pod's index never inherits its hop. Only resolved hops are
//! remembered: a hop whose neighbour is unknown goes through
//! `bpf_redirect_neigh`, as before. Not remembered, so assumed absent
//! between pods on one node: policy rules on L4 ports and multipath
//! routes (the FIB would pick a nexthop by flow).
//!
//! Not pinned: each program generation has its own, filled by its own
//! packets (an empty cache only costs the lookups it would have saved).

use crate::{assert_size, user_pod};

/// How long a remembered hop is used before the FIB is asked again: the
/// bound on how long a route or neighbour change (a pod's device or MAC
/// replaced under the same address, within its veth's life) goes unseen.
pub const HOP_TTL_NS: u64 = 1_000_000_000;

/// Key of `sl_hops4`: an IPv4 destination and the device the packet came
/// in through.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hop4Key {
    pub dst: [u8; 4],
    pub ingress: u32,
}
assert_size!(Hop4Key, 8);

/// Key of `sl_hops6`: an IPv6 destination and the device the packet came
/// in through.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hop6Key {
    pub dst: [u8; 16],
    pub ingress: u32,
}
assert_size!(Hop6Key, 20);

/// Value of `sl_hops4` and `sl_hops6`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HopEntry {
    /// `CLOCK_MONOTONIC` nanoseconds (the coarse clock) of the FIB answer.
    pub stamp_ns: u64,
    /// The pod's device on the node (host side of its veth or netkit).
    pub out: u32,
    /// The pod's MAC address (the Ethernet destination).
    pub dmac: [u8; 6],
    /// The node side's MAC address (the Ethernet source).
    pub smac: [u8; 6],
}
assert_size!(HopEntry, 24);

user_pod!(Hop4Key, Hop6Key, HopEntry);
