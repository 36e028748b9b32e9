//! Building packets with correct checksums, and reading them back: the
//! datapath's own (lenient) view of a flow's tuple, and a strict check of
//! every checksum a packet carries.

use std::net::IpAddr;

pub const ETH_LEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const ICMPV6: u8 = 58;
pub const SCTP: u8 = 132;
pub const FRAG6: u8 = 44;

/// The one's-complement sum of `data` (folded to 16 bits, not inverted).
pub fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

pub fn fold(acc: u32) -> u16 {
    !(sum(acc, &[]) as u16)
}

fn pseudo(src: &[u8], dst: &[u8], proto: u8, len: usize) -> u32 {
    let mut acc = sum(0, src);
    acc = sum(acc, dst);
    acc += u32::from(proto);
    acc += (len as u32) & 0xffff;
    acc += (len as u32) >> 16;
    acc
}

pub fn eth(ether_type: u16) -> Vec<u8> {
    let mut v = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    v.extend_from_slice(&ether_type.to_be_bytes());
    v
}

/// An IPv4 header (with `options`, padded to 4 bytes) and its checksum.
#[allow(clippy::too_many_arguments)]
pub fn ipv4_header(
    src: [u8; 4],
    dst: [u8; 4],
    proto: u8,
    payload_len: usize,
    options: &[u8],
    ttl: u8,
    id: u16,
    frag_off: u16,
) -> Vec<u8> {
    let mut opts = options.to_vec();
    while !opts.len().is_multiple_of(4) {
        opts.push(0);
    }
    opts.truncate(40);
    let ihl = 5 + opts.len() / 4;
    let total = (ihl * 4 + payload_len) as u16;
    let mut h = vec![(4 << 4) | ihl as u8, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&frag_off.to_be_bytes());
    h.extend_from_slice(&[ttl, proto, 0, 0]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(&opts);
    let c = fold(sum(0, &h));
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

pub fn ipv6_header(src: [u8; 16], dst: [u8; 16], next: u8, payload_len: usize) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(payload_len as u16).to_be_bytes());
    h.extend_from_slice(&[next, 64]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h
}

/// A TCP segment with a correct checksum for the pseudo-header of
/// `src`/`dst` (4 or 16 bytes each). `doff` in words; options are NOPs.
pub fn tcp(
    src: &[u8],
    dst: &[u8],
    sport: u16,
    dport: u16,
    flags: u8,
    doff: u8,
    payload: &[u8],
) -> Vec<u8> {
    let hlen = usize::from(doff.clamp(5, 15)) * 4;
    let mut t = Vec::with_capacity(hlen + payload.len());
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&0x1234_5678u32.to_be_bytes());
    t.extend_from_slice(&0x0abc_def0u32.to_be_bytes());
    t.extend_from_slice(&[doff << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
    t.resize(hlen, 1);
    t.extend_from_slice(payload);
    let c = fold(sum(pseudo(src, dst, TCP, t.len()), &t));
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

/// A UDP datagram; `zero_csum` leaves the checksum 0 (IPv4 "none").
pub fn udp(
    src: &[u8],
    dst: &[u8],
    sport: u16,
    dport: u16,
    payload: &[u8],
    zero_csum: bool,
) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut u = Vec::with_capacity(len);
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(len as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    if !zero_csum {
        let mut c = fold(sum(pseudo(src, dst, UDP, u.len()), &u));
        if c == 0 {
            c = 0xffff;
        }
        u[6..8].copy_from_slice(&c.to_be_bytes());
    }
    u
}

/// An ICMP (IPv4: `v6` false) or ICMPv6 message quoting `body`.
pub fn icmp(v6: bool, src: &[u8], dst: &[u8], ty: u8, code: u8, rest: u32, body: &[u8]) -> Vec<u8> {
    let mut m = vec![ty, code, 0, 0];
    m.extend_from_slice(&rest.to_be_bytes());
    m.extend_from_slice(body);
    let acc = if v6 {
        sum(pseudo(src, dst, ICMPV6, m.len()), &m)
    } else {
        sum(0, &m)
    };
    let c = fold(acc);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

pub fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A flow's tuple as the datapath reads it (addresses as bytes, ports
/// host order).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    pub src: Vec<u8>,
    pub dst: Vec<u8>,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

impl Tuple {
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst.clone(),
            dst: self.src.clone(),
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(off)?, *b.get(off + 1)?]))
}

/// What the datapath's parsers (`flow.rs`, `flow6.rs`) make of a frame:
/// the TCP/UDP tuple of an unfragmented packet or first fragment, read as
/// leniently as they read it (IHL honoured, lengths not checked). `None`
/// for anything they would not balance (later fragments included).
pub fn lenient_tuple(f: &[u8]) -> Option<Tuple> {
    match be16(f, 12)? {
        ETH_P_IP => {
            let ip = f.get(ETH_LEN..ETH_LEN + 20)?;
            let proto = ip[9];
            if proto != TCP && proto != UDP {
                return None;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < 20 || be16(ip, 6)? & 0x1fff != 0 {
                return None;
            }
            let l4 = ETH_LEN + ihl;
            f.get(l4..l4 + if proto == TCP { 20 } else { 8 })?;
            Some(Tuple {
                src: ip[12..16].to_vec(),
                dst: ip[16..20].to_vec(),
                sport: be16(f, l4)?,
                dport: be16(f, l4 + 2)?,
                proto,
            })
        }
        ETH_P_IPV6 => {
            let ip = f.get(ETH_LEN..ETH_LEN + 40)?;
            if ip[0] >> 4 != 6 {
                return None;
            }
            let (mut proto, mut l4) = (ip[6], ETH_LEN + 40);
            if proto == FRAG6 {
                let fh = f.get(l4..l4 + 8)?;
                if be16(fh, 2)? & 0xfff8 != 0 {
                    return None;
                }
                proto = fh[0];
                l4 += 8;
            }
            if proto != TCP && proto != UDP {
                return None;
            }
            f.get(l4..l4 + if proto == TCP { 20 } else { 8 })?;
            Some(Tuple {
                src: ip[8..24].to_vec(),
                dst: ip[24..40].to_vec(),
                sport: be16(f, l4)?,
                dport: be16(f, l4 + 2)?,
                proto,
            })
        }
        _ => None,
    }
}

/// The tuple quoted by an ICMP/ICMPv6 error (destination unreachable,
/// time exceeded, parameter problem, packet too big) in frame `f`, when
/// the quote holds the 8 bytes of L4 header an error must quote (RFC 792,
/// 4443; Linux conntrack and the datapath need them too).
pub fn quoted_tuple(f: &[u8]) -> Option<Tuple> {
    let l = layout(f)?;
    if l.fragment {
        return None;
    }
    let msg = f.get(l.l4..l.end)?;
    let inner = match (l.v6, l.proto) {
        (false, ICMP) if matches!(msg.first()?, 3 | 11 | 12) => msg.get(8..)?,
        (true, ICMPV6) if matches!(msg.first()?, 1..=4) => msg.get(8..)?,
        _ => return None,
    };
    let l3 = if l.v6 {
        40
    } else {
        usize::from(inner.first()? & 0x0f) * 4
    };
    if inner.len() < l3 + 8 {
        return None;
    }
    let mut frame = eth(if l.v6 { ETH_P_IPV6 } else { ETH_P_IP });
    frame.extend_from_slice(inner);
    // The lenient parser wants a whole TCP header: pad the quote.
    frame.resize(frame.len() + 20, 0);
    lenient_tuple(&frame)
}

/// The headers of a frame, as a strict reader sees them.
#[derive(Debug)]
pub struct Layout {
    pub v6: bool,
    pub proto: u8,
    /// Offset of the upper-layer header.
    pub l4: usize,
    /// End of the IP packet (by its length fields).
    pub end: usize,
    /// A fragment (first or later): the L4 checksum covers data not here.
    pub fragment: bool,
    pub src: Vec<u8>,
    pub dst: Vec<u8>,
}

/// The strict layout of an IPv4/IPv6 frame whose length fields fit the
/// frame; `None` for anything else.
pub fn layout(f: &[u8]) -> Option<Layout> {
    match be16(f, 12)? {
        ETH_P_IP => {
            let ip = f.get(ETH_LEN..ETH_LEN + 20)?;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let total = usize::from(be16(ip, 2)?);
            if ip[0] >> 4 != 4 || ihl < 20 || total < ihl || ETH_LEN + total > f.len() {
                return None;
            }
            let frag = be16(ip, 6)? & 0x3fff;
            Some(Layout {
                v6: false,
                proto: ip[9],
                l4: ETH_LEN + ihl,
                end: ETH_LEN + total,
                fragment: frag != 0,
                src: ip[12..16].to_vec(),
                dst: ip[16..20].to_vec(),
            })
        }
        ETH_P_IPV6 => {
            let ip = f.get(ETH_LEN..ETH_LEN + 40)?;
            let end = ETH_LEN + 40 + usize::from(be16(ip, 4)?);
            if ip[0] >> 4 != 6 || end > f.len() {
                return None;
            }
            let (mut next, mut off, mut fragment) = (ip[6], ETH_LEN + 40, false);
            for _ in 0..8 {
                match next {
                    0 | 43 | 60 => {
                        let h = f.get(off..off + 2)?;
                        next = h[0];
                        off += (usize::from(h[1]) + 1) * 8;
                    }
                    FRAG6 => {
                        let h = f.get(off..off + 8)?;
                        next = h[0];
                        fragment |= be16(h, 2)? & 0xfff9 != 0;
                        off += 8;
                    }
                    _ => break,
                }
            }
            if off > end {
                return None;
            }
            Some(Layout {
                v6: true,
                proto: next,
                l4: off,
                end,
                fragment,
                src: ip[8..24].to_vec(),
                dst: ip[24..40].to_vec(),
            })
        }
        _ => None,
    }
}

/// Whether a router would forward frame `f` as the IP packet it says it
/// is: a consistent IPv4 or IPv6 header (version, lengths within the
/// frame), an IPv4 header checksum that adds up, and a whole TCP or UDP
/// header within the packet. The node's stack drops anything else before
/// forwarding it.
pub fn forwardable(f: &[u8]) -> bool {
    let Some(l) = layout(f) else {
        return false;
    };
    if !l.v6 && sum(0, &f[ETH_LEN..l.l4]) != 0xffff {
        return false;
    }
    let l4 = match l.proto {
        TCP => 20,
        UDP => 8,
        _ => 0,
    };
    l.l4 + l4 <= l.end
}

/// Whether every checksum of frame `f` is right: the IPv4 header, the
/// TCP/UDP/ICMP/ICMPv6 checksum of an unfragmented packet (IPv6
/// pseudo-header included), and the IPv4 header an ICMP error quotes.
/// `None` when the frame's structure is not consistent enough to say.
pub fn checksums_ok(f: &[u8]) -> Option<bool> {
    let l = layout(f)?;
    if !l.v6 && fold(sum(0, &f[ETH_LEN..l.l4])) != 0 {
        return Some(false);
    }
    if l.fragment {
        return Some(true);
    }
    let seg = f.get(l.l4..l.end)?;
    let pseudo_sum = |proto| pseudo(&l.src, &l.dst, proto, seg.len());
    match l.proto {
        TCP => {
            if seg.len() < 20 {
                return None;
            }
            Some(fold(sum(pseudo_sum(TCP), seg)) == 0)
        }
        UDP => {
            if seg.len() < 8 || usize::from(be16(seg, 4)?) != seg.len() {
                return None;
            }
            if !l.v6 && be16(seg, 6)? == 0 {
                return Some(true);
            }
            Some(fold(sum(pseudo_sum(UDP), seg)) == 0)
        }
        ICMP if !l.v6 => {
            if seg.len() < 8 || fold(sum(0, seg)) != 0 {
                return Some(false);
            }
            if matches!(seg[0], 3 | 11 | 12) && seg.len() >= 28 {
                let inner = &seg[8..];
                let ihl = usize::from(inner[0] & 0x0f) * 4;
                if inner[0] >> 4 == 4 && ihl >= 20 && inner.len() >= ihl {
                    return Some(fold(sum(0, &inner[..ihl])) == 0);
                }
            }
            Some(true)
        }
        ICMPV6 if l.v6 => {
            if seg.len() < 8 {
                return None;
            }
            Some(fold(sum(pseudo_sum(ICMPV6), seg)) == 0)
        }
        _ => Some(true),
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
