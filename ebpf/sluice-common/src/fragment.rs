//! `sl_frag4` and `sl_frag6`: the ports of fragmented datagrams (LRU
//! hashes, after Cilium's `cilium_ipv4_frag_datagrams`).
//!
//! Only the first fragment of a datagram carries its TCP/UDP header. When
//! the datapath sees a first fragment it records the datagram's ports
//! under its IP identity (source, destination, IP identification,
//! protocol); a later fragment of the same datagram looks them up, takes
//! the flow of its first fragment and follows that flow's conntrack
//! entry, with only its IP addresses (and the IPv4 header checksum)
//! rewritten. Nothing deletes entries: a datagram's fragments follow each
//! other within microseconds, and the LRU evicts the oldest datagrams.

use crate::{assert_size, user_pod};

/// Key of `sl_frag4`: a datagram's IPv4 identity.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frag4Key {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// IP identification, host order.
    pub id: u16,
    pub proto: u8,
    pub _pad: u8,
}
assert_size!(Frag4Key, 12);

/// Key of `sl_frag6`: a datagram's IPv6 identity (the fragment header's
/// 32-bit identification; `proto` is the fragment header's next header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frag6Key {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Fragment identification, host order.
    pub id: u32,
    pub proto: u8,
    pub _pad: [u8; 3],
}
assert_size!(Frag6Key, 40);

/// Value of `sl_frag4` and `sl_frag6`: the ports of the datagram's first
/// fragment, as it was seen where it was recorded (before any rewrite).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragPorts {
    /// Host order.
    pub sport: u16,
    /// Host order.
    pub dport: u16,
}
assert_size!(FragPorts, 4);

user_pod!(Frag4Key, Frag6Key, FragPorts);
