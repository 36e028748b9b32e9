//! `sl_xdp`'s rewrites: routing with `bpf_fib_lookup`, address and port
//! rewrites with incremental checksum updates (XDP has no
//! `bpf_l3_csum_replace`/`bpf_l4_csum_replace`: RFC 1624 in registers,
//! `checksum::adjust`), the TTL, the Ethernet addresses, and the verdict
//! that sends the frame out (`XDP_TX` on the device it came in on,
//! `XDP_REDIRECT` to another XDP device through `sl_xdp_devs`).
//!
//! A frame whose L4 checksum is left partial by the sender (a veth with
//! TX checksum offload) cannot be fixed here: XDP sees no checksum state.
//! Real NICs deliver complete checksums; on veths the sender must have
//! TX offload off (the tests and the bench do so).

use aya_ebpf::{
    bindings::{xdp_md, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_SRC},
    helpers::bpf_fib_lookup as fib_lookup,
};
use sluice_common::{CtEntry, Stat, IPPROTO_TCP};

use crate::{
    checksum::{adjust, words4},
    conntrack::{note_reply, v4},
    flow::Flow4,
    headers::{EthHdr, Ipv4Hdr, ETH_LEN},
    maps::{self, count, XDP_DEVS},
    xdp::{Action, L4_OFF},
};

const AF_INET: u8 = 2;

/// The addresses and ports (host order) a packet leaves with.
pub struct Ends {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
}

/// Routes a packet of `flow` (of IP length `tot_len`) to `dst` from the
/// device it came in on. Returns the egress ifindex when `sl_xdp` can
/// send it there itself (the lookup found the route and the neighbour,
/// and the device is this one or an XDP device), else 0: the caller
/// passes the packet to TC. The result (source address for SNAT, L2
/// addresses) stays in the scratch map's `fib` for `route_source` and
/// `send`. A separate BPF function.
#[inline(never)]
pub fn route(ctx: *mut xdp_md, flow: &Flow4, dst: [u8; 4], tot_len: u16) -> u32 {
    if !crate::xdp::forwardable(ctx) {
        return 0;
    }
    let Some(scratch) = maps::scratch() else {
        return 0;
    };
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; the IPv4 fields follow.
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = flow.proto;
    p.sport = flow.sport.to_be();
    p.dport = flow.dport.to_be();
    p.__bindgen_anon_1.tot_len = tot_len;
    // SAFETY: reading the context's ingress device.
    let ingress = unsafe { (*ctx).ingress_ifindex };
    p.ifindex = ingress;
    p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(flow.src);
    p.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
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
    let out = p.ifindex;
    if out == ingress || XDP_DEVS.get(out).is_some() {
        out
    } else {
        0
    }
}

/// The source address the last `route` chose (the node's address for
/// SNAT, as MASQUERADE picks it).
#[inline(always)]
pub fn route_source() -> Option<[u8; 4]> {
    let scratch = maps::scratch()?;
    // SAFETY: the lookup filled the IPv4 source.
    Some(unsafe { scratch.fib.__bindgen_anon_3.ipv4_src }.to_ne_bytes())
}

/// The reply of an SNATed flow (`entry`: its reply entry): back to
/// frontend -> client, sent towards the client. A separate BPF function.
#[inline(never)]
pub fn reply(ctx: *mut xdp_md, flow: &Flow4, entry: *mut CtEntry, tot_len: u16) -> Action {
    // SAFETY: the caller found the entry; fields copied at once.
    let ends = unsafe {
        Ends {
            src: v4(&(*entry).nat_addr),
            dst: v4(&(*entry).peer_addr),
            sport: (*entry).nat_port,
            dport: (*entry).peer_port,
        }
    };
    let ifindex = route(ctx, flow, ends.dst, tot_len);
    if ifindex == 0 {
        return Action::Pass;
    }
    note_reply(flow, entry);
    count(Stat::SnatReply);
    send(ctx, flow, &ends, ifindex)
}

/// Rewrites the packet of `flow` to `ends`, decrements its TTL, puts the
/// L2 addresses of the last `route` in, and sends it out of `ifindex`. A
/// separate BPF function.
#[inline(never)]
pub fn send(ctx: *mut xdp_md, flow: &Flow4, ends: &Ends, ifindex: u32) -> Action {
    if !rewrite(ctx, flow, ends) {
        return Action::Aborted;
    }
    // SAFETY: reading the context's ingress device.
    if ifindex == unsafe { (*ctx).ingress_ifindex } {
        return Action::Tx;
    }
    match XDP_DEVS.redirect(ifindex, 0) {
        Ok(_) => Action::Redirect,
        Err(_) => Action::Aborted,
    }
}

#[inline(always)]
fn word(hi: u8, lo: u8) -> u32 {
    ((hi as u32) << 8) | lo as u32
}

#[inline(always)]
fn rewrite(ctx: *mut xdp_md, flow: &Flow4, ends: &Ends) -> bool {
    let Some(scratch) = maps::scratch() else {
        return false;
    };
    let (smac, dmac) = (scratch.fib.smac, scratch.fib.dmac);
    // SAFETY: reading the context's packet bounds.
    let (start, end) = unsafe { ((*ctx).data as usize, (*ctx).data_end as usize) };
    let tcp = flow.proto == IPPROTO_TCP;
    let csum_off = if tcp { L4_OFF + 16 } else { L4_OFF + 6 };
    // Both L4 headers reach past their checksum field.
    if start + L4_OFF + 8 > end || start + csum_off + 2 > end {
        return false;
    }
    // SAFETY: bounds checked above; byte-aligned headers.
    let eth = unsafe { &mut *(start as *mut EthHdr) };
    // SAFETY: as above.
    let ip = unsafe { &mut *((start + ETH_LEN) as *mut Ipv4Hdr) };
    eth.dst = dmac;
    eth.src = smac;
    let ttl = ip.ttl;
    let old_ip = words4(flow.src) + words4(flow.dst);
    let new_ip = words4(ends.src) + words4(ends.dst);
    ip.check = adjust(
        ip.check,
        old_ip + word(ttl, ip.proto),
        new_ip + word(ttl.wrapping_sub(1), ip.proto),
    );
    ip.ttl = ttl.wrapping_sub(1);
    ip.src = ends.src;
    ip.dst = ends.dst;
    // SAFETY: bounds checked above (2 bytes at `csum_off`, 4 at L4_OFF).
    let check = unsafe { &mut *((start + csum_off) as *mut [u8; 2]) };
    let old_l4 = old_ip + flow.sport as u32 + flow.dport as u32;
    let new_l4 = new_ip + ends.sport as u32 + ends.dport as u32;
    if tcp {
        *check = adjust(*check, old_l4, new_l4);
    } else if *check != [0, 0] {
        // UDP: 0 means "no checksum"; a computed 0 is sent as 0xffff.
        let c = adjust(*check, old_l4, new_l4);
        *check = if c == [0, 0] { [0xff, 0xff] } else { c };
    }
    // SAFETY: bounds checked above.
    let ports = unsafe { &mut *((start + L4_OFF) as *mut [u8; 4]) };
    let (s, d) = (ends.sport.to_be_bytes(), ends.dport.to_be_bytes());
    *ports = [s[0], s[1], d[0], d[1]];
    true
}
