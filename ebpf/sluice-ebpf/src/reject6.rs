//! The IPv6 answers of `reject.rs`: a TCP RST, or an ICMPv6 destination
//! unreachable / port unreachable (type 1, code 4) for UDP, built in place
//! and sent back out of the interface the packet came in on.

use aya_ebpf::{bindings::__sk_buff, programs::TcContext};
use sluice_common::IPPROTO_TCP;

use crate::{
    checksum::{bytes_of, fold, sum_words},
    error::{settle, Error, Verdict},
    flow::header,
    flow6::{read6, Flow6},
    headers::{
        EthHdr, Ipv6Hdr, TcpHdr, UdpHdr, ETH_LEN, ETH_P_IPV6, IPPROTO_ICMPV6, IPV6_LEN, TCP_ACK,
        TCP_FIN, TCP_LEN, TCP_RST, TCP_SYN, UDP_LEN,
    },
    reject::{send_back, swap_eth},
};

const HOP_LIMIT: u8 = 64;

#[repr(C)]
struct Rst6Packet {
    eth: EthHdr,
    ip: Ipv6Hdr,
    tcp: TcpHdr,
}
const RST6_LEN: usize = ETH_LEN + IPV6_LEN + TCP_LEN;
const _: () = assert!(core::mem::size_of::<Rst6Packet>() == RST6_LEN);

#[repr(C)]
struct Icmp6Hdr {
    kind: u8,
    code: u8,
    check: [u8; 2],
    unused: [u8; 4],
}

#[repr(C)]
struct Icmp6Packet {
    eth: EthHdr,
    ip: Ipv6Hdr,
    icmp: Icmp6Hdr,
    /// The offending packet's IPv6 header and UDP header.
    inner_ip: Ipv6Hdr,
    inner_l4: UdpHdr,
}
const ICMP6_BODY: usize = 8 + IPV6_LEN + UDP_LEN;
const ICMP6_LEN: usize = ETH_LEN + IPV6_LEN + ICMP6_BODY;
const _: () = assert!(core::mem::size_of::<Icmp6Packet>() == ICMP6_LEN);

#[inline(always)]
fn reply_ip(src: [u8; 16], dst: [u8; 16], payload: usize, next_header: u8) -> Ipv6Hdr {
    Ipv6Hdr {
        vtcfl: [0x60, 0, 0, 0],
        payload_len: (payload as u16).to_be_bytes(),
        next_header,
        hop_limit: HOP_LIMIT,
        src,
        dst,
    }
}

/// The IPv6 pseudo header's share of an upper-layer checksum (RFC 8200
/// 8.1): both addresses, the upper-layer length and the next header.
#[inline(always)]
fn pseudo_sum(src: &[u8; 16], dst: &[u8; 16], len: usize, next_header: u8) -> u32 {
    let sum = sum_words::<16>(src, 0);
    sum_words::<16>(dst, sum) + len as u32 + next_header as u32
}

/// Answers a TCP segment with a RST from the address it was sent to. A
/// RST is never answered. A separate BPF function, like `reject.rs`'s
/// (returning a `Verdict`, see `error::settle`).
#[inline(never)]
pub fn tcp_reset(skb: *mut __sk_buff, flow: &Flow6) -> Verdict {
    settle(try_tcp_reset(skb, flow))
}

#[inline(always)]
fn try_tcp_reset(skb: *mut __sk_buff, flow: &Flow6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    if flow.proto != IPPROTO_TCP || flow.has_tcp_flag(TCP_RST) {
        return Ok(Verdict::Drop);
    }
    let eth = header::<EthHdr>(ctx, 0)?;
    let payload_len: [u8; 2] = ctx.load(ETH_LEN + 4).map_err(|_| Error::Truncated)?;
    let tcp = read6::<TcpHdr>(ctx, flow.l4_off()).ok_or(Error::Truncated)?;

    let (seq, ack, flags) = if tcp.flags & TCP_ACK != 0 {
        (tcp.ack, [0; 4], TCP_RST)
    } else {
        let doff = ((tcp.doff_res >> 4) as u32) * 4;
        // The segment's data: the IPv6 payload without the extension
        // headers and the TCP header.
        let mut len = (u16::from_be_bytes(payload_len) as u32)
            .saturating_sub(flow.ext_len() as u32)
            .saturating_sub(doff);
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
    let out = unsafe { &mut *(scratch.pkt.as_mut_ptr() as *mut Rst6Packet) };
    out.eth = swap_eth(&eth, ETH_P_IPV6);
    out.ip = reply_ip(flow.dst, flow.src, TCP_LEN, IPPROTO_TCP);
    out.tcp = TcpHdr {
        sport: flow.dport.to_be_bytes(),
        dport: flow.sport.to_be_bytes(),
        seq,
        ack,
        doff_res: ((TCP_LEN / 4) as u8) << 4,
        flags,
        window: [0; 2],
        check: [0; 2],
        urg: [0; 2],
    };
    let sum = pseudo_sum(&flow.dst, &flow.src, TCP_LEN, IPPROTO_TCP);
    out.tcp.check = fold(sum_words::<TCP_LEN>(bytes_of(&out.tcp), sum));

    send_back(ctx, out, RST6_LEN)
}

/// Answers a UDP datagram or an SCTP packet with ICMPv6 port unreachable,
/// quoting its IPv6 header and the first 8 bytes of its L4 header (the
/// client's stack finds its socket by them).
#[inline(never)]
pub fn port_unreachable(skb: *mut __sk_buff, flow: &Flow6) -> Verdict {
    settle(try_port_unreachable(skb, flow))
}

#[inline(always)]
fn try_port_unreachable(skb: *mut __sk_buff, flow: &Flow6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    if flow.proto == IPPROTO_TCP {
        return Ok(Verdict::Drop);
    }
    let eth = header::<EthHdr>(ctx, 0)?;

    let scratch = crate::maps::scratch().ok_or(Error::Reject)?;
    // SAFETY: as in tcp_reset.
    let out = unsafe { &mut *(scratch.pkt.as_mut_ptr() as *mut Icmp6Packet) };
    out.inner_ip = header::<Ipv6Hdr>(ctx, ETH_LEN)?;
    out.inner_l4 = read6::<UdpHdr>(ctx, flow.l4_off()).ok_or(Error::Truncated)?;
    let ext_len = flow.ext_len();
    if ext_len != 0 {
        // Behind extension headers (or a first fragment's fragment
        // header): quoted as the plain datagram they carry (the quote has
        // no room for them), which is what the client's stack matches its
        // socket by.
        out.inner_ip.next_header = flow.proto;
        let payload = u16::from_be_bytes(out.inner_ip.payload_len) as usize;
        out.inner_ip.payload_len = (payload.saturating_sub(ext_len) as u16).to_be_bytes();
    }
    out.eth = swap_eth(&eth, ETH_P_IPV6);
    out.ip = reply_ip(flow.dst, flow.src, ICMP6_BODY, IPPROTO_ICMPV6);
    out.icmp = Icmp6Hdr {
        kind: 1, // destination unreachable
        code: 4, // port unreachable
        check: [0; 2],
        unused: [0; 4],
    };
    let mut sum = pseudo_sum(&flow.dst, &flow.src, ICMP6_BODY, IPPROTO_ICMPV6);
    sum = sum_words::<8>(bytes_of(&out.icmp), sum);
    sum = sum_words::<IPV6_LEN>(bytes_of(&out.inner_ip), sum);
    sum = sum_words::<UDP_LEN>(bytes_of(&out.inner_l4), sum);
    out.icmp.check = fold(sum);

    send_back(ctx, out, ICMP6_LEN)
}
