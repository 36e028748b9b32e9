//! Service-port and backend ids.
//!
//! Ids are what conntrack entries record, so they must survive agent
//! restarts (adopted from the pinned maps) and must not be reused while an
//! entry may still name them: both counters only move forward.

use std::collections::{HashMap, HashSet};

use crate::{
    model::{Frontend, ServicePortName},
    state::MapState,
};

#[derive(Debug, Default)]
pub struct Ids {
    by_name: HashMap<ServicePortName, u32>,
    next_svc: u32,
    next_backend: u32,
}

impl Ids {
    /// Starts counting after every id in `programmed`.
    pub fn adopt(programmed: &MapState) -> Self {
        let max_svc = programmed
            .frontends
            .values()
            .map(|f| f.svc_id)
            .chain(programmed.backends.values().map(|b| b.svc_id))
            .max()
            .unwrap_or(0);
        let max_backend = programmed.backends.keys().copied().max().unwrap_or(0);
        Self {
            by_name: HashMap::new(),
            next_svc: max_svc.wrapping_add(1).max(1),
            next_backend: max_backend.wrapping_add(1).max(1),
        }
    }

    /// The id of a service port: the one it had, else the id its frontends
    /// carry in the maps (after a restart), else a new one. `claimed` holds
    /// ids already given to other service ports in this pass.
    pub fn service(
        &mut self,
        name: &ServicePortName,
        frontends: &[Frontend],
        programmed: &MapState,
        claimed: &HashSet<u32>,
    ) -> u32 {
        if let Some(&id) = self.by_name.get(name) {
            if !claimed.contains(&id) {
                return id;
            }
        }
        let adopted = frontends
            .iter()
            .filter_map(|f| programmed.frontends.get(&f.key))
            .map(|f| f.svc_id)
            .find(|id| *id != 0 && !claimed.contains(id));
        let id = match adopted {
            Some(id) => id,
            None => self.fresh_service(programmed, claimed),
        };
        self.by_name.insert(name.clone(), id);
        id
    }

    fn fresh_service(&mut self, programmed: &MapState, claimed: &HashSet<u32>) -> u32 {
        loop {
            let id = self.next_svc;
            self.next_svc = self.next_svc.wrapping_add(1).max(1);
            let in_use = claimed.contains(&id)
                || programmed.frontends.values().any(|f| f.svc_id == id)
                || programmed.backends.values().any(|b| b.svc_id == id);
            if !in_use {
                return id;
            }
        }
    }

    /// A backend id not present in `programmed` nor handed out before.
    pub fn backend(&mut self, programmed: &MapState, taken: &HashSet<u32>) -> u32 {
        loop {
            let id = self.next_backend;
            self.next_backend = self.next_backend.wrapping_add(1).max(1);
            if !programmed.backends.contains_key(&id) && !taken.contains(&id) {
                return id;
            }
        }
    }

    /// Forgets service ports that are no longer desired.
    pub fn retain(&mut self, keep: impl Fn(&ServicePortName) -> bool) {
        self.by_name.retain(|name, _| keep(name));
    }
}
