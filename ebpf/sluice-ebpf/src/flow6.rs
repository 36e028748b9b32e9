//! Parsing one IPv6 TCP/UDP packet into the fields the datapath needs.
//!
//! Only TCP or UDP directly after the fixed 40-byte header is balanced:
//! walking extension headers would need a bounded loop per packet for
//! headers that service traffic practically never carries. Such packets,
//! and fragments, pass untouched and are counted.

use aya_ebpf::programs::TcContext;
use sluice_common::{Ct6Key, Svc6Key, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    error::Error,
    flow::{ensure, read},
    headers::{
        Ipv6Hdr, TcpHdr, UdpHdr, ETH_LEN, IPPROTO_ICMPV6, IPV6_LEN, NEXTHDR_AUTH, NEXTHDR_DEST,
        NEXTHDR_FRAGMENT, NEXTHDR_HIP, NEXTHDR_HOP, NEXTHDR_MOBILITY, NEXTHDR_ROUTING,
        NEXTHDR_SHIM6, TCP_ACK, TCP_LEN, TCP_SYN, UDP_LEN,
    },
};

/// Offset of the L4 header of every packet the IPv6 path handles.
pub const L4_OFF6: usize = ETH_LEN + IPV6_LEN;

/// An IPv6 TCP or UDP packet, addresses in network order, ports host order.
/// It lives in the per-CPU `Scratch6` (with the keys built from it), not
/// on the stack: the IPv6 path runs on what the IPv4 path's frame leaves
/// of the 512-byte stack.
#[repr(C)]
pub struct Flow6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// TCP flags byte; 0 for UDP.
    pub tcp_flags: u8,
    pub _pad: [u8; 2],
}

/// What `Flow6::parse` found.
pub enum Parsed6 {
    /// A TCP/UDP packet, now in the `Flow6`.
    Flow,
    /// A fragment header follows the fixed header: ports unknown.
    Fragment,
    /// Another extension header follows the fixed header: not balanced.
    ExtHeader,
    /// ICMPv6 (its errors may quote a DNATed packet: `icmp6.rs`).
    Icmp,
    /// Not IPv6 TCP/UDP (ICMPv6, neighbour discovery, ...): not ours.
    Other,
}

impl Flow6 {
    /// Parses the packet into `self`, reading the headers in place.
    #[inline(always)]
    pub fn parse(&mut self, ctx: &TcContext) -> Result<Parsed6, Error> {
        if !ensure(ctx, L4_OFF6) {
            return Ok(Parsed6::Other);
        }
        let start = ctx.data();
        if start + L4_OFF6 > ctx.data_end() {
            return Ok(Parsed6::Other);
        }
        // SAFETY: the fixed header is within the packet (checked above);
        // the struct is byte-aligned. The reference is dropped before
        // anything can move the packet data (`ensure` below).
        let ip = unsafe { &*((start + ETH_LEN) as *const Ipv6Hdr) };
        if ip.vtcfl[0] >> 4 != 6 {
            return Ok(Parsed6::Other);
        }
        let proto = ip.next_header;
        match proto {
            IPPROTO_TCP | IPPROTO_UDP => {}
            NEXTHDR_FRAGMENT => return Ok(Parsed6::Fragment),
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_AUTH | NEXTHDR_DEST | NEXTHDR_MOBILITY
            | NEXTHDR_HIP | NEXTHDR_SHIM6 => return Ok(Parsed6::ExtHeader),
            IPPROTO_ICMPV6 => return Ok(Parsed6::Icmp),
            _ => return Ok(Parsed6::Other),
        }
        self.src = ip.src;
        self.dst = ip.dst;
        self.proto = proto;
        if proto == IPPROTO_TCP {
            if !ensure(ctx, L4_OFF6 + TCP_LEN) {
                return Err(Error::Truncated);
            }
            let tcp = read::<TcpHdr>(ctx, L4_OFF6).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(tcp.sport);
            self.dport = u16::from_be_bytes(tcp.dport);
            self.tcp_flags = tcp.flags;
        } else {
            if !ensure(ctx, L4_OFF6 + UDP_LEN) {
                return Err(Error::Truncated);
            }
            let udp = read::<UdpHdr>(ctx, L4_OFF6).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(udp.sport);
            self.dport = u16::from_be_bytes(udp.dport);
            self.tcp_flags = 0;
        }
        Ok(Parsed6::Flow)
    }

    /// Writes the conntrack key of this packet's own tuple into `key`.
    #[inline(always)]
    pub fn ct_key_into(&self, key: &mut Ct6Key) {
        key.src = self.src;
        key.dst = self.dst;
        key.sport = self.sport;
        key.dport = self.dport;
        key.proto = self.proto;
        key._pad = [0; 3];
    }

    /// Writes the key of `slot` of this packet's frontend into `key`.
    #[inline(always)]
    pub fn svc_key_into(&self, key: &mut Svc6Key, slot: u16, scope: u8) {
        key.addr = self.dst;
        key.port = self.dport;
        key.slot = slot;
        key.proto = self.proto;
        key.scope = scope;
        key._pad = [0; 2];
    }

    /// A TCP SYN without ACK: the first packet of a new connection.
    #[inline(always)]
    pub fn is_syn(&self) -> bool {
        self.proto == IPPROTO_TCP && self.tcp_flags & TCP_SYN != 0 && self.tcp_flags & TCP_ACK == 0
    }

    #[inline(always)]
    pub fn has_tcp_flag(&self, flag: u8) -> bool {
        self.proto == IPPROTO_TCP && self.tcp_flags & flag != 0
    }
}

/// Whether two IPv6 addresses are equal, compared as four words: a
/// 16-byte slice comparison could become a `bcmp` call, which BPF lacks.
#[inline(always)]
pub fn same_addr(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let w = |x: &[u8; 16], i: usize| u32::from_ne_bytes([x[i], x[i + 1], x[i + 2], x[i + 3]]);
    (w(a, 0) ^ w(b, 0)) | (w(a, 4) ^ w(b, 4)) | (w(a, 8) ^ w(b, 8)) | (w(a, 12) ^ w(b, 12)) == 0
}
