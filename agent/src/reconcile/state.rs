//! The content of the service and backend maps in compact form. The
//! reconciler keeps one `MapState` for what is programmed (read back from
//! the pinned maps at start-up, then updated write by write) and computes
//! another for what should be; the difference is what gets written.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use sluice_common::{service::FRONTEND_KIND_MASK, FrontendKind, SvcnetSummary4};

use super::{
    backends::BackendTable,
    frontend_table::FrontendTable,
    id_list::IdList,
    ids::{BackendId, SvcId},
};
use crate::{fast_hash::HashMap, model::Endpoint};

/// One frontend: its master entry and its slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendState {
    /// Owner service port; `SvcId(0)` means the master entry is missing or its state
    /// is unknown (forces a full rewrite).
    pub svc_id: SvcId,
    /// `SvcValue::flags` of the master entry.
    pub flags: u16,
    pub active: u16,
    pub fallback: u16,
    /// Session affinity timeout (seconds) of the master entry.
    pub affinity_s: u32,
    /// Backend id of slot `i + 1`; `BackendId(0)` for a missing slot
    /// entry (shared with the unit's backends when they are the same ids).
    pub slots: IdList,
    /// The backends its Maglev table spreads over (sorted by endpoint);
    /// empty: no table.
    pub maglev: MaglevMembers,
    /// It has an entry in `sl_sockfe4`/`sl_sockfe6`, the one `picks::entry`
    /// gives for this record (in a target: it should have one,
    /// `picks::qualifies`).
    pub sock_picks: bool,
}

/// The backends a frontend's Maglev table spreads over; most frontends
/// have no table (a thin pointer: 1 MB at 100,000 frontends).
pub type MaglevMembers = crate::few::Rare<(BackendId, Endpoint)>;

impl FrontendState {
    pub fn kind(&self) -> FrontendKind {
        FrontendKind::from_bits(self.flags & FRONTEND_KIND_MASK)
    }

    /// Records slot `i` as naming `id`, growing the record to reach it
    /// (the maps list a frontend's slots in no order: a reallocation per
    /// higher slot, when reading them back).
    pub fn set_slot(&mut self, i: usize, id: BackendId) {
        if self.slots.len() <= i {
            self.resize_slots(i + 1);
        }
        self.slots.update(|slots| slots[i] = id);
    }

    /// Resizes the slots to `len` (new ones missing: `BackendId(0)`). The
    /// record holds exactly as many as are programmed (a `Vec` would keep
    /// spare room: 100,000 frontends).
    pub fn resize_slots(&mut self, len: usize) {
        self.slots.resize(len);
    }
}

/// A loadBalancerSourceRanges entry: network and prefix length (IPv4
/// ranges live in `sl_srcrng4`, IPv6 ones in `sl_srcrng6`).
pub type SourceRange = (IpAddr, u8);

/// `sl_svc4`, `sl_svc6`, `sl_backends`, `sl_srcrng4`, `sl_srcrng6`,
/// `sl_local4`, `sl_local6`, `sl_localif`, `sl_svcnet4` and `sl_svcnet6`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapState {
    pub frontends: FrontendTable,
    pub backends: BackendTable,
    /// Source ranges per service-port id.
    pub source_ranges: HashMap<SvcId, BTreeSet<SourceRange>>,
    /// The cluster's own sources (`sl_local4`, `sl_local6`).
    pub local_sources: BTreeSet<SourceRange>,
    /// The pods' devices (`sl_localif`), by ifindex.
    pub local_ifaces: BTreeSet<u32>,
    /// The service address space (`sl_svcnet4`, `sl_svcnet6`): service
    /// CIDRs and cluster IPs (host routes), each with its `SVCNET_*` kind.
    pub service_nets: BTreeMap<SourceRange, u8>,
    /// `sl_svcnetsum4`: prefixes covering the IPv4 `service_nets`.
    pub svcnet_summary_v4: SvcnetSummary4,
}

impl MapState {
    /// Entries this state occupies in the service maps (masters + slots).
    pub fn service_entries(&self) -> usize {
        self.frontends.values().map(|f| 1 + f.slots.len()).sum()
    }
}
