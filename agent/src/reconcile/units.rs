//! The reconciler's record of each service-port id ("unit"), in one place.
//!
//! Per id: the live service port that holds it (none for a leftover whose
//! entries drain), the frontends that service port claimed in its last
//! reconcile, and the frontends and backends the maps hold under the id.
//! Six maps said this before (ids by name and by id, frontends claimed per
//! name, frontends and backends per id): one record per id and the index
//! by name hold it in about half their memory at 100,000 service ports
//! (docs/performance.md, issue 17). A record with nothing left goes.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::fast_hash::HashMap;

use super::{
    id_list::IdList,
    ids::{BackendId, Ids, SvcId},
    state::MapState,
};
use crate::{
    few::Few,
    model::{FrontendKey, ServicePortName},
};

#[derive(Debug, Default)]
struct Unit {
    /// The live service port holding the id.
    holder: Option<ServicePortName>,
    /// The frontends its holder claimed, in key order, when they are not
    /// exactly `frontends`; `None`: exactly those (so a unit in the
    /// steady state keeps its frontends once: 8 bytes here, where a list
    /// of its own took 24, 2 MB at 100,000 service ports). A unit without
    /// a holder claims nothing.
    #[allow(clippy::box_collection, reason = "one thin pointer: rarely set")]
    claimed: Option<Box<Vec<FrontendKey>>>,
    /// Frontends whose master entry carries the id, in key order.
    frontends: Option<Few<FrontendKey>>,
    /// Backends whose entry carries the id, in id order (a unit's
    /// backends are written as one batch; shared with a frontend's slots
    /// that are the same ids).
    backends: IdList,
}

impl Unit {
    fn is_empty(&self) -> bool {
        self.holder.is_none()
            && self.claimed.is_none()
            && self.frontends.is_none()
            && self.backends.is_empty()
    }

    fn frontends(&self) -> &[FrontendKey] {
        self.frontends.as_ref().map_or(&[], Few::as_slice)
    }

    /// The frontends its holder claims, in key order.
    fn claims(&self) -> &[FrontendKey] {
        match (&self.holder, &self.claimed) {
            (None, _) => &[],
            (Some(_), Some(own)) => own,
            (Some(_), None) => self.frontends(),
        }
    }

    /// Sets the claims (any order, repeats allowed), kept apart only if
    /// they differ from `frontends`.
    fn set_claims(&mut self, mut keys: Vec<FrontendKey>) {
        keys.sort_unstable();
        keys.dedup();
        self.claimed = (keys != self.frontends()).then(|| Box::new(keys));
    }

    /// Changes `frontends` without changing the claims.
    fn edit_frontends(&mut self, change: impl FnOnce(&mut Option<Few<FrontendKey>>)) {
        let claims =
            (self.holder.is_some() && self.claimed.is_none()).then(|| self.frontends().to_vec());
        change(&mut self.frontends);
        if let Some(claims) = claims {
            self.set_claims(claims);
        } else if self
            .claimed
            .as_deref()
            .is_some_and(|own| own.as_slice() == self.frontends())
        {
            self.claimed = None;
        }
    }
}

/// Every unit the reconciler knows, by id, and the live ones by name.
#[derive(Default)]
pub struct Units {
    by_id: HashMap<SvcId, Unit>,
    /// The ids of live service ports, found by their holder's name (the
    /// record holds the name: 4 bytes an entry, where a map keyed by the
    /// name held 16, 1.6 MB more at 100,000 service ports).
    by_name: HashTable<SvcId>,
    hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for Units {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Units")
            .field("by_id", &self.by_id)
            .finish_non_exhaustive()
    }
}

/// The name holding `id` in `by_id`, if any.
fn holder_of<'a>(by_id: &'a HashMap<SvcId, Unit>, id: &SvcId) -> Option<&'a ServicePortName> {
    by_id.get(id).and_then(|u| u.holder.as_ref())
}

/// The hash `by_name` files `id` under: its holder's name's (what the
/// index's growth needs to move an entry).
fn hash_of(by_id: &HashMap<SvcId, Unit>, hasher: &foldhash::fast::RandomState, id: &SvcId) -> u64 {
    holder_of(by_id, id).map_or(0, |n| hasher.hash_one(n))
}

impl Units {
    fn hash(&self, name: &ServicePortName) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The id a live service port holds.
    pub fn get(&self, name: &ServicePortName) -> Option<SvcId> {
        self.by_name
            .find(self.hash(name), |id| {
                holder_of(&self.by_id, id) == Some(name)
            })
            .copied()
    }

    /// The live service port that holds `id`, if any.
    pub fn holder(&self, id: SvcId) -> Option<&ServicePortName> {
        self.by_id.get(&id).and_then(|u| u.holder.as_ref())
    }

    /// Every live service port.
    pub fn names(&self) -> impl Iterator<Item = &ServicePortName> {
        self.by_name
            .iter()
            .filter_map(|id| holder_of(&self.by_id, id))
    }

    /// Every id the maps hold a frontend or a backend under.
    pub fn with_entries(&self) -> impl Iterator<Item = SvcId> + '_ {
        self.by_id
            .iter()
            .filter(|(_, u)| u.frontends.is_some() || !u.backends.is_empty())
            .map(|(id, _)| *id)
    }

    /// The id of a service port: the one it has, else the id one of its
    /// frontends carries in the maps and no other service port holds (after
    /// a restart), else a fresh one from `ids` that no record uses.
    pub fn service(
        &mut self,
        name: &ServicePortName,
        frontends: &[FrontendKey],
        programmed: &MapState,
        ids: &mut Ids,
    ) -> SvcId {
        if let Some(id) = self.get(name) {
            return id;
        }
        let adopted = frontends
            .iter()
            .filter_map(|f| programmed.frontends.get(f))
            .map(|f| f.svc_id)
            .find(|id| *id != SvcId::default() && self.holder(*id).is_none());
        let id = adopted.unwrap_or_else(|| ids.next_service(|id| self.by_id.contains_key(&id)));
        let unit = self.by_id.entry(id).or_default();
        unit.holder = Some(name.clone());
        // It claims nothing yet (not the frontends an adopted id holds).
        unit.set_claims(Vec::new());
        let (by_id, hasher) = (&self.by_id, &self.hasher);
        self.by_name
            .insert_unique(hasher.hash_one(name), id, |id| hash_of(by_id, hasher, id));
        id
    }

    /// Forgets a service port that is no longer desired; its id (if its
    /// entries remain) becomes a leftover to drain.
    pub fn release(&mut self, name: &ServicePortName) -> Option<SvcId> {
        let hash = self.hash(name);
        let by_id = &self.by_id;
        let (id, _) = self
            .by_name
            .find_entry(hash, |id| holder_of(by_id, id) == Some(name))
            .ok()?
            .remove();
        self.edit(id, |u| {
            u.holder = None;
            u.claimed = None;
        });
        Some(id)
    }

    /// Records the frontends the holder of `id` claims.
    pub fn set_claimed(&mut self, id: SvcId, frontends: Vec<FrontendKey>) {
        self.edit(id, |u| {
            if u.holder.is_some() {
                u.set_claims(frontends);
            }
        });
    }

    /// Whether the unit `id` claims frontend `key`.
    pub fn claims(&self, id: SvcId, key: &FrontendKey) -> bool {
        self.by_id
            .get(&id)
            .is_some_and(|u| u.claims().binary_search(key).is_ok())
    }

    /// Every live service port and the frontends it claims (tests).
    #[cfg(test)]
    pub fn all_claims(&self) -> impl Iterator<Item = (&ServicePortName, &[FrontendKey])> {
        self.by_id
            .values()
            .filter_map(|u| Some((u.holder.as_ref()?, u.claims())))
    }

    /// Takes back the frontends a live service port claimed.
    pub fn take_claimed(&mut self, name: &ServicePortName) -> Vec<FrontendKey> {
        let Some(id) = self.get(name) else {
            return Vec::new();
        };
        let mut claimed = Vec::new();
        self.edit(id, |u| {
            claimed = u.claims().to_vec();
            u.set_claims(Vec::new());
        });
        claimed
    }

    /// The frontends the maps hold under `id`, in key order.
    pub fn frontends(&self, id: SvcId) -> &[FrontendKey] {
        self.by_id.get(&id).map_or(&[], Unit::frontends)
    }

    pub fn add_frontend(&mut self, id: SvcId, key: FrontendKey) {
        self.by_id
            .entry(id)
            .or_default()
            .edit_frontends(|frontends| match frontends {
                Some(few) => few.insert_sorted(&key),
                none => *none = Some(Few::One(key)),
            });
    }

    pub fn remove_frontend(&mut self, id: SvcId, key: &FrontendKey) {
        self.edit(id, |u| {
            u.edit_frontends(|frontends| {
                if frontends.as_mut().is_some_and(|f| f.remove_sorted(key)) {
                    *frontends = None;
                }
            });
        });
    }

    /// The backends the maps hold under `id`, in id order.
    pub fn backends(&self, id: SvcId) -> &[BackendId] {
        self.by_id.get(&id).map_or(&[], |u| &u.backends)
    }

    /// Makes `slots` hold the unit's list of backends when they are the
    /// same ids (see `IdList`).
    pub fn share_backends(&self, id: SvcId, slots: &mut IdList) {
        if let Some(unit) = self.by_id.get(&id) {
            slots.share(&unit.backends);
        }
    }

    /// Adds backends, each under the unit its pair names (sorted into
    /// one batch per unit).
    pub fn index_backends(&mut self, mut held: Vec<(SvcId, BackendId)>) {
        held.sort_unstable();
        for unit in held.chunk_by(|a, b| a.0 == b.0) {
            self.add_backends(unit[0].0, unit.iter().map(|(_, b)| *b));
        }
    }

    /// Adds backends held under `id` (those already there are kept once).
    pub fn add_backends(&mut self, id: SvcId, added: impl IntoIterator<Item = BackendId>) {
        let unit = self.by_id.entry(id).or_default();
        let mut all: Vec<BackendId> = unit.backends.iter().copied().chain(added).collect();
        all.sort_unstable();
        all.dedup();
        if all.len() != unit.backends.len() {
            unit.backends = IdList::from(all);
        }
    }

    pub fn remove_backend(&mut self, id: SvcId, backend: BackendId) {
        self.edit(id, |u| {
            if let Ok(at) = u.backends.binary_search(&backend) {
                let mut rest = u.backends.to_vec();
                rest.remove(at);
                u.backends = IdList::from(rest);
            }
        });
    }

    /// Room for about `units` records without rehashing.
    pub fn reserve(&mut self, units: usize) {
        self.by_id.reserve(units.saturating_sub(self.by_id.len()));
        let (by_id, hasher) = (&self.by_id, &self.hasher);
        self.by_name
            .reserve(units.saturating_sub(self.by_name.len()), |id| {
                hash_of(by_id, hasher, id)
            });
    }

    /// Changes the record of `id` (if any) and drops it when nothing is left.
    fn edit(&mut self, id: SvcId, change: impl FnOnce(&mut Unit)) {
        if let Some(unit) = self.by_id.get_mut(&id) {
            change(unit);
            if unit.is_empty() {
                self.by_id.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_units_entry_takes_56_bytes() {
        // The id, the holder's name, the claims and the backends behind
        // thin pointers, the frontends in place (docs/performance.md).
        assert_eq!(std::mem::size_of::<(SvcId, Unit)>(), 56);
    }
    use crate::model::Proto;

    fn name(n: &str) -> ServicePortName {
        ServicePortName::new("default", n, "http", Proto::Tcp)
    }

    fn fe(last: u8) -> FrontendKey {
        FrontendKey::new([10, 96, 0, last].into(), 80, Proto::Tcp)
    }

    #[test]
    fn a_record_lives_while_anything_holds_it() {
        let mut units = Units::default();
        let mut ids = Ids::default();
        let web = name("web");
        let id = units.service(&web, &[fe(1)], &MapState::default(), &mut ids);
        assert_eq!(
            units.service(&web, &[fe(1)], &MapState::default(), &mut ids),
            id
        );
        units.set_claimed(id, vec![fe(1)]);
        units.add_frontend(id, fe(1));
        units.add_backends(id, [BackendId(7), BackendId(3)]);
        units.add_backends(id, [BackendId(3), BackendId(5)]);
        assert_eq!(
            units.backends(id),
            &[BackendId(3), BackendId(5), BackendId(7)]
        );
        assert_eq!(units.holder(id), Some(&web));
        assert_eq!(units.take_claimed(&web), vec![fe(1)]);
        assert!(units.take_claimed(&web).is_empty(), "taken once");

        // Released, the id stays a leftover while the maps hold its entries.
        assert_eq!(units.release(&web), Some(id));
        assert_eq!(units.holder(id), None);
        assert_eq!(units.get(&web), None);
        assert_eq!(units.with_entries().collect::<Vec<_>>(), vec![id]);
        units.remove_frontend(id, &fe(1));
        assert!(units.frontends(id).is_empty());
        assert_eq!(units.with_entries().collect::<Vec<_>>(), vec![id]);
        for b in [3, 7] {
            units.remove_backend(id, BackendId(b));
        }
        assert_eq!(units.backends(id), &[BackendId(5)], "the backends hold it");
        units.remove_backend(id, BackendId(5));
        assert_eq!(units.with_entries().count(), 0);
        assert!(units.by_id.is_empty(), "nothing left: the record goes");
    }

    #[test]
    fn a_fresh_id_is_one_no_record_uses_and_an_adopted_one_is_kept() {
        let mut units = Units::default();
        let mut ids = Ids::default();
        // A leftover holds entries under the id the counter would give next.
        let next = ids.next_service(|_| false);
        units.add_backends(next.next(), [BackendId(1)]);
        let a = units.service(&name("a"), &[], &MapState::default(), &mut ids);
        assert_ne!(a, next.next(), "an id with entries is not handed out");

        // After a restart, a frontend's master entry names its unit's id.
        let mut programmed = MapState::default();
        programmed.frontends.insert(
            fe(2),
            super::super::FrontendState {
                svc_id: SvcId(42),
                ..Default::default()
            },
        );
        let b = units.service(&name("b"), &[fe(2)], &programmed, &mut ids);
        assert_eq!(b, SvcId(42));
        // Held now: another service port claiming that frontend gets its own.
        let c = units.service(&name("c"), &[fe(2)], &programmed, &mut ids);
        assert_ne!(c, SvcId(42));
    }

    #[test]
    fn live_names_are_found_through_their_records_as_the_index_grows() {
        let mut units = Units::default();
        let mut ids = Ids::default();
        let none = MapState::default();
        let all: Vec<(ServicePortName, SvcId)> = (0..2000)
            .map(|i| {
                let n = name(&format!("svc-{i}"));
                let id = units.service(&n, &[], &none, &mut ids);
                (n, id)
            })
            .collect();
        for (n, _) in all.iter().step_by(2) {
            assert!(units.release(n).is_some());
            assert!(units.release(n).is_none(), "released once");
        }
        for (i, (n, id)) in all.iter().enumerate() {
            let want = (i % 2 == 1).then_some(*id);
            assert_eq!(units.get(n), want, "{n:?}");
        }
        let mut live: Vec<&ServicePortName> = units.names().collect();
        live.sort();
        let mut want: Vec<&ServicePortName> =
            all.iter().skip(1).step_by(2).map(|(n, _)| n).collect();
        want.sort();
        assert_eq!(live, want);
        // A released name comes back with an id of its own.
        let back = units.service(&all[0].0, &[], &none, &mut ids);
        assert_eq!(units.get(&all[0].0), Some(back));
        assert_eq!(units.holder(back), Some(&all[0].0));
    }

    #[test]
    fn claims_are_kept_once_while_they_equal_the_frontends_and_apart_otherwise() {
        let mut units = Units::default();
        let mut ids = Ids::default();
        let mut programmed = MapState::default();
        programmed.frontends.insert(
            fe(1),
            super::super::FrontendState {
                svc_id: SvcId(5),
                ..Default::default()
            },
        );
        // Adopted after a restart: the maps hold fe(1) under the id, and
        // its new holder claims nothing until it says so.
        units.add_frontend(SvcId(5), fe(1));
        let id = units.service(&name("web"), &[fe(1)], &programmed, &mut ids);
        assert_eq!(id, SvcId(5));
        assert!(!units.claims(id, &fe(1)));
        units.set_claimed(id, vec![fe(2), fe(1), fe(2)]);
        assert!(units.claims(id, &fe(1)) && units.claims(id, &fe(2)));
        units.add_frontend(id, fe(2));
        assert!(units.by_id[&id].claimed.is_none(), "equal: kept once");
        // The frontends change under the claims; the claims do not.
        units.add_frontend(id, fe(3));
        units.remove_frontend(id, &fe(1));
        assert_eq!(units.frontends(id), &[fe(2), fe(3)]);
        let claims: Vec<_> = (1..=3).filter(|i| units.claims(id, &fe(*i))).collect();
        assert_eq!(claims, [1, 2]);
        units.set_claimed(id, vec![fe(3), fe(2)]);
        assert!(units.by_id[&id].claimed.is_none(), "equal again");
        assert_eq!(units.take_claimed(&name("web")), vec![fe(2), fe(3)]);
        assert!(!units.claims(id, &fe(2)), "taken: claims nothing");
        assert_eq!(units.frontends(id), &[fe(2), fe(3)]);
        // Released: no claims, only the entries that drain.
        units.set_claimed(id, vec![fe(2)]);
        assert_eq!(units.release(&name("web")), Some(id));
        assert!(!units.claims(id, &fe(2)));
        units.remove_frontend(id, &fe(2));
        units.remove_frontend(id, &fe(3));
        assert!(units.by_id.is_empty());
    }

    #[test]
    fn frontends_stay_in_key_order() {
        let mut units = Units::default();
        let id = SvcId(9);
        units.add_frontend(id, fe(3));
        units.add_frontend(id, fe(1));
        units.add_frontend(id, fe(3));
        assert_eq!(units.frontends(id), &[fe(1), fe(3)]);
        units.remove_frontend(id, &fe(2));
        units.remove_frontend(id, &fe(3));
        assert_eq!(units.frontends(id), &[fe(1)]);
        units.remove_frontend(id, &fe(1));
        assert!(units.frontends(id).is_empty());
        assert!(units.by_id.is_empty());
    }
}
