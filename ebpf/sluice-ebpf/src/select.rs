//! What a packet to a frontend gets, independent of the address family:
//! the verdict on a tracked flow, and which slots a new flow may pick.
//! `ingress.rs` (IPv4) and `ingress6.rs` (IPv6) share these so that
//! graceful termination follows one set of rules.
//!
//! Map calls take references on purpose (clippy would pass by value): a
//! value copy would put the 40-byte keys back on the stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::bindings::BPF_ANY;
use sluice_common::{
    hash::pick_slot,
    service::{SVC_F_AFFINITY, SVC_F_DROP_EMPTY, SVC_F_MAGLEV, SVC_F_SNAT},
    Affinity4Key, AffinityValue, Backend, BackendState, Svc4Key, SvcValue, IPPROTO_TCP,
};

use crate::{
    flow::Flow4,
    flow6::Flow6,
    headers::{TCP_ACK, TCP_SYN},
    maglev,
    maps::{self, Scratch6, AFFINITY_V4, AFFINITY_V6},
};

pub enum Tracked {
    /// Keep sending the flow to this backend.
    Follow(&'static Backend),
    /// Treat the packet as the first of a new flow.
    Reselect,
    /// The flow's backend is gone mid-connection: reset it.
    Reset,
}

/// What `judge` needs to know about a packet, for either family.
pub trait Packet {
    /// A TCP SYN without ACK: the first packet of a new connection.
    fn is_syn(&self) -> bool;
    fn proto(&self) -> u8;
}

impl Packet for Flow4 {
    #[inline(always)]
    fn is_syn(&self) -> bool {
        Flow4::is_syn(self)
    }
    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }
}

impl Packet for Flow6 {
    #[inline(always)]
    fn is_syn(&self) -> bool {
        Flow6::is_syn(self)
    }
    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }
}

/// Decides what a packet of a tracked flow gets. (Generic rather than
/// taking `is_syn` as a value: computing it before the backend lookup
/// costs the IPv4 path a stack slot it does not have.)
#[inline(always)]
pub fn judge<P: Packet>(
    flow: &P,
    master: &SvcValue,
    backend_id: u32,
    svc_id: u32,
    ct_flags: u8,
) -> Tracked {
    let closing = sluice_common::conntrack::closing(ct_flags);
    match maps::backend(backend_id) {
        Some(b) if b.svc_id == svc_id && master.svc_id == svc_id => {
            // A SYN on a finished flow, or to a backend that no longer takes
            // new flows, starts a new connection (source-port reuse).
            if flow.is_syn() && (closing || b.state != BackendState::Active as u8) {
                Tracked::Reselect
            } else {
                Tracked::Follow(b)
            }
        }
        // The backend was removed, or the frontend now belongs to another
        // service: a new connection or a UDP packet gets a fresh pick, an
        // established TCP connection is reset. An SCTP packet gets a fresh
        // pick too: the new backend answers a packet of an association it
        // does not know with an ABORT (RFC 9260 8.4), SCTP's reset.
        _ if flow.is_syn() || flow.proto() != IPPROTO_TCP => Tracked::Reselect,
        _ => Tracked::Reset,
    }
}

/// Where a new flow may go.
pub enum Pick {
    /// `n` slots starting at `first`.
    Slots(u16, u16),
    /// Nothing selectable, drop-when-empty frontend.
    Drop,
    /// Nothing selectable: refuse (RST / port unreachable).
    Reject,
}

/// The active slots, or the terminating-but-serving ones when none is
/// active (KEP-1669 fallback); never the rest.
#[inline(always)]
pub fn candidates(master: &SvcValue) -> Pick {
    if master.active > 0 {
        Pick::Slots(1, master.active)
    } else if master.fallback > 0 {
        Pick::Slots(1 + master.active, master.fallback)
    } else if master.flags & SVC_F_DROP_EMPTY != 0 {
        Pick::Drop
    } else {
        Pick::Reject
    }
}

/// Whether backend `id` may take a new flow of `master`'s frontend: it
/// belongs to the frontend's service port and is active, or serving while
/// terminating when no backend is active. Affinity entries and Maglev
/// tables name backends by id; this is the check both go through, on every
/// hook.
#[inline(always)]
pub fn selectable(id: u32, master: &SvcValue) -> bool {
    match maps::backend(id) {
        Some(b) => {
            b.svc_id == master.svc_id
                && (b.state == BackendState::Active as u8
                    || (master.active == 0 && b.state == BackendState::TerminatingServing as u8))
        }
        None => false,
    }
}

/// The backend a client's session-affinity entry names, if the entry is
/// within the frontend's timeout and the backend may still take new flows
/// (0: none).
#[inline(always)]
pub fn sticky(entry: &AffinityValue, master: &SvcValue, now: u64) -> u32 {
    let (last_used, backend_id, svc_id) = (entry.last_used_ns, entry.backend_id, entry.svc_id);
    if now.saturating_sub(last_used) > u64::from(master.affinity_s) * 1_000_000_000 {
        return 0;
    }
    if svc_id == master.svc_id && selectable(backend_id, master) {
        backend_id
    } else {
        0
    }
}

/// A TCP segment other than an opening SYN, with no conntrack entry, to a
/// frontend that SNATs. Picking it up as a new flow would give it a fresh
/// SNAT port: a connection its backend never opened, which the backend
/// resets, and an entry that would shadow the real one. So it is dropped
/// (counted as `snat_failed`): if the flow's entry is being carried over
/// by an upgrade, the retransmission finds it; if it was lost, the
/// connection could not have survived anyway.
#[inline(always)]
pub fn orphan_snat_segment(proto: u8, tcp_flags: u8, master: &SvcValue) -> bool {
    proto == IPPROTO_TCP
        && !(tcp_flags & TCP_SYN != 0 && tcp_flags & TCP_ACK == 0)
        && master.flags & SVC_F_SNAT != 0
}

/// Set in `pick4`'s result when the client's session affinity chose.
pub const PICK_AFFINITY: u64 = 1 << 32;

/// The backend a new IPv4 flow of `master`'s frontend (in `scope`) takes,
/// the one selection of every hook that sees packets (`sl_ingress`,
/// `sl_xdp`): the client's session affinity while fresh and selectable,
/// else the Maglev table's pick, else the slot the flow hash `h` names
/// among the candidates (`candidates`, which the caller checked). The
/// backend id is in the low 32 bits (0: a slot is dangling),
/// `PICK_AFFINITY` says affinity chose. Nothing is written or counted
/// here (but `maglev_fallback`): a caller that hands the packet on after
/// picking leaves no trace, and the next hook picks the same. A
/// separate BPF function, context-free: its keys stay off the callers'
/// frames.
#[inline(never)]
pub fn pick4(flow: &Flow4, master: &SvcValue, scope: u8, h: u32, now: u64) -> u64 {
    if master.flags & SVC_F_AFFINITY != 0 {
        let id = match AFFINITY_V4.get_ptr(affinity_key(flow)) {
            // SAFETY: pointer from a successful lookup; read at once.
            Some(a) => sticky(unsafe { &*a }, master, now),
            None => 0,
        };
        if id != 0 && maps::backend(id).is_some() {
            return PICK_AFFINITY | id as u64;
        }
    }
    let by_table = if master.flags & SVC_F_MAGLEV != 0 {
        maglev::pick4(flow, master, scope)
    } else {
        0
    };
    if by_table != 0 {
        return by_table as u64;
    }
    let Pick::Slots(first, n) = candidates(master) else {
        return 0;
    };
    let slot = pick_slot(h, first, n);
    match maps::service(&Svc4Key::scoped(
        flow.dst, flow.dport, flow.proto, slot, scope,
    )) {
        Some(v) => v.backend_id as u64,
        None => 0,
    }
}

/// The session-affinity key of `flow`'s client and frontend.
#[inline(always)]
fn affinity_key(flow: &Flow4) -> Affinity4Key {
    Affinity4Key {
        client: flow.src,
        frontend: flow.dst,
        port: flow.dport,
        proto: flow.proto,
        _pad: 0,
    }
}

/// Records the backend of the client's new flow for its next ones. A
/// separate BPF function, off the callers' frames.
#[inline(never)]
pub fn remember4(flow: &Flow4, svc_id: u32, backend_id: u32, now: u64) {
    let value = AffinityValue {
        last_used_ns: now,
        backend_id,
        svc_id,
    };
    let _ = AFFINITY_V4.insert(affinity_key(flow), value, BPF_ANY as u64);
}

/// `pick4` for the IPv6 flow in `s` (`s.flow`), the one selection of
/// `sl_ingress6` and `sl_xdp`. Builds its keys in `s` (the affinity key
/// stays in `s.aff_key` for `remember6`). A separate BPF function.
#[inline(never)]
pub fn pick6(s: &mut Scratch6, master: &SvcValue, scope: u8, h: u32) -> u64 {
    if master.flags & SVC_F_AFFINITY != 0 {
        let key = &mut s.aff_key;
        key.client = s.flow.src;
        key.frontend = s.flow.dst;
        key.port = s.flow.dport;
        key.proto = s.flow.proto;
        key._pad = 0;
        let now = crate::clock::now();
        let id = match AFFINITY_V6.get_ptr(&*key) {
            // SAFETY: pointer from a successful lookup; read at once.
            Some(a) => sticky(unsafe { &*a }, master, now),
            None => 0,
        };
        if id != 0 {
            return PICK_AFFINITY | id as u64;
        }
    }
    if master.flags & SVC_F_MAGLEV != 0 {
        s.flow.svc_key_into(&mut s.svc_key, 0, scope);
        let id = maglev::pick6(&s.flow, &s.svc_key, master);
        if id != 0 {
            return id as u64;
        }
    }
    let Pick::Slots(first, n) = candidates(master) else {
        return 0;
    };
    s.flow
        .svc_key_into(&mut s.svc_key, pick_slot(h, first, n), scope);
    match maps::service6(&s.svc_key) {
        Some(v) => v.backend_id as u64,
        None => 0,
    }
}

/// Records the backend of the client's new IPv6 flow for its next ones
/// (the key `pick6` built is still in `s.aff_key`).
#[inline(never)]
pub fn remember6(s: &mut Scratch6, svc_id: u32, backend_id: u32) {
    let value = AffinityValue {
        last_used_ns: crate::clock::now(),
        backend_id,
        svc_id,
    };
    let _ = AFFINITY_V6.insert(&s.aff_key, &value, BPF_ANY as u64);
}
