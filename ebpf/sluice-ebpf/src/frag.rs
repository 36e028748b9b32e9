//! Fragmented datagrams (after Cilium's `ipv4_handle_fragmentation` and
//! `ipv6_handle_fragmentation`, written for these maps).
//!
//! Only a datagram's first fragment carries its TCP/UDP header. Both TC
//! programs record the ports of every first fragment they see in
//! `sl_frag4`/`sl_frag6`, keyed by the datagram's IP identity (source,
//! destination, identification, protocol), before any rewrite; a later
//! fragment passing the same hook looks its ports up and so becomes a
//! packet of the same flow, marked so that the rewrites touch only its IP
//! addresses (`nat.rs`, `nat6.rs`): it has no L4 header, and the L4
//! checksum the first fragment's rewrite updated covers the whole datagram.
//!
//! Recording every first fragment, service or not, keeps this before the
//! service lookup (the same lookups then decide for all fragments) and
//! costs one LRU insert per fragmented datagram. A later fragment whose
//! first fragment was not seen here (reordered, or evicted) cannot be
//! told apart from any other traffic: it passes untouched
//! (`fragment_unknown`).
//!
//! Separate BPF functions with few, small arguments: the IPv4 path runs in
//! a frame that is nearly full.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::bindings::BPF_ANY;
use sluice_common::{Frag4Key, FragPorts, Stat};

use crate::{
    flow6::{FRAG_FIRST, FRAG_NONE},
    maps::{count, Scratch6, FRAGMENTS_V4, FRAGMENTS_V6},
};

/// Records the ports of an IPv4 first fragment. `id_proto` is the IP
/// identification (host order) shifted left by 8 and the protocol;
/// `ports` the source port shifted left by 16 and the destination port.
#[inline(never)]
pub fn record4(src: u32, dst: u32, id_proto: u32, ports: u32) {
    let key = Frag4Key {
        src: src.to_ne_bytes(),
        dst: dst.to_ne_bytes(),
        id: (id_proto >> 8) as u16,
        proto: id_proto as u8,
        _pad: 0,
    };
    let ports = FragPorts {
        sport: (ports >> 16) as u16,
        dport: ports as u16,
    };
    let _ = FRAGMENTS_V4.insert(key, ports, BPF_ANY as u64);
    count(Stat::Fragment);
}

/// The ports of the datagram an IPv4 later fragment belongs to, packed as
/// in `record4`; 0 if its first fragment was not seen.
#[inline(never)]
pub fn ports4(src: u32, dst: u32, id_proto: u32) -> u32 {
    let key = Frag4Key {
        src: src.to_ne_bytes(),
        dst: dst.to_ne_bytes(),
        id: (id_proto >> 8) as u16,
        proto: id_proto as u8,
        _pad: 0,
    };
    match FRAGMENTS_V4.get_ptr(key) {
        // SAFETY: pointer from a successful lookup; copied at once.
        Some(p) => unsafe { ((*p).sport as u32) << 16 | (*p).dport as u32 },
        None => 0,
    }
}

/// For a packet with an IPv6 fragment header (`s.flow.frag` set by the
/// parser): records a first fragment's ports, or fills in a later
/// fragment's. Returns false for a later fragment whose first fragment was
/// not seen. The key is built in `s.frag_key`, off the stack.
#[inline(never)]
pub fn track6(s: &mut Scratch6) -> bool {
    let flow = &mut s.flow;
    if flow.frag == FRAG_NONE {
        return true;
    }
    let key = &mut s.frag_key;
    key.src = flow.src;
    key.dst = flow.dst;
    key.id = flow.frag_id;
    key.proto = flow.proto;
    key._pad = [0; 3];
    if flow.frag == FRAG_FIRST {
        let ports = FragPorts {
            sport: flow.sport,
            dport: flow.dport,
        };
        let _ = FRAGMENTS_V6.insert(&*key, &ports, BPF_ANY as u64);
        count(Stat::Fragment);
        return true;
    }
    match FRAGMENTS_V6.get_ptr(&*key) {
        Some(p) => {
            // SAFETY: pointer from a successful lookup; copied at once.
            unsafe {
                flow.sport = (*p).sport;
                flow.dport = (*p).dport;
            }
            true
        }
        None => false,
    }
}
