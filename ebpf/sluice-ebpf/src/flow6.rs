//! Parsing one IPv6 TCP/UDP/SCTP packet into the fields the datapath needs.
//!
//! Only TCP, UDP or SCTP directly after the fixed 40-byte header, or TCP
//! or UDP after a fragment header directly after it, is balanced (a
//! fragmented SCTP packet passes: see `flow.rs`): walking extension
//! headers would need a bounded loop per packet for headers that service
//! traffic practically never carries. Such packets pass untouched and are
//! counted. A fragment's ports come from its first fragment (`frag.rs`).

use aya_ebpf::programs::TcContext;
use sluice_common::{Ct6Key, Svc6Key, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    error::Error,
    flow::{ensure, opens, read},
    headers::{
        Frag6Hdr, Ipv6Hdr, SctpHdr, TcpHdr, UdpHdr, ETH_LEN, FRAG6_LEN, IP6_OFFSET, IPPROTO_ICMPV6,
        IPV6_LEN, NEXTHDR_AUTH, NEXTHDR_DEST, NEXTHDR_FRAGMENT, NEXTHDR_HIP, NEXTHDR_HOP,
        NEXTHDR_MOBILITY, NEXTHDR_ROUTING, NEXTHDR_SHIM6, SCTP_LEN, TCP_LEN, UDP_LEN,
    },
};

/// Offset of the L4 header of every packet the IPv6 path handles.
pub const L4_OFF6: usize = ETH_LEN + IPV6_LEN;

/// An IPv6 TCP, UDP or SCTP packet, addresses in network order, ports host order.
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
    /// TCP flags byte; for SCTP the type of the first chunk; 0 for UDP
    /// (and for a later fragment).
    pub tcp_flags: u8,
    /// `FRAG_NONE`, or a fragment header follows the fixed header:
    /// `FRAG_FIRST` (offset 0, the L4 header after it) or `FRAG_LATER`
    /// (no L4 header: the ports are its first fragment's).
    pub frag: u8,
    pub _pad: u8,
    /// The fragment header's identification (host order), when `frag`.
    pub frag_id: u32,
}

/// `Flow6::frag`: no fragment header.
pub const FRAG_NONE: u8 = 0;
/// `Flow6::frag`: a fragment at offset 0, its L4 header after the
/// fragment header.
pub const FRAG_FIRST: u8 = 1;
/// `Flow6::frag`: a fragment at a later offset, without L4 header.
pub const FRAG_LATER: u8 = 2;

/// What `Flow6::parse` found.
pub enum Parsed6 {
    /// A TCP/UDP/SCTP packet, now in the `Flow6`.
    Flow,
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
        let mut proto = ip.next_header;
        match proto {
            IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP | NEXTHDR_FRAGMENT => {}
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_AUTH | NEXTHDR_DEST | NEXTHDR_MOBILITY
            | NEXTHDR_HIP | NEXTHDR_SHIM6 => return Ok(Parsed6::ExtHeader),
            IPPROTO_ICMPV6 => return Ok(Parsed6::Icmp),
            _ => return Ok(Parsed6::Other),
        }
        self.src = ip.src;
        self.dst = ip.dst;
        self.frag = FRAG_NONE;
        self._pad = 0;
        self.frag_id = 0;
        let mut l4_off = L4_OFF6;
        if proto == NEXTHDR_FRAGMENT {
            if !ensure(ctx, L4_OFF6 + FRAG6_LEN) {
                return Err(Error::Truncated);
            }
            let fh = read::<Frag6Hdr>(ctx, L4_OFF6).ok_or(Error::Truncated)?;
            proto = fh.next_header;
            if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
                return Ok(Parsed6::Other);
            }
            self.frag_id = u32::from_be_bytes(fh.id);
            if u16::from_be_bytes(fh.frag_off) & IP6_OFFSET != 0 {
                // No L4 header: `frag::track6` fills in the ports.
                self.frag = FRAG_LATER;
                self.proto = proto;
                self.sport = 0;
                self.dport = 0;
                self.tcp_flags = 0;
                return Ok(Parsed6::Flow);
            }
            self.frag = FRAG_FIRST;
            l4_off = L4_OFF6 + FRAG6_LEN;
        }
        self.proto = proto;
        if proto == IPPROTO_TCP {
            if !ensure(ctx, l4_off + TCP_LEN) {
                return Err(Error::Truncated);
            }
            let tcp = read::<TcpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(tcp.sport);
            self.dport = u16::from_be_bytes(tcp.dport);
            self.tcp_flags = tcp.flags;
        } else if proto == IPPROTO_SCTP {
            if !ensure(ctx, l4_off + SCTP_LEN) {
                return Err(Error::Truncated);
            }
            let sctp = read::<SctpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(sctp.sport);
            self.dport = u16::from_be_bytes(sctp.dport);
            self.tcp_flags = sctp.chunk_type;
        } else {
            if !ensure(ctx, l4_off + UDP_LEN) {
                return Err(Error::Truncated);
            }
            let udp = read::<UdpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(udp.sport);
            self.dport = u16::from_be_bytes(udp.dport);
            self.tcp_flags = 0;
        }
        Ok(Parsed6::Flow)
    }

    /// Offset of the L4 header: after the fragment header in a first
    /// fragment. (A later fragment has none; nothing reads it.)
    #[inline(always)]
    pub fn l4_off(&self) -> usize {
        if self.frag == FRAG_NONE {
            L4_OFF6
        } else {
            L4_OFF6 + FRAG6_LEN
        }
    }

    /// A non-first fragment: no L4 header to read or rewrite.
    #[inline(always)]
    pub fn later(&self) -> bool {
        self.frag == FRAG_LATER
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

    /// A TCP SYN without ACK, or an SCTP INIT (see `flow::opens`).
    #[inline(always)]
    pub fn is_syn(&self) -> bool {
        opens(self.proto, self.tcp_flags)
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
