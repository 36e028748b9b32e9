//! Socket-level balancing for the node's own processes (cgroup
//! `connect4`/`sendmsg4` pick a backend once per socket or datagram; no
//! packet is rewritten).
//!
//! `sl_sock4` records each socket's backend, so that the drain manager
//! counts the node's own flows like any other and `sock_release` can clean
//! up; `sl_sockrev4` maps (socket, backend) back to the frontend, so that
//! `getpeername()` and UDP `recvmsg()` report the service address.

use crate::{assert_size, user_pod};

/// Value of `sl_sock4` (key: the socket cookie, `u64`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockEntry {
    pub backend_id: u32,
    pub svc_id: u32,
    /// The backend the socket was sent to, and the frontend it asked for.
    pub backend: [u8; 4],
    pub frontend: [u8; 4],
    pub backend_port: u16,
    pub frontend_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}
assert_size!(SockEntry, 24);

/// Key of `sl_sockrev4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockRevKey {
    pub cookie: u64,
    pub backend: [u8; 4],
    pub port: u16,
    pub _pad: [u8; 2],
}
assert_size!(SockRevKey, 16);

/// Value of `sl_sockrev4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevValue {
    pub frontend: [u8; 4],
    pub port: u16,
    pub _pad: [u8; 2],
}
assert_size!(SockRevValue, 8);

user_pod!(SockEntry, SockRevKey, SockRevValue);
