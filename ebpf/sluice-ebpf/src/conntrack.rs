//! Conntrack bookkeeping shared by both directions.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use sluice_common::{
    conntrack::{
        CT_F_RST, CT_F_RX_CLOSING, CT_F_SEEN_REPLY, CT_F_SYN, CT_F_TX_CLOSING, CT_REFRESH_NS,
    },
    CtEntry, CtKind, IPPROTO_TCP,
};

use crate::{
    flow::Flow4,
    headers::{TCP_FIN, TCP_RST, TCP_SYN},
    maps::CONNTRACK_V4,
};

/// Conntrack flag bits a client packet contributes.
#[inline(always)]
pub fn tcp_bits(flow: &Flow4) -> u8 {
    if flow.proto != IPPROTO_TCP {
        return 0;
    }
    let mut bits = 0;
    if flow.tcp_flags & TCP_SYN != 0 {
        bits |= CT_F_SYN;
    }
    if flow.tcp_flags & TCP_FIN != 0 {
        bits |= CT_F_TX_CLOSING;
    }
    if flow.tcp_flags & TCP_RST != 0 {
        bits |= CT_F_RST;
    }
    bits
}

/// Records a backend packet on a reply entry, and on its forward entry
/// what only the reply direction sees (the backend answered, sent FIN or
/// RST), at most once per `CT_REFRESH_NS` unless the flags change.
#[inline(always)]
pub fn note_reply(flow: &Flow4, entry: *mut CtEntry) {
    // SAFETY: the caller found the entry; fields are copied at once.
    let (old_flags, last_seen, backend_id) =
        unsafe { ((*entry).flags, (*entry).last_seen_ns, (*entry).backend_id) };
    let mut flags = old_flags | CT_F_SEEN_REPLY;
    if flow.has_tcp_flag(TCP_FIN) {
        flags |= CT_F_RX_CLOSING;
    }
    if flow.has_tcp_flag(TCP_RST) {
        flags |= CT_F_RST;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if flags == old_flags && now.wrapping_sub(last_seen) <= CT_REFRESH_NS {
        return;
    }
    // SAFETY: the entry stays valid for this program run; racing writers
    // only lose a refresh.
    unsafe {
        (*entry).flags = flags;
        (*entry).last_seen_ns = now;
    }
    // SAFETY: as above.
    let forward_key = unsafe { (*entry).forward_key_of_reply(flow.proto) };
    if let Some(fwd) = CONNTRACK_V4.get_ptr_mut(forward_key) {
        // SAFETY: as above; only bits are added.
        unsafe {
            if (*fwd).kind == CtKind::Forward as u8 && (*fwd).backend_id == backend_id {
                (*fwd).flags |= flags & (CT_F_SEEN_REPLY | CT_F_RX_CLOSING | CT_F_RST);
                (*fwd).last_seen_ns = now;
            }
        }
    }
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
