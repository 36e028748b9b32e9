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

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
};

use super::state::MapState;
use crate::model::{FrontendKey, ServicePortName};

#[derive(Debug, Default)]
pub struct Ids {
    by_name: HashMap<ServicePortName, SvcId>,
    by_id: HashMap<SvcId, ServicePortName>,
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
            .chain(programmed.backends.values().map(SvcId::of))
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
            by_name: HashMap::new(),
            by_id: HashMap::new(),
            next_svc: max_svc.next(),
            next_backend: max_backend.next(),
            freed,
            free: BinaryHeap::new(),
        }
    }

    pub fn get(&self, name: &ServicePortName) -> Option<SvcId> {
        self.by_name.get(name).copied()
    }

    /// The live service port that holds `id`, if any.
    pub fn owner(&self, id: SvcId) -> Option<&ServicePortName> {
        self.by_id.get(&id)
    }

    pub fn names(&self) -> impl Iterator<Item = &ServicePortName> {
        self.by_name.keys()
    }

    /// The id of a service port: the one it has, else the id one of its
    /// frontends carries in the maps and no other service port holds (after
    /// a restart), else a fresh one (`in_use` tells which ids the maps hold).
    pub fn service(
        &mut self,
        name: &ServicePortName,
        frontends: &[FrontendKey],
        programmed: &MapState,
        in_use: impl Fn(SvcId) -> bool,
    ) -> SvcId {
        if let Some(id) = self.get(name) {
            return id;
        }
        let adopted = frontends
            .iter()
            .filter_map(|f| programmed.frontends.get(f))
            .map(|f| f.svc_id)
            .find(|id| *id != SvcId::default() && !self.by_id.contains_key(id));
        let id = match adopted {
            Some(id) => id,
            None => loop {
                let id = self.next_svc;
                self.next_svc = self.next_svc.next();
                if !in_use(id) && !self.by_id.contains_key(&id) {
                    break id;
                }
            },
        };
        self.by_name.insert(name.clone(), id);
        self.by_id.insert(id, name.clone());
        id
    }

    /// Forgets a service port that is no longer desired; its id (if its
    /// entries remain) becomes a leftover to drain.
    pub fn release(&mut self, name: &ServicePortName) -> Option<SvcId> {
        let id = self.by_name.remove(name)?;
        self.by_id.remove(&id);
        Some(id)
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

    fn next(self) -> Self {
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
