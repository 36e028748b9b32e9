//! IPv6 flows SNATed to the node: the IPv6 twin of `snat.rs` (external
//! traffic with externalTrafficPolicy Cluster, and hairpin).
//!
//! The same scheme: the node's source address for the backend comes from
//! `bpf_fib_lookup` with `BPF_FIB_LOOKUP_SRC` (as MASQUERADE picks it), an
//! SNAT port is claimed by inserting the reply entry with `BPF_NOEXIST`,
//! and the packet is routed here (hop limit decremented, as a router does)
//! and sent with `bpf_redirect_neigh`, since the kernel would drop a packet
//! arriving with one of its own addresses as source. Replies come back to
//! the node's address and SNAT port and are turned back on the way in.
//!
//! The IPv6 program runs with its own stack (tail call), but its tuple and
//! keys still live in `Scratch6` and the entry and FIB parameters in the
//! per-CPU `Scratch`, so nothing large is copied. Map calls take keys and
//! values by reference on purpose (clippy would pass them by value).
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{
        __sk_buff, BPF_ANY, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LOOKUP_SRC, BPF_NOEXIST, TC_ACT_REDIRECT,
    },
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect_neigh},
    programs::TcContext,
    EbpfContext,
};
use sluice_common::{conntrack::CT_F_SNAT, CtEntry, CtKind, Stat};

use crate::events;
use crate::{
    conntrack::{note_reply6, tcp_bits_of},
    error::{settle, Error, Verdict},
    headers::ETH_LEN,
    maps::{self, count, Scratch6, CONNTRACK_V6},
    nat::Side,
    nat6,
};

const AF_INET6: u8 = 10;
/// SNAT port candidates tried before giving up on a new flow.
const PORT_TRIES: u32 = 8;
/// Offset of the hop limit in the IPv6 header.
const HOP_LIMIT_OFF: usize = ETH_LEN + 7;

#[inline(always)]
pub(crate) fn words(a: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

#[inline(always)]
pub(crate) fn bytes(w: &[u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let b = w[i].to_ne_bytes();
        out[i * 4] = b[0];
        out[i * 4 + 1] = b[1];
        out[i * 4 + 2] = b[2];
        out[i * 4 + 3] = b[3];
        i += 1;
    }
    out
}

/// Where a packet of the flow in `s` to `dst` leaves; writes the source
/// address the node would use there into `s.snat_addr`.
#[inline(never)]
pub(crate) fn route(skb: *mut __sk_buff, s: &mut Scratch6, to_client: bool) -> Option<u32> {
    let ctx = &TcContext::new(skb);
    let scratch = maps::scratch()?;
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; we then set the fields
    // the IPv6 lookup reads.
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET6;
    p.l4_protocol = s.flow.proto;
    p.sport = s.flow.sport.to_be();
    p.dport = s.flow.dport.to_be();
    // SAFETY: reading the context's ingress interface.
    p.ifindex = unsafe { (*skb).ifindex };
    p.__bindgen_anon_3.ipv6_src = words(&s.flow.src);
    // The destination is the backend (new and forward packets, read from
    // the conntrack key the caller built) or the client (replies).
    p.__bindgen_anon_4.ipv6_dst = if to_client {
        words(&s.ct_key.dst)
    } else {
        words(&s.ct_key.src)
    };
    // SAFETY: the helper reads and writes only the struct we pass.
    let ret = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            p,
            core::mem::size_of::<aya_ebpf::bindings::bpf_fib_lookup>() as i32,
            BPF_FIB_LOOKUP_SRC,
        )
    };
    if ret != BPF_FIB_LKUP_RET_SUCCESS as i64 && ret != BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
        return None;
    }
    // SAFETY: the lookup filled the IPv6 source.
    s.snat_addr = bytes(unsafe { &p.__bindgen_anon_3.ipv6_src });
    Some(p.ifindex)
}

/// Decrements the hop limit as a router does (IPv6 has no header
/// checksum), then sends the packet out of `ifindex` with L2 addresses
/// from the neighbour table.
#[inline(never)]
pub(crate) fn send(skb: *mut __sk_buff, ifindex: u32) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let hops: u8 = ctx.load(HOP_LIMIT_OFF).map_err(|_| Error::Truncated)?;
    if hops <= 1 {
        count(Stat::TtlExpired);
        events::bare(Stat::TtlExpired, sluice_common::Hook::Ingress);
        return Ok(Verdict::Drop);
    }
    ctx.store(HOP_LIMIT_OFF, &(hops - 1), 0)
        .map_err(|_| Error::Nat)?;
    // SAFETY: NULL params: the helper does its own lookup and resolution.
    let ret = unsafe { bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) };
    if ret == TC_ACT_REDIRECT as i64 {
        Ok(Verdict::Redirect)
    } else {
        Err(Error::Nat)
    }
}

/// A new flow that must be SNATed: claims a port, records the flow, and
/// sends the rewritten packet on. (Returns a plain `Verdict`: a `Result`
/// would be a sixth, stack-passed argument, which BPF lacks.)
#[inline(never)]
pub fn new_flow(
    skb: *mut __sk_buff,
    s: &mut Scratch6,
    svc_id: u32,
    backend_id: u32,
    hash: u32,
) -> Verdict {
    settle(try_new_flow(skb, s, svc_id, backend_id, hash))
}

#[inline(always)]
fn try_new_flow(
    skb: *mut __sk_buff,
    s: &mut Scratch6,
    svc_id: u32,
    backend_id: u32,
    hash: u32,
) -> Result<Verdict, Error> {
    let backend = maps::backend(backend_id).ok_or(Error::Dangling)?;
    // The reply key: backend -> node; its destination is filled by `route`.
    s.ct_key.src = backend.addr;
    s.ct_key.sport = backend.port;
    s.ct_key.proto = s.flow.proto;
    s.ct_key._pad = [0; 3];
    let Some(ifindex) = route(skb, s, false) else {
        count(Stat::SnatFailed);
        events::ingress6(Stat::SnatFailed, skb, &s.flow, svc_id, backend_id);
        return Ok(Verdict::Drop);
    };
    let port = claim6(s, svc_id, backend_id, hash);
    if port == 0 {
        count(Stat::SnatFailed);
        events::ingress6(Stat::SnatFailed, skb, &s.flow, svc_id, backend_id);
        return Ok(Verdict::Drop);
    }
    nat6::rewrite(skb, &s.flow, Side::Dst, &backend.addr, backend.port)?;
    nat6::rewrite(skb, &s.flow, Side::Src, &s.snat_addr, port)?;
    send(skb, ifindex)
}

/// Claims an SNAT port for the new IPv6 flow in `s` and records it (reply
/// entry claimed with an exclusive insert, then the forward entry), as
/// `snat::claim` does for IPv4. Expects the reply key's backend half in
/// `s.ct_key` (`src`, `sport`, `proto`) and the node address in
/// `s.snat_addr`. Returns the port, 0 when none was free. Context-free,
/// shared by `sl_ingress6` and `sl_xdp`.
#[inline(always)]
pub(crate) fn claim6(s: &mut Scratch6, svc_id: u32, backend_id: u32, hash: u32) -> u16 {
    s.ct_key.dst = s.snat_addr;
    let config = maps::config();
    let (min, max) = (config.snat_port_min, config.snat_port_max);
    if min == 0 || max < min {
        return 0;
    }
    let range = (max - min) as u32 + 1;
    let Some(scratch) = maps::scratch() else {
        return 0;
    };
    let e = &mut scratch.ct;
    let flow = &s.flow;
    e.last_seen_ns = crate::clock::now();
    e.backend_id = backend_id;
    e.svc_id = svc_id;
    e.nat_addr = flow.dst;
    e.peer_addr = flow.src;
    e.nat_port = flow.dport;
    e.peer_port = flow.sport;
    e.kind = CtKind::Reply as u8;
    e.flags = CT_F_SNAT;
    e._pad = [0; 2];
    // A port whose reply tuple is free; the reply entry claims it.
    let mut port = 0u16;
    let mut i = 0;
    while i < PORT_TRIES {
        let candidate = min + (hash.wrapping_add(i.wrapping_mul(0x9e37_79b9)) % range) as u16;
        s.ct_key.dport = candidate;
        if CONNTRACK_V6
            .insert(&s.ct_key, &*e, BPF_NOEXIST as u64)
            .is_ok()
        {
            port = candidate;
            break;
        }
        i += 1;
    }
    if port == 0 {
        return 0;
    }
    e.nat_addr = s.snat_addr;
    e.nat_port = port;
    e.peer_addr = [0; 16];
    e.peer_port = 0;
    e.kind = CtKind::Forward as u8;
    e.flags = tcp_bits_of(flow.proto, flow.tcp_flags) | CT_F_SNAT;
    flow.ct_key_into(&mut s.ct_key);
    if CONNTRACK_V6.insert(&s.ct_key, &*e, BPF_ANY as u64).is_err() {
        count(Stat::CtInsertFailed);
    }
    port
}

/// A packet of an established SNATed flow (`entry` is its forward entry).
#[inline(never)]
pub fn forward(
    skb: *mut __sk_buff,
    s: &mut Scratch6,
    backend_id: u32,
    entry: *const CtEntry,
) -> Result<Verdict, Error> {
    let backend = maps::backend(backend_id).ok_or(Error::Dangling)?;
    s.ct_key.src = backend.addr;
    let Some(ifindex) = route(skb, s, false) else {
        count(Stat::SnatFailed);
        events::ingress6(Stat::SnatFailed, skb, &s.flow, 0, backend_id);
        return Ok(Verdict::Drop);
    };
    // SAFETY: the caller found the entry; the fields are copied at once.
    let snat_port = unsafe {
        s.snat_addr = (*entry).nat_addr;
        (*entry).nat_port
    };
    nat6::rewrite(skb, &s.flow, Side::Dst, &backend.addr, backend.port)?;
    nat6::rewrite(skb, &s.flow, Side::Src, &s.snat_addr, snat_port)?;
    send(skb, ifindex)
}

/// A reply to an SNATed flow, arriving at the node: back to VIP -> client.
#[inline(never)]
pub fn reply(skb: *mut __sk_buff, s: &mut Scratch6, entry: *mut CtEntry) -> Result<Verdict, Error> {
    // SAFETY: the caller found the entry; fields copied at once. The
    // client goes into the key's destination (for `route`), the frontend
    // into `snat_addr` once routing no longer needs it.
    let (client_port, frontend_port) = unsafe {
        s.ct_key.dst = (*entry).peer_addr;
        ((*entry).peer_port, (*entry).nat_port)
    };
    note_reply6(&s.flow, entry);
    let Some(ifindex) = route(skb, s, true) else {
        count(Stat::SnatFailed);
        events::ingress6(Stat::SnatFailed, skb, &s.flow, 0, 0);
        return Ok(Verdict::Drop);
    };
    // SAFETY: as above.
    unsafe { s.snat_addr = (*entry).nat_addr };
    nat6::rewrite(skb, &s.flow, Side::Src, &s.snat_addr, frontend_port)?;
    nat6::rewrite(skb, &s.flow, Side::Dst, &s.ct_key.dst, client_port)?;
    count(Stat::SnatReply);
    if s.flow.later() {
        count(Stat::FragmentTracked);
    }
    send(skb, ifindex)
}
