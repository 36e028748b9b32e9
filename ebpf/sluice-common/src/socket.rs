//! Socket-level balancing for the node's own processes (cgroup
//! `connect4`/`connect6`/`sendmsg4`/`sendmsg6` pick a backend once per
//! socket or datagram; no packet is rewritten). One pair of maps serves
//! both families: addresses are 16 bytes, as the socket sees them (an
//! `AF_INET` socket's IPv4 address in the first 4 bytes; an `AF_INET6`
//! socket's address whole, an IPv4 service reached through a v4-mapped
//! address `::ffff:a.b.c.d` included).
//!
//! `sl_sock` records each socket's backend, so that the drain manager
//! counts the node's own flows like any other and `sock_release` can clean
//! up; `sl_sockrev` maps (socket, backend) back to the frontend, so that
//! `getpeername()` and UDP `recvmsg()` report the service address.

use crate::{assert_size, user_pod};

/// Value of `sl_sock` (key: the socket cookie, `u64`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockEntry {
    pub backend_id: u32,
    pub svc_id: u32,
    /// The backend the socket was sent to, and the frontend it asked for,
    /// as the socket sees them.
    pub backend: [u8; 16],
    pub frontend: [u8; 16],
    pub backend_port: u16,
    pub frontend_port: u16,
    pub proto: u8,
    /// The socket's family: `FAMILY_V4` (`AF_INET`) or `FAMILY_V6`
    /// (`AF_INET6`, v4-mapped addresses included).
    pub family: u8,
    pub _pad: [u8; 2],
}
assert_size!(SockEntry, 48);

/// Key of `sl_sockrev`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockRevKey {
    pub cookie: u64,
    /// The backend, as the socket sees it (see the module comment).
    pub backend: [u8; 16],
    pub port: u16,
    pub _pad: [u8; 6],
}
assert_size!(SockRevKey, 32);

/// Value of `sl_sockrev`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevValue {
    pub frontend: [u8; 16],
    pub port: u16,
    pub _pad: [u8; 2],
}
assert_size!(SockRevValue, 20);

user_pod!(SockEntry, SockRevKey, SockRevValue);
