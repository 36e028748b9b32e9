//! IPv6 packets arriving at the node: the IPv6 twin of `ingress.rs`, with
//! the same conntrack rules (`select.rs`) and the same maps' semantics
//! (`sl_svc6`, `sl_ct6`, the shared `sl_backends`).
//!
//! The IPv4 path runs in the program's own frame, so this path has only
//! what that frame leaves of the 512-byte stack: the flow and the map keys
//! live in the per-CPU `Scratch6`, and the work is split into BPF
//! functions (`handle` -> `new_flow` -> `record`/`nat6`/`reject6`) whose
//! frames stay small.
//!
//! Not done for IPv6 (see docs/maps.md): SNAT (so no hairpin: such a flow
//! is dropped and counted), source ranges and session affinity (the agent
//! never sets those flags on an IPv6 frontend; a frontend that has them is
//! refused new flows rather than served without them).
//!
//! Map calls take keys and values by reference on purpose (clippy would
//! pass them by value): a copy would put them back on the stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{__sk_buff, BPF_ANY},
    helpers::bpf_ktime_get_ns,
    programs::TcContext,
};
use sluice_common::{
    conntrack::CT_REFRESH_NS,
    hash::{flow_hash_v6, pick_slot},
    service::{SVC_F_AFFINITY, SVC_F_SNAT, SVC_F_SOURCE_RANGES},
    Backend, CtKind, Stat, SvcValue, FAMILY_V6, IPPROTO_TCP,
};

use crate::{
    conntrack::tcp_bits_of,
    error::{settle, Error, Verdict},
    flow6::{same_addr, Flow6, Parsed6},
    maps::{self, count, Scratch6, CONNTRACK_V6},
    nat::Side,
    nat6, reject6,
    select::{candidates, judge, Pick, Tracked},
};

/// Frontend flags whose feature the IPv6 datapath lacks.
const UNSUPPORTED: u16 = SVC_F_SNAT | SVC_F_SOURCE_RANGES | SVC_F_AFFINITY;

/// A separate BPF function (returning a `Verdict`, see `error::settle`).
#[inline(never)]
pub fn handle(skb: *mut __sk_buff) -> Verdict {
    let Some(s) = maps::scratch6() else {
        return Verdict::Next;
    };
    settle(try_handle(skb, s))
}

#[inline(always)]
fn try_handle(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    match s.flow.parse(ctx)? {
        Parsed6::Flow => {}
        Parsed6::Fragment => {
            count(Stat::Fragment);
            return Ok(Verdict::Next);
        }
        Parsed6::ExtHeader => {
            count(Stat::Ipv6ExtHeader);
            return Ok(Verdict::Next);
        }
        Parsed6::Icmp | Parsed6::Other => return Ok(Verdict::Next),
    }
    s.flow.svc_key_into(&mut s.svc_key, 0);
    let Some(master) = maps::service6(&s.svc_key) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };

    let mut reselected = false;
    s.flow.ct_key_into(&mut s.ct_key);
    if let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) {
        // SAFETY: pointer from a successful lookup; fields copied at once.
        let (kind, ct_flags, backend_id, svc_id, last_seen) = unsafe {
            (
                (*entry).kind,
                (*entry).flags,
                (*entry).backend_id,
                (*entry).svc_id,
                (*entry).last_seen_ns,
            )
        };
        if kind == CtKind::Forward as u8 {
            let flow = &s.flow;
            match judge(flow, master, backend_id, svc_id, ct_flags) {
                Tracked::Follow(backend) => {
                    let flags = ct_flags | tcp_bits_of(flow.proto, flow.tcp_flags);
                    if flags != ct_flags || now.wrapping_sub(last_seen) > CT_REFRESH_NS {
                        // SAFETY: the entry stays valid for this program
                        // run; a racing writer only loses a refresh.
                        unsafe {
                            (*entry).flags = flags;
                            (*entry).last_seen_ns = now;
                        }
                    }
                    count(Stat::Established);
                    nat6::rewrite(skb, flow, Side::Dst, &backend.addr, backend.port)?;
                    return Ok(Verdict::Next);
                }
                Tracked::Reset => {
                    count(Stat::StaleReset);
                    return Ok(reject6::tcp_reset(skb, flow));
                }
                Tracked::Reselect => reselected = true,
            }
        }
    }
    Ok(new_flow(skb, s, master, reselected))
}

/// Picks a backend for a new flow, records it and DNATs the packet.
#[inline(never)]
fn new_flow(skb: *mut __sk_buff, s: &mut Scratch6, master: &SvcValue, reselected: bool) -> Verdict {
    settle(try_new_flow(skb, s, master, reselected))
}

#[inline(always)]
fn try_new_flow(
    skb: *mut __sk_buff,
    s: &mut Scratch6,
    master: &SvcValue,
    reselected: bool,
) -> Result<Verdict, Error> {
    if master.flags & UNSUPPORTED != 0 {
        count(Stat::Ipv6Unsupported);
        return Ok(Verdict::Drop);
    }
    let (first, n) = match candidates(master) {
        Pick::Slots(first, n) => (first, n),
        Pick::Drop => {
            count(Stat::NoBackendDrop);
            return Ok(Verdict::Drop);
        }
        Pick::Reject => {
            count(Stat::NoBackend);
            return Ok(if s.flow.proto == IPPROTO_TCP {
                reject6::tcp_reset(skb, &s.flow)
            } else {
                reject6::port_unreachable(skb, &s.flow)
            });
        }
    };
    let slot = pick_slot(hash(&s.flow), first, n);
    s.flow.svc_key_into(&mut s.svc_key, slot);
    let slot = maps::service6(&s.svc_key).ok_or(Error::Dangling)?;
    let backend_id = slot.backend_id;
    let backend = maps::backend(backend_id).ok_or(Error::Dangling)?;
    if backend.family != FAMILY_V6 {
        return Err(Error::Dangling);
    }
    if same_addr(&backend.addr, &s.flow.src) {
        // Hairpin needs SNAT, which the IPv6 datapath does not do: the
        // backend would answer itself directly, from the wrong address.
        count(Stat::Ipv6Unsupported);
        return Ok(Verdict::Drop);
    }
    count(if reselected {
        Stat::Reselected
    } else {
        Stat::NewFlow
    });
    record(s, backend, master.svc_id, backend_id)?;
    nat6::rewrite(skb, &s.flow, Side::Dst, &backend.addr, backend.port)?;
    Ok(Verdict::Next)
}

/// The flow hash with the node's seed. A separate BPF function: the hash
/// over eight address words needs many registers, and its spills would
/// otherwise sit in `new_flow`'s frame under every call it makes.
#[inline(never)]
fn hash(flow: &Flow6) -> u32 {
    let seed = maps::config().hash_seed;
    flow_hash_v6(
        &flow.src, &flow.dst, flow.sport, flow.dport, flow.proto, seed,
    )
}

/// Records a new flow: reply entry first (the backend cannot answer before
/// the rewritten packet leaves), then forward entry. The entry is built in
/// the per-CPU scratch map and the keys in `Scratch6`; map inserts take
/// references so that nothing is copied onto the stack.
#[inline(never)]
fn record(s: &mut Scratch6, backend: &Backend, svc_id: u32, backend_id: u32) -> Result<(), Error> {
    let scratch = maps::scratch().ok_or(Error::Dangling)?;
    let e = &mut scratch.ct;
    let flow = &s.flow;
    // SAFETY: plain helper call.
    e.last_seen_ns = unsafe { bpf_ktime_get_ns() };
    e.backend_id = backend_id;
    e.svc_id = svc_id;
    e.nat_addr = flow.dst;
    e.peer_addr = flow.src;
    e.nat_port = flow.dport;
    e.peer_port = flow.sport;
    e.kind = CtKind::Reply as u8;
    e.flags = 0;
    e._pad = [0; 2];
    // The reply key: backend -> client.
    let key = &mut s.ct_key;
    key.src = backend.addr;
    key.dst = flow.src;
    key.sport = backend.port;
    key.dport = flow.sport;
    key.proto = flow.proto;
    key._pad = [0; 3];
    let reply_ok = CONNTRACK_V6.insert(&*key, &*e, BPF_ANY as u64).is_ok();
    e.nat_addr = [0; 16];
    e.peer_addr = [0; 16];
    e.nat_port = 0;
    e.peer_port = 0;
    e.kind = CtKind::Forward as u8;
    e.flags = tcp_bits_of(flow.proto, flow.tcp_flags);
    flow.ct_key_into(key);
    if !reply_ok || CONNTRACK_V6.insert(&*key, &*e, BPF_ANY as u64).is_err() {
        count(Stat::CtInsertFailed);
    }
    Ok(())
}
