//! Host routing (`--host-routing`, `CFG_F_HOST_ROUTING`): a service flow
//! between two of the pods' devices (`sl_peer_devs`) skips the node's IP
//! stack in both directions.
//!
//! - A packet that `sl_ingress` has DNATed to a backend without SNAT
//!   (`to_pod4`/`to_pod6`), and
//! - a backend's reply, which `sl_ingress` then reverse-NATs itself where
//!   `sl_egress` on the client's device would have (`reply4`/`reply6`),
//!
//! are handed straight into the other pod's network namespace with
//! `bpf_redirect_peer`, as a router would deliver them (TTL or hop limit
//! decremented, MAC addresses from the FIB) but without routing, netfilter
//! or the backlog queue. The FIB's answer for a pod is remembered per
//! destination and ingress device (`sl_hops4`/`sl_hops6`,
//! `sluice_common::hop`) and asked again when the entry is a second old,
//! or at once if its device is no longer a pod's or is the ingress. A
//! neighbour not resolved yet is left to the kernel
//! (`bpf_redirect_neigh`: out of the pod's device, past routing and
//! netfilter, through the device's egress). Anything else (no route,
//! another device, a TTL about to expire) goes on to the stack untouched,
//! as without the option.
//!
//! Only pod to pod: a client from outside the cluster would have its
//! replies masqueraded by a CNI's iptables rules once the node's conntrack
//! saw them without their request. The devices are the pods' by the
//! operator's word (`--pod-devices`) and veth or netkit by the agent's
//! check: `bpf_redirect_peer` returns `TC_ACT_REDIRECT` whatever the
//! device, and the kernel drops the packet later if it has no peer in
//! another namespace.

use aya_ebpf::{
    bindings::{
        __sk_buff, BPF_ANY, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_REDIRECT,
    },
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect_neigh, bpf_redirect_peer},
    programs::TcContext,
};
use sluice_common::{
    config::CFG_F_PODS_ON_SOCKETS,
    hop::{Hop4Key, Hop6Key, HopEntry, HOP_TTL_NS},
    Hook, Stat,
};

use crate::{
    checksum,
    conntrack::{note_reply6_at, note_reply_at, reverse_nat_of, syn_reply, syn_reply6, v4},
    error::Verdict,
    events,
    flow::{read, Flow4},
    headers::{ETH_LEN, TCP_SYN},
    maps::{self, count, Scratch6, CONNTRACK_V4, CONNTRACK_V6},
    nat::{self, Side},
    nat6,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Protocol and ports (host order) in one argument (a BPF function takes
/// five at most).
#[inline(always)]
pub fn ports(proto: u8, sport: u16, dport: u16) -> u64 {
    (proto as u64) << 32 | (sport as u64) << 16 | dport as u64
}

/// Where the FIB sends a packet: the device, if it is a pod's other than
/// the one it came in through, and whether its neighbour is resolved (the
/// MAC addresses are then in `Hop`).
struct Hop {
    out: u32,
    macs: Option<([u8; 6], [u8; 6])>,
}

/// The packet's device, if it is one of the pods'.
#[inline(always)]
fn from_pod(skb: *mut __sk_buff) -> Option<u32> {
    // SAFETY: reading the context's device.
    let ingress = unsafe { (*skb).ifindex };
    maps::PEER_DEVS.get_ifindex(ingress).map(|_| ingress)
}

/// Asks the FIB for the route of the packet `fill` describes (family and
/// addresses), entered through `ingress` with `ports`.
#[inline(always)]
fn lookup(
    skb: *mut __sk_buff,
    ingress: u32,
    ports: u64,
    fill: impl FnOnce(&mut aya_ebpf::bindings::bpf_fib_lookup),
) -> Option<Hop> {
    let scratch = maps::scratch()?;
    let p = &mut scratch.fib;
    // SAFETY: all-zero is a valid bpf_fib_lookup; then the fields the
    // lookup reads.
    *p = unsafe { core::mem::zeroed() };
    p.l4_protocol = (ports >> 32) as u8;
    p.sport = ((ports >> 16) as u16).to_be();
    p.dport = (ports as u16).to_be();
    p.ifindex = ingress;
    fill(p);
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
        return None;
    }
    maps::PEER_DEVS.get_ifindex(p.ifindex)?;
    Some(Hop {
        out: p.ifindex,
        macs: resolved.then_some((p.dmac, p.smac)),
    })
}

/// The hop `entry` remembers (`sluice_common::hop`), if it may still be
/// used for a packet that came in through `ingress` (its key has it too):
/// younger than `HOP_TTL_NS`, to a device that is still one of the pods',
/// not back out of the one it came in through.
#[inline(always)]
fn remembered(entry: Option<*const HopEntry>, ingress: u32, now: u64) -> Option<Hop> {
    let e = entry?;
    // SAFETY: pointer from a successful lookup; fields copied at once (a
    // racing update of the entry leaves a hop the FIB gave for the same
    // destination).
    let (stamp, out, dmac, smac) = unsafe { ((*e).stamp_ns, (*e).out, (*e).dmac, (*e).smac) };
    // Wrapping: a stamp ahead of the clock reads as old.
    if now.wrapping_sub(stamp) > HOP_TTL_NS || out == ingress {
        return None;
    }
    maps::PEER_DEVS.get_ifindex(out)?;
    Some(Hop {
        out,
        macs: Some((dmac, smac)),
    })
}

/// The entry that remembers `hop`, if resolved (it has both MAC
/// addresses), written in the scratch space and inserted by reference,
/// off the stack, under `key` (IPv4) or the scratch space's IPv6 key.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn remember(hop: &Hop, now: u64, key: Option<Hop4Key>) {
    let (Some((dmac, smac)), Some(s)) = (hop.macs, maps::scratch()) else {
        return;
    };
    s.hop = HopEntry {
        stamp_ns: now,
        out: hop.out,
        dmac,
        smac,
    };
    let _ = match key {
        Some(key) => maps::HOPS_V4.insert(key, &s.hop, BPF_ANY as u64),
        None => maps::HOPS_V6.insert(&s.hop6_key, &s.hop, BPF_ANY as u64),
    };
}

/// The hop to IPv4 `dst`: remembered, or asked of the FIB (and then
/// remembered if resolved).
#[inline(always)]
fn route4(
    skb: *mut __sk_buff,
    ingress: u32,
    ports: u64,
    (src, dst): (u32, u32),
    now: u64,
) -> Option<Hop> {
    let key = Hop4Key {
        dst: dst.to_ne_bytes(),
        ingress,
    };
    if let Some(hop) = remembered(maps::HOPS_V4.get_ptr(key), ingress, now) {
        return Some(hop);
    }
    let hop = lookup(skb, ingress, ports, |p| {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src = src;
        p.__bindgen_anon_4.ipv4_dst = dst;
    })?;
    remember(&hop, now, Some(key));
    Some(hop)
}

/// `route4` for IPv6 (the key by reference: a copy would take 20 bytes of
/// the caller's frame).
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn route6(
    skb: *mut __sk_buff,
    ingress: u32,
    ports: u64,
    src: &[u8; 16],
    dst: &[u8; 16],
    now: u64,
) -> Option<Hop> {
    {
        let s = maps::scratch()?;
        s.hop6_key = Hop6Key { dst: *dst, ingress };
        if let Some(hop) = remembered(maps::HOPS_V6.get_ptr(&s.hop6_key), ingress, now) {
            return Some(hop);
        }
    }
    let hop = lookup(skb, ingress, ports, |p| {
        p.family = AF_INET6;
        p.__bindgen_anon_3.ipv6_src = words(src);
        p.__bindgen_anon_4.ipv6_dst = words(dst);
    })?;
    // `lookup` uses the scratch space's FIB request only: the key stays.
    remember(&hop, now, None);
    Some(hop)
}

/// An IPv4 packet from `src` already rewritten to `dst` (and the ports of
/// `ports`): handed to its pod, or `Next`.
#[inline(never)]
pub fn to_pod4(skb: *mut __sk_buff, ports: u64, src: u32, dst: u32, now: u64) -> Verdict {
    if !maps::host_routing() {
        return Verdict::Next;
    }
    let Some(ingress) = from_pod(skb) else {
        return Verdict::Next;
    };
    let Some(hop) = route4(skb, ingress, ports, (src, dst), now) else {
        return Verdict::Next;
    };
    let ctx = &TcContext::new(skb);
    if !decrement_ttl(ctx) {
        return Verdict::Next;
    }
    hand_over(ctx, &hop)
}

/// `to_pod4` for an IPv6 packet.
#[inline(never)]
pub fn to_pod6(
    skb: *mut __sk_buff,
    ports: u64,
    src: &[u8; 16],
    dst: &[u8; 16],
    now: u64,
) -> Verdict {
    if !maps::host_routing() {
        return Verdict::Next;
    }
    let Some(ingress) = from_pod(skb) else {
        return Verdict::Next;
    };
    let Some(hop) = route6(skb, ingress, ports, src, dst, now) else {
        return Verdict::Next;
    };
    let ctx = &TcContext::new(skb);
    if !decrement_hop_limit(ctx) {
        return Verdict::Next;
    }
    hand_over(ctx, &hop)
}

/// A packet that no frontend takes, from a pod's device: if it is a
/// backend's reply of a flow this node DNATed (without SNAT) for a client
/// behind another pod's device, reverse-NATed here and handed to the
/// client; otherwise `Next`, untouched (`sl_egress` on the client's device
/// then does what it did before). Nothing is changed, in the packet or in
/// conntrack, until the route is known and the TTL allows the hop. While
/// every pod's flow is the sockets' (`CFG_F_PODS_ON_SOCKETS`) no pod needs
/// reverse NAT and nothing is looked up, as `sl_egress_pod` does. Called
/// with host routing on; `flags`: the config word the caller read.
#[inline(never)]
pub fn reply4(skb: *mut __sk_buff, flow: &Flow4, flags: u32) -> Verdict {
    if flags & CFG_F_PODS_ON_SOCKETS != 0 || !maps::may_be_backend_port(flow.sport) {
        return Verdict::Next;
    }
    let Some(ingress) = from_pod(skb) else {
        return Verdict::Next;
    };
    let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) else {
        return Verdict::Next;
    };
    let Some((frontend, port)) = reverse_nat_of(entry) else {
        return Verdict::Next;
    };
    let frontend = v4(&frontend);
    let ports = ports(flow.proto, flow.sport, flow.dport);
    let (src, dst) = (u32::from_ne_bytes(flow.src), u32::from_ne_bytes(flow.dst));
    let now = crate::clock::now();
    let Some(hop) = route4(skb, ingress, ports, (src, dst), now) else {
        return Verdict::Next;
    };
    let ctx = &TcContext::new(skb);
    if !decrement_ttl(ctx) {
        return Verdict::Next;
    }
    // A direct connection's SYN-ACK on the tuple of a closed service
    // flow: the stale entry goes, the packet is handed over as it is.
    if flow.has_tcp_flag(TCP_SYN) {
        if !syn_reply(flow, entry, now) {
            return hand_over(ctx, &hop);
        }
    } else {
        note_reply_at(flow, entry, now);
    }
    if nat::rewrite(ctx, flow, Side::Src, frontend, port).is_err() {
        return nat_failed();
    }
    count(Stat::ReplyNat);
    if flow.later {
        count(Stat::FragmentTracked);
    }
    hand_over(ctx, &hop)
}

/// `reply4` for IPv6 (the flow parsed into `s`).
// The key by reference: a copy would take 40 bytes of this frame.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(never)]
pub fn reply6(skb: *mut __sk_buff, s: &mut Scratch6, flags: u32) -> Verdict {
    if flags & CFG_F_PODS_ON_SOCKETS != 0 || !maps::may_be_backend_port(s.flow.sport) {
        return Verdict::Next;
    }
    let Some(ingress) = from_pod(skb) else {
        return Verdict::Next;
    };
    s.flow.ct_key_into(&mut s.ct_key);
    let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) else {
        return Verdict::Next;
    };
    let Some((frontend, port)) = reverse_nat_of(entry) else {
        return Verdict::Next;
    };
    let ports = ports(s.flow.proto, s.flow.sport, s.flow.dport);
    let now = crate::clock::now();
    let Some(hop) = route6(skb, ingress, ports, &s.flow.src, &s.flow.dst, now) else {
        return Verdict::Next;
    };
    let ctx = &TcContext::new(skb);
    if !decrement_hop_limit(ctx) {
        return Verdict::Next;
    }
    if s.flow.has_tcp_flag(TCP_SYN) {
        if !syn_reply6(&s.flow, entry, &mut s.ct_key, now) {
            return hand_over(ctx, &hop);
        }
    } else {
        note_reply6_at(&s.flow, entry, now);
    }
    if nat6::rewrite(skb, &s.flow, Side::Src, &frontend, port).is_err() {
        return nat_failed();
    }
    count(Stat::ReplyNat);
    if s.flow.later() {
        count(Stat::FragmentTracked);
    }
    hand_over(ctx, &hop)
}

/// A rewrite helper failed half way: the packet is inconsistent, dropped
/// and counted as `settle` does for the other paths.
#[inline(always)]
fn nat_failed() -> Verdict {
    count(Stat::NatFailed);
    events::bare(Stat::NatFailed, Hook::Ingress);
    Verdict::Drop
}

/// The IPv4 TTL one less, the header checksum with it, in one store of
/// TTL, protocol and checksum (the IPv4 header checksum is never left to
/// an offload, so it is computed here: RFC 1624); false (nothing changed)
/// for a TTL the stack must answer (time exceeded) or a failed helper.
#[inline(always)]
fn decrement_ttl(ctx: &TcContext) -> bool {
    // TTL, protocol, header checksum: read in place (no helper).
    let Some([ttl, proto, c0, c1]) = read::<[u8; 4]>(ctx, ETH_LEN + 8) else {
        return false;
    };
    if ttl <= 1 {
        return false;
    }
    let old = u16::from_be_bytes([ttl, proto]) as u32;
    let new = u16::from_be_bytes([ttl - 1, proto]) as u32;
    let [n0, n1] = checksum::adjust([c0, c1], old, new);
    ctx.store(ETH_LEN + 8, &[ttl - 1, proto, n0, n1], 0).is_ok()
}

/// The IPv6 hop limit one less (no header checksum).
#[inline(always)]
fn decrement_hop_limit(ctx: &TcContext) -> bool {
    let Some(hops) = read::<u8>(ctx, ETH_LEN + 7) else {
        return false;
    };
    hops > 1 && ctx.store(ETH_LEN + 7, &(hops - 1), 0).is_ok()
}

/// With the neighbour's addresses: new L2 addresses, then into the peer of
/// the pod's device. Without (no neighbour entry yet, as for a pod nothing
/// on the node has talked to): out of the pod's device with the kernel
/// resolving it (`bpf_redirect_neigh`), which skips the node's IP stack as
/// well and creates the entry the next packets use.
#[inline(always)]
fn hand_over(ctx: &TcContext, hop: &Hop) -> Verdict {
    let ret = match &hop.macs {
        Some((dmac, smac)) => {
            // Both MAC addresses in one store.
            let mut macs = [0u8; 12];
            macs[..6].copy_from_slice(dmac);
            macs[6..].copy_from_slice(smac);
            if ctx.store(0, &macs, 0).is_err() {
                return Verdict::Next;
            }
            // SAFETY: a helper call on the running program's packet.
            unsafe { bpf_redirect_peer(hop.out, 0) }
        }
        // SAFETY: NULL params: the helper does its own lookup and resolution.
        None => unsafe { bpf_redirect_neigh(hop.out, core::ptr::null_mut(), 0, 0) },
    };
    if ret == TC_ACT_REDIRECT as i64 {
        count(Stat::HostRouted);
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
