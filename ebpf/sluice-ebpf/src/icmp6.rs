//! ICMPv6 errors about NATed flows, translated back so that the client's
//! stack recognises them: the IPv6 twin of `icmp.rs`. It matters more for
//! IPv6 than for IPv4, as routers never fragment: a node or router between
//! here and a backend answers a too-big DNATed packet with Packet Too Big,
//! quoting it as it was after DNAT (client -> backend), while the client's
//! socket talks to the VIP. On its way out to the client the quoted
//! destination is put back to the frontend, and the ICMPv6 checksum is
//! updated for the changed bytes (the quoted packet is ordinary data to
//! it; the outer addresses do not change, so no pseudo-header update).
//!
//! Errors about flows also SNATed to the node (`snat6.rs`) arrive at the
//! node, quoting node:SNAT port -> backend (`ingress`): as for IPv4 (and
//! as Linux conntrack does), the quote becomes client -> frontend, the
//! outer destination the client and the outer source the frontend; the
//! ICMPv6 checksum takes the changed quote and, through its
//! pseudo-header, the changed outer addresses; the error is routed to the
//! client as an SNAT reply is.
//!
//! Not handled, as for IPv4: errors generated on the client's side about
//! replies.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::{bpf_csum_diff, bpf_skb_load_bytes},
    programs::TcContext,
};
use sluice_common::{conntrack::CT_F_SNAT, CtKind, Stat, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

use crate::events;
use crate::{
    checksum::{adjust, sum_addr6, words4},
    error::{settle, Error, Verdict},
    flow6::{is_ext, same_addr, walk, walked, L4_OFF6},
    headers::{Ipv6Hdr, ETH_LEN, IPPROTO_ICMPV6, IPV6_LEN},
    maps::{self, count, Scratch6, CONNTRACK_V6},
    snat6,
};
use sluice_common::Hook;

const DEST_UNREACH: u8 = 1;
const PACKET_TOO_BIG: u8 = 2;
const TIME_EXCEEDED: u8 = 3;
const PARAMETER_PROBLEM: u8 = 4;

/// Offsets from the ICMPv6 header (`Flow6::l4_off`, behind any extension
/// headers of the error itself): its checksum, the quoted IPv6 header,
/// the quote's source and destination.
const ICMP_CSUM: usize = 2;
const INNER: usize = 8;
const INNER_SRC: usize = INNER + 8;
const INNER_DST: usize = INNER + 24;

/// Where the quoted packet's L4 header is, behind the quote's own
/// extension headers (walked as the packet's were: `flow6::walk`), and
/// its protocol; `None` when the walk does not get there.
#[inline(always)]
fn inner_l4(skb: *mut __sk_buff, inner: usize, next: u8) -> Option<(u8, usize)> {
    let l4 = inner + IPV6_LEN;
    if !is_ext(next) {
        return Some((next, l4));
    }
    walked(walk(skb, l4 as u32, next as u32)).ok()
}

/// An ICMPv6 message leaving towards a client (a separate BPF function,
/// returning a `Verdict`, see `error::settle`).
#[inline(never)]
pub fn egress(skb: *mut __sk_buff, s: &mut Scratch6) -> Verdict {
    settle(try_egress(skb, s))
}

#[inline(always)]
fn try_egress(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let icmp = s.flow.l4_off();
    let kind: u8 = ctx.load(icmp).map_err(|_| Error::Truncated)?;
    if !matches!(
        kind,
        DEST_UNREACH | PACKET_TOO_BIG | TIME_EXCEEDED | PARAMETER_PROBLEM
    ) {
        return Ok(Verdict::Next);
    }
    // Loaded with the helper: the quote may lie beyond the linear part.
    let inner: Ipv6Hdr = ctx.load(icmp + INNER).map_err(|_| Error::Truncated)?;
    let Some((proto, inner_l4)) = inner_l4(skb, icmp + INNER, inner.next_header) else {
        return Ok(Verdict::Next);
    };
    if !matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP) {
        return Ok(Verdict::Next);
    }
    // The quote must hold the ports within the IPv6 packet, not in the
    // frame's padding after it (whose bytes the ICMPv6 checksum does not
    // cover), as on the way in.
    let payload_len: [u8; 2] = ctx.load(ETH_LEN + 4).map_err(|_| Error::Truncated)?;
    if inner_l4 + 8 > L4_OFF6 + u16::from_be_bytes(payload_len) as usize {
        return Ok(Verdict::Next);
    }
    // The first 4 bytes of TCP, UDP and SCTP are the ports alike.
    let ports: [u8; 4] = ctx.load(inner_l4).map_err(|_| Error::Truncated)?;
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    // The quoted packet went client -> backend: its reply entry is keyed
    // backend -> client.
    let key = &mut s.ct_key;
    key.src = inner.dst;
    key.dst = inner.src;
    key.sport = dport;
    key.dport = sport;
    key.proto = proto;
    key._pad = [0; 3];
    let Some(entry) = CONNTRACK_V6.get_ptr(&*key) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: pointer from a successful lookup; fields copied at once.
    let (entry_kind, mut frontend, frontend_port) =
        unsafe { ((*entry).kind, (*entry).nat_addr, (*entry).nat_port) };
    if entry_kind != CtKind::Reply as u8 {
        return Ok(Verdict::Next);
    }
    let mut old = inner.dst;
    if !same_addr(&old, &frontend) {
        // SAFETY: two 16-byte stack arrays, as the helper requires.
        let diff = unsafe {
            bpf_csum_diff(
                old.as_mut_ptr().cast(),
                16,
                frontend.as_mut_ptr().cast(),
                16,
                0,
            )
        };
        if diff < 0 {
            return Err(Error::Nat);
        }
        ctx.l4_csum_replace(icmp + ICMP_CSUM, 0, diff as u64, 0)
            .map_err(|_| Error::Nat)?;
        ctx.store(icmp + INNER_DST, &frontend, 0)
            .map_err(|_| Error::Nat)?;
    }
    if dport != frontend_port {
        let (from, to) = (dport.to_be() as u64, frontend_port.to_be() as u64);
        ctx.l4_csum_replace(icmp + ICMP_CSUM, from, to, 2)
            .map_err(|_| Error::Nat)?;
        ctx.store(inner_l4 + 2, &frontend_port.to_be(), 0)
            .map_err(|_| Error::Nat)?;
    }
    count(Stat::IcmpTranslated);
    Ok(Verdict::Next)
}

/// kube-proxy's `cluster-ips-check` for an IPv6 packet that is not TCP,
/// UDP or SCTP (`sl_ingress6` calls it for other protocols, and for
/// ICMPv6 that `ingress` passed): an echo request or a packet of another
/// protocol to a cluster IP gets ICMPv6 port unreachable, one to another
/// address of the service CIDRs is dropped, anything else (ICMPv6 errors,
/// replies, neighbour discovery: no new flows) passes.
#[inline(never)]
pub fn cluster_ips_check(skb: *mut __sk_buff, s: &mut Scratch6) -> Verdict {
    settle(try_cluster_ips_check(skb, s))
}

#[inline(always)]
fn try_cluster_ips_check(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    load_into(skb, ETH_LEN, &mut s.icmp_outer)?;
    // The header the parser stopped at, behind any extension headers.
    let proto = s.flow.proto;
    if proto == IPPROTO_ICMPV6 {
        let kind: u8 = ctx.load(s.flow.l4_off()).map_err(|_| Error::Truncated)?;
        // Echo request: the one ICMPv6 query conntrack opens a flow for.
        if kind != 128 {
            return Ok(Verdict::Next);
        }
    }
    let kind = maps::svcnet_v6(&mut s.local_key, &s.icmp_outer.dst);
    if kind == 0 {
        return Ok(Verdict::Next);
    }
    if kind != sluice_common::maps::SVCNET_CLUSTER_IP {
        count(Stat::UnallocatedIp);
        events::bare(Stat::UnallocatedIp, Hook::Ingress);
        return Ok(Verdict::Drop);
    }
    count(Stat::UnservedPort);
    s.flow.src = s.icmp_outer.src;
    s.flow.dst = s.icmp_outer.dst;
    s.flow.proto = proto;
    s.flow.sport = 0;
    s.flow.dport = 0;
    s.flow.tcp_flags = 0;
    s.flow.frag = crate::flow6::FRAG_NONE;
    s.flow.frag_id = 0;
    events::ingress6(Stat::UnservedPort, skb, &s.flow, 0, 0);
    Ok(crate::reject6::port_unreachable(skb, &s.flow))
}

/// An ICMPv6 message arriving at the node: translated and sent on to the
/// client when it is an error about an SNATed flow, otherwise passed.
#[inline(never)]
pub fn ingress(skb: *mut __sk_buff, s: &mut Scratch6) -> Verdict {
    settle(try_ingress(skb, s))
}

/// Copies a `T` out of the packet at `off` into `dst` (map memory: no
/// stack copy), with the helper, which reads beyond the linear part too.
#[inline(always)]
fn load_into<T>(skb: *mut __sk_buff, off: usize, dst: &mut T) -> Result<(), Error> {
    // SAFETY: the helper writes exactly `size_of::<T>()` bytes into `dst`,
    // a byte-aligned header struct for which any bytes are valid.
    let ret = unsafe {
        bpf_skb_load_bytes(
            skb.cast(),
            off as u32,
            (dst as *mut T).cast(),
            core::mem::size_of::<T>() as u32,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(Error::Truncated)
    }
}

#[inline(always)]
fn try_ingress(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let icmp = s.flow.l4_off();
    let kind: u8 = ctx.load(icmp).map_err(|_| Error::Truncated)?;
    if !matches!(
        kind,
        DEST_UNREACH | PACKET_TOO_BIG | TIME_EXCEEDED | PARAMETER_PROBLEM
    ) {
        return Ok(Verdict::Next);
    }
    load_into(skb, ETH_LEN, &mut s.icmp_outer)?;
    let end = L4_OFF6 + u16::from_be_bytes(s.icmp_outer.payload_len) as usize;
    if icmp + INNER + IPV6_LEN > end {
        return Ok(Verdict::Next);
    }
    load_into(skb, icmp + INNER, &mut s.icmp_inner)?;
    let Some((proto, inner_l4)) = inner_l4(skb, icmp + INNER, s.icmp_inner.next_header) else {
        return Ok(Verdict::Next);
    };
    // The quote must hold the ports (its first 8 L4 bytes); a shorter one
    // is left alone.
    if inner_l4 + 8 > end {
        return Ok(Verdict::Next);
    }
    let inner = &s.icmp_inner;
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return Ok(Verdict::Next);
    }
    let ports: [u8; 4] = ctx.load(inner_l4).map_err(|_| Error::Truncated)?;
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    let config = maps::config();
    if config.snat_port_min == 0 || sport < config.snat_port_min || sport > config.snat_port_max {
        return Ok(Verdict::Next);
    }
    // The quoted packet went node:port -> backend; the SNAT reply entry is
    // keyed backend -> node:port.
    let key = &mut s.ct_key;
    key.src = inner.dst;
    key.dst = inner.src;
    key.sport = dport;
    key.dport = sport;
    key.proto = proto;
    key._pad = [0; 3];
    let Some(entry) = CONNTRACK_V6.get_ptr(&*key) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: pointer from a successful lookup; fields copied at once. The
    // client goes into the key's destination, where `snat6::route` reads
    // it.
    let (ct_kind, flags, client_port, frontend_port) = unsafe {
        s.ct_key.dst = (*entry).peer_addr;
        (
            (*entry).kind,
            (*entry).flags,
            (*entry).peer_port,
            (*entry).nat_port,
        )
    };
    if ct_kind != CtKind::Reply as u8 || flags & CT_F_SNAT == 0 {
        return Ok(Verdict::Next);
    }
    s.flow.src = s.icmp_outer.src;
    s.flow.proto = IPPROTO_ICMPV6;
    s.flow.sport = 0;
    s.flow.dport = 0;
    let Some(ifindex) = snat6::route(skb, s, true) else {
        count(Stat::SnatFailed);
        events::ingress6(Stat::SnatFailed, skb, &s.flow, 0, 0);
        return Ok(Verdict::Drop);
    };
    // SAFETY: as above (the entry stays valid for this program run).
    unsafe { s.snat_addr = (*entry).nat_addr };
    let (client, frontend) = (&s.ct_key.dst, &s.snat_addr);
    let (outer, inner) = (&s.icmp_outer, &s.icmp_inner);
    let old_inner = sum_addr6(&inner.src) + sum_addr6(&inner.dst);
    let old_outer = sum_addr6(&outer.src) + sum_addr6(&outer.dst);
    let addrs = sum_addr6(client) + sum_addr6(frontend);
    let new_ports = [
        (client_port >> 8) as u8,
        client_port as u8,
        (frontend_port >> 8) as u8,
        frontend_port as u8,
    ];

    // The quoted L4 checksum, as Linux updates it: TCP's only when the
    // quote holds the whole TCP header, UDP's unless it is 0.
    let (csum_off, has_csum) = if proto == IPPROTO_TCP {
        (inner_l4 + 16, inner_l4 + 20 <= end)
    } else {
        (inner_l4 + 6, true)
    };
    let mut l4_old = [0u8; 2];
    let mut l4_new = [0u8; 2];
    if has_csum {
        l4_old = ctx.load(csum_off).map_err(|_| Error::Truncated)?;
        if proto == IPPROTO_TCP || l4_old != [0, 0] {
            l4_new = adjust(l4_old, old_inner + words4(ports), addrs + words4(new_ports));
            if proto == IPPROTO_UDP && l4_new == [0, 0] {
                l4_new = [0xff, 0xff];
            }
        } else {
            l4_new = l4_old;
        }
    }
    // The ICMPv6 checksum: the outer addresses (pseudo-header) and every
    // quoted byte that changes.
    let pair = |c: [u8; 2]| u16::from_be_bytes(c) as u32;
    let icmp_csum: [u8; 2] = ctx.load(icmp + ICMP_CSUM).map_err(|_| Error::Truncated)?;
    let icmp_new = adjust(
        icmp_csum,
        old_outer + old_inner + words4(ports) + pair(l4_old),
        addrs + addrs + words4(new_ports) + pair(l4_new),
    );

    ctx.store(icmp + INNER_SRC, client, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(icmp + INNER_DST, frontend, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(inner_l4, &new_ports, 0).map_err(|_| Error::Nat)?;
    if has_csum {
        ctx.store(csum_off, &l4_new, 0).map_err(|_| Error::Nat)?;
    }
    ctx.store(icmp + ICMP_CSUM, &icmp_new, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(ETH_LEN + 8, frontend, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(ETH_LEN + 24, client, 0).map_err(|_| Error::Nat)?;
    count(Stat::IcmpSnatTranslated);
    snat6::send(skb, ifindex)
}
