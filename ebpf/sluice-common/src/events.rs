//! `sl_events`: datapath events for `sluice monitor`. Every verdict that is
//! not a plain forward (a drop, a reject, a packet passed unbalanced, a
//! failed tail call) writes one `Event` into this BPF ring buffer when the
//! agent switched events on (`CFG_F_EVENTS_DROPS` in `Config::flags`),
//! rate limited per CPU. The reason is the `Stat` counter the same verdict
//! counts (`Event::reason` is its index, named by `Stat::name`): the
//! counters and the events are one vocabulary.

use crate::{assert_size, stats::Stat, user_pod};

/// Capacity of `sl_events` in bytes (a power of two, a multiple of the page
/// size): 256 KiB holds about 3,600 events (64 bytes and the ring's 8-byte
/// header each), over a second of the rate limit of a 2-CPU node, so a
/// reader that wakes every 100 ms never loses one to a full ring.
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;

/// Events each CPU may emit per second once its burst is spent.
pub const EVENTS_PER_SEC: u64 = 1_000;
/// Events a CPU may emit at once after a quiet second (the bucket's depth).
pub const EVENTS_BURST: u64 = 1_000;

/// Where the event was made (`Event::hook`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    /// A TC program whose direction the error path does not know (an error
    /// settled after the flow was gone).
    Tc = 0,
    /// `sl_ingress`/`sl_ingress6` (a packet arriving at the node).
    Ingress = 1,
    /// `sl_egress`/`sl_egress6` (a packet leaving the node).
    Egress = 2,
    /// A socket of the node: `connect()`, or `sendmsg()` on an
    /// unconnected UDP socket (`sl_connect4`/`6`, `sl_sendmsg4`/`6`).
    Socket = 3,
    /// `sl_xdp` (a packet from outside, at the driver).
    Xdp = 4,
}

impl Hook {
    /// The name `sluice monitor` prints.
    pub const fn name(self) -> &'static str {
        match self {
            Hook::Tc => "tc",
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
            Hook::Socket => "socket",
            Hook::Xdp => "xdp",
        }
    }

    /// The hook with this number, if any.
    pub const fn from_u8(v: u8) -> Option<Hook> {
        match v {
            0 => Some(Hook::Tc),
            1 => Some(Hook::Ingress),
            2 => Some(Hook::Egress),
            3 => Some(Hook::Socket),
            4 => Some(Hook::Xdp),
            _ => None,
        }
    }
}

/// One datapath event, as the programs write it into `sl_events`.
///
/// The frontend is the packet's destination (`dst`, `dport`, `proto`) for
/// ingress and socket events; `svc_id` and `backend_id` are 0 when the
/// verdict came before a frontend or a backend was known. An event with
/// `family` 0 carries no tuple (an error settled after its flow was gone, a
/// fragment whose ports are unknown, a failed tail call).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Event {
    /// `CLOCK_MONOTONIC` (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Addresses in network order; IPv4 in the first 4 bytes.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Host order.
    pub sport: u16,
    pub dport: u16,
    /// Service port (`SvcValue::svc_id`), 0: none.
    pub svc_id: u32,
    /// `sl_backends` id, 0: none.
    pub backend_id: u32,
    /// The device the packet came through (`skb->ifindex`, or the XDP
    /// context's `ingress_ifindex`), 0 for sockets.
    pub ifindex: u32,
    /// `Stat` index of the reason.
    pub reason: u8,
    /// `Hook`.
    pub hook: u8,
    /// `FAMILY_V4`, `FAMILY_V6`, or 0 (no tuple).
    pub family: u8,
    pub proto: u8,
    pub _pad: u32,
}
assert_size!(Event, 64);

impl Event {
    /// The reason as a counter, if the index is one this build knows.
    pub fn stat(&self) -> Option<Stat> {
        Stat::from_index(self.reason as u32)
    }
}

/// Per-CPU token bucket of the rate limit (`sl_evrate`, one slot; not
/// pinned: each program generation starts with a full bucket).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventBucket {
    /// When the bucket was last refilled (`bpf_ktime_get_ns`).
    pub last_ns: u64,
    /// Tokens left, in nanoseconds of refill (`NS_PER_EVENT` per event).
    pub budget_ns: u64,
}
assert_size!(EventBucket, 16);

/// Refill time of one token.
pub const NS_PER_EVENT: u64 = 1_000_000_000 / EVENTS_PER_SEC;
/// The bucket's depth in nanoseconds.
pub const BUDGET_MAX_NS: u64 = EVENTS_BURST * NS_PER_EVENT;

user_pod!(Event, EventBucket);
