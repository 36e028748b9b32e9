//! The sync task's stores of trimmed objects, and the problems of the
//! objects it could not use.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    sources::{Change, Converted, Kind, Update},
    translate::{NodeInfo, ObjectKey, Problem, ServiceInfo, SliceInfo},
};

#[derive(Debug, Default)]
pub struct Stores {
    pub services: BTreeMap<ObjectKey, ServiceInfo>,
    pub slices: BTreeMap<ObjectKey, SliceInfo>,
    /// Node objects by name; translation uses the one named like this node.
    pub nodes: BTreeMap<ObjectKey, NodeInfo>,
    /// Objects that could not be used at all, by kind and key.
    pub rejected: BTreeMap<(Kind, ObjectKey), Problem>,
    /// Kinds whose complete set has arrived at least once.
    pub synced: BTreeSet<Kind>,
}

fn apply_one<T: PartialEq>(
    kind: Kind,
    store: &mut BTreeMap<ObjectKey, T>,
    rejected: &mut BTreeMap<(Kind, ObjectKey), Problem>,
    item: Converted<T>,
) -> bool {
    let Converted { key, value } = item;
    let rejected_changed = match &value {
        Err(problem) => {
            rejected
                .insert((kind, key.clone()), problem.clone())
                .as_ref()
                != Some(problem)
        }
        Ok(_) => rejected.remove(&(kind, key.clone())).is_some(),
    };
    let store_changed = match value {
        Ok(Some(v)) => {
            if store.get(&key) == Some(&v) {
                false
            } else {
                store.insert(key, v);
                true
            }
        }
        Ok(None) | Err(_) => store.remove(&key).is_some(),
    };
    store_changed || rejected_changed
}

fn apply_change<T: PartialEq>(
    kind: Kind,
    store: &mut BTreeMap<ObjectKey, T>,
    rejected: &mut BTreeMap<(Kind, ObjectKey), Problem>,
    change: Change<T>,
) -> bool {
    match change {
        Change::Apply(item) => apply_one(kind, store, rejected, item),
        Change::Delete(key) => {
            let a = store.remove(&key).is_some();
            let b = rejected.remove(&(kind, key)).is_some();
            a || b
        }
        Change::Reset(items) => {
            let mut fresh = BTreeMap::new();
            let mut fresh_rejected: BTreeMap<(Kind, ObjectKey), Problem> = rejected
                .iter()
                .filter(|((k, _), _)| *k != kind)
                .map(|(k, p)| (k.clone(), p.clone()))
                .collect();
            for item in items {
                apply_one(kind, &mut fresh, &mut fresh_rejected, item);
            }
            let changed = fresh != *store || fresh_rejected != *rejected;
            *store = fresh;
            *rejected = fresh_rejected;
            changed
        }
    }
}

impl Stores {
    /// Applies one update; returns whether anything translation reads
    /// changed (a replayed or duplicated event changes nothing).
    pub fn apply(&mut self, update: Update) -> bool {
        let kind = update.kind();
        let first_sync = update.is_reset() && self.synced.insert(kind);
        let changed = match update {
            Update::Services(c) => apply_change(kind, &mut self.services, &mut self.rejected, c),
            Update::Slices(c) => apply_change(kind, &mut self.slices, &mut self.rejected, c),
            Update::Node(c) => apply_change(kind, &mut self.nodes, &mut self.rejected, c),
        };
        changed || first_sync
    }

    /// Every kind has delivered its complete set once.
    pub fn all_synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.synced.contains(k))
    }

    /// This node's Node object, if known.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.values().find(|n| n.name == name)
    }
}
