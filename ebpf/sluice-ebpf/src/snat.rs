//! Flows SNATed to the node: external traffic with externalTrafficPolicy
//! Cluster (so that replies from a backend on another node come back
//! through this node, as kube-proxy's masquerade does), and hairpin traffic
//! (a pod reaching itself through a service).
//!
//! After the rewrite the packet's source is one of the node's own
//! addresses, which the kernel's input path would drop as a martian; so the
//! packet is routed here with `bpf_fib_lookup` (which also picks the source
//! address, like MASQUERADE) and sent with `bpf_redirect_neigh`. Replies
//! come back to the node's address and an SNAT port, and are turned back
//! on the way in, then redirected towards the client the same way.
//!
//! These are separate BPF functions (`inline(never)`), and their large
//! temporaries live in the per-CPU scratch map: the BPF stack of a whole
//! call chain is 512 bytes. Map inserts take references on purpose (clippy
//! would pass by value): a value copy would put the entry back on the stack.
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
use sluice_common::{
    conntrack::{CT_F_POD, CT_F_SNAT},
    Ct4Key, CtEntry, CtKind, Stat,
};

use crate::events;
use crate::{
    conntrack::{note_reply, reusable, tcp_bits, v4, v4_in_16},
    error::{Error, Verdict},
    flow::Flow4,
    headers::ETH_LEN,
    maps::{self, count, CONNTRACK_V4},
    nat::{self, Side},
};

const AF_INET: u8 = 2;
/// SNAT port candidates tried before giving up on a new flow.
const PORT_TRIES: u32 = 8;

/// What a new flow was assigned, handed to the functions that record it.
pub struct NewFlow {
    pub svc_id: u32,
    pub backend_id: u32,
    pub now: u64,
    pub hash: u32,
}

/// Where a packet to `dst` leaves, and the source address a locally
/// generated packet would use there: (ifindex, source).
#[inline(always)]
fn route(ctx: &TcContext, flow: &Flow4, dst: [u8; 4]) -> Option<(u32, [u8; 4])> {
    route_to(ctx, flow.proto, flow.sport, flow.dport, flow.src, dst)
}

/// `route` for a packet given by its parts (ports in host order).
#[inline(always)]
pub(crate) fn route_to(
    ctx: &TcContext,
    proto: u8,
    sport: u16,
    dport: u16,
    src: [u8; 4],
    dst: [u8; 4],
) -> Option<(u32, [u8; 4])> {
    let scratch = maps::scratch()?;
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; we then set the fields
    // the IPv4 lookup reads.
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = proto;
    p.sport = sport.to_be();
    p.dport = dport.to_be();
    // SAFETY: reading the context's ingress interface.
    p.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(src);
    p.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
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
    // SAFETY: the lookup filled the IPv4 source.
    let src = unsafe { p.__bindgen_anon_3.ipv4_src }.to_ne_bytes();
    Some((p.ifindex, src))
}

/// Decrements the TTL as a router does, then sends the packet out of
/// `ifindex` with L2 addresses from the neighbour table.
#[inline(always)]
pub(crate) fn send(ctx: &TcContext, ifindex: u32) -> Result<Verdict, Error> {
    let ttl: u8 = ctx.load(ETH_LEN + 8).map_err(|_| Error::Truncated)?;
    let proto: u8 = ctx.load(ETH_LEN + 9).map_err(|_| Error::Truncated)?;
    if ttl <= 1 {
        count(Stat::TtlExpired);
        events::bare(Stat::TtlExpired, sluice_common::Hook::Ingress);
        return Ok(Verdict::Drop);
    }
    let from = u16::from_ne_bytes([ttl, proto]) as u64;
    let to = u16::from_ne_bytes([ttl - 1, proto]) as u64;
    ctx.l3_csum_replace(ETH_LEN + 10, from, to, 2)
        .map_err(|_| Error::Nat)?;
    ctx.store(ETH_LEN + 8, &(ttl - 1), 0)
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
/// sends the rewritten packet on.
#[inline(never)]
pub fn new_flow(skb: *mut __sk_buff, flow: &Flow4, nf: &NewFlow) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let backend = maps::backend(nf.backend_id).ok_or(Error::Dangling)?;
    let baddr = backend.addr_v4();
    let Some((ifindex, src)) = route(ctx, flow, baddr) else {
        count(Stat::SnatFailed);
        events::ingress4(Stat::SnatFailed, skb, flow, nf.svc_id, nf.backend_id);
        return Ok(Verdict::Drop);
    };
    let port = claim(flow, nf, baddr, backend.port, src);
    if port == 0 {
        count(Stat::SnatFailed);
        let config = maps::config();
        crate::log::snat_exhausted(
            skb,
            nf.backend_id,
            config.snat_port_min,
            config.snat_port_max,
        );
        events::ingress4(Stat::SnatFailed, skb, flow, nf.svc_id, nf.backend_id);
        return Ok(Verdict::Drop);
    }
    nat::rewrite(ctx, flow, Side::Dst, baddr, backend.port)?;
    nat::rewrite(ctx, flow, Side::Src, src, port)?;
    send(ctx, ifindex)
}

/// Claims an SNAT port for a new flow to backend `baddr:bport` leaving
/// from node address `src`, and records the flow: the reply entry (backend
/// -> node:port, claimed with an exclusive insert) and the forward entry.
/// Returns the port, 0 when none was free (nothing recorded then).
/// Context-free, shared by `sl_ingress` and `sl_xdp`, so that a flow's
/// entries are the same whichever hook started it.
#[inline(always)]
pub(crate) fn claim(flow: &Flow4, nf: &NewFlow, baddr: [u8; 4], bport: u16, src: [u8; 4]) -> u16 {
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
    fill(e, flow, nf, CtKind::Reply, CT_F_SNAT);
    // A port whose reply tuple is free; the reply entry claims it.
    let mut key = Ct4Key::new(baddr, src, bport, 0, flow.proto);
    let mut port = 0u16;
    let mut i = 0;
    while i < PORT_TRIES {
        key.dport = min + (nf.hash.wrapping_add(i.wrapping_mul(0x9e37_79b9)) % range) as u16;
        if CONNTRACK_V4.insert(&key, &*e, BPF_NOEXIST as u64).is_ok() {
            port = key.dport;
            break;
        }
        i += 1;
    }
    if port == 0 {
        return 0;
    }
    e.nat_addr = v4_in_16(src);
    e.nat_port = port;
    e.peer_addr = [0; 16];
    e.peer_port = 0;
    e.kind = CtKind::Forward as u8;
    e.flags = tcp_bits(flow) | CT_F_SNAT;
    if CONNTRACK_V4
        .insert(flow.ct_key(), &*e, BPF_ANY as u64)
        .is_err()
    {
        count(Stat::CtInsertFailed);
    }
    port
}

/// A packet of an established SNATed flow (`entry` is its forward entry).
#[inline(never)]
pub fn forward(
    skb: *mut __sk_buff,
    flow: &Flow4,
    backend_id: u32,
    entry: *const CtEntry,
) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let backend = maps::backend(backend_id).ok_or(Error::Dangling)?;
    let baddr = backend.addr_v4();
    // SAFETY: the caller found the entry; the fields are copied at once.
    let (snat_addr, snat_port) = unsafe { (v4(&(*entry).nat_addr), (*entry).nat_port) };
    let Some((ifindex, _)) = route(ctx, flow, baddr) else {
        count(Stat::SnatFailed);
        events::ingress4(Stat::SnatFailed, skb, flow, 0, backend_id);
        return Ok(Verdict::Drop);
    };
    nat::rewrite(ctx, flow, Side::Dst, baddr, backend.port)?;
    nat::rewrite(ctx, flow, Side::Src, snat_addr, snat_port)?;
    send(ctx, ifindex)
}

/// A reply to an SNATed flow, arriving at the node: back to VIP -> client.
#[inline(never)]
pub fn reply(skb: *mut __sk_buff, flow: &Flow4, entry: *mut CtEntry) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    // SAFETY: the caller found the entry; fields copied at once.
    let (client, client_port, frontend, frontend_port) = unsafe {
        (
            v4(&(*entry).peer_addr),
            (*entry).peer_port,
            v4(&(*entry).nat_addr),
            (*entry).nat_port,
        )
    };
    note_reply(flow, entry);
    let Some((ifindex, _)) = route(ctx, flow, client) else {
        count(Stat::SnatFailed);
        events::ingress4(Stat::SnatFailed, skb, flow, 0, 0);
        return Ok(Verdict::Drop);
    };
    nat::rewrite(ctx, flow, Side::Src, frontend, frontend_port)?;
    nat::rewrite(ctx, flow, Side::Dst, client, client_port)?;
    count(Stat::SnatReply);
    if flow.later {
        count(Stat::FragmentTracked);
    }
    send(ctx, ifindex)
}

/// Writes a new flow's reply entry into `e` (in place: no stack copy).
#[inline(always)]
fn fill(e: &mut CtEntry, flow: &Flow4, nf: &NewFlow, kind: CtKind, flags: u8) {
    e.last_seen_ns = nf.now;
    e.backend_id = nf.backend_id;
    e.svc_id = nf.svc_id;
    e.nat_addr = v4_in_16(flow.dst);
    e.peer_addr = v4_in_16(flow.src);
    e.nat_port = flow.dport;
    e.peer_port = flow.sport;
    e.kind = kind as u8;
    e.flags = flags;
    e._pad = [0; 2];
}

/// Turns a new flow's reply entry `e` into its forward entry, `flags` its
/// first ones (either family).
#[inline(always)]
pub fn forward_fields(e: &mut CtEntry, flags: u8) {
    e.nat_addr = [0; 16];
    e.peer_addr = [0; 16];
    e.nat_port = 0;
    e.peer_port = 0;
    e.kind = CtKind::Forward as u8;
    e.flags = flags;
}

/// `record`'s options: the flow is a pod's (`CT_F_POD`).
pub const RECORD_POD: u8 = 1;
/// `record`'s options: the reply tuple may be taken (the caller checked
/// that the entry there is no live flow's, `conntrack::clashes4`).
pub const RECORD_REPLACE: u8 = 2;

/// `record`'s options: the flow was reselected on a tracked tuple (a SYN
/// on a finished flow's, mostly): when the entries an earlier flow left
/// there are this frontend's, to this backend, unSNATed and recently used,
/// they are rewritten in place (`conntrack::reusable`) instead of
/// inserting two new elements and freeing the old ones.
pub const RECORD_REUSE: u8 = 4;

/// `EEXIST`, as a map insert with `BPF_NOEXIST` returns it.
const EEXIST: i32 = -17;

/// The conntrack mark of a flow `record`ed (either family) with `options`.
#[inline(always)]
pub fn record_mark(options: u8) -> u8 {
    if options & RECORD_POD != 0 {
        CT_F_POD
    } else {
        0
    }
}

/// The flag `record` (either family) inserts the reply entry with under
/// `options`.
#[inline(always)]
pub fn reply_insert_flag(options: u8) -> u64 {
    if options & RECORD_REPLACE != 0 {
        BPF_ANY as u64
    } else {
        BPF_NOEXIST as u64
    }
}

/// What the reply entry's insert says: `Some(inserted)`, or `None` when
/// another entry holds the tuple (`BPF_NOEXIST` refused it).
#[inline(always)]
pub fn reply_inserted(result: Result<(), i32>) -> Option<bool> {
    match result {
        Ok(()) => Some(true),
        Err(EEXIST) => None,
        Err(_) => Some(false),
    }
}

/// What `record` (and IPv6's, in `ingress6.rs`) did. A plain enum, which
/// comes back in a register: IPv6's `record` takes five arguments, and a
/// `Result<bool, _>` was returned through memory, a sixth.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Recorded {
    /// Both entries written (or their failure counted).
    Done,
    /// Another entry holds the reply tuple: nothing written.
    Taken,
    /// No scratch space (cannot happen: a per-CPU array's slot 0).
    NoScratch,
}

impl Recorded {
    /// Whether the tuple was taken; the scratch failure as `Dangling`.
    #[inline(always)]
    pub fn taken(self) -> Result<bool, Error> {
        match self {
            Recorded::Done => Ok(false),
            Recorded::Taken => Ok(true),
            Recorded::NoScratch => Err(Error::Dangling),
        }
    }
}

/// Records a new flow that is not SNATed, to `backend` (its address in the
/// low 32 bits as the programs hold addresses, its port above): reply
/// entry first (the backend cannot answer before the rewritten packet
/// leaves), then forward entry. The reply entry goes in with
/// `BPF_NOEXIST` unless `RECORD_REPLACE`: `Taken` when another entry holds
/// its tuple (nothing written; the caller asks `conntrack::clashes4`
/// whether that entry is a live flow's). The insert does the lookup the
/// check would have made, so most new flows pay for one, not two. With
/// `RECORD_REUSE` an earlier flow's entries on the same tuple and
/// backend are taken over in place: an insert into the LRU map takes an
/// element off its free lists and a replaced one goes back under the
/// map's global lock, the largest cost of a new flow on the TC path.
#[inline(never)]
pub fn record(flow: &Flow4, nf: &NewFlow, backend: u64, options: u8) -> Recorded {
    let backend_addr = (backend as u32).to_ne_bytes();
    let backend_port = (backend >> 32) as u16;
    let Some(scratch) = maps::scratch() else {
        return Recorded::NoScratch;
    };
    let e = &mut scratch.ct;
    let mark = record_mark(options);
    fill(e, flow, nf, CtKind::Reply, mark);
    let reply_key = Ct4Key::new(backend_addr, flow.src, backend_port, flow.sport, flow.proto);
    if options & RECORD_REUSE != 0 {
        if let Some(reply) = CONNTRACK_V4.get_ptr_mut(&reply_key) {
            if let Some(fwd) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) {
                // SAFETY: pointers from successful lookups, to entries
                // used within `CT_REUSE_IDLE_NS` (not being collected).
                // The backend cannot answer before this SYN leaves; a late
                // packet of the earlier flow on another CPU may add its
                // bits, as it would to inserted entries.
                unsafe {
                    if reusable(&*reply, &*fwd, &e.nat_addr, flow.dport, nf.now) {
                        *reply = *e;
                        forward_fields(e, tcp_bits(flow) | mark);
                        *fwd = *e;
                        count(Stat::CtReused);
                        return Recorded::Done;
                    }
                }
            }
        }
    }
    let Some(reply_ok) =
        reply_inserted(CONNTRACK_V4.insert(&reply_key, &*e, reply_insert_flag(options)))
    else {
        return Recorded::Taken;
    };
    forward_fields(e, tcp_bits(flow) | mark);
    if !reply_ok
        || CONNTRACK_V4
            .insert(flow.ct_key(), &*e, BPF_ANY as u64)
            .is_err()
    {
        count(Stat::CtInsertFailed);
    }
    Recorded::Done
}
