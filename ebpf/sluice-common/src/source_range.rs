//! `sl_srcrng4` and `sl_srcrng6`: loadBalancerSourceRanges, LPM tries (one
//! per family). A key is the service
//! port id (all 32 bits significant) followed by the client network, so one
//! trie serves every service: the prefix length is 32 + the CIDR length.

use crate::{assert_size, user_pod};

/// The data part of an LPM key (`bpf_lpm_trie_key` adds the prefix length).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrcRange4 {
    /// `SvcValue::svc_id`, big-endian so that it is a byte prefix.
    pub svc_id: [u8; 4],
    pub addr: [u8; 4],
}
assert_size!(SrcRange4, 8);

impl SrcRange4 {
    pub const fn new(svc_id: u32, addr: [u8; 4]) -> Self {
        Self {
            svc_id: svc_id.to_be_bytes(),
            addr,
        }
    }

    /// The LPM prefix length of a range of `cidr_len` bits.
    pub const fn prefix_len(cidr_len: u8) -> u32 {
        32 + cidr_len as u32
    }
}

/// The data part of an `sl_srcrng6` key: `SrcRange4` with an IPv6 network.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrcRange6 {
    /// `SvcValue::svc_id`, big-endian so that it is a byte prefix.
    pub svc_id: [u8; 4],
    pub addr: [u8; 16],
}
assert_size!(SrcRange6, 20);

impl SrcRange6 {
    pub const fn new(svc_id: u32, addr: [u8; 16]) -> Self {
        Self {
            svc_id: svc_id.to_be_bytes(),
            addr,
        }
    }

    /// The LPM prefix length of a range of `cidr_len` bits.
    pub const fn prefix_len(cidr_len: u8) -> u32 {
        32 + cidr_len as u32
    }
}

user_pod!(SrcRange4, SrcRange6);
