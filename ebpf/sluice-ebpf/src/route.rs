//! Host routing (`--host-routing`, `CFG_F_HOST_ROUTING`): a packet that
//! `sl_ingress` has DNATed to a backend without SNAT, that came from one
//! of the pods' devices (`sl_peer_devs`) and whose route leaves through
//! another, is handed straight into that pod's network namespace with
//! `bpf_redirect_peer`, as a router would deliver it (TTL or hop limit
//! decremented, MAC addresses from the FIB) but without the node's IP
//! stack: no routing, no netfilter, no backlog queue. A neighbour not
//! resolved yet is left to the kernel (`bpf_redirect_neigh` out of the
//! pod's device, past the stack too). Anything else (no route, another
//! device, a TTL about to expire) goes on to the stack as without the
//! option. Replies take the usual way (their reverse NAT is on the
//! client's device).
//!
//! Only pod to pod: a client from outside the cluster would have its
//! replies masqueraded by a CNI's iptables rules once the node's conntrack
//! saw them without their request. The devices are the pods' by the
//! operator's word (`--pod-devices`) and veth or netkit by the agent's
//! check: `bpf_redirect_peer` returns `TC_ACT_REDIRECT` whatever the
//! device, and the kernel drops the packet later if it has no peer in
//! another namespace.

use aya_ebpf::{
    bindings::{__sk_buff, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_REDIRECT},
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect_neigh, bpf_redirect_peer},
    programs::TcContext,
};

use crate::{error::Verdict, headers::ETH_LEN, maps};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Protocol and ports (host order) in one argument (a BPF function takes
/// five at most).
#[inline(always)]
pub fn ports(proto: u8, sport: u16, dport: u16) -> u64 {
    (proto as u64) << 32 | (sport as u64) << 16 | dport as u64
}

/// An IPv4 packet from `src` already rewritten to `dst` (and the ports of
/// `ports`): handed to its pod, or `Next`.
#[inline(never)]
pub fn to_pod4(skb: *mut __sk_buff, ports: u64, src: u32, dst: u32) -> Verdict {
    // SAFETY: reading the context's device.
    let ingress = unsafe { (*skb).ifindex };
    if !maps::host_routing() || maps::PEER_DEVS.get_ifindex(ingress).is_none() {
        return Verdict::Next;
    }
    let Some(scratch) = maps::scratch() else {
        return Verdict::Next;
    };
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; we then set the fields
    // the IPv4 lookup reads.
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = (ports >> 32) as u8;
    p.sport = ((ports >> 16) as u16).to_be();
    p.dport = (ports as u16).to_be();
    p.ifindex = ingress;
    p.__bindgen_anon_3.ipv4_src = src;
    p.__bindgen_anon_4.ipv4_dst = dst;
    // SAFETY: the helper reads and writes only the struct we pass.
    let ret = unsafe {
        fib_lookup(
            skb as *mut _,
            p,
            core::mem::size_of::<aya_ebpf::bindings::bpf_fib_lookup>() as i32,
            0,
        )
    };
    let resolved = ret == BPF_FIB_LKUP_RET_SUCCESS as i64;
    if !(resolved || ret == BPF_FIB_LKUP_RET_NO_NEIGH as i64) || p.ifindex == ingress {
        return Verdict::Next;
    }
    let (out, dmac, smac) = (p.ifindex, p.dmac, p.smac);
    if maps::PEER_DEVS.get_ifindex(out).is_none() {
        return Verdict::Next;
    }
    let ctx = &TcContext::new(skb);
    let Ok(ttl) = ctx.load::<u8>(ETH_LEN + 8) else {
        return Verdict::Next;
    };
    let Ok(proto) = ctx.load::<u8>(ETH_LEN + 9) else {
        return Verdict::Next;
    };
    if ttl <= 1 {
        // The stack answers with its ICMP time exceeded.
        return Verdict::Next;
    }
    let from = u16::from_ne_bytes([ttl, proto]) as u64;
    let to = u16::from_ne_bytes([ttl - 1, proto]) as u64;
    if ctx.l3_csum_replace(ETH_LEN + 10, from, to, 2).is_err()
        || ctx.store(ETH_LEN + 8, &(ttl - 1), 0).is_err()
    {
        return Verdict::Next;
    }
    redirect(ctx, out, resolved.then_some((&dmac, &smac)))
}

/// `to_pod4` for an IPv6 packet.
#[inline(never)]
pub fn to_pod6(skb: *mut __sk_buff, ports: u64, src: &[u8; 16], dst: &[u8; 16]) -> Verdict {
    // SAFETY: reading the context's device.
    let ingress = unsafe { (*skb).ifindex };
    if !maps::host_routing() || maps::PEER_DEVS.get_ifindex(ingress).is_none() {
        return Verdict::Next;
    }
    let Some(scratch) = maps::scratch() else {
        return Verdict::Next;
    };
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; we then set the fields
    // the IPv6 lookup reads.
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET6;
    p.l4_protocol = (ports >> 32) as u8;
    p.sport = ((ports >> 16) as u16).to_be();
    p.dport = (ports as u16).to_be();
    p.ifindex = ingress;
    p.__bindgen_anon_3.ipv6_src = words(src);
    p.__bindgen_anon_4.ipv6_dst = words(dst);
    // SAFETY: the helper reads and writes only the struct we pass.
    let ret = unsafe {
        fib_lookup(
            skb as *mut _,
            p,
            core::mem::size_of::<aya_ebpf::bindings::bpf_fib_lookup>() as i32,
            0,
        )
    };
    let resolved = ret == BPF_FIB_LKUP_RET_SUCCESS as i64;
    if !(resolved || ret == BPF_FIB_LKUP_RET_NO_NEIGH as i64) || p.ifindex == ingress {
        return Verdict::Next;
    }
    let (out, dmac, smac) = (p.ifindex, p.dmac, p.smac);
    if maps::PEER_DEVS.get_ifindex(out).is_none() {
        return Verdict::Next;
    }
    let ctx = &TcContext::new(skb);
    let Ok(hops) = ctx.load::<u8>(ETH_LEN + 7) else {
        return Verdict::Next;
    };
    if hops <= 1 || ctx.store(ETH_LEN + 7, &(hops - 1), 0).is_err() {
        return Verdict::Next;
    }
    redirect(ctx, out, resolved.then_some((&dmac, &smac)))
}

/// With the neighbour's address (`macs`: destination, source): new L2
/// addresses, then into the peer of `out`. Without (no neighbour entry
/// yet, as for a pod that nothing on the node has talked to): out of `out`
/// with the kernel resolving it (`bpf_redirect_neigh`), which also skips
/// the node's IP stack, and creates the entry the next packets use.
#[inline(always)]
fn redirect(ctx: &TcContext, out: u32, macs: Option<(&[u8; 6], &[u8; 6])>) -> Verdict {
    let ret = match macs {
        Some((dmac, smac)) => {
            if ctx.store(0, dmac, 0).is_err() || ctx.store(6, smac, 0).is_err() {
                return Verdict::Next;
            }
            // SAFETY: a helper call on the running program's packet.
            unsafe { bpf_redirect_peer(out, 0) }
        }
        // SAFETY: NULL params: the helper does its own lookup and resolution.
        None => unsafe { bpf_redirect_neigh(out, core::ptr::null_mut(), 0, 0) },
    };
    if ret == TC_ACT_REDIRECT as i64 {
        maps::count(sluice_common::Stat::HostRouted);
        Verdict::Redirect
    } else {
        Verdict::Next
    }
}

#[inline(always)]
fn words(a: &[u8; 16]) -> [u32; 4] {
    let mut w = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        w[i] = u32::from_ne_bytes([a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]]);
        i += 1;
    }
    w
}
