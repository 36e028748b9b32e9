//! Packets arriving at the node: service frontends get DNAT.
//!
//! 1. Not IPv4 TCP/UDP, or not a frontend (no master entry): pass, one
//!    hash lookup spent.
//! 2. A forward conntrack entry exists: follow it to its backend (even a
//!    terminating one) unless the backend or the frontend's owner changed,
//!    or a SYN shows a new connection on a closed or non-active entry.
//! 3. Otherwise pick a slot by flow hash among the active backends, or the
//!    terminating-but-serving ones when none is active; none at all means
//!    reject (RST / ICMP port unreachable).

use aya_ebpf::{bindings::BPF_ANY, helpers::bpf_ktime_get_ns, programs::TcContext};
use sluice_common::{
    conntrack::{CT_F_RST, CT_F_SYN, CT_F_TX_CLOSING, CT_REFRESH_NS},
    hash::pick_slot,
    service::SVC_F_DROP_EMPTY,
    Backend, BackendState, CtEntry, CtKind, Stat, Svc4Key, SvcValue, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::{
    error::{Error, Verdict},
    flow::{Flow4, Parsed},
    hash,
    headers::{TCP_FIN, TCP_RST, TCP_SYN},
    maps::{self, count, CONNTRACK_V4},
    nat::{self, Side},
    reject,
};

enum Tracked {
    /// Keep sending the flow to this backend.
    Follow(Backend),
    /// Treat the packet as the first of a new flow.
    Reselect,
    /// The flow's backend is gone mid-connection: reset it.
    Reset,
}

#[inline(always)]
pub fn handle(ctx: &TcContext) -> Result<Verdict, Error> {
    let flow = match Flow4::parse(ctx)? {
        Parsed::Flow(flow) => flow,
        Parsed::Fragment => {
            count(Stat::Fragment);
            return Ok(Verdict::Next);
        }
        Parsed::Other => return Ok(Verdict::Next),
    };
    let Some(master) = maps::service(&Svc4Key::new(flow.dst, flow.dport, flow.proto, 0)) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = flow.ct_key();

    let mut reselected = false;
    if let Some(entry) = CONNTRACK_V4.get_ptr_mut(key) {
        // SAFETY: pointer from a successful lookup; copied at once.
        let ct = unsafe { *entry };
        if ct.kind == CtKind::Forward as u8 {
            match judge(&flow, &master, &ct) {
                Tracked::Follow(backend) => {
                    let flags = ct.flags | tcp_bits(&flow);
                    if flags != ct.flags || now.wrapping_sub(ct.last_seen_ns) > CT_REFRESH_NS {
                        // SAFETY: the entry stays valid for this program
                        // run; a racing writer only loses a refresh.
                        unsafe {
                            (*entry).flags = flags;
                            (*entry).last_seen_ns = now;
                        }
                    }
                    nat::rewrite(ctx, &flow, Side::Dst, backend.addr_v4(), backend.port)?;
                    count(Stat::Established);
                    return Ok(Verdict::Next);
                }
                Tracked::Reset => {
                    count(Stat::StaleReset);
                    return reject::tcp_reset(ctx, &flow);
                }
                Tracked::Reselect => reselected = true,
            }
        }
    }
    new_flow(ctx, &flow, &master, now, reselected)
}

/// Decides what a tracked flow's packet gets.
#[inline(always)]
fn judge(flow: &Flow4, master: &SvcValue, ct: &CtEntry) -> Tracked {
    match maps::backend(ct.backend_id) {
        Some(b) if b.svc_id == ct.svc_id && master.svc_id == ct.svc_id => {
            // A SYN on a finished flow, or to a backend that no longer takes
            // new flows, starts a new connection (source-port reuse).
            if flow.is_syn() && (ct.is_closing() || b.state != BackendState::Active as u8) {
                Tracked::Reselect
            } else {
                Tracked::Follow(b)
            }
        }
        // The backend was removed, or the frontend now belongs to another
        // service: a new connection or a UDP packet gets a fresh pick, an
        // established TCP connection is reset.
        _ if flow.is_syn() || flow.proto == IPPROTO_UDP => Tracked::Reselect,
        _ => Tracked::Reset,
    }
}

/// Conntrack flag bits this client packet contributes.
#[inline(always)]
fn tcp_bits(flow: &Flow4) -> u8 {
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

#[inline(always)]
fn new_flow(
    ctx: &TcContext,
    flow: &Flow4,
    master: &SvcValue,
    now: u64,
    reselected: bool,
) -> Result<Verdict, Error> {
    let (first, n) = if master.active > 0 {
        (1, master.active)
    } else if master.fallback > 0 {
        (1 + master.active, master.fallback)
    } else if master.flags & SVC_F_DROP_EMPTY != 0 {
        count(Stat::NoBackendDrop);
        return Ok(Verdict::Drop);
    } else {
        count(Stat::NoBackend);
        return if flow.proto == IPPROTO_TCP {
            reject::tcp_reset(ctx, flow)
        } else {
            reject::icmp_port_unreachable(ctx, flow)
        };
    };
    let slot = pick_slot(hash::flow(flow, maps::hash_seed()), first, n);
    let slot = maps::service(&Svc4Key::new(flow.dst, flow.dport, flow.proto, slot))
        .ok_or(Error::Dangling)?;
    let backend = maps::backend(slot.backend_id).ok_or(Error::Dangling)?;
    let backend_addr = backend.addr_v4();

    let forward = CtEntry {
        last_seen_ns: now,
        backend_id: slot.backend_id,
        svc_id: master.svc_id,
        nat_addr: v4_in_16(backend_addr),
        nat_port: backend.port,
        kind: CtKind::Forward as u8,
        flags: tcp_bits(flow),
        _pad: [0; 4],
    };
    let reply_key =
        sluice_common::Ct4Key::new(backend_addr, flow.src, backend.port, flow.sport, flow.proto);
    let reply = CtEntry {
        last_seen_ns: now,
        backend_id: slot.backend_id,
        svc_id: master.svc_id,
        nat_addr: v4_in_16(flow.dst),
        nat_port: flow.dport,
        kind: CtKind::Reply as u8,
        flags: 0,
        _pad: [0; 4],
    };
    // The reply entry goes in first: the backend cannot answer before the
    // rewritten packet leaves this program.
    if CONNTRACK_V4
        .insert(reply_key, reply, BPF_ANY as u64)
        .is_err()
        || CONNTRACK_V4
            .insert(flow.ct_key(), forward, BPF_ANY as u64)
            .is_err()
    {
        count(Stat::CtInsertFailed);
    }
    nat::rewrite(ctx, flow, Side::Dst, backend_addr, backend.port)?;
    count(if reselected {
        Stat::Reselected
    } else {
        Stat::NewFlow
    });
    Ok(Verdict::Next)
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
