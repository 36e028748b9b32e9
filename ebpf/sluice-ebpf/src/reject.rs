//! Answers built in place and sent back out the interface they came in on:
//! a TCP RST (no backend for a TCP flow, or a flow whose backend is gone)
//! and an ICMP port unreachable (no backend for a UDP flow), the way
//! kube-proxy's REJECT rules answer. A client gets "connection refused" at
//! once instead of a timeout.

use aya_ebpf::{
    bindings::{__sk_buff, BPF_F_RECOMPUTE_CSUM},
    helpers::{bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use sluice_common::IPPROTO_TCP;

use crate::{
    checksum::{bytes_of, fold, sum_words},
    error::{Error, Verdict},
    flow::{header, Flow4},
    headers::{
        EthHdr, Ipv4Hdr, TcpHdr, UdpHdr, ETH_LEN, ETH_P_IP, IPPROTO_ICMP, IPV4_LEN, IP_DF, TCP_ACK,
        TCP_FIN, TCP_LEN, TCP_RST, TCP_SYN,
    },
};

const TTL: u8 = 64;

#[repr(C)]
struct RstPacket {
    eth: EthHdr,
    ip: Ipv4Hdr,
    tcp: TcpHdr,
}
const RST_LEN: usize = ETH_LEN + IPV4_LEN + TCP_LEN;
const _: () = assert!(core::mem::size_of::<RstPacket>() == RST_LEN);

#[repr(C)]
struct IcmpHdr {
    kind: u8,
    code: u8,
    check: [u8; 2],
    unused: [u8; 4],
}

#[repr(C)]
struct IcmpPacket {
    eth: EthHdr,
    ip: Ipv4Hdr,
    icmp: IcmpHdr,
    /// The offending packet's IP header (options dropped) and first 8 bytes.
    inner_ip: Ipv4Hdr,
    inner_l4: UdpHdr,
}
const ICMP_LEN: usize = ETH_LEN + IPV4_LEN + 8 + IPV4_LEN + 8;
const _: () = assert!(core::mem::size_of::<IcmpPacket>() == ICMP_LEN);

#[inline(always)]
fn reply_ip(src: [u8; 4], dst: [u8; 4], total: usize, proto: u8) -> Ipv4Hdr {
    let mut ip = Ipv4Hdr {
        vihl: 0x45,
        tos: 0,
        tot_len: (total as u16).to_be_bytes(),
        id: [0; 2],
        frag_off: IP_DF.to_be_bytes(),
        ttl: TTL,
        proto,
        check: [0; 2],
        src,
        dst,
    };
    ip.check = fold(sum_words::<IPV4_LEN>(bytes_of(&ip), 0));
    ip
}

/// The answer's Ethernet header: back to where the packet came from.
#[inline(always)]
pub(crate) fn swap_eth(eth: &EthHdr, ether_type: [u8; 2]) -> EthHdr {
    EthHdr {
        dst: eth.src,
        src: eth.dst,
        ether_type,
    }
}

/// Resizes the packet, writes `pkt` over its start and sends it back out
/// of the interface it arrived on.
#[inline(always)]
pub(crate) fn send_back<T>(ctx: &TcContext, pkt: &T, len: usize) -> Result<Verdict, Error> {
    const { assert!(core::mem::size_of::<T>() <= crate::maps::PKT_MAX) };
    // SAFETY: the skb pointer is the program's context.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, len as u32, 0) } != 0 {
        return Err(Error::Reject);
    }
    ctx.store(0, pkt, BPF_F_RECOMPUTE_CSUM as u64)
        .map_err(|_| Error::Reject)?;
    // SAFETY: reading a field of the context.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: plain helper call; returns TC_ACT_REDIRECT or TC_ACT_SHOT.
    let redirected = unsafe { bpf_redirect(ifindex, 0) };
    if redirected == aya_ebpf::bindings::TC_ACT_REDIRECT as i64 {
        Ok(Verdict::Redirect)
    } else {
        Err(Error::Reject)
    }
}

/// Answers a TCP segment with a RST from the address it was sent to
/// (RFC 9293 3.10.7.1). A RST is never answered. A separate BPF function:
/// its packet buffer must not share the caller's stack frame.
#[inline(never)]
pub fn tcp_reset(skb: *mut __sk_buff, flow: &Flow4) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    if flow.proto != IPPROTO_TCP || flow.has_tcp_flag(TCP_RST) {
        return Ok(Verdict::Drop);
    }
    let eth = header::<EthHdr>(ctx, 0)?;
    let ip = header::<Ipv4Hdr>(ctx, ETH_LEN)?;
    let tcp = header::<TcpHdr>(ctx, flow.l4_off)?;

    let (seq, ack, flags) = if tcp.flags & TCP_ACK != 0 {
        (tcp.ack, [0; 4], TCP_RST)
    } else {
        let ihl = ((ip.vihl & 0x0f) as u32) * 4;
        let doff = ((tcp.doff_res >> 4) as u32) * 4;
        let payload = (u16::from_be_bytes(ip.tot_len) as u32).saturating_sub(ihl + doff);
        let mut len = payload;
        if tcp.flags & TCP_SYN != 0 {
            len += 1;
        }
        if tcp.flags & TCP_FIN != 0 {
            len += 1;
        }
        let ack = u32::from_be_bytes(tcp.seq).wrapping_add(len);
        ([0; 4], ack.to_be_bytes(), TCP_RST | TCP_ACK)
    };

    let scratch = crate::maps::scratch().ok_or(Error::Reject)?;
    // SAFETY: the scratch buffer is large enough (checked in send_back) and
    // the header structs are byte-aligned.
    let out = unsafe { &mut *(scratch.pkt.as_mut_ptr() as *mut RstPacket) };
    *out = RstPacket {
        eth: swap_eth(&eth, ETH_P_IP),
        ip: reply_ip(flow.dst, flow.src, IPV4_LEN + TCP_LEN, IPPROTO_TCP),
        tcp: TcpHdr {
            sport: flow.dport.to_be_bytes(),
            dport: flow.sport.to_be_bytes(),
            seq,
            ack,
            doff_res: ((TCP_LEN / 4) as u8) << 4,
            flags,
            window: [0; 2],
            check: [0; 2],
            urg: [0; 2],
        },
    };
    // Pseudo header: source, destination, protocol, TCP length.
    let mut sum = sum_words::<4>(&flow.dst, 0);
    sum = sum_words::<4>(&flow.src, sum);
    sum += IPPROTO_TCP as u32 + TCP_LEN as u32;
    sum = sum_words::<TCP_LEN>(bytes_of(&out.tcp), sum);
    out.tcp.check = fold(sum);

    send_back(ctx, out, RST_LEN)
}

/// Answers a UDP datagram or an SCTP packet with ICMP destination/port
/// unreachable (a
/// separate BPF function, like `tcp_reset`).
#[inline(never)]
pub fn icmp_port_unreachable(skb: *mut __sk_buff, flow: &Flow4) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let eth = header::<EthHdr>(ctx, 0)?;
    let mut inner_ip = header::<Ipv4Hdr>(ctx, ETH_LEN)?;
    let inner_l4 = header::<UdpHdr>(ctx, flow.l4_off)?;
    // The quoted header is sent without its options, so its checksum is
    // computed again (found by the fuzzer: the quote kept the checksum
    // of the header with options).
    if inner_ip.vihl != 0x45 {
        inner_ip.vihl = 0x45;
        inner_ip.check = [0; 2];
        inner_ip.check = fold(sum_words::<IPV4_LEN>(bytes_of(&inner_ip), 0));
    }

    let scratch = crate::maps::scratch().ok_or(Error::Reject)?;
    // SAFETY: as in tcp_reset.
    let out = unsafe { &mut *(scratch.pkt.as_mut_ptr() as *mut IcmpPacket) };
    *out = IcmpPacket {
        eth: swap_eth(&eth, ETH_P_IP),
        ip: reply_ip(flow.dst, flow.src, ICMP_LEN - ETH_LEN, IPPROTO_ICMP),
        icmp: IcmpHdr {
            kind: 3, // destination unreachable
            code: 3, // port unreachable
            check: [0; 2],
            unused: [0; 4],
        },
        inner_ip,
        inner_l4,
    };
    let mut sum = sum_words::<8>(bytes_of(&out.icmp), 0);
    sum = sum_words::<IPV4_LEN>(bytes_of(&out.inner_ip), sum);
    sum = sum_words::<8>(bytes_of(&out.inner_l4), sum);
    out.icmp.check = fold(sum);

    send_back(ctx, out, ICMP_LEN)
}
