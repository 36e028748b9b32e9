//! Socket-level balancing for the node's own processes (cgroup
//! `connect4`/`connect6`/`sendmsg4`/`sendmsg6` pick a backend once per
//! socket or datagram; no packet is rewritten). One pair of maps serves
//! both families: addresses are 16 bytes, as the socket sees them (an
//! `AF_INET` socket's IPv4 address in the first 4 bytes; an `AF_INET6`
//! socket's address whole, an IPv4 service reached through a v4-mapped
//! address `::ffff:a.b.c.d` included).
//!
//! `sl_sock` records each socket's backend, so that the drain manager
//! counts the node's own flows like any other, `sock_release` can clean
//! up, and a TCP socket's `getpeername()` reports the service address;
//! `sl_sockrev` maps a UDP socket's (socket, backend) back to the
//! frontend (an unconnected socket may send to several), so that its
//! `getpeername()` and `recvmsg()` report the service address. After
//! 0.1.0 a TCP socket has no `sl_sockrev` entry (one map insert fewer per
//! connection, one delete fewer at close; same layouts, same ABI). After
//! a rollback to 0.1.0, whose `getpeername()` reads only `sl_sockrev`, a
//! TCP socket connected by a later agent reports its backend as peer; its
//! flow is not affected.

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
