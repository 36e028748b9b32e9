//! `sl_sockfe4`/`sl_sockfe6`: a frontend's backends for the socket
//! programs in one lookup.
//!
//! A socket's `connect()` on the general path makes three hash lookups:
//! the master entry, the slot the hash picks, the backend the slot names
//! (`sl_svc4`, `sl_svc4`, `sl_backends`). In maps of 1,000 frontends and
//! more each of them misses the caches. For a frontend with nothing a
//! socket must decide on its own (no session affinity, Maglev table,
//! source ranges or internal scope) and at most `SOCK_PICKS_MAX` active
//! backends, the agent also writes this entry, keyed like its master
//! entry: the service port and each active backend's id, address and
//! port, in slot order. The socket programs take it first; `picks[i]` is
//! the backend of slot `i + 1`, so a socket gets the backend the general
//! path would have given it.
//!
//! The agent deletes a frontend's entry before its slots or master entry
//! change in a way that changes it and writes the new one after them, so
//! an entry always gives what they give and names only backends that
//! exist. The programs read these maps only while `CFG_F_SOCK_PICKS` is
//! set, which the agent sets once the maps hold nothing stale and clears
//! as it stops, so that a release that does not keep them (0.1.0, which
//! never reads or writes the bit) is never followed by reads of entries
//! it left behind, unless the agent before it crashed.

use crate::{
    assert_size,
    service::{
        SVC_F_AFFINITY, SVC_F_INTERNAL, SVC_F_MAGLEV, SVC_F_NODE_DENIED, SVC_F_SOURCE_RANGES,
    },
    user_pod,
};

/// Active backends an entry holds at most: a frontend with more has none.
/// 14 keeps an `sl_sockfe4` element (the kernel's 48-byte element header,
/// the 16-byte key slot and the 176-byte value, plus the allocator's 8)
/// in the 256-byte allocation class: 16 would take the 512-byte one.
pub const SOCK_PICKS_MAX: usize = 14;

/// Master flags that make a socket's pick depend on more than a hash over
/// the active backends: a frontend with any of them has no entry.
pub const SOCK_PICKS_EXCLUDED: u16 =
    SVC_F_AFFINITY | SVC_F_MAGLEV | SVC_F_SOURCE_RANGES | SVC_F_NODE_DENIED | SVC_F_INTERNAL;

/// Whether an external-scope frontend with master `flags` and `active`
/// active backends gets an entry.
pub const fn takes_picks(flags: u16, active: u16) -> bool {
    flags & SOCK_PICKS_EXCLUDED == 0 && active > 0 && active as usize <= SOCK_PICKS_MAX
}

/// One active backend of an IPv4 frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockPick4 {
    /// The backend's id in `sl_backends`.
    pub backend_id: u32,
    /// Address, network order.
    pub addr: [u8; 4],
    /// Port, host order.
    pub port: u16,
    pub _pad: [u8; 2],
}
assert_size!(SockPick4, 12);

/// Value of `sl_sockfe4` (key: the frontend's master `Svc4Key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockPicks4 {
    /// The frontend's service port (`SvcValue::svc_id`).
    pub svc_id: u32,
    /// `picks[..count]` are the active backends (1..=`SOCK_PICKS_MAX`).
    pub count: u16,
    pub _pad: [u8; 2],
    pub picks: [SockPick4; SOCK_PICKS_MAX],
}
assert_size!(SockPicks4, 8 + 12 * SOCK_PICKS_MAX);

/// One active backend of an IPv6 frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockPick6 {
    /// The backend's id in `sl_backends`.
    pub backend_id: u32,
    /// Port, host order.
    pub port: u16,
    pub _pad: [u8; 2],
    /// Address, network order.
    pub addr: [u8; 16],
}
assert_size!(SockPick6, 24);

/// Value of `sl_sockfe6` (key: the frontend's master `Svc6Key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockPicks6 {
    /// The frontend's service port (`SvcValue::svc_id`).
    pub svc_id: u32,
    /// `picks[..count]` are the active backends (1..=`SOCK_PICKS_MAX`).
    pub count: u16,
    pub _pad: [u8; 2],
    pub picks: [SockPick6; SOCK_PICKS_MAX],
}
assert_size!(SockPicks6, 8 + 24 * SOCK_PICKS_MAX);

user_pod!(SockPick4, SockPicks4, SockPick6, SockPicks6);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::{SVC_F_DROP_EMPTY, SVC_F_MASQ_OUTSIDE, SVC_F_SNAT};

    #[test]
    fn only_a_plain_hash_over_a_few_active_backends_takes_picks() {
        assert!(takes_picks(0, 1));
        assert!(takes_picks(0, SOCK_PICKS_MAX as u16));
        // What only the TC path reads does not matter to a socket.
        assert!(takes_picks(
            SVC_F_SNAT | SVC_F_MASQ_OUTSIDE | SVC_F_DROP_EMPTY,
            3
        ));
        assert!(!takes_picks(0, 0));
        assert!(!takes_picks(0, SOCK_PICKS_MAX as u16 + 1));
        for flag in [
            SVC_F_AFFINITY,
            SVC_F_MAGLEV,
            SVC_F_SOURCE_RANGES,
            SVC_F_NODE_DENIED,
            SVC_F_INTERNAL,
        ] {
            assert!(!takes_picks(flag, 2), "flag {flag:#x}");
        }
    }
}
