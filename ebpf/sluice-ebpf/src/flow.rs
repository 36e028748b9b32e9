//! Parsing one IPv4 TCP/UDP/SCTP packet into the fields the datapath needs.

use aya_ebpf::programs::TcContext;
use sluice_common::{Ct4Key, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    error::Error,
    frag,
    headers::{
        EthHdr, Ipv4Hdr, SctpHdr, TcpHdr, UdpHdr, ETH_LEN, ETH_P_IP, IPV4_LEN, IP_MF_OFFSET,
        IP_OFFSET, SCTP_INIT, SCTP_LEN, TCP_ACK, TCP_LEN, TCP_SYN, UDP_LEN,
    },
};

/// An IPv4 TCP, UDP or SCTP packet, addresses in network order, ports host
/// order.
pub struct Flow4 {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// TCP flags byte; for SCTP the type of the first chunk; 0 for UDP.
    pub tcp_flags: u8,
    /// Offset of the L4 header (Ethernet + IPv4 header with options).
    pub l4_off: usize,
    /// A non-first fragment: the ports are its first fragment's (from
    /// `sl_frag4`), and it has no L4 header to read or rewrite.
    pub later: bool,
}

pub enum Parsed {
    Flow(Flow4),
    /// An IPv4 packet of another protocol (its header, for ICMP).
    OtherIpv4(Ipv4Hdr),
    /// A non-first IPv4 fragment whose first fragment was not seen: its
    /// ports are unknown, so it cannot be balanced.
    UnknownFragment,
    /// Anything else (not IPv4, not TCP/UDP/SCTP): not ours.
    Other,
}

/// Makes `len` bytes readable through direct packet access, pulling
/// non-linear data in if needed. Invalidates earlier packet pointers.
#[inline(always)]
pub(crate) fn ensure(ctx: &TcContext, len: usize) -> bool {
    if ctx.data() + len <= ctx.data_end() {
        return true;
    }
    if (ctx.len() as usize) < len || ctx.pull_data(len as u32).is_err() {
        return false;
    }
    ctx.data() + len <= ctx.data_end()
}

/// The furthest header offset the datapath reads: Ethernet plus an IPv4
/// header with the most options (an IPv6 L4 header, at 54, is within).
pub const MAX_L4_OFF: usize = ETH_LEN + 60;

/// Copies a `T` out of the packet at `off`, bounds-checked. The explicit
/// bound on `off` keeps the verifier's range when the offset comes from
/// another stack frame.
#[inline(always)]
pub(crate) fn read<T: Copy>(ctx: &TcContext, off: usize) -> Option<T> {
    read_within(ctx, off, MAX_L4_OFF)
}

/// `read` with another bound on `off` (the IPv6 path's, whose L4 header
/// may follow extension headers: `flow6::MAX_L4_OFF6`).
#[inline(always)]
pub(crate) fn read_within<T: Copy>(ctx: &TcContext, off: usize, max: usize) -> Option<T> {
    if off > max {
        return None;
    }
    let start = ctx.data();
    if start + off + core::mem::size_of::<T>() > ctx.data_end() {
        return None;
    }
    // SAFETY: bounds checked against data_end just above; T is a
    // byte-aligned header struct, so any address is suitably aligned.
    Some(unsafe { *((start + off) as *const T) })
}

impl Flow4 {
    #[inline(always)]
    pub fn parse(ctx: &TcContext) -> Result<Parsed, Error> {
        if !ensure(ctx, ETH_LEN + IPV4_LEN) {
            return Ok(Parsed::Other);
        }
        let Some(eth) = read::<EthHdr>(ctx, 0) else {
            return Ok(Parsed::Other);
        };
        if eth.ether_type != ETH_P_IP {
            return Ok(Parsed::Other);
        }
        let ip = read::<Ipv4Hdr>(ctx, ETH_LEN).ok_or(Error::Truncated)?;
        let proto = ip.proto;
        if proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP {
            return Ok(Parsed::OtherIpv4(ip));
        }
        let ihl = ((ip.vihl & 0x0f) as usize) * 4;
        if ihl < IPV4_LEN {
            return Err(Error::Truncated);
        }
        let l4_off = ETH_LEN + ihl;
        let frag = u16::from_be_bytes(ip.frag_off) & IP_MF_OFFSET;
        if frag != 0 && proto == IPPROTO_SCTP {
            // A fragmented SCTP packet passes untouched: its CRC32c covers
            // the whole datagram, whose length the first fragment does
            // not tell, so a port rewrite could not update it (SCTP splits
            // its messages into chunks itself and sends with DF set).
            return Ok(Parsed::OtherIpv4(ip));
        }
        let id_proto = (u16::from_be_bytes(ip.id) as u32) << 8 | proto as u32;
        if frag & IP_OFFSET != 0 {
            // A later fragment: the ports its first fragment recorded.
            let ports = frag::ports4(
                u32::from_ne_bytes(ip.src),
                u32::from_ne_bytes(ip.dst),
                id_proto,
            );
            if ports == 0 {
                return Ok(Parsed::UnknownFragment);
            }
            return Ok(Parsed::Flow(Flow4 {
                src: ip.src,
                dst: ip.dst,
                sport: (ports >> 16) as u16,
                dport: ports as u16,
                proto,
                tcp_flags: 0,
                l4_off,
                later: true,
            }));
        }
        let (sport, dport, tcp_flags) = if proto == IPPROTO_TCP {
            if !ensure(ctx, l4_off + TCP_LEN) {
                return Err(Error::Truncated);
            }
            let tcp = read::<TcpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            (tcp.sport, tcp.dport, tcp.flags)
        } else if proto == IPPROTO_SCTP {
            // The common header and the first chunk's type (an INIT
            // opens an association, see `is_syn`).
            if !ensure(ctx, l4_off + SCTP_LEN) {
                return Err(Error::Truncated);
            }
            let sctp = read::<SctpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            (sctp.sport, sctp.dport, sctp.chunk_type)
        } else {
            if !ensure(ctx, l4_off + UDP_LEN) {
                return Err(Error::Truncated);
            }
            let udp = read::<UdpHdr>(ctx, l4_off).ok_or(Error::Truncated)?;
            (udp.sport, udp.dport, 0)
        };
        let (sport, dport) = (u16::from_be_bytes(sport), u16::from_be_bytes(dport));
        if frag != 0 {
            // The first fragment (offset 0, more fragments): its ports
            // for the later ones. It is a packet of its flow like any.
            frag::record4(
                u32::from_ne_bytes(ip.src),
                u32::from_ne_bytes(ip.dst),
                id_proto,
                (sport as u32) << 16 | dport as u32,
            );
        }
        Ok(Parsed::Flow(Flow4 {
            src: ip.src,
            dst: ip.dst,
            sport,
            dport,
            proto,
            tcp_flags,
            l4_off,
            later: false,
        }))
    }

    /// The conntrack key of this packet's own tuple.
    #[inline(always)]
    pub fn ct_key(&self) -> Ct4Key {
        Ct4Key::new(self.src, self.dst, self.sport, self.dport, self.proto)
    }

    /// A TCP SYN without ACK, or an SCTP INIT: the first packet of a new
    /// connection or association.
    #[inline(always)]
    pub fn is_syn(&self) -> bool {
        opens(self.proto, self.tcp_flags)
    }

    #[inline(always)]
    pub fn has_tcp_flag(&self, flag: u8) -> bool {
        self.proto == IPPROTO_TCP && self.tcp_flags & flag != 0
    }
}

/// Whether a packet of `proto` with `tcp_flags` (the first chunk's type
/// for SCTP) opens a connection: a TCP SYN without ACK, an SCTP INIT.
#[inline(always)]
pub fn opens(proto: u8, tcp_flags: u8) -> bool {
    (proto == IPPROTO_TCP && tcp_flags & TCP_SYN != 0 && tcp_flags & TCP_ACK == 0)
        || (proto == IPPROTO_SCTP && tcp_flags == SCTP_INIT)
}

/// The frame's ethertype, to pick the IPv4 or the IPv6 path. Read in
/// place (TC always has the Ethernet header linear): no stack slot in the
/// program's frame, which the IPv4 path fills.
#[inline(always)]
pub fn ether_type(ctx: &TcContext) -> Option<[u8; 2]> {
    let start = ctx.data();
    if start + ETH_LEN > ctx.data_end() {
        return None;
    }
    // SAFETY: bounds checked just above; byte-aligned read.
    Some(unsafe { *((start + 12) as *const [u8; 2]) })
}

/// Whether an IPv4 frame may carry SCTP: its protocol byte says so, or is
/// not in the linear data (then `sctp::ports` looks). `sctp::ports`
/// asks it, to spare every other packet its BPF call.
#[inline(always)]
pub fn may_be_sctp4(ctx: &TcContext) -> bool {
    let start = ctx.data();
    let off = ETH_LEN + 9;
    if start + off + 1 > ctx.data_end() {
        return true;
    }
    // SAFETY: bounds checked just above; one byte read.
    unsafe { *((start + off) as *const u8) == IPPROTO_SCTP }
}

/// Reads header `T` at `off` for the reject builders (after `parse`
/// ensured the headers are linear).
#[inline(always)]
pub fn header<T: Copy>(ctx: &TcContext, off: usize) -> Result<T, Error> {
    read::<T>(ctx, off).ok_or(Error::Truncated)
}
