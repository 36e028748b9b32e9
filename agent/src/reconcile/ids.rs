//! Service-port and backend ids.
//!
//! Ids are what conntrack entries record, so they must survive agent
//! restarts (adopted from the pinned maps) and must not be reused while an
//! entry may still name them. Service-port ids only move forward, skipping
//! ids still in the maps. Backend ids stay dense, so that the record of
//! the backends is a flat table (`backends.rs`): a freed id is reused,
//! lowest first, once a conntrack scan that began after it was freed has
//! completed (the scan deletes every conntrack, socket and affinity entry
//! of a backend that is gone, and nothing can name an id once its backend
//! is out of `sl_backends`). Ids missing from the maps at adoption wait
//! for the first scan the same way: the previous agent may have freed
//! them just before it stopped.

use std::{cmp::Reverse, collections::BinaryHeap};

use super::state::MapState;

#[derive(Debug, Default)]
pub struct Ids {
    next_svc: SvcId,
    next_backend: BackendId,
    /// Backend ids freed since the last conntrack scan began.
    freed: Vec<BackendId>,
    /// Backend ids a completed scan cleared, lowest first.
    free: BinaryHeap<Reverse<BackendId>>,
}

/// Below this many ids beyond twice the backends adopted, the gaps among
/// adopted ids are worth reusing (and cheap to list).
const GAP_SLACK: u32 = 4096;

impl Ids {
    /// Starts counting after every id in `programmed`.
    pub fn adopt(programmed: &MapState) -> Self {
        let max_svc = programmed
            .frontends
            .values()
            .map(|f| f.svc_id)
            .chain(programmed.backends.values().map(|b| SvcId::of(&b)))
            .max()
            .unwrap_or_default();
        let max_backend = programmed.backends.keys().max().unwrap_or_default();
        let dense =
            u64::from(max_backend.0) <= 2 * programmed.backends.len() as u64 + u64::from(GAP_SLACK);
        let freed = if dense {
            (1..max_backend.0)
                .map(BackendId)
                .filter(|id| !programmed.backends.contains_key(id))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            next_svc: max_svc.next(),
            next_backend: max_backend.next(),
            freed,
            free: BinaryHeap::new(),
        }
    }

    /// The next service-port id that `in_use` does not name (ids only
    /// move forward).
    pub fn next_service(&mut self, in_use: impl Fn(SvcId) -> bool) -> SvcId {
        loop {
            let id = self.next_svc;
            self.next_svc = self.next_svc.next();
            if !in_use(id) {
                return id;
            }
        }
    }

    /// A backend id that `in_use` says is free: the lowest one a scan
    /// cleared, else the next never used.
    pub fn backend(&mut self, in_use: impl Fn(BackendId) -> bool) -> BackendId {
        while let Some(Reverse(id)) = self.free.pop() {
            if !in_use(id) {
                return id;
            }
        }
        loop {
            let id = self.next_backend;
            self.next_backend = self.next_backend.next();
            if !in_use(id) {
                return id;
            }
        }
    }
}

impl Ids {
    /// A backend left `sl_backends`: its id waits for a scan.
    pub fn release_backend(&mut self, id: BackendId) {
        self.freed.push(id);
    }

    /// Ids handed out for a plan that was refused: never written, so
    /// nothing names them; free again at once.
    pub fn unclaim_backends(&mut self, ids: impl IntoIterator<Item = BackendId>) {
        self.free.extend(ids.into_iter().map(Reverse));
    }

    /// A conntrack scan begins: the ids it will clear (hand them back with
    /// `scan_done`).
    pub fn scan_begins(&mut self) -> Vec<BackendId> {
        std::mem::take(&mut self.freed)
    }

    /// The scan that began with `ids` completed (`cleared`: it deleted
    /// every stale entry it found) or not (they wait for the next one).
    pub fn scan_done(&mut self, ids: Vec<BackendId>, cleared: bool) {
        if cleared {
            self.free.extend(ids.into_iter().map(Reverse));
        } else {
            self.freed.extend(ids);
        }
    }
}

/// A service port's id (`SvcValue::svc_id`, `Backend::svc_id`, and what
/// conntrack entries record); 0 is no service port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SvcId(pub u32);

/// A backend's id (the key of `sl_backends`, `SvcValue::backend_id` of a
/// slot); 0 is no backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u32);

impl SvcId {
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The service port a backend entry belongs to.
    pub const fn of(backend: &sluice_common::Backend) -> Self {
        Self(backend.svc_id)
    }

    pub(super) fn next(self) -> Self {
        Self(self.0.wrapping_add(1).max(1))
    }
}

impl BackendId {
    pub const fn get(self) -> u32 {
        self.0
    }

    fn next(self) -> Self {
        Self(self.0.wrapping_add(1).max(1))
    }
}

impl std::fmt::Display for SvcId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for BackendId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
