//! `sl_hops4` and `sl_hops6`: host routing's route cache (`--host-routing`,
//! `route.rs`). A service packet that host routing hands into a pod, and a
//! backend's reply it hands back into the client's pod, need the pod's
//! device and the two MAC addresses of that hop: the answer of
//! `bpf_fib_lookup`, which costs more than the rest of the hand-over
//! together (the FIB walk, the neighbour lookup, and the 64-byte request
//! to clear and fill). The answer depends only on the destination (a pod
//! on this node), so the programs remember it per destination address
//! (LRU hashes) and ask the FIB again only when the entry is older than
//! `HOP_TTL_NS`, or when its device is no longer one of the pods'
//! (`sl_peer_devs`: the kernel drops a device that goes away from it, and
//! device indexes are handed out cyclically, so a gone pod's index does
//! not name another pod within the entry's life) or is the one the packet
//! came in through. Only resolved hops are remembered: a hop whose
//! neighbour is unknown goes through `bpf_redirect_neigh`, as before.
//!
//! Not pinned: each program generation has its own, filled by its own
//! packets (an empty cache only costs the lookups it would have saved).

use crate::{assert_size, user_pod};

/// How long a remembered hop is used before the FIB is asked again: the
/// bound on how long a route or neighbour change (a pod's device or MAC
/// replaced under the same address, within its veth's life) goes unseen.
pub const HOP_TTL_NS: u64 = 1_000_000_000;

/// Value of `sl_hops4` (key: the IPv4 destination, network-order bytes
/// read as a native `u32`) and `sl_hops6` (key: the 16-byte destination).
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

user_pod!(HopEntry);
