//! Conntrack bookkeeping shared by both directions and both families.

use sluice_common::{
    conntrack::{
        CT_F_RST, CT_F_RX_CLOSING, CT_F_SEEN_REPLY, CT_F_SNAT, CT_F_SYN, CT_F_TX_CLOSING,
        CT_REFRESH_NS, CT_REUSE_IDLE_NS,
    },
    Ct4Key, Ct6Key, CtEntry, CtKind, IPPROTO_SCTP, IPPROTO_TCP,
};

use crate::{
    flow::Flow4,
    flow6::Flow6,
    headers::{SCTP_ABORT, SCTP_INIT, SCTP_SHUTDOWN_COMPLETE, TCP_FIN, TCP_RST, TCP_SYN},
    maps::{CONNTRACK_V4, CONNTRACK_V6},
};

/// Conntrack flag bits a client packet contributes.
#[inline(always)]
pub fn tcp_bits(flow: &Flow4) -> u8 {
    tcp_bits_of(flow.proto, flow.tcp_flags)
}

/// Conntrack flag bits of a client packet with `proto` and TCP `flags`
/// (for SCTP, the first chunk's type: see `sctp_bits`).
#[inline(always)]
pub fn tcp_bits_of(proto: u8, flags: u8) -> u8 {
    if proto == IPPROTO_SCTP {
        return sctp_bits(flags) | if flags == SCTP_INIT { CT_F_SYN } else { 0 };
    }
    if proto != IPPROTO_TCP {
        return 0;
    }
    let mut bits = 0;
    if flags & TCP_SYN != 0 {
        bits |= CT_F_SYN;
    }
    if flags & TCP_FIN != 0 {
        bits |= CT_F_TX_CLOSING;
    }
    if flags & TCP_RST != 0 {
        bits |= CT_F_RST;
    }
    bits
}

/// SCTP's end of an association, from either side: an ABORT, or the
/// SHUTDOWN COMPLETE that ends a graceful shutdown, marks the flow closed
/// (as a RST does; only the first chunk is read: both are sent alone or
/// last, and a missed one leaves the flow to its idle timeout).
#[inline(always)]
fn sctp_bits(chunk_type: u8) -> u8 {
    if chunk_type == SCTP_ABORT || chunk_type == SCTP_SHUTDOWN_COMPLETE {
        CT_F_RST
    } else {
        0
    }
}

/// Records a backend packet on a reply entry, and on its forward entry
/// what only the reply direction sees (the backend answered, sent FIN or
/// RST), at most once per `CT_REFRESH_NS` unless the flags change.
#[inline(always)]
pub fn note_reply(flow: &Flow4, entry: *mut CtEntry) {
    note_reply_at(flow, entry, crate::clock::now());
}

/// `note_reply` with the clock the caller read (`now`).
#[inline(always)]
pub fn note_reply_at(flow: &Flow4, entry: *mut CtEntry, now: u64) {
    let Some((flags, backend_id)) = refresh_reply(flow.proto, flow.tcp_flags, entry, now) else {
        return;
    };
    // SAFETY: the caller found the entry; the key is computed from a copy.
    let forward_key = unsafe { (*entry).forward_key_of_reply(flow.proto) };
    if let Some(fwd) = CONNTRACK_V4.get_ptr_mut(forward_key) {
        push_to_forward(fwd, backend_id, flags, now);
    }
}

/// `note_reply` for an IPv6 flow.
#[inline(always)]
pub fn note_reply6(flow: &Flow6, entry: *mut CtEntry) {
    note_reply6_at(flow, entry, crate::clock::now());
}

/// `note_reply6` with the clock the caller read (`now`).
#[inline(always)]
pub fn note_reply6_at(flow: &Flow6, entry: *mut CtEntry, now: u64) {
    let Some((flags, backend_id)) = refresh_reply(flow.proto, flow.tcp_flags, entry, now) else {
        return;
    };
    // SAFETY: as in `note_reply`.
    let forward_key = unsafe { (*entry).forward_key6_of_reply(flow.proto) };
    if let Some(fwd) = CONNTRACK_V6.get_ptr_mut(forward_key) {
        push_to_forward(fwd, backend_id, flags, now);
    }
}

/// Bits that say a flow has begun to end, in either direction: after any
/// of them a SYN-ACK on its tuple cannot belong to it.
const ENDING: u8 = CT_F_RST | CT_F_TX_CLOSING | CT_F_RX_CLOSING;

/// A backend's SYN-ACK (`flow`) that found the reply entry `entry`: false
/// when it belongs to a new connection reusing a finished service flow's
/// tuple: the client reused its port towards the backend's own address
/// after a service connection to the same backend had closed (RST or FIN
/// from either side; the forward entry carries both sides' bits) or its
/// forward entry was gone or is now another flow's (reselected to another
/// backend, or masqueraded). The stale reply entry is then removed and the
/// packet must pass untranslated, as netfilter lets a new connection
/// replace a closed one. A SYN-ACK of a live flow (its handshake, or a
/// retransmission) is recorded as `note_reply` records a backend packet,
/// on the forward entry the check found (one lookup, not two), and true:
/// it is translated. A separate BPF function, called for SYN-ACKs only.
#[inline(never)]
pub fn syn_reply(flow: &Flow4, entry: *mut CtEntry, now: u64) -> bool {
    // SAFETY: the caller found the entry; fields are copied at once.
    let (flags, backend_id, forward_key) = unsafe {
        (
            (*entry).flags,
            (*entry).backend_id,
            (*entry).forward_key_of_reply(flow.proto),
        )
    };
    let fwd = if flags & ENDING != 0 {
        None
    } else {
        CONNTRACK_V4.get_ptr_mut(forward_key)
    };
    // SAFETY: pointer from a successful lookup; fields read at once.
    let live =
        fwd.is_some_and(|f| unsafe { same_flow(&*f, backend_id) && (*f).flags & ENDING == 0 });
    if !live {
        let _ = CONNTRACK_V4.remove(flow.ct_key());
        return false;
    }
    if let (Some(f), Some((flags, backend_id))) =
        (fwd, refresh_reply(flow.proto, flow.tcp_flags, entry, now))
    {
        push_to_forward(f, backend_id, flags, now);
    }
    true
}

/// Whether a new flow to `backend`:`port` would take the reply tuple of
/// a live flow of another frontend: Linux gives one local port to several
/// connections with different peers, so a client may hold live
/// connections from one port to two services whose backend is the same,
/// and after DNAT both have one tuple. The live flow keeps it (netfilter
/// would remap the new connection's source port; the caller masquerades
/// it). Not a clash, and the new flow replaces the entry: a reply entry of
/// the same frontend (the flow itself, reselected), of a flow that is
/// over (a RST, or a FIN each way: a half-closed flow still needs its
/// replies), or a stale one whose forward entry is gone or now belongs to
/// another flow (another backend, or masqueraded). A separate BPF
/// function, called for new flows only.
#[inline(never)]
pub fn clashes4(flow: &Flow4, backend: [u8; 4], port: u16) -> bool {
    let key = Ct4Key::new(backend, flow.src, port, flow.sport, flow.proto);
    let Some(entry) = CONNTRACK_V4.get_ptr(key) else {
        return false;
    };
    // SAFETY: pointer from a successful lookup; fields copied at once.
    let (kind, flags, backend_id, nat_addr, nat_port, forward_key) = unsafe {
        (
            (*entry).kind,
            (*entry).flags,
            (*entry).backend_id,
            (*entry).nat_addr,
            (*entry).nat_port,
            (*entry).forward_key_of_reply(flow.proto),
        )
    };
    if kind != CtKind::Reply as u8
        || flags & CT_F_SNAT != 0
        || (nat_addr == v4_in_16(flow.dst) && nat_port == flow.dport)
    {
        return false;
    }
    CONNTRACK_V4
        .get_ptr(forward_key)
        // SAFETY: pointer from a successful lookup; fields read at once.
        .is_some_and(|fwd| unsafe { live_forward(&*fwd, backend_id, flags) })
}

/// `clashes4` for IPv6 (`key`: scratch space, clobbered).
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(never)]
pub fn clashes6(flow: &Flow6, backend: &[u8; 16], port: u16, key: &mut Ct6Key) -> bool {
    flow.reply_ct_key_into(key, backend, port);
    let Some(entry) = CONNTRACK_V6.get_ptr(&*key) else {
        return false;
    };
    // SAFETY: pointer from a successful lookup; fields read at once.
    let (kind, flags, backend_id, nat_port) = unsafe {
        (
            (*entry).kind,
            (*entry).flags,
            (*entry).backend_id,
            (*entry).nat_port,
        )
    };
    // SAFETY: as above.
    let same_frontend = nat_port == flow.dport && unsafe { (*entry).nat_addr } == flow.dst;
    if kind != CtKind::Reply as u8 || flags & CT_F_SNAT != 0 || same_frontend {
        return false;
    }
    // SAFETY: as above.
    *key = unsafe { (*entry).forward_key6_of_reply(flow.proto) };
    CONNTRACK_V6
        .get_ptr(&*key)
        // SAFETY: pointer from a successful lookup; fields read at once.
        .is_some_and(|fwd| unsafe { live_forward(&*fwd, backend_id, flags) })
}

/// Whether a reselected flow through the frontend `frontend`:`port` may
/// take over `reply`, found under its reply key, and `fwd`, under its
/// forward key, in place (`snat::RECORD_REUSE`), at `now`: they are the
/// entries an earlier flow on the same tuple left, through the same
/// frontend, to the same backend address and port (the reply key says
/// so), neither SNATed, both used within `CT_REUSE_IDLE_NS`. The end state
/// is the one the inserts would leave (`clashes4/6` never calls the same
/// frontend's entry a clash, and the retry replaces both); anything else
/// is left to the inserts and their checks.
#[inline(always)]
pub fn reusable(reply: &CtEntry, fwd: &CtEntry, frontend: &[u8; 16], port: u16, now: u64) -> bool {
    reply.kind == CtKind::Reply as u8
        && reply.flags & CT_F_SNAT == 0
        && reply.nat_addr == *frontend
        && reply.nat_port == port
        && fwd.kind == CtKind::Forward as u8
        && fwd.flags & CT_F_SNAT == 0
        && now.saturating_sub(reply.last_seen_ns) < CT_REUSE_IDLE_NS
        && now.saturating_sub(fwd.last_seen_ns) < CT_REUSE_IDLE_NS
}

/// Whether `fwd` is the live forward entry of the flow whose reply entry
/// names `backend_id` and carries `reply_flags`: the same flow (a forward
/// entry to that backend, not masqueraded) that is not over.
#[inline(always)]
fn live_forward(fwd: &CtEntry, backend_id: u32, reply_flags: u8) -> bool {
    const BOTH_FINS: u8 = CT_F_TX_CLOSING | CT_F_RX_CLOSING;
    let flags = fwd.flags | reply_flags;
    same_flow(fwd, backend_id) && flags & CT_F_RST == 0 && flags & BOTH_FINS != BOTH_FINS
}

/// Whether `fwd`, found under the forward key a reply entry names, is
/// that flow's forward entry: one to the reply entry's backend, not
/// masqueraded. After a reselection (the client reused the tuple and the
/// flow went to another backend) the old backend's reply entry is stale.
#[inline(always)]
fn same_flow(fwd: &CtEntry, backend_id: u32) -> bool {
    fwd.kind == CtKind::Forward as u8 && fwd.backend_id == backend_id && fwd.flags & CT_F_SNAT == 0
}

/// `syn_reply` for IPv6 (`key`: scratch space, the reply entry's key
/// on entry, clobbered). The map calls take the key by reference on
/// purpose: a copy would put the 40-byte key on the stack.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(never)]
pub fn syn_reply6(flow: &Flow6, entry: *mut CtEntry, key: &mut Ct6Key, now: u64) -> bool {
    // SAFETY: as in `syn_reply`.
    let (flags, backend_id) = unsafe { ((*entry).flags, (*entry).backend_id) };
    let fwd = if flags & ENDING != 0 {
        None
    } else {
        // SAFETY: as in `syn_reply`.
        *key = unsafe { (*entry).forward_key6_of_reply(flow.proto) };
        CONNTRACK_V6.get_ptr_mut(&*key)
    };
    // SAFETY: pointer from a successful lookup; fields read at once.
    let live =
        fwd.is_some_and(|f| unsafe { same_flow(&*f, backend_id) && (*f).flags & ENDING == 0 });
    if !live {
        flow.ct_key_into(key);
        let _ = CONNTRACK_V6.remove(&*key);
        return false;
    }
    if let (Some(f), Some((flags, backend_id))) =
        (fwd, refresh_reply(flow.proto, flow.tcp_flags, entry, now))
    {
        push_to_forward(f, backend_id, flags, now);
    }
    true
}

/// Updates a reply entry for one backend packet at `now`. Returns the new
/// flags and the entry's backend when the forward entry should hear of it
/// (at the same `now`), `None` when nothing changed within
/// `CT_REFRESH_NS`.
#[inline(always)]
fn refresh_reply(proto: u8, tcp_flags: u8, entry: *mut CtEntry, now: u64) -> Option<(u8, u32)> {
    // SAFETY: the caller found the entry; fields are copied at once.
    let (old_flags, last_seen, backend_id) =
        unsafe { ((*entry).flags, (*entry).last_seen_ns, (*entry).backend_id) };
    let mut flags = old_flags | CT_F_SEEN_REPLY;
    if proto == IPPROTO_TCP && tcp_flags & TCP_FIN != 0 {
        flags |= CT_F_RX_CLOSING;
    }
    if proto == IPPROTO_TCP && tcp_flags & TCP_RST != 0 {
        flags |= CT_F_RST;
    }
    if proto == IPPROTO_SCTP {
        flags |= sctp_bits(tcp_flags);
    }
    if flags == old_flags && now.saturating_sub(last_seen) <= CT_REFRESH_NS {
        return None;
    }
    // SAFETY: the entry stays valid for this program run; racing writers
    // only lose a refresh.
    unsafe {
        (*entry).flags = flags;
        (*entry).last_seen_ns = now;
    }
    Some((flags, backend_id))
}

/// Adds the reply direction's bits to a forward entry of the same backend.
#[inline(always)]
fn push_to_forward(fwd: *mut CtEntry, backend_id: u32, flags: u8, now: u64) {
    // SAFETY: as in `refresh_reply`; only bits are added.
    unsafe {
        if (*fwd).kind == CtKind::Forward as u8 && (*fwd).backend_id == backend_id {
            (*fwd).flags |= flags & (CT_F_SEEN_REPLY | CT_F_RX_CLOSING | CT_F_RST);
            (*fwd).last_seen_ns = now;
        }
    }
}

/// The frontend (address as 16 bytes, port) a backend's packet gets back
/// as its source, if `entry` is the reply entry of a flow DNATed without
/// SNAT (SNATed flows are turned back on the way in, `snat::reply`).
#[inline(always)]
pub fn reverse_nat_of(entry: *mut CtEntry) -> Option<([u8; 16], u16)> {
    // SAFETY: the caller found the entry; fields are copied at once.
    let (kind, flags, addr, port) = unsafe {
        (
            (*entry).kind,
            (*entry).flags,
            (*entry).nat_addr,
            (*entry).nat_port,
        )
    };
    (kind == CtKind::Reply as u8 && flags & CT_F_SNAT == 0).then_some((addr, port))
}

#[inline(always)]
pub fn v4(a: &[u8; 16]) -> [u8; 4] {
    [a[0], a[1], a[2], a[3]]
}

#[inline(always)]
pub fn v4_in_16(a: [u8; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0] = a[0];
    out[1] = a[1];
    out[2] = a[2];
    out[3] = a[3];
    out
}
