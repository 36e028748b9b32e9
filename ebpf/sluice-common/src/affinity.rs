//! `sl_aff4` and `sl_aff6`: session affinity (sessionAffinity: ClientIP),
//! LRU hashes (one per family, sharing `AffinityValue`).
//! The datapath records which backend each client's last new flow to a
//! service port got, and sends the client's next new flow there if it is
//! within the frontend's timeout and the backend is still active; the
//! agent's scan removes entries of removed backends.

use crate::{assert_size, user_pod};

/// Keyed per frontend: a frontend may select among a subset of its service
/// port's backends (traffic policy Local), and its affinity must stay
/// within that subset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Affinity4Key {
    pub client: [u8; 4],
    pub frontend: [u8; 4],
    /// Frontend port, host order.
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}
assert_size!(Affinity4Key, 12);

/// Key of `sl_aff6`: `Affinity4Key` with 16-byte addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Affinity6Key {
    pub client: [u8; 16],
    pub frontend: [u8; 16],
    /// Frontend port, host order.
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}
assert_size!(Affinity6Key, 36);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityValue {
    /// `CLOCK_MONOTONIC` nanoseconds of the last new flow.
    pub last_used_ns: u64,
    pub backend_id: u32,
    pub svc_id: u32,
}
assert_size!(AffinityValue, 16);

user_pod!(Affinity4Key, Affinity6Key, AffinityValue);
