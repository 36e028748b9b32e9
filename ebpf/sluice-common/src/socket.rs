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

//!
//! `sl_sockmark` counts the TCP entries of `sl_sock` by slot of their
//! cookie, so that a closing TCP socket that was never balanced (its slot
//! counts none) costs `sock_release` no lookup in `sl_sock`, a map too big
//! to stay in the caches. An entry the counts hold is marked `counted`
//! (its first padding byte; 0.1.0 writes 0 there and never reads it); the
//! release of a counted entry takes its count back (while the counts are
//! valid every TCP entry is counted, so that release deletes without a
//! lookup first). A count may stay too
//! high (an entry the LRU evicted, a socket that connected twice), never
//! too low within one set of maps; the counts are trusted only while the
//! validity word is set, which the agent writes after a scan of `sl_sock`
//! (and `sl_socktab`) found no uncounted TCP entry (0.1.0's, or one a migration stripped of
//! its bit) and every slot's count at least its entries, and clears as it
//! stops (the loader clears it at every start too).
//!
//! `sl_socktab` holds a TCP socket's entry in place of `sl_sock` while the
//! counts are valid: one array slot per cookie slot (`table_slot`), taken
//! with an atomic compare-and-swap of its cookie from 0 (busy while the
//! entry is written, `SOCK_SLOT_BUSY`) and given back the same way at the
//! socket's close, so that a connection costs no hash insert and no hash
//! delete (an `sl_sock` entry measured about 300 ns to insert and 170 ns
//! to delete, more than the rest of `connect4`). A slot another live
//! socket holds sends the socket to `sl_sock` as before. A table entry is
//! counted in `sl_sockmark` like a counted `sl_sock` entry. Whenever the
//! counts lose their validity (an agent starts or stops) the agent moves
//! every table entry into `sl_sock` (as it is, counted), so that an older
//! release, which knows only `sl_sock`, finds the sockets there. A connect
//! reads the validity again after it took a slot and, if it is gone,
//! gives the slot back (unless the agent moved it already) and goes to
//! `sl_sock`: a slot taken after the agent's move is not left behind. The
//! agent owns a slot while it moves it (`SOCK_SLOT_MOVING`): it copies the
//! entry into `sl_sock` without overwriting (a connect's newer entry
//! wins) and then frees the slot; a close that finds its slot being moved
//! takes it, deletes the copy if it was made and takes its count back,
//! and the agent's failed compare-and-swap then tells it to delete a copy
//! made after that. A connect that goes to `sl_sock` gives back any slot
//! its socket holds (a socket connecting again), so a socket never keeps
//! an older table entry beside a newer `sl_sock` one; one that went to
//! `sl_sock` first (its slot taken) and takes a slot on a later connect
//! (a TCP socket connects again only after an `AF_UNSPEC` disconnect)
//! deletes its older `sl_sock` entry, looked up only where its cookie's
//! count says one may be.

use crate::{
    assert_size,
    maps::{SOCK_MARK_SLOTS, SOCK_TABLE_SLOTS},
    user_pod,
};

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

/// `SockEntry::_pad[0]` bit: the entry is counted in `sl_sockmark`. A
/// migration into a new `sl_sock` layout does not copy `_` fields, so it
/// strips the bit: such entries then keep the counts untrusted until their
/// sockets close (safe), unless that migration carries the bit itself.
pub const SOCK_F_COUNTED: u8 = 1;

impl SockEntry {
    /// Whether `sl_sockmark` counts this entry.
    #[inline(always)]
    pub fn counted(&self) -> bool {
        self._pad[0] & SOCK_F_COUNTED != 0
    }

    #[inline(always)]
    pub fn set_counted(&mut self) {
        self._pad[0] |= SOCK_F_COUNTED;
    }
}

/// The `sl_sockmark` slot counting the socket with `cookie` (cookies are
/// handed out in sequence, so their low bits spread).
#[inline(always)]
pub const fn mark_slot(cookie: u64) -> u32 {
    ((cookie ^ (cookie >> 32)) as u32) % SOCK_MARK_SLOTS
}

/// One slot of `sl_socktab`: the cookie of the socket that holds it (0:
/// free) and that socket's entry (counted, TCP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockSlot {
    pub cookie: u64,
    pub entry: SockEntry,
}
assert_size!(SockSlot, 56);

/// The `sl_socktab` slot of the socket with `cookie` (the kernel hands
/// cookies out from one counter, in per-CPU batches, to every socket
/// whose cookie is asked for: their low bits spread).
#[inline(always)]
pub const fn table_slot(cookie: u64) -> u32 {
    (cookie as u32) % SOCK_TABLE_SLOTS
}

/// `SockSlot::cookie` bit: the socket is writing its entry (readers skip
/// the slot). Cookies count up from 1 and never reach it.
pub const SOCK_SLOT_BUSY: u64 = 1 << 63;

/// `SockSlot::cookie` bit: the agent is moving the entry into `sl_sock`.
/// The entry stays readable (`getpeername`); only the socket's close may
/// take the slot from the agent (it then deletes the copy too), and a
/// connect passes the slot by (its newer entry goes to `sl_sock`, where
/// the agent's copy never overwrites an entry).
pub const SOCK_SLOT_MOVING: u64 = 1 << 62;

/// The index of `sl_sockmark`'s validity word.
pub const MARKS_VALID: u32 = SOCK_MARK_SLOTS;

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

user_pod!(SockEntry, SockRevKey, SockRevValue, SockSlot);
