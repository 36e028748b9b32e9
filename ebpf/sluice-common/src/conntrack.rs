//! `sl_ct4` and `sl_ct6`: connection tracking for IPv4 and IPv6 service
//! flows (LRU hashes). Both hold `CtEntry` values; only the key differs.
//!
//! Each flow has two entries, both keyed by a full 5-tuple including the
//! protocol:
//! - the forward entry, keyed by the tuple the client sent
//!   (client -> VIP), records the chosen backend, the TCP state and, for a
//!   flow SNATed to the node, the node address and port it uses;
//! - the reply entry, keyed by the tuple the backend sends back
//!   (backend -> client, or backend -> node for an SNATed flow), records
//!   the VIP and port to restore as source and the client.
//!
//! The two key spaces cannot collide (one has the VIP as destination, the
//! other the backend as source), so one lookup of the packet's own tuple
//! finds either kind. The datapath never deletes entries; the agent's
//! garbage collector removes expired ones and those of removed backends.

use crate::{assert_size, user_pod};

/// Key of `sl_ct4`: the packet's tuple as seen on the wire.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ct4Key {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// Host order.
    pub sport: u16,
    /// Host order.
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}
assert_size!(Ct4Key, 16);

impl Ct4Key {
    /// A key from its parts.
    pub const fn new(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, proto: u8) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto,
            _pad: [0; 3],
        }
    }
}

/// Key of `sl_ct6`: `Ct4Key` with 16-byte addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ct6Key {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Host order.
    pub sport: u16,
    /// Host order.
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}
assert_size!(Ct6Key, 40);

impl Ct6Key {
    /// A key from its parts.
    pub const fn new(src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16, proto: u8) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto,
            _pad: [0; 3],
        }
    }
}

/// Value of `sl_ct4` and `sl_ct6`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtEntry {
    /// Only in the `abi-probe` test build: moves every field, so that the
    /// upgrade tests prove conntrack is carried field by field.
    #[cfg(feature = "abi-probe")]
    pub probe: u64,
    /// `CLOCK_MONOTONIC` nanoseconds of the last packet, refreshed at most
    /// once per `CT_REFRESH_NS` or when `flags` change.
    pub last_seen_ns: u64,
    /// Backend the flow was assigned to.
    pub backend_id: u32,
    /// Service port (`SvcValue::svc_id`) the flow was assigned by.
    pub svc_id: u32,
    /// Forward: the SNAT source (with `CT_F_SNAT`), else unused. Reply: the
    /// frontend address to restore as source. Network order, IPv4 in the
    /// first 4 bytes.
    pub nat_addr: [u8; 16],
    /// Reply: the client, i.e. the forward entry's source (restored as
    /// destination when the flow was SNATed). Forward: unused.
    pub peer_addr: [u8; 16],
    /// Port matching `nat_addr`, host order.
    pub nat_port: u16,
    /// Port matching `peer_addr`, host order.
    pub peer_port: u16,
    /// A `CtKind` value.
    pub kind: u8,
    /// `CT_F_*` bits (kept on the forward entry; a reply entry carries
    /// `CT_F_SNAT` and what it pushed to its forward entry).
    pub flags: u8,
    pub _pad: [u8; 2],
}
#[cfg(not(feature = "abi-probe"))]
assert_size!(CtEntry, 56);
#[cfg(feature = "abi-probe")]
assert_size!(CtEntry, 64);

impl CtEntry {
    /// The key of the forward entry a reply entry belongs to.
    pub const fn forward_key_of_reply(&self, proto: u8) -> Ct4Key {
        Ct4Key::new(
            [
                self.peer_addr[0],
                self.peer_addr[1],
                self.peer_addr[2],
                self.peer_addr[3],
            ],
            [
                self.nat_addr[0],
                self.nat_addr[1],
                self.nat_addr[2],
                self.nat_addr[3],
            ],
            self.peer_port,
            self.nat_port,
            proto,
        )
    }

    /// The key of the forward entry an IPv6 reply entry belongs to.
    pub const fn forward_key6_of_reply(&self, proto: u8) -> Ct6Key {
        Ct6Key::new(
            self.peer_addr,
            self.nat_addr,
            self.peer_port,
            self.nat_port,
            proto,
        )
    }

    /// Both directions have closed (FIN each way) or a RST was seen.
    pub const fn is_closing(&self) -> bool {
        closing(self.flags)
    }
}

/// Whether `CT_F_*` flags say both directions closed or a RST was seen.
pub const fn closing(flags: u8) -> bool {
    flags & CT_F_RST != 0 || (flags & CT_F_TX_CLOSING != 0 && flags & CT_F_RX_CLOSING != 0)
}

/// Which side of a flow an entry describes.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtKind {
    Forward = 1,
    Reply = 2,
}

/// The client sent a SYN (SCTP: an INIT chunk).
pub const CT_F_SYN: u8 = 1 << 0;
/// The client sent a FIN.
pub const CT_F_TX_CLOSING: u8 = 1 << 1;
/// The backend sent a FIN.
pub const CT_F_RX_CLOSING: u8 = 1 << 2;
/// Either side sent a RST (SCTP: an ABORT or a SHUTDOWN COMPLETE chunk,
/// the end of the association).
pub const CT_F_RST: u8 = 1 << 3;
/// The backend has answered at least once.
pub const CT_F_SEEN_REPLY: u8 = 1 << 4;
/// The flow is SNATed to the node (`nat_addr:nat_port` on the forward
/// entry); its replies are handled on the way in.
pub const CT_F_SNAT: u8 = 1 << 5;
/// Both entries of a flow without SNAT whose client is a pod of this node
/// (local-traffic detection, with `CFG_F_SOCK_PODS`): its replies need
/// reverse NAT on the pod's device, so while either entry lives the agent
/// keeps `CFG_F_PODS_ON_SOCKETS` clear (the reply entry too: an LRU may
/// evict the forward one first). 0.1.0 neither sets nor reads it.
pub const CT_F_POD: u8 = 1 << 6;

/// The datapath rewrites `last_seen_ns` at most this often per entry.
pub const CT_REFRESH_NS: u64 = 1_000_000_000;

/// A new flow takes over the entries of an earlier flow on its tuple in
/// place only while both were used this recently: the agent's collector
/// deletes a closed flow's entries once they are idle `TCP_CLOSING_S`
/// (the shortest timeout), and an LRU map's deleted element goes back
/// to its free lists at once, so a store through a pointer to an entry
/// being collected could land in another flow's. Half the shortest
/// timeout keeps the two apart; older entries take the inserts.
pub const CT_REUSE_IDLE_NS: u64 = timeouts::TCP_CLOSING_S * 1_000_000_000 / 2;

/// Idle timeouts the agent's garbage collector applies (seconds), after
/// Cilium's defaults.
pub mod timeouts {
    /// TCP flow that has seen traffic both ways.
    pub const TCP_ESTABLISHED_S: u64 = 6 * 3600;
    /// TCP flow whose backend has not answered yet.
    pub const TCP_SYN_S: u64 = 60;
    /// TCP flow closed both ways or reset.
    pub const TCP_CLOSING_S: u64 = 10;
    /// UDP (and any other) flow.
    pub const UDP_S: u64 = 60;
    /// SCTP association that has seen traffic both ways (netfilter's
    /// `nf_conntrack_sctp_timeout_established`: heartbeats, every 30 s by
    /// default, keep a live association well inside it). Before the
    /// backend answers, `TCP_SYN_S`; after ABORT or SHUTDOWN COMPLETE,
    /// `TCP_CLOSING_S`.
    pub const SCTP_ESTABLISHED_S: u64 = 210;
}

user_pod!(Ct4Key, Ct6Key, CtEntry);
