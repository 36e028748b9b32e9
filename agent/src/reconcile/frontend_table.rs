//! The programmed frontends by key, IPv4 keys packed.
//!
//! A `FrontendKey` takes 22 bytes (an `IpAddr` is 17); an IPv4 frontend's
//! address, port, protocol and scope fit in 8. The table keeps IPv4
//! frontends under packed keys and IPv6 ones as they are: at 100,000
//! frontends an entry takes 40 bytes instead of 72 (with the state's
//! Maglev members and slots behind thin pointers; 4 MB;
//! docs/performance.md, issue 17). Lookups and iteration speak
//! `FrontendKey` as before.

use std::net::{IpAddr, Ipv4Addr};

use super::state::FrontendState;
use crate::{
    fast_hash::HashMap,
    model::{FrontendKey, Proto, Scope},
};

/// An IPv4 frontend's key in 8 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key4 {
    addr: [u8; 4],
    port: u16,
    proto: Proto,
    scope: Scope,
}

impl std::fmt::Debug for Key4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.key())
    }
}

impl Key4 {
    fn of(key: &FrontendKey) -> Option<Self> {
        match key.addr {
            IpAddr::V4(a) => Some(Self {
                addr: a.octets(),
                port: key.port,
                proto: key.proto,
                scope: key.scope,
            }),
            IpAddr::V6(_) => None,
        }
    }

    fn key(self) -> FrontendKey {
        FrontendKey {
            addr: IpAddr::V4(Ipv4Addr::from(self.addr)),
            port: self.port,
            proto: self.proto,
            scope: self.scope,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendTable {
    v4: HashMap<Key4, FrontendState>,
    v6: HashMap<FrontendKey, FrontendState>,
}

impl FrontendTable {
    pub fn get(&self, key: &FrontendKey) -> Option<&FrontendState> {
        match Key4::of(key) {
            Some(k) => self.v4.get(&k),
            None => self.v6.get(key),
        }
    }

    pub fn get_mut(&mut self, key: &FrontendKey) -> Option<&mut FrontendState> {
        match Key4::of(key) {
            Some(k) => self.v4.get_mut(&k),
            None => self.v6.get_mut(key),
        }
    }

    /// The state of `key`, a default one added if it has none.
    pub fn get_or_default(&mut self, key: FrontendKey) -> &mut FrontendState {
        match Key4::of(&key) {
            Some(k) => self.v4.entry(k).or_default(),
            None => self.v6.entry(key).or_default(),
        }
    }

    pub fn contains_key(&self, key: &FrontendKey) -> bool {
        self.get(key).is_some()
    }

    pub fn insert(&mut self, key: FrontendKey, state: FrontendState) -> Option<FrontendState> {
        match Key4::of(&key) {
            Some(k) => self.v4.insert(k, state),
            None => self.v6.insert(key, state),
        }
    }

    pub fn remove(&mut self, key: &FrontendKey) -> Option<FrontendState> {
        match Key4::of(key) {
            Some(k) => self.v4.remove(&k),
            None => self.v6.remove(key),
        }
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Every frontend and its state, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (FrontendKey, &FrontendState)> {
        let v4 = self.v4.iter().map(|(k, s)| (k.key(), s));
        v4.chain(self.v6.iter().map(|(k, s)| (*k, s)))
    }

    pub fn keys(&self) -> impl Iterator<Item = FrontendKey> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &FrontendState> {
        self.v4.values().chain(self.v6.values())
    }

    /// Keeps the frontends `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&FrontendKey, &mut FrontendState) -> bool) {
        self.v4.retain(|k, s| keep(&k.key(), s));
        self.v6.retain(|k, s| keep(k, s));
    }

    /// Room for `total` frontends of unknown families without rehashing:
    /// what it lacks goes to the family that holds the most, IPv4 if
    /// neither holds any.
    pub fn reserve(&mut self, total: usize) {
        let more = total.saturating_sub(self.len());
        if self.v6.len() > self.v4.len() {
            self.v6.reserve(more);
        } else {
            self.v4.reserve(more);
        }
    }

    /// Room for `v4` IPv4 and `v6` IPv6 frontends in all.
    pub fn reserve_each(&mut self, v4: usize, v6: usize) {
        self.v4.reserve(v4.saturating_sub(self.v4.len()));
        self.v6.reserve(v6.saturating_sub(self.v6.len()));
    }
}

impl std::ops::Index<&FrontendKey> for FrontendTable {
    type Output = FrontendState;

    /// Panics if `key` is not in the table, as a map's index does (tests).
    #[allow(
        clippy::expect_used,
        reason = "indexing panics on a missing key, as a map's"
    )]
    fn index(&self, key: &FrontendKey) -> &FrontendState {
        self.get(key).expect("no such frontend")
    }
}

impl IntoIterator for FrontendTable {
    type Item = (FrontendKey, FrontendState);
    type IntoIter = Box<dyn Iterator<Item = (FrontendKey, FrontendState)>>;

    fn into_iter(self) -> Self::IntoIter {
        let v4 = self.v4.into_iter().map(|(k, s)| (k.key(), s));
        Box::new(v4.chain(self.v6))
    }
}

impl<'a> IntoIterator for &'a FrontendTable {
    type Item = (FrontendKey, &'a FrontendState);
    type IntoIter = Box<dyn Iterator<Item = (FrontendKey, &'a FrontendState)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl FromIterator<(FrontendKey, FrontendState)> for FrontendTable {
    fn from_iter<I: IntoIterator<Item = (FrontendKey, FrontendState)>>(items: I) -> Self {
        let mut table = Self::default();
        for (key, state) in items {
            table.insert(key, state);
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::ids::SvcId;

    fn state(id: u32) -> FrontendState {
        FrontendState {
            svc_id: SvcId(id),
            ..FrontendState::default()
        }
    }

    #[test]
    fn keys_of_both_families_come_back_as_they_went_in() {
        // An IPv4 entry: 8 bytes of key, 32 of state (docs/performance.md).
        assert_eq!(std::mem::size_of::<(Key4, FrontendState)>(), 40);
        let v4 = FrontendKey::new("10.96.0.10".parse().unwrap(), 80, Proto::Udp);
        let v4_internal = v4.in_scope(Scope::Internal);
        let v6 = FrontendKey::new("fd00::10".parse().unwrap(), 443, Proto::Sctp);
        let mut table: FrontendTable = [(v4, state(1)), (v4_internal, state(2)), (v6, state(3))]
            .into_iter()
            .collect();
        assert_eq!(table.len(), 3);
        assert_eq!(table[&v4].svc_id, SvcId(1));
        assert_eq!(table.get(&v4_internal).map(|s| s.svc_id), Some(SvcId(2)));
        assert_eq!(table.get(&v6).map(|s| s.svc_id), Some(SvcId(3)));
        let mut keys: Vec<FrontendKey> = table.keys().collect();
        keys.sort();
        let mut want = vec![v4, v4_internal, v6];
        want.sort();
        assert_eq!(keys, want);
        table.get_or_default(v6).active = 7;
        assert_eq!(table[&v6].active, 7);
        assert_eq!(table.remove(&v4).map(|s| s.svc_id), Some(SvcId(1)));
        assert!(!table.contains_key(&v4));
        let mut all: Vec<(FrontendKey, u32)> = table
            .into_iter()
            .map(|(k, s)| (k, s.svc_id.get()))
            .collect();
        all.sort();
        assert_eq!(all, vec![(v4_internal, 2), (v6, 3)]);
    }

    #[test]
    fn room_goes_to_the_family_that_needs_it() {
        let mut table = FrontendTable::default();
        table.reserve(1000);
        assert!(table.v4.capacity() >= 1000, "IPv4 when nothing is held");
        let v6 = FrontendKey::new("fd00::10".parse().unwrap(), 443, Proto::Tcp);
        let mut table: FrontendTable = [(v6, state(1))].into_iter().collect();
        table.reserve(1000);
        assert!(table.v6.capacity() >= 1000 && table.v4.capacity() < 1000);
        table.reserve_each(2000, 0);
        assert!(table.v4.capacity() >= 2000);
    }
}
