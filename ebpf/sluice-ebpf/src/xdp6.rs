//! `sl_xdp`'s IPv6 half: the same decisions as `xdp.rs` for IPv6 frames
//! whose L4 header follows the IPv6 header (no extension headers: those,
//! fragments and ICMPv6 pass to TC). The flow and the map keys live in the
//! per-CPU `Scratch6`, as on the TC path; the selection (`select::pick6`)
//! and the SNAT port claim (`snat6::claim6`) are `sl_ingress6`'s.
//!
//! Map calls take references on purpose (clippy would pass by value): a
//! value copy would put the 40-byte keys back on the stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{xdp_md, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_SRC},
    helpers::bpf_fib_lookup as fib_lookup,
    programs::XdpContext,
};
use sluice_common::{
    conntrack::{CT_F_SNAT, CT_REFRESH_NS},
    maps::SVCNET_CLUSTER_IP,
    service::{
        FrontendKind, SCOPE_EXTERNAL, SVC_F_AFFINITY, SVC_F_INTERNAL, SVC_F_MASQ_OUTSIDE,
        SVC_F_SNAT, SVC_F_SOURCE_RANGES,
    },
    CtEntry, CtKind, Stat, SvcValue, FAMILY_V6, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::{
    checksum::{adjust, sum_addr6},
    conntrack::{note_reply6, tcp_bits_of},
    events,
    flow6::{same_addr, FRAG_NONE},
    headers::{EthHdr, Ipv6Hdr, TcpHdr, UdpHdr, ETH_LEN, IPV6_LEN},
    ingress6,
    maps::{self, count, Scratch6, CONNTRACK_V6, XDP_DEVS},
    select::{
        candidates, judge, orphan_snat_segment, pick6, remember6, Pick, Tracked, PICK_AFFINITY,
    },
    snat6::{bytes, claim6, words},
    xdp::{at, bytes_at, frame_len, l4_min_len, Action},
};

const AF_INET6: u8 = 10;
/// Offset of the L4 header: no extension headers.
const L4_OFF6: usize = ETH_LEN + IPV6_LEN;

/// The addresses and ports (host order) an IPv6 packet leaves with, in
/// `Scratch6::out` (off the stack: the XDP program's call chain is deep).
#[repr(C)]
pub struct Ends6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
}

/// An IPv6 frame. A separate BPF function.
#[inline(never)]
pub fn decide6(ctx: *mut xdp_md) -> Action {
    let Some(s) = maps::scratch6() else {
        return Action::Ignore;
    };
    let Some(tot_len) = parse6(ctx, s) else {
        return Action::Ignore;
    };
    let config = maps::config();
    if config.snat_port_min != 0
        && s.flow.dport >= config.snat_port_min
        && s.flow.dport <= config.snat_port_max
    {
        s.flow.ct_key_into(&mut s.ct_key);
        if let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) {
            // SAFETY: pointer from a successful lookup; read at once.
            let (kind, flags) = unsafe { ((*entry).kind, (*entry).flags) };
            if kind == CtKind::Reply as u8 && flags & CT_F_SNAT != 0 {
                return reply6(ctx, s, entry, tot_len);
            }
        }
    }
    s.flow.svc_key_into(&mut s.svc_key, 0, SCOPE_EXTERNAL);
    let Some(master) = maps::service6(&s.svc_key) else {
        let action = unserved6(s);
        return refused6(ctx, s, 0, action);
    };
    if master.kind() == FrontendKind::ClusterIp {
        return Action::Pass;
    }
    let now = crate::clock::now();
    s.flow.ct_key_into(&mut s.ct_key);
    if let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) {
        // SAFETY: pointer from a successful lookup; fields copied at once.
        let (kind, ct_flags, backend_id, svc_id) = unsafe {
            (
                (*entry).kind,
                (*entry).flags,
                (*entry).backend_id,
                (*entry).svc_id,
            )
        };
        if kind != CtKind::Forward as u8 || ct_flags & CT_F_SNAT == 0 {
            return Action::Pass;
        }
        return match judge(&s.flow, master, backend_id, svc_id, ct_flags) {
            Tracked::Follow(_) => forward6(ctx, s, entry, now, tot_len),
            Tracked::Reselect | Tracked::Reset => Action::Pass,
        };
    }
    if let Some(done) = screen6(ctx, s, master) {
        return refused6(ctx, s, master.svc_id, done);
    }
    let h = ingress6::hash(&s.flow);
    let picked = pick6(s, master, SCOPE_EXTERNAL, h);
    let action = commit6(ctx, s, master, picked, tot_len);
    refused6(ctx, s, master.svc_id, action)
}

/// `xdp::refused4` for IPv6.
#[inline(always)]
fn refused6(ctx: *mut xdp_md, s: &Scratch6, svc_id: u32, action: Action) -> Action {
    if let Action::Refused(reason) = action {
        // SAFETY: reading the context's ingress device.
        events::xdp6(reason, unsafe { (*ctx).ingress_ifindex }, &s.flow, svc_id);
    }
    action
}

/// Fills `s.flow` from an IPv6 TCP/UDP frame without extension headers
/// and a hop limit above 1; returns the packet's length from the IPv6
/// header on.
#[inline(always)]
fn parse6(ctx: *mut xdp_md, s: &mut Scratch6) -> Option<u16> {
    let xdp = XdpContext::new(ctx);
    let ip = at::<Ipv6Hdr>(&xdp, ETH_LEN)?;
    // A header of another version behind the IPv6 ethertype is not IPv6
    // (the stack and the TC path drop it): nothing to decide.
    if ip.vtcfl[0] >> 4 != 6 || ip.hop_limit <= 1 {
        return None;
    }
    let (sport, dport, tcp_flags) = if ip.next_header == IPPROTO_TCP {
        let tcp = at::<TcpHdr>(&xdp, L4_OFF6)?;
        (tcp.sport, tcp.dport, tcp.flags)
    } else if ip.next_header == IPPROTO_UDP {
        let udp = at::<UdpHdr>(&xdp, L4_OFF6)?;
        (udp.sport, udp.dport, 0)
    } else {
        return None;
    };
    let f = &mut s.flow;
    f.src = ip.src;
    f.dst = ip.dst;
    f.sport = u16::from_be_bytes(sport);
    f.dport = u16::from_be_bytes(dport);
    f.proto = ip.next_header;
    f.tcp_flags = tcp_flags;
    f.frag = FRAG_NONE;
    f._pad = 0;
    f.frag_id = 0;
    f.l4_off = L4_OFF6 as u16;
    f._pad2 = [0; 2];
    Some(u16::from_be_bytes(ip.payload_len).wrapping_add(IPV6_LEN as u16))
}

/// Whether the stack would forward the frame (`ipv6_rcv`): a payload
/// length within the frame and long enough for the TCP or UDP header.
/// `sl_xdp` sends nothing else on (`route6` passes it to TC, and the stack
/// drops it). Asked only of frames about to be sent. A separate BPF
/// function that reads the header in place.
#[inline(never)]
fn forwardable6(ctx: *mut xdp_md) -> bool {
    let xdp = XdpContext::new(ctx);
    let Some(ip) = bytes_at::<IPV6_LEN>(&xdp, ETH_LEN) else {
        return false;
    };
    let payload = u16::from_be_bytes([ip[4], ip[5]]) as u64;
    payload >= l4_min_len(ip[6]) as u64 && (L4_OFF6 as u64) + payload <= frame_len(ctx)
}

/// `xdp::unserved` for IPv6.
#[inline(never)]
fn unserved6(s: &mut Scratch6) -> Action {
    let kind = maps::svcnet_v6(&mut s.local_key, &s.flow.dst);
    if kind == 0 {
        return Action::Ignore;
    }
    if kind == SVCNET_CLUSTER_IP {
        return Action::Pass;
    }
    s.flow.ct_key_into(&mut s.ct_key);
    if CONNTRACK_V6.get_ptr(&s.ct_key).is_some() {
        return Action::Pass;
    }
    Action::Refused(Stat::UnallocatedIp)
}

/// Routes the packet in `s` to `s.out.dst` (see `xdp_nat::route`); the
/// source the node would use goes to `s.snat_addr`.
#[inline(never)]
fn route6(ctx: *mut xdp_md, s: &mut Scratch6, tot_len: u16) -> u32 {
    if !forwardable6(ctx) {
        return 0;
    }
    let Some(scratch) = maps::scratch() else {
        return 0;
    };
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; the IPv6 fields follow.
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET6;
    p.l4_protocol = s.flow.proto;
    p.sport = s.flow.sport.to_be();
    p.dport = s.flow.dport.to_be();
    p.__bindgen_anon_1.tot_len = tot_len;
    // SAFETY: reading the context's ingress device.
    let ingress = unsafe { (*ctx).ingress_ifindex };
    p.ifindex = ingress;
    p.__bindgen_anon_3.ipv6_src = words(&s.flow.src);
    p.__bindgen_anon_4.ipv6_dst = words(&s.out.dst);
    // SAFETY: the helper reads and writes only the struct we pass.
    let ret = unsafe {
        fib_lookup(
            ctx.cast(),
            p,
            core::mem::size_of::<aya_ebpf::bindings::bpf_fib_lookup>() as i32,
            BPF_FIB_LOOKUP_SRC,
        )
    };
    if ret != BPF_FIB_LKUP_RET_SUCCESS as i64 {
        return 0;
    }
    // SAFETY: the lookup filled the IPv6 source.
    s.snat_addr = bytes(unsafe { &p.__bindgen_anon_3.ipv6_src });
    let out = p.ifindex;
    if out == ingress || XDP_DEVS.get(out).is_some() {
        out
    } else {
        0
    }
}

/// The reply of an SNATed IPv6 flow (`entry`: its reply entry).
#[inline(never)]
fn reply6(ctx: *mut xdp_md, s: &mut Scratch6, entry: *mut CtEntry, tot_len: u16) -> Action {
    // SAFETY: the caller found the entry; fields copied at once.
    unsafe {
        s.out.src = (*entry).nat_addr;
        s.out.dst = (*entry).peer_addr;
        s.out.sport = (*entry).nat_port;
        s.out.dport = (*entry).peer_port;
    }
    let ifindex = route6(ctx, s, tot_len);
    if ifindex == 0 {
        return Action::Pass;
    }
    note_reply6(&s.flow, entry);
    count(Stat::SnatReply);
    send6(ctx, s, ifindex)
}

/// A packet of a tracked SNATed IPv6 flow (judged `Follow`).
#[inline(never)]
fn forward6(
    ctx: *mut xdp_md,
    s: &mut Scratch6,
    entry: *mut CtEntry,
    now: u64,
    tot_len: u16,
) -> Action {
    // SAFETY: the caller found the entry; fields copied at once.
    let (backend_id, ct_flags, last_seen) =
        unsafe { ((*entry).backend_id, (*entry).flags, (*entry).last_seen_ns) };
    let Some(backend) = maps::backend(backend_id) else {
        return Action::Pass;
    };
    // SAFETY: as above.
    unsafe {
        s.out.src = (*entry).nat_addr;
        s.out.sport = (*entry).nat_port;
    }
    s.out.dst = backend.addr;
    s.out.dport = backend.port;
    let ifindex = route6(ctx, s, tot_len);
    if ifindex == 0 {
        return Action::Pass;
    }
    let flags = ct_flags | tcp_bits_of(s.flow.proto, s.flow.tcp_flags);
    if flags != ct_flags || now.saturating_sub(last_seen) > CT_REFRESH_NS {
        // SAFETY: the entry stays valid for this program run.
        unsafe {
            (*entry).flags = flags;
            (*entry).last_seen_ns = now;
        }
    }
    count(Stat::Established);
    send6(ctx, s, ifindex)
}

/// The checks of a new IPv6 flow to an external frontend, before any
/// pick (`xdp::new_flow`'s rules): `Some` ends the packet's walk here.
/// A separate BPF function (the pick is called from `decide6`, which
/// keeps the Maglev hash's deep frame off this chain).
#[inline(never)]
fn screen6(ctx: *mut xdp_md, s: &mut Scratch6, master: &SvcValue) -> Option<Action> {
    if master.flags & SVC_F_MASQ_OUTSIDE != 0 {
        return Some(Action::Pass);
    }
    // SAFETY: reading the context's ingress device.
    let ingress = unsafe { (*ctx).ingress_ifindex };
    if master.flags & SVC_F_INTERNAL != 0 && maps::inside_v6(&mut s.local_key, &s.flow.src, ingress)
    {
        return Some(Action::Pass);
    }
    if master.flags & SVC_F_SOURCE_RANGES != 0
        && !maps::source_allowed6(&mut s.range_key, master.svc_id, &s.flow.src)
    {
        return Some(Action::Refused(Stat::SourceDenied));
    }
    match candidates(master) {
        Pick::Slots(..) => {}
        Pick::Drop => {
            return Some(Action::Refused(Stat::NoBackendDrop));
        }
        Pick::Reject => return Some(Action::Pass),
    }
    if master.flags & SVC_F_SNAT == 0 || orphan_snat_segment(s.flow.proto, s.flow.tcp_flags, master)
    {
        return Some(Action::Pass);
    }
    None
}

/// A new IPv6 flow whose backend `pick6` chose (`picked`): routed, then
/// (only if `sl_xdp` can send it) recorded with an SNAT port and sent.
#[inline(never)]
fn commit6(
    ctx: *mut xdp_md,
    s: &mut Scratch6,
    master: &SvcValue,
    picked: u64,
    tot_len: u16,
) -> Action {
    let backend_id = picked as u32;
    let Some(backend) = maps::backend(backend_id) else {
        return Action::Pass;
    };
    if backend.family != FAMILY_V6 || same_addr(&backend.addr, &s.flow.src) {
        return Action::Pass;
    }
    let bport = backend.port;
    s.out.dst = backend.addr;
    let ifindex = route6(ctx, s, tot_len);
    if ifindex == 0 {
        return Action::Pass;
    }
    // Decided: from here on, as `ingress6::new_flow` and `snat6::new_flow`.
    if picked & PICK_AFFINITY != 0 {
        count(Stat::AffinityHit);
    }
    if master.flags & SVC_F_AFFINITY != 0 {
        remember6(s, master.svc_id, backend_id);
    }
    s.ct_key.src = s.out.dst;
    s.ct_key.sport = bport;
    s.ct_key.proto = s.flow.proto;
    s.ct_key._pad = [0; 3];
    let h = ingress6::hash(&s.flow);
    let port = claim6(s, master.svc_id, backend_id, h);
    if port == 0 {
        return Action::Refused(Stat::SnatFailed);
    }
    count(Stat::NewFlow);
    s.out.src = s.snat_addr;
    s.out.sport = port;
    s.out.dport = bport;
    send6(ctx, s, ifindex)
}

/// Rewrites the IPv6 packet of `s.flow` to `s.out`, decrements its hop limit,
/// puts the L2 addresses of the last route in and sends it out of
/// `ifindex`.
#[inline(never)]
fn send6(ctx: *mut xdp_md, s: &Scratch6, ifindex: u32) -> Action {
    let (flow, ends) = (&s.flow, &s.out);
    let old = sum_addr6(&flow.src) + sum_addr6(&flow.dst) + flow.sport as u32 + flow.dport as u32;
    let new = sum_addr6(&ends.src) + sum_addr6(&ends.dst) + ends.sport as u32 + ends.dport as u32;
    let Some(scratch) = maps::scratch() else {
        return Action::Aborted;
    };
    let (smac, dmac) = (scratch.fib.smac, scratch.fib.dmac);
    // SAFETY: reading the context's packet bounds.
    let (start, end) = unsafe { ((*ctx).data as usize, (*ctx).data_end as usize) };
    let tcp = flow.proto == IPPROTO_TCP;
    let csum_off = if tcp { L4_OFF6 + 16 } else { L4_OFF6 + 6 };
    if start + L4_OFF6 + 8 > end || start + csum_off + 2 > end {
        return Action::Aborted;
    }
    // SAFETY: bounds checked above; byte-aligned headers.
    let eth = unsafe { &mut *(start as *mut EthHdr) };
    eth.dst = dmac;
    eth.src = smac;
    // SAFETY: as above.
    let ip = unsafe { &mut *((start + ETH_LEN) as *mut Ipv6Hdr) };
    ip.hop_limit = ip.hop_limit.wrapping_sub(1);
    ip.src = ends.src;
    ip.dst = ends.dst;
    // SAFETY: bounds checked above.
    let check = unsafe { &mut *((start + csum_off) as *mut [u8; 2]) };
    let c = adjust(*check, old, new);
    // UDP over IPv6 always has a checksum; a computed 0 is sent as 0xffff.
    *check = if !tcp && c == [0, 0] { [0xff, 0xff] } else { c };
    // SAFETY: bounds checked above.
    let ports = unsafe { &mut *((start + L4_OFF6) as *mut [u8; 4]) };
    let (sp, dp) = (ends.sport.to_be_bytes(), ends.dport.to_be_bytes());
    *ports = [sp[0], sp[1], dp[0], dp[1]];
    // SAFETY: reading the context's ingress device.
    if ifindex == unsafe { (*ctx).ingress_ifindex } {
        return Action::Tx;
    }
    match XDP_DEVS.redirect(ifindex, 0) {
        Ok(_) => Action::Redirect,
        Err(_) => Action::Aborted,
    }
}
