//! ICMP errors about NATed flows, translated back so that the client's
//! stack recognises them. The case that matters in practice is path MTU
//! discovery: a router between this node and a backend (often this node
//! itself, forwarding) answers a too-big DNATed packet with "fragmentation
//! needed", quoting the packet as it was after DNAT (client -> backend);
//! the client's socket talks to the VIP. On its way out to the client the
//! quoted destination is put back to the frontend, with the quoted IP
//! header's checksum and the ICMP checksum updated.
//!
//! Not handled: errors about SNATed flows (they arrive at the node's own
//! address) and errors generated on the client's side about replies.

use aya_ebpf::programs::TcContext;
use sluice_common::{conntrack::CT_F_SNAT, Ct4Key, CtKind, Stat, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    conntrack::v4,
    error::{Error, Verdict},
    flow::{header, MAX_L4_OFF},
    headers::{Ipv4Hdr, UdpHdr, ETH_LEN, IPPROTO_ICMP},
    maps::{count, CONNTRACK_V4},
};

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
    let inner = header::<Ipv4Hdr>(ctx, inner_off)?;
    if inner.proto != IPPROTO_TCP && inner.proto != IPPROTO_UDP {
        return Ok(Verdict::Next);
    }
    let inner_l4 = inner_off + ((inner.vihl & 0x0f) as usize) * 4;
    if inner_l4 > inner_off + 60 || inner.vihl & 0x0f < 5 {
        return Ok(Verdict::Next);
    }
    // The first 8 bytes of TCP and UDP hold the ports alike.
    let ports = header::<UdpHdr>(ctx, inner_l4)?;
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
