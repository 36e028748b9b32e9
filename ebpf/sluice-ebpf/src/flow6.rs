//! Parsing one IPv6 TCP/UDP/SCTP packet into the fields the datapath needs.
//!
//! The L4 header is found as Linux's `ipv6_skip_exthdr` (conntrack's) and
//! Cilium's `ipv6_hdrlen` find it: by walking the extension headers after
//! the fixed header (`walk`): hop-by-hop, routing, destination options,
//! AH and mobility, at most `MAX_EXT` of them, then at most one fragment
//! header, directly followed by TCP or UDP (a fragmented SCTP packet
//! passes: see `flow.rs`). What the walk cannot balance passes untouched
//! and is counted (`ipv6_ext_header`): ESP or No Next Header in the chain
//! (no L4 header to read), HIP and Shim6, a longer chain, extension headers
//! behind the fragment header (a later fragment could not be matched to
//! them), and a routing header with segments left: the destination in the
//! fixed header is then the next waypoint, not the final one, which is
//! what kube-proxy's rules match (the packet is routed on untouched, as
//! Linux forwards it towards that waypoint). The offset the walk finds
//! (`Flow6::l4_off`) is the one every rewrite and reply uses. A fragment's
//! ports come from its first fragment (`frag.rs`).

use aya_ebpf::{bindings::__sk_buff, programs::TcContext};
use sluice_common::{Ct6Key, Stat, Svc6Key, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    error::Error,
    flow::{ensure, opens, read_within},
    headers::{
        Frag6Hdr, Ipv6Hdr, SctpHdr, TcpHdr, UdpHdr, ETH_LEN, FRAG6_LEN, IP6_OFFSET, IPPROTO_ICMPV6,
        IPV6_LEN, NEXTHDR_AUTH, NEXTHDR_DEST, NEXTHDR_ESP, NEXTHDR_FRAGMENT, NEXTHDR_HIP,
        NEXTHDR_HOP, NEXTHDR_MOBILITY, NEXTHDR_NONE, NEXTHDR_ROUTING, NEXTHDR_SHIM6, SCTP_LEN,
        TCP_LEN, UDP_LEN,
    },
    maps::count,
};

/// Offset of the L4 header of a packet without extension headers (and of
/// the first header after the fixed one).
pub const L4_OFF6: usize = ETH_LEN + IPV6_LEN;

/// Most extension headers walked before the fragment header or the L4
/// header (as Cilium's `IPV6_MAX_HEADERS`); a longer chain passes.
pub const MAX_EXT: usize = 8;

/// The furthest L4 header offset the walk can find: `MAX_EXT` headers of
/// the largest size (2048 bytes) and a fragment header. A bound for the
/// verifier on direct packet reads (`read6`).
pub const MAX_L4_OFF6: usize = L4_OFF6 + MAX_EXT * 2048 + FRAG6_LEN;

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
    /// `FRAG_NONE`, or a fragment header precedes the L4 header:
    /// `FRAG_FIRST` (offset 0, the L4 header after it) or `FRAG_LATER`
    /// (no L4 header: the ports are its first fragment's).
    pub frag: u8,
    pub _pad: u8,
    /// The fragment header's identification (host order), when `frag`.
    pub frag_id: u32,
    /// Offset of the L4 header (of the ICMPv6 header for `Parsed6::Icmp`)
    /// from the start of the frame, behind any extension headers. (A later
    /// fragment has none; nothing reads it then.)
    pub l4_off: u16,
    pub _pad2: [u8; 2],
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
    /// Extension headers the walk does not get through: not balanced.
    ExtHeader,
    /// ICMPv6 at `Flow6::l4_off` (its errors may quote a DNATed packet:
    /// `icmp6.rs`).
    Icmp,
    /// Not IPv6 TCP/UDP/SCTP/ICMPv6 (or a fragment of another protocol):
    /// not balanced. `Flow6::proto` and `l4_off` say which header and
    /// where (behind any extension headers; 0 at offset 54 for a packet
    /// too short or not IPv6), for `icmp6::cluster_ips_check`.
    Other,
}

/// `walk`'s answer: the header found (bits 16-23) and its offset (bits
/// 0-15), or one of these in bits 24-31.
const WALK_UNBALANCED: u32 = 1 << 24;
const WALK_TRUNCATED: u32 = 2 << 24;

/// Whether `next` starts an extension header chain for `walk` (ESP and No
/// Next Header included: the walk ends there, unbalanced).
#[inline(always)]
pub fn is_ext(next: u8) -> bool {
    matches!(
        next,
        NEXTHDR_HOP
            | NEXTHDR_ROUTING
            | NEXTHDR_DEST
            | NEXTHDR_AUTH
            | NEXTHDR_MOBILITY
            | NEXTHDR_ESP
            | NEXTHDR_NONE
    )
}

/// Walks the extension headers starting at `off`, the first of type
/// `next`, up to the first header that is not one (the fragment header,
/// the L4 header, or anything else). Returns that header's type (bits
/// 16-23) and offset (bits 0-15), or `WALK_UNBALANCED` (ESP, No Next
/// Header, a routing header with segments left, more than `MAX_EXT`
/// headers) or `WALK_TRUNCATED`. A separate BPF function: a bounded loop
/// of helper loads (any offset, linear or not), with a frame of its own;
/// also used on the packet an ICMPv6 error quotes.
#[inline(never)]
pub fn walk(skb: *mut __sk_buff, off: u32, next: u32) -> u32 {
    let ctx = TcContext::new(skb);
    let mut off = off as usize;
    let mut next = next as u8;
    let mut i = 0;
    while i <= MAX_EXT {
        match next {
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST | NEXTHDR_AUTH | NEXTHDR_MOBILITY => {}
            NEXTHDR_ESP | NEXTHDR_NONE => return WALK_UNBALANCED,
            _ => return (next as u32) << 16 | off as u32,
        }
        if i == MAX_EXT {
            return WALK_UNBALANCED;
        }
        // Next header, header length, and (routing) type and segments left.
        let Ok(h) = ctx.load::<[u8; 4]>(off) else {
            return WALK_TRUNCATED;
        };
        if next == NEXTHDR_ROUTING && h[3] != 0 {
            return WALK_UNBALANCED;
        }
        off += if next == NEXTHDR_AUTH {
            (h[1] as usize + 2) * 4
        } else {
            (h[1] as usize + 1) * 8
        };
        next = h[0];
        i += 1;
    }
    WALK_UNBALANCED
}

/// `walk`'s answer as `(header type, offset)`, or how the packet is
/// treated when the walk did not end at one.
#[inline(always)]
pub fn walked(w: u32) -> Result<(u8, usize), WalkEnd> {
    match w {
        WALK_UNBALANCED => Err(WalkEnd::Unbalanced),
        WALK_TRUNCATED => Err(WalkEnd::Truncated),
        _ => Ok(((w >> 16) as u8, (w & 0xffff) as usize)),
    }
}

/// Why `walk` found no header.
pub enum WalkEnd {
    Unbalanced,
    Truncated,
}

/// Copies a `T` out of the packet at `off` (bounds-checked, made linear
/// by `ensure` first), for offsets behind extension headers.
#[inline(always)]
pub fn read6<T: Copy>(ctx: &TcContext, off: usize) -> Option<T> {
    read_within::<T>(ctx, off, MAX_L4_OFF6)
}

impl Flow6 {
    /// Parses the packet into `self`, reading the headers in place.
    #[inline(always)]
    pub fn parse(&mut self, ctx: &TcContext) -> Result<Parsed6, Error> {
        self.l4_off = L4_OFF6 as u16;
        self.proto = 0;
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
            IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP | NEXTHDR_FRAGMENT | IPPROTO_ICMPV6 => {}
            NEXTHDR_HIP | NEXTHDR_SHIM6 => return Ok(Parsed6::ExtHeader),
            p if is_ext(p) => {}
            _ => {
                self.proto = proto;
                return Ok(Parsed6::Other);
            }
        }
        self.src = ip.src;
        self.dst = ip.dst;
        self.frag = FRAG_NONE;
        self._pad = 0;
        self.frag_id = 0;
        self._pad2 = [0; 2];
        let mut l4_off = L4_OFF6;
        let mut walked_ext = false;
        if is_ext(proto) {
            match walked(walk(ctx.skb.skb, L4_OFF6 as u32, proto as u32)) {
                Ok((next, off)) => {
                    proto = next;
                    l4_off = off;
                }
                Err(WalkEnd::Unbalanced) => return Ok(Parsed6::ExtHeader),
                Err(WalkEnd::Truncated) => return Err(Error::Truncated),
            }
            match proto {
                IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP | NEXTHDR_FRAGMENT | IPPROTO_ICMPV6 => {}
                NEXTHDR_HIP | NEXTHDR_SHIM6 => return Ok(Parsed6::ExtHeader),
                _ => {
                    self.proto = proto;
                    self.l4_off = l4_off as u16;
                    return Ok(Parsed6::Other);
                }
            }
            walked_ext = true;
        }
        self.l4_off = l4_off as u16;
        if proto == IPPROTO_ICMPV6 {
            self.proto = proto;
            if walked_ext {
                count(Stat::Ipv6ExtWalked);
            }
            return Ok(Parsed6::Icmp);
        }
        if proto == NEXTHDR_FRAGMENT {
            if !ensure(ctx, l4_off + FRAG6_LEN) {
                return Err(Error::Truncated);
            }
            let fh = read6::<Frag6Hdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            proto = fh.next_header;
            if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
                // Extension headers behind the fragment header are in the
                // fragmentable part: a later fragment could not be told
                // by them.
                if is_ext(proto) {
                    return Ok(Parsed6::ExtHeader);
                }
                // Another protocol: `Other` at the fragment header.
                self.proto = NEXTHDR_FRAGMENT;
                return Ok(Parsed6::Other);
            }
            self.frag_id = u32::from_be_bytes(fh.id);
            if walked_ext {
                count(Stat::Ipv6ExtWalked);
            }
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
            l4_off += FRAG6_LEN;
            self.l4_off = l4_off as u16;
        } else if walked_ext {
            count(Stat::Ipv6ExtWalked);
        }
        self.proto = proto;
        if proto == IPPROTO_TCP {
            if !ensure(ctx, l4_off + TCP_LEN) {
                return Err(Error::Truncated);
            }
            let tcp = read6::<TcpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(tcp.sport);
            self.dport = u16::from_be_bytes(tcp.dport);
            self.tcp_flags = tcp.flags;
        } else if proto == IPPROTO_SCTP {
            if !ensure(ctx, l4_off + SCTP_LEN) {
                return Err(Error::Truncated);
            }
            let sctp = read6::<SctpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(sctp.sport);
            self.dport = u16::from_be_bytes(sctp.dport);
            self.tcp_flags = sctp.chunk_type;
        } else {
            if !ensure(ctx, l4_off + UDP_LEN) {
                return Err(Error::Truncated);
            }
            let udp = read6::<UdpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            self.sport = u16::from_be_bytes(udp.sport);
            self.dport = u16::from_be_bytes(udp.dport);
            self.tcp_flags = 0;
        }
        Ok(Parsed6::Flow)
    }

    /// Offset of the L4 header, behind any extension headers and a first
    /// fragment's fragment header. (A later fragment has none; nothing
    /// reads it.)
    #[inline(always)]
    pub fn l4_off(&self) -> usize {
        self.l4_off as usize
    }

    /// How many bytes of extension headers (the fragment header included)
    /// precede the L4 header: the IPv6 payload length minus this is the
    /// L4 length.
    #[inline(always)]
    pub fn ext_len(&self) -> usize {
        self.l4_off().saturating_sub(L4_OFF6)
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

    /// Writes into `key` the conntrack key of the replies this flow gets
    /// from `backend`:`port` after DNAT (backend -> client).
    #[inline(always)]
    pub fn reply_ct_key_into(&self, key: &mut Ct6Key, backend: &[u8; 16], port: u16) {
        key.src = *backend;
        key.dst = self.src;
        key.sport = port;
        key.dport = self.sport;
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
