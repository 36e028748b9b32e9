//! Wire headers as byte-aligned `#[repr(C)]` structs (no implicit padding,
//! no alignment assumptions about packet memory).

pub const ETH_LEN: usize = 14;
pub const ETH_P_IP: [u8; 2] = [0x08, 0x00];
pub const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];
pub const IPV4_LEN: usize = 20;
pub const IPV6_LEN: usize = 40;
pub const TCP_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
/// The SCTP common header (12 bytes) and the first chunk's header (4).
pub const SCTP_LEN: usize = 16;

/// `frag_off` bits: more-fragments flag and offset mask.
pub const IP_MF_OFFSET: u16 = 0x3fff;
pub const IP_DF: u16 = 0x4000;
/// `frag_off` bits: the fragment offset alone (non-zero: not the first).
pub const IP_OFFSET: u16 = 0x1fff;
/// Length of the IPv6 fragment header.
pub const FRAG6_LEN: usize = 8;
/// IPv6 fragment header `frag_off` bits: the offset (in bytes, a
/// multiple of 8) and the more-fragments flag.
pub const IP6_OFFSET: u16 = 0xfff8;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// SCTP chunk types the conntrack follows (RFC 9260 3.2): an INIT opens
/// an association, an ABORT or a SHUTDOWN COMPLETE ends it.
pub const SCTP_INIT: u8 = 1;
pub const SCTP_ABORT: u8 = 6;
pub const SCTP_SHUTDOWN_COMPLETE: u8 = 14;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// IPv6 next-header values that are extension headers (RFC 8200 4.1, plus
/// ESP, AH, mobility, HIP and shim6) or No Next Header.
pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_ESP: u8 = 50;
pub const NEXTHDR_AUTH: u8 = 51;
pub const NEXTHDR_NONE: u8 = 59;
pub const NEXTHDR_DEST: u8 = 60;
pub const NEXTHDR_MOBILITY: u8 = 135;
pub const NEXTHDR_HIP: u8 = 139;
pub const NEXTHDR_SHIM6: u8 = 140;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ether_type: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv4Hdr {
    pub vihl: u8,
    pub tos: u8,
    pub tot_len: [u8; 2],
    pub id: [u8; 2],
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub proto: u8,
    pub check: [u8; 2],
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6Hdr {
    /// Version (4 bits), traffic class (8), flow label (20).
    pub vtcfl: [u8; 4],
    pub payload_len: [u8; 2],
    pub next_header: u8,
    pub hop_limit: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

/// The IPv6 fragment header (RFC 8200 4.5).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Frag6Hdr {
    pub next_header: u8,
    pub reserved: u8,
    /// Offset (13 bits, in 8-byte units), 2 reserved bits, M flag.
    pub frag_off: [u8; 2],
    pub id: [u8; 4],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct TcpHdr {
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub seq: [u8; 4],
    pub ack: [u8; 4],
    pub doff_res: u8,
    pub flags: u8,
    pub window: [u8; 2],
    pub check: [u8; 2],
    pub urg: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UdpHdr {
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub len: [u8; 2],
    pub check: [u8; 2],
}

/// The SCTP common header and the header of the packet's first chunk.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SctpHdr {
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub vtag: [u8; 4],
    /// CRC32c, stored little-endian (as Linux writes it).
    pub check: [u8; 4],
    pub chunk_type: u8,
    pub chunk_flags: u8,
    pub chunk_len: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_LEN);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == IPV4_LEN);
const _: () = assert!(core::mem::size_of::<Ipv6Hdr>() == IPV6_LEN);
const _: () = assert!(core::mem::size_of::<Frag6Hdr>() == FRAG6_LEN);
const _: () = assert!(core::mem::size_of::<TcpHdr>() == TCP_LEN);
const _: () = assert!(core::mem::size_of::<UdpHdr>() == UDP_LEN);
const _: () = assert!(core::mem::size_of::<SctpHdr>() == SCTP_LEN);
