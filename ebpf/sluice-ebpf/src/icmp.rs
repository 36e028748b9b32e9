//! ICMP errors about NATed flows, translated back so that the client's
//! stack recognises them. The case that matters in practice is path MTU
//! discovery: a router between this node and a backend (often this node
//! itself, forwarding) answers a too-big DNATed packet with "fragmentation
//! needed", quoting the packet as it was after DNAT (client -> backend);
//! the client's socket talks to the VIP. On its way out to the client the
//! quoted destination is put back to the frontend, with the quoted IP
//! header's checksum and the ICMP checksum updated (`egress`).
//!
//! Errors about flows that were also SNATed to the node (`snat.rs`) arrive
//! at the node instead, addressed to the node and quoting a packet from
//! the node's SNAT port to the backend (`ingress`): the SNAT reply entry of
//! the quoted tuple names the client and the frontend. As Linux conntrack
//! does for kube-proxy (`nf_nat_icmp_reply_translation`), the quoted packet
//! becomes client -> frontend, the outer destination the client and the
//! outer source the frontend (whoever sent the error: a router on the
//! way, or the backend's own port unreachable); every checksum is kept
//! right (the quoted L4 checksum too when it is in the quote), and the
//! error is routed to the client as an SNAT reply is.
//!
//! Not handled: errors generated on the client's side about replies.
//!
//! Every other IPv4 packet that is not TCP, UDP or SCTP also arrives here
//! (`ingress`): a query (ping, ...) or a packet of another protocol to a
//! cluster IP is answered with ICMP port unreachable, and one to another
//! address of the service CIDRs dropped, as kube-proxy's
//! `cluster-ips-check` does for every new flow no service rule took
//! (`cluster_ips_check`).

use aya_ebpf::{bindings::__sk_buff, programs::TcContext};
use sluice_common::{
    conntrack::CT_F_SNAT, Ct4Key, CtKind, Stat, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::events;
use crate::{
    checksum::{adjust, words4},
    conntrack::v4,
    error::{settle, Error, Verdict},
    flow::MAX_L4_OFF,
    headers::{Ipv4Hdr, UdpHdr, ETH_LEN, IPPROTO_ICMP, IPV4_LEN, IP_MF_OFFSET},
    maps::{self, count, CONNTRACK_V4},
    snat,
};
use sluice_common::Hook;

/// `frag_off` bits of the fragment offset: a quoted packet with one has
/// no L4 header.
const IP_OFFSET: u16 = 0x1fff;
const DEST_UNREACH: u8 = 3;
const TIME_EXCEEDED: u8 = 11;
const PARAMETER_PROBLEM: u8 = 12;

/// An ICMP error leaving towards a client.
#[inline(always)]
pub fn egress(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<Verdict, Error> {
    if ip.proto != IPPROTO_ICMP {
        return Ok(Verdict::Next);
    }
    let l4_off = ETH_LEN + ((ip.vihl & 0x0f) as usize) * 4;
    if l4_off > MAX_L4_OFF {
        return Ok(Verdict::Next);
    }
    let kind: u8 = ctx.load(l4_off).map_err(|_| Error::Truncated)?;
    if kind != DEST_UNREACH && kind != TIME_EXCEEDED && kind != PARAMETER_PROBLEM {
        return Ok(Verdict::Next);
    }
    let inner_off = l4_off + 8;
    // Loaded by helper, not read in place: with IP options in the outer
    // header and in the quote, the quoted ports lie beyond the bound of
    // direct packet reads (`flow::MAX_L4_OFF`).
    let inner: Ipv4Hdr = ctx.load(inner_off).map_err(|_| Error::Truncated)?;
    if inner.proto != IPPROTO_TCP && inner.proto != IPPROTO_UDP && inner.proto != IPPROTO_SCTP {
        return Ok(Verdict::Next);
    }
    let inner_l4 = inner_off + ((inner.vihl & 0x0f) as usize) * 4;
    if inner_l4 > inner_off + 60 || inner.vihl & 0x0f < 5 {
        return Ok(Verdict::Next);
    }
    // The quote must hold the ports within the IP packet (RFC 792: 8
    // bytes of the datagram), not in the frame's padding after it: a port
    // rewritten there would change bytes the ICMP checksum does not cover
    // while the checksum is updated for them. A shorter quote is left
    // alone, as on the way in.
    if inner_l4 + 8 > ETH_LEN + u16::from_be_bytes(ip.tot_len) as usize {
        return Ok(Verdict::Next);
    }
    // The first 8 bytes of TCP, UDP and SCTP hold the ports alike. (The
    // quoted L4 checksum is left as it is, as for TCP and UDP here.)
    let ports: UdpHdr = ctx.load(inner_l4).map_err(|_| Error::Truncated)?;
    let (sport, dport) = (
        u16::from_be_bytes(ports.sport),
        u16::from_be_bytes(ports.dport),
    );
    // The quoted packet went client -> backend: its reply entry is keyed
    // backend -> client.
    let key = Ct4Key::new(inner.dst, inner.src, dport, sport, inner.proto);
    let Some(entry) = CONNTRACK_V4.get_ptr(key) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: pointer from a successful lookup; fields copied at once.
    let (kind, flags, frontend, frontend_port) = unsafe {
        (
            (*entry).kind,
            (*entry).flags,
            v4(&(*entry).nat_addr),
            (*entry).nat_port,
        )
    };
    if kind != CtKind::Reply as u8 || flags & CT_F_SNAT != 0 {
        return Ok(Verdict::Next);
    }

    let icmp_csum = l4_off + 2;
    let old_addr = u32::from_ne_bytes(inner.dst) as u64;
    let new_addr = u32::from_ne_bytes(frontend) as u64;
    let old_port = dport.to_be() as u64;
    let new_port = frontend_port.to_be() as u64;
    // The quoted header's own checksum, then the ICMP checksum over every
    // quoted word that changes (the address, that checksum, the port).
    let old_ip_csum: u16 = ctx.load(inner_off + 10).map_err(|_| Error::Nat)?;
    ctx.l3_csum_replace(inner_off + 10, old_addr, new_addr, 4)
        .map_err(|_| Error::Nat)?;
    let new_ip_csum: u16 = ctx.load(inner_off + 10).map_err(|_| Error::Nat)?;
    ctx.store(inner_off + 16, &frontend, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(inner_l4 + 2, &frontend_port.to_be(), 0)
        .map_err(|_| Error::Nat)?;
    ctx.l4_csum_replace(icmp_csum, old_addr, new_addr, 4)
        .map_err(|_| Error::Nat)?;
    ctx.l4_csum_replace(icmp_csum, old_ip_csum as u64, new_ip_csum as u64, 2)
        .map_err(|_| Error::Nat)?;
    ctx.l4_csum_replace(icmp_csum, old_port, new_port, 2)
        .map_err(|_| Error::Nat)?;
    count(Stat::IcmpTranslated);
    Ok(Verdict::Next)
}

/// ICMP types that open a flow in conntrack's eyes (echo, timestamp,
/// information and address mask requests): the only ICMP packets
/// kube-proxy's `ct state new` rules see.
#[inline(always)]
fn is_query(kind: u8) -> bool {
    matches!(kind, 8 | 13 | 15 | 17)
}

/// kube-proxy's `cluster-ips-check` for an IPv4 packet that is not TCP,
/// UDP or SCTP (`sl_ingress` calls it after `ingress` passed the packet):
/// an ICMP query or a packet of another protocol to a cluster IP gets ICMP
/// port unreachable (nft's `reject`), one to another address of the
/// service CIDRs is dropped, anything else (ICMP errors and replies
/// included: no new flows) passes. A later fragment has no header to
/// quote: dropped where its first one was refused. A separate BPF
/// function, beside `ingress` rather than under it (stack).
#[inline(never)]
pub fn cluster_ips_check(skb: *mut __sk_buff) -> Verdict {
    settle(try_cluster_ips_check(skb))
}

#[inline(always)]
fn try_cluster_ips_check(skb: *mut __sk_buff) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let ip: Ipv4Hdr = ctx.load(ETH_LEN).map_err(|_| Error::Truncated)?;
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    if ihl < IPV4_LEN {
        return Ok(Verdict::Next);
    }
    let l4_off = ETH_LEN + ihl;
    let first = u16::from_be_bytes(ip.frag_off) & IP_OFFSET == 0;
    if ip.proto == IPPROTO_ICMP && first {
        let kind: u8 = ctx.load(l4_off).map_err(|_| Error::Truncated)?;
        if !is_query(kind) {
            return Ok(Verdict::Next);
        }
    }
    let kind = maps::svcnet_v4(u32::from_ne_bytes(ip.dst));
    if kind == 0 {
        return Ok(Verdict::Next);
    }
    if kind != sluice_common::maps::SVCNET_CLUSTER_IP {
        count(Stat::UnallocatedIp);
        events::bare(Stat::UnallocatedIp, Hook::Ingress);
        return Ok(Verdict::Drop);
    }
    if !first {
        count(Stat::FragmentDropped);
        events::bare(Stat::FragmentDropped, Hook::Ingress);
        return Ok(Verdict::Drop);
    }
    count(Stat::UnservedPort);
    let flow = crate::flow::Flow4 {
        src: ip.src,
        dst: ip.dst,
        sport: 0,
        dport: 0,
        proto: ip.proto,
        tcp_flags: 0,
        l4_off,
        later: false,
    };
    events::ingress4(Stat::UnservedPort, skb, &flow, 0, 0);
    crate::reject::icmp_port_unreachable(skb, &flow)
}

/// An IPv4 packet that is not TCP, UDP or SCTP arriving at the node: an
/// ICMP error is translated and sent on to the client when it is about an
/// SNATed flow, otherwise passed; anything else meets the
/// `cluster_ips_check`. A separate
/// BPF function (its frame stays off `sl_ingress`'s, which the SNAT chain
/// fills), returning a `Verdict` (see `error::settle`).
#[inline(never)]
pub fn ingress(skb: *mut __sk_buff) -> Verdict {
    settle(try_ingress(skb))
}

#[inline(always)]
fn try_ingress(skb: *mut __sk_buff) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    // Loaded with the helper throughout: the quote may lie beyond the
    // linear part.
    let ip: Ipv4Hdr = ctx.load(ETH_LEN).map_err(|_| Error::Truncated)?;
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    if ihl < IPV4_LEN {
        return Ok(Verdict::Next);
    }
    let l4_off = ETH_LEN + ihl;
    if ip.proto != IPPROTO_ICMP || u16::from_be_bytes(ip.frag_off) & IP_MF_OFFSET != 0 {
        return Ok(Verdict::Next);
    }
    // The end of the IP packet (the frame may carry padding).
    let end = ETH_LEN + u16::from_be_bytes(ip.tot_len) as usize;
    let kind: u8 = ctx.load(l4_off).map_err(|_| Error::Truncated)?;
    if kind != DEST_UNREACH && kind != TIME_EXCEEDED && kind != PARAMETER_PROBLEM {
        return Ok(Verdict::Next);
    }
    let inner_off = l4_off + 8;
    let inner: Ipv4Hdr = ctx.load(inner_off).map_err(|_| Error::Truncated)?;
    let inner_ihl = ((inner.vihl & 0x0f) as usize) * 4;
    if (inner.proto != IPPROTO_TCP && inner.proto != IPPROTO_UDP)
        || inner_ihl < IPV4_LEN
        || u16::from_be_bytes(inner.frag_off) & IP_OFFSET != 0
    {
        return Ok(Verdict::Next);
    }
    let inner_l4 = inner_off + inner_ihl;
    // The quote must hold the ports (RFC 792: 8 bytes of the datagram);
    // a shorter one is left alone.
    if inner_l4 + 8 > end {
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
    let key = Ct4Key::new(inner.dst, inner.src, dport, sport, inner.proto);
    let Some(entry) = CONNTRACK_V4.get_ptr(key) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: pointer from a successful lookup; fields copied at once.
    let (ct_kind, flags, client, client_port, frontend, frontend_port) = unsafe {
        (
            (*entry).kind,
            (*entry).flags,
            v4(&(*entry).peer_addr),
            (*entry).peer_port,
            v4(&(*entry).nat_addr),
            (*entry).nat_port,
        )
    };
    if ct_kind != CtKind::Reply as u8 || flags & CT_F_SNAT == 0 {
        return Ok(Verdict::Next);
    }
    let Some((ifindex, _)) = snat::route_to(ctx, IPPROTO_ICMP, 0, 0, frontend, client) else {
        count(Stat::SnatFailed);
        events::bare(Stat::SnatFailed, Hook::Ingress);
        return Ok(Verdict::Drop);
    };
    let new_ports = [
        (client_port >> 8) as u8,
        client_port as u8,
        (frontend_port >> 8) as u8,
        frontend_port as u8,
    ];

    // The quoted L4 checksum, as Linux updates it: TCP's only when the
    // quote holds the whole TCP header, UDP's unless it is 0 (none).
    let (csum_off, has_csum) = if inner.proto == IPPROTO_TCP {
        (inner_l4 + 16, inner_l4 + 20 <= end)
    } else {
        (inner_l4 + 6, true)
    };
    let mut l4_old = [0u8; 2];
    let mut l4_new = [0u8; 2];
    if has_csum {
        l4_old = ctx.load(csum_off).map_err(|_| Error::Truncated)?;
        if inner.proto == IPPROTO_TCP || l4_old != [0, 0] {
            let old = words4(inner.src) + words4(inner.dst) + words4(ports);
            let new = words4(client) + words4(frontend) + words4(new_ports);
            l4_new = adjust(l4_old, old, new);
            if inner.proto == IPPROTO_UDP && l4_new == [0, 0] {
                l4_new = [0xff, 0xff];
            }
        } else {
            l4_new = l4_old;
        }
    }
    let ip_csum_new = adjust(
        inner.check,
        words4(inner.src) + words4(inner.dst),
        words4(client) + words4(frontend),
    );
    // The ICMP checksum covers every quoted byte that changes (no
    // pseudo-header in IPv4: the outer addresses are not in it).
    let icmp_csum: [u8; 2] = ctx.load(l4_off + 2).map_err(|_| Error::Truncated)?;
    let pair = |c: [u8; 2]| u16::from_be_bytes(c) as u32;
    let icmp_new = adjust(
        icmp_csum,
        words4(inner.src) + words4(inner.dst) + words4(ports) + pair(inner.check) + pair(l4_old),
        words4(client) + words4(frontend) + words4(new_ports) + pair(ip_csum_new) + pair(l4_new),
    );
    let outer_new = adjust(
        ip.check,
        words4(ip.src) + words4(ip.dst),
        words4(frontend) + words4(client),
    );

    ctx.store(inner_off + 10, &ip_csum_new, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(inner_off + 12, &client, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(inner_off + 16, &frontend, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(inner_l4, &new_ports, 0).map_err(|_| Error::Nat)?;
    if has_csum {
        ctx.store(csum_off, &l4_new, 0).map_err(|_| Error::Nat)?;
    }
    ctx.store(l4_off + 2, &icmp_new, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(ETH_LEN + 10, &outer_new, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(ETH_LEN + 12, &frontend, 0)
        .map_err(|_| Error::Nat)?;
    ctx.store(ETH_LEN + 16, &client, 0)
        .map_err(|_| Error::Nat)?;
    count(Stat::IcmpSnatTranslated);
    snat::send(ctx, ifindex)
}
