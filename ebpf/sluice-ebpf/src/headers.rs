//! Wire headers as byte-aligned `#[repr(C)]` structs (no implicit padding,
//! no alignment assumptions about packet memory).

pub const ETH_LEN: usize = 14;
pub const ETH_P_IP: [u8; 2] = [0x08, 0x00];
pub const IPV4_LEN: usize = 20;
pub const TCP_LEN: usize = 20;
pub const UDP_LEN: usize = 8;

/// `frag_off` bits: more-fragments flag and offset mask.
pub const IP_MF_OFFSET: u16 = 0x3fff;
pub const IP_DF: u16 = 0x4000;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

pub const IPPROTO_ICMP: u8 = 1;

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

const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_LEN);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == IPV4_LEN);
const _: () = assert!(core::mem::size_of::<TcpHdr>() == TCP_LEN);
const _: () = assert!(core::mem::size_of::<UdpHdr>() == UDP_LEN);
