//! Datapath events for `sluice monitor` (`sl_events`, see
//! `sluice_common::events`). Every verdict that is not a plain forward
//! calls one of the functions below beside its `count(Stat::...)`; the
//! counter names the reason.
//!
//! Cost: nothing on the forward path (no call is made there). On a
//! non-forward path, one BPF call that reads `Config::flags` and returns
//! when events are off; on, a per-CPU token bucket (`sl_evrate`) and a
//! ring buffer reservation. The event is built in the ring buffer's memory,
//! never on the stack: the IPv4 path's frame leaves little room (the
//! functions here are separate BPF functions with frames of their own, a
//! few bytes each).

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    maps::ring_buf::RingBufEntry,
};
use sluice_common::{
    config::{
        CFG_EVENTS_SAMPLE_MASK, CFG_EVENTS_SAMPLE_SHIFT, CFG_F_EVENTS_DROPS, CFG_F_EVENTS_TRACE,
    },
    events::{BUDGET_MAX_NS, NS_PER_EVENT},
    Event, Hook, Stat, FAMILY_V4, FAMILY_V6,
};

use crate::{
    flow::Flow4,
    flow6::Flow6,
    maps::{count, CONFIG, EVENTS, EVENT_RATE},
};

/// `reason | hook << 8`: one argument register for both.
#[inline(always)]
const fn code(reason: Stat, hook: Hook) -> u32 {
    reason as u32 | (hook as u32) << 8
}

/// In a code: a new-flow trace (gated on `CFG_F_EVENTS_TRACE`), not a
/// drop.
const TRACE: u32 = 1 << 15;

/// A new IPv4 flow picked `backend_id`: traced when `flags` (the
/// `Config::flags` the caller already holds) ask for it and the flow is
/// sampled. Off, one test of a word on the stack.
#[inline(always)]
pub fn new_flow4(
    flags: u32,
    reselected: bool,
    skb: *mut __sk_buff,
    flow: &Flow4,
    svc_id: u32,
    backend_id: u32,
) {
    if flags & CFG_F_EVENTS_TRACE != 0 && sampled(flags) {
        let reason = if reselected {
            Stat::Reselected
        } else {
            Stat::NewFlow
        };
        emit4(
            code(reason, Hook::Ingress) | TRACE,
            ifindex(skb),
            flow,
            svc_id,
            backend_id,
        );
    }
}

/// `new_flow4` for IPv6 (reads the flags word itself).
#[inline(always)]
pub fn new_flow6(
    reselected: bool,
    skb: *mut __sk_buff,
    flow: &Flow6,
    svc_id: u32,
    backend_id: u32,
) {
    // SAFETY: array slot 0 always exists; one word read.
    let flags = CONFIG.get_ptr(0).map_or(0, |c| unsafe { (*c).flags() });
    if flags & CFG_F_EVENTS_TRACE != 0 && sampled(flags) {
        let reason = if reselected {
            Stat::Reselected
        } else {
            Stat::NewFlow
        };
        emit6(
            code(reason, Hook::Ingress) | TRACE,
            ifindex(skb),
            flow,
            svc_id,
            backend_id,
        );
    }
}

/// Whether this new flow is one of the `2^n` traced.
#[inline(always)]
fn sampled(flags: u32) -> bool {
    let shift = (flags & CFG_EVENTS_SAMPLE_MASK) >> CFG_EVENTS_SAMPLE_SHIFT;
    // SAFETY: plain helper call.
    shift == 0 || unsafe { bpf_get_prandom_u32() } & ((1 << shift) - 1) == 0
}

/// An IPv4 packet's event at `sl_ingress`.
#[inline(always)]
pub fn ingress4(reason: Stat, skb: *mut __sk_buff, flow: &Flow4, svc_id: u32, backend_id: u32) {
    emit4(
        code(reason, Hook::Ingress),
        ifindex(skb),
        flow,
        svc_id,
        backend_id,
    );
}

/// An IPv4 packet's event at `sl_xdp` (`ingress`: the context's
/// `ingress_ifindex`).
#[inline(always)]
pub fn xdp4(reason: Stat, ingress: u32, flow: &Flow4, svc_id: u32) {
    emit4(code(reason, Hook::Xdp), ingress, flow, svc_id, 0);
}

/// An IPv6 packet's event at `sl_xdp`.
#[inline(always)]
pub fn xdp6(reason: Stat, ingress: u32, flow: &Flow6, svc_id: u32) {
    emit6(code(reason, Hook::Xdp), ingress, flow, svc_id, 0);
}

/// The device an skb came through.
#[inline(always)]
fn ifindex(skb: *mut __sk_buff) -> u32 {
    // SAFETY: the program's own context.
    unsafe { (*skb).ifindex }
}

/// An IPv6 packet's event at `sl_ingress6`.
#[inline(always)]
pub fn ingress6(reason: Stat, skb: *mut __sk_buff, flow: &Flow6, svc_id: u32, backend_id: u32) {
    flow6(reason, Hook::Ingress, skb, flow, svc_id, backend_id);
}

/// An IPv6 packet's event (TC programs).
#[inline(always)]
pub fn flow6(
    reason: Stat,
    hook: Hook,
    skb: *mut __sk_buff,
    flow: &Flow6,
    svc_id: u32,
    backend_id: u32,
) {
    emit6(code(reason, hook), ifindex(skb), flow, svc_id, backend_id);
}

/// A socket's refused (or dangling) `connect()`/`sendmsg()` to
/// `addr`:`port` (16 bytes, IPv4 in the first 4 with `v4`).
#[inline(always)]
pub fn sock(reason: Stat, addr: &[u8; 16], port: u16, proto: u8, v4: bool) {
    let family = if v4 { FAMILY_V4 } else { FAMILY_V6 };
    emit_sock(
        code(reason, Hook::Socket) | (proto as u32) << 16 | (family as u32) << 24,
        addr,
        port as u32,
    );
}

/// An event without a tuple (an error settled after its flow was gone, a
/// fragment whose ports are unknown, a failed tail call).
#[inline(always)]
pub fn bare(reason: Stat, hook: Hook) {
    emit_bare(code(reason, hook));
}

/// A slot in the ring for one event, if events are on, this CPU's rate
/// limit allows one and the ring has room (each refusal counted).
#[inline(always)]
fn reserve(code: u32) -> Option<RingBufEntry<Event>> {
    // Only the flags word: no copy of the whole `Config` on the stack.
    let config = CONFIG.get_ptr(0)?;
    // SAFETY: array slot 0 always exists; one word read.
    let wanted = if code & TRACE != 0 {
        CFG_F_EVENTS_TRACE
    } else {
        CFG_F_EVENTS_DROPS
    };
    if unsafe { (*config).flags() } & wanted == 0 {
        return None;
    }
    let bucket = EVENT_RATE.get_ptr_mut(0)?;
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: this CPU's slot (programs run with migration off). A socket
    // program preempted by a TC one on the same CPU may race on it: that
    // only miscounts a token, never an out-of-bounds access.
    unsafe {
        let budget = ((*bucket).budget_ns + now.wrapping_sub((*bucket).last_ns)).min(BUDGET_MAX_NS);
        (*bucket).last_ns = now;
        if budget < NS_PER_EVENT {
            (*bucket).budget_ns = budget;
            count(Stat::EventsSuppressed);
            return None;
        }
        (*bucket).budget_ns = budget - NS_PER_EVENT;
    }
    let Some(mut entry) = EVENTS.reserve(0) else {
        count(Stat::EventsLost);
        return None;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: the reserved slot is ours until submitted; every field is
    // written before `submit` (the callers fill the tuple).
    unsafe {
        (*event).ts_ns = now;
        (*event).reason = code as u8;
        (*event).hook = (code >> 8) as u8 & 0x7f;
        (*event).family = 0;
        (*event).proto = 0;
        (*event).src = [0; 16];
        (*event).dst = [0; 16];
        (*event).sport = 0;
        (*event).dport = 0;
        (*event).svc_id = 0;
        (*event).backend_id = 0;
        (*event).ifindex = 0;
        (*event)._pad = 0;
    }
    Some(entry)
}

#[inline(never)]
fn emit4(code: u32, ifindex: u32, flow: &Flow4, svc_id: u32, backend_id: u32) {
    let Some(mut entry) = reserve(code) else {
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: a reserved slot (see `reserve`).
    unsafe {
        (*event).family = FAMILY_V4;
        (*event).proto = flow.proto;
        let e = &mut *event;
        e.src[..4].copy_from_slice(&flow.src);
        e.dst[..4].copy_from_slice(&flow.dst);
        (*event).sport = flow.sport;
        (*event).dport = flow.dport;
        (*event).svc_id = svc_id;
        (*event).backend_id = backend_id;
        (*event).ifindex = ifindex;
    }
    entry.submit(0);
}

#[inline(never)]
fn emit6(code: u32, ifindex: u32, flow: &Flow6, svc_id: u32, backend_id: u32) {
    let Some(mut entry) = reserve(code) else {
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: a reserved slot (see `reserve`).
    unsafe {
        (*event).family = FAMILY_V6;
        (*event).proto = flow.proto;
        (*event).src = flow.src;
        (*event).dst = flow.dst;
        (*event).sport = flow.sport;
        (*event).dport = flow.dport;
        (*event).svc_id = svc_id;
        (*event).backend_id = backend_id;
        (*event).ifindex = ifindex;
    }
    entry.submit(0);
}

#[inline(never)]
fn emit_sock(code: u32, addr: &[u8; 16], port: u32) {
    let Some(mut entry) = reserve(code) else {
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: a reserved slot (see `reserve`).
    unsafe {
        (*event).proto = (code >> 16) as u8;
        (*event).family = (code >> 24) as u8;
        (*event).dst = *addr;
        (*event).dport = port as u16;
    }
    entry.submit(0);
}

#[inline(never)]
fn emit_bare(code: u32) {
    if let Some(entry) = reserve(code) {
        entry.submit(0);
    }
}
