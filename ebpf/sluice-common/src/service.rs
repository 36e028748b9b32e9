//! `sl_svc4` and `sl_svc6`: service frontends, modelled on Cilium's
//! `lb4_services` / `lb6_services`. Both families share `SvcValue`, the
//! service-port id space and `sl_backends`.
//!
//! A frontend (VIP, port, protocol) owns slots `0..=total`. Slot 0 is the
//! master entry: it says how many slots there are and which are selectable.
//! Slots `1..=active` hold ready backends, the next `fallback` slots hold
//! terminating-but-serving backends (used only when `active` is 0, as
//! kube-proxy does since KEP-1669), and the remaining slots up to `total`
//! hold backends that are never selected for new flows (terminating, not
//! ready, draining) so that operators can still see them.
//!
//! The writer orders its updates so that a packet never sees a slot whose
//! backend is missing or a master count that covers a missing slot:
//! backends first, then slots, then the master entry, then surplus slots are
//! trimmed.

use crate::{assert_size, user_pod};

/// Key of `sl_svc4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Svc4Key {
    /// Frontend address, network order.
    pub addr: [u8; 4],
    /// Frontend port, host order.
    pub port: u16,
    /// 0 for the master entry, 1.. for backend slots.
    pub slot: u16,
    /// IP protocol (`IPPROTO_TCP` / `IPPROTO_UDP`).
    pub proto: u8,
    /// `SCOPE_EXTERNAL` (every frontend) or `SCOPE_INTERNAL` (the second
    /// backend list of an externalTrafficPolicy Local frontend, for
    /// sources inside the cluster).
    pub scope: u8,
    pub _pad: [u8; 2],
}
assert_size!(Svc4Key, 12);

impl Svc4Key {
    /// The key of `slot` of the frontend `addr:port/proto` (external scope).
    pub const fn new(addr: [u8; 4], port: u16, proto: u8, slot: u16) -> Self {
        Self::scoped(addr, port, proto, slot, SCOPE_EXTERNAL)
    }

    /// The key of `slot` of the frontend `addr:port/proto` in `scope`.
    pub const fn scoped(addr: [u8; 4], port: u16, proto: u8, slot: u16, scope: u8) -> Self {
        Self {
            addr,
            port,
            slot,
            proto,
            scope,
            _pad: [0; 2],
        }
    }

    /// The same frontend's master entry (same scope).
    pub const fn master(&self) -> Self {
        Self::scoped(self.addr, self.port, self.proto, 0, self.scope)
    }
}

/// Key of `sl_svc6`: `Svc4Key` with a 16-byte address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Svc6Key {
    /// Frontend address, network order.
    pub addr: [u8; 16],
    /// Frontend port, host order.
    pub port: u16,
    /// 0 for the master entry, 1.. for backend slots.
    pub slot: u16,
    /// IP protocol (`IPPROTO_TCP` / `IPPROTO_UDP`).
    pub proto: u8,
    /// `SCOPE_EXTERNAL` (every frontend) or `SCOPE_INTERNAL` (the second
    /// backend list of an externalTrafficPolicy Local frontend, for
    /// sources inside the cluster).
    pub scope: u8,
    pub _pad: [u8; 2],
}
assert_size!(Svc6Key, 24);

impl Svc6Key {
    /// The key of `slot` of the frontend `[addr]:port/proto` (external
    /// scope).
    pub const fn new(addr: [u8; 16], port: u16, proto: u8, slot: u16) -> Self {
        Self::scoped(addr, port, proto, slot, SCOPE_EXTERNAL)
    }

    /// The key of `slot` of the frontend `[addr]:port/proto` in `scope`.
    pub const fn scoped(addr: [u8; 16], port: u16, proto: u8, slot: u16, scope: u8) -> Self {
        Self {
            addr,
            port,
            slot,
            proto,
            scope,
            _pad: [0; 2],
        }
    }

    /// The same frontend's master entry (same scope).
    pub const fn master(&self) -> Self {
        Self::scoped(self.addr, self.port, self.proto, 0, self.scope)
    }
}

/// The scope every frontend has: for externalTrafficPolicy Local external
/// frontends, the node-local backend list that clients outside the
/// cluster get.
pub const SCOPE_EXTERNAL: u8 = 0;

/// The second scope of an externalTrafficPolicy Local external frontend
/// (as Cilium's `LB_LOOKUP_SCOPE_INT`): every endpoint of the cluster, for
/// sources inside the cluster (pods recognised by local-traffic detection,
/// the node itself), as kube-proxy "short-circuits" them. Its master entry
/// is found only when the external one has `SVC_F_INTERNAL`.
pub const SCOPE_INTERNAL: u8 = 1;

/// Value of `sl_svc4` and `sl_svc6`. In the master entry (slot 0) `backend_id` is 0 and
/// the counts are set; in a backend slot only `svc_id` and `backend_id`
/// are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SvcValue {
    /// The service port this frontend belongs to. Every frontend of one
    /// Kubernetes service port (ClusterIP, NodePort, ...) shares it, and
    /// conntrack entries record it to detect a VIP that changed owner.
    pub svc_id: u32,
    /// Backend in this slot (slots >= 1), 0 in the master entry.
    pub backend_id: u32,
    /// Master: slots `1..=active` hold ready backends.
    pub active: u16,
    /// Master: slots `active+1..=active+fallback` hold terminating but
    /// serving backends, selected only when `active` is 0.
    pub fallback: u16,
    /// Master: slots `1..=total` exist; those past `active+fallback` are
    /// never selected.
    pub total: u16,
    /// Master: `FrontendKind` in the low 4 bits, `SVC_F_*` above.
    pub flags: u16,
    /// Master: session affinity timeout in seconds (with `SVC_F_AFFINITY`).
    pub affinity_s: u32,
    pub _pad: u32,
}
assert_size!(SvcValue, 24);

impl SvcValue {
    /// The kind of frontend this master entry describes.
    pub const fn kind(&self) -> FrontendKind {
        FrontendKind::from_bits(self.flags & FRONTEND_KIND_MASK)
    }
}

/// Bits of `SvcValue::flags` that hold the `FrontendKind`.
pub const FRONTEND_KIND_MASK: u16 = 0x000f;

/// Master flag: the frontend's service port is gone; the entry stays (with
/// no selectable backend, so new flows are refused) only until the flows
/// of its draining backends end.
pub const SVC_F_DRAINING: u16 = 1 << 4;

/// Master flag: with no selectable backend, drop new flows silently instead
/// of rejecting them (kube-proxy's DROP for traffic that has endpoints but
/// none it may use).
pub const SVC_F_DROP_EMPTY: u16 = 1 << 5;

/// Master flag: new flows are also SNATed to the node's address on the way
/// to the backend (external traffic with externalTrafficPolicy Cluster, as
/// kube-proxy masquerades it), so replies come back through this node.
pub const SVC_F_SNAT: u16 = 1 << 6;

/// Master flag: only clients in `sl_srcrng4` under this frontend's `svc_id`
/// may open flows (`loadBalancerSourceRanges`); others are dropped.
pub const SVC_F_SOURCE_RANGES: u16 = 1 << 7;

/// Master flag: a client's new flows go to the backend its last flow used,
/// within `affinity_s` (sessionAffinity ClientIP), if it is still active.
pub const SVC_F_AFFINITY: u16 = 1 << 8;

/// Master flag: new flows take the backend of this frontend's Maglev table
/// (`sl_maglev4`/`sl_maglev6`) when it is selectable.
pub const SVC_F_MAGLEV: u16 = 1 << 9;

/// Master flag: sources inside the cluster (`sl_local4`/`sl_local6`, or
/// the node's own sockets) take this frontend's `SCOPE_INTERNAL` entries,
/// if they exist (externalTrafficPolicy Local short-circuit).
pub const SVC_F_INTERNAL: u16 = 1 << 10;

/// Master flag: new flows from sources outside the cluster (not in
/// `sl_local4`/`sl_local6`) are SNATed to the node (kube-proxy masquerades
/// off-cluster traffic to a cluster IP when local-traffic detection is
/// configured).
pub const SVC_F_MASQ_OUTSIDE: u16 = 1 << 11;

/// Master flag: the frontend's loadBalancerSourceRanges admit none of the
/// node's own addresses, so the node's own sockets may not connect (the
/// socket programs decide before the kernel picks a source address; the
/// TC path checks the real source in `sl_srcrng4`/`sl_srcrng6`). Release
/// 0.1.0's programs ignore it.
pub const SVC_F_NODE_DENIED: u16 = 1 << 12;

/// What kind of address a frontend is, for operators (`sluice lb list`).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrontendKind {
    ClusterIp = 0,
    NodePort = 1,
    LoadBalancer = 2,
    ExternalIp = 3,
}

impl FrontendKind {
    /// Decodes the low bits of `SvcValue::flags`; unknown values read as
    /// `ClusterIp`.
    pub const fn from_bits(bits: u16) -> Self {
        match bits {
            1 => Self::NodePort,
            2 => Self::LoadBalancer,
            3 => Self::ExternalIp,
            _ => Self::ClusterIp,
        }
    }
}

user_pod!(Svc4Key, Svc6Key, SvcValue);
