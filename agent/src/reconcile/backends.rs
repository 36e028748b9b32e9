//! The programmed backends by id, as a flat table.
//!
//! Backend ids are dense (`ids.rs` hands out the lowest free one), so the
//! record of `sl_backends` is a `Vec` indexed by id: 24 bytes a backend,
//! where a hash map of a million entries held 61 MB (2^21 buckets of 28
//! bytes and a control byte). Ids far above the table (adopted from maps
//! an agent with other habits wrote) go to a small hash map beside it, so
//! no id can make the table huge.

use std::collections::HashMap;

use sluice_common::Backend;

use super::ids::BackendId;

/// Slots an id may add to the table beyond twice the backends it holds
/// (a fresh node's first ids, and room for churn).
const SLACK: usize = 4096;

/// Read access to backends by id: the table, or a plain map (tests,
/// inspection).
pub trait BackendLookup {
    fn backend(&self, id: BackendId) -> Option<&Backend>;
}

impl BackendLookup for HashMap<BackendId, Backend> {
    fn backend(&self, id: BackendId) -> Option<&Backend> {
        self.get(&id)
    }
}

/// `sl_backends` as programmed: id -> backend.
#[derive(Clone, Default)]
pub struct BackendTable {
    /// Index = id; a slot whose `family` is 0 is empty (every backend the
    /// agent writes has a family; one read back without goes to `sparse`).
    dense: Vec<Backend>,
    sparse: HashMap<BackendId, Backend>,
    len: usize,
}

impl BackendTable {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, id: &BackendId) -> Option<&Backend> {
        match self.dense.get(id.0 as usize) {
            Some(b) if b.family != 0 => Some(b),
            _ => self.sparse.get(id),
        }
    }

    pub fn contains_key(&self, id: &BackendId) -> bool {
        self.get(id).is_some()
    }

    /// Whether `id` belongs in the flat part (growing it if need be).
    fn dense_slot(&self, id: BackendId, b: &Backend) -> bool {
        let i = id.0 as usize;
        b.family != 0 && (i < self.dense.len() || i <= 2 * self.len + SLACK)
    }

    pub fn insert(&mut self, id: BackendId, b: Backend) -> Option<Backend> {
        let old = self.remove(&id);
        if self.dense_slot(id, &b) {
            let i = id.0 as usize;
            if i >= self.dense.len() {
                // Grown by a sixteenth, not doubled: at a million backends
                // one id past the end would otherwise add 24 MB.
                if i >= self.dense.capacity() {
                    self.dense
                        .reserve_exact(i + 1 + (i >> 4) - self.dense.len());
                }
                self.dense.resize(i + 1, Backend::default());
            }
            self.dense[i] = b;
        } else {
            self.sparse.insert(id, b);
        }
        self.len += 1;
        old
    }

    pub fn remove(&mut self, id: &BackendId) -> Option<Backend> {
        let old = match self.dense.get_mut(id.0 as usize) {
            Some(b) if b.family != 0 => Some(std::mem::take(b)),
            _ => self.sparse.remove(id),
        };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Room for ids up to `additional` above the backends held (a full
    /// reconcile's first ids), without the doubling of a growing `Vec`.
    pub fn reserve(&mut self, additional: usize) {
        let want = (self.len + additional + 1).saturating_sub(self.dense.len());
        self.dense.reserve_exact(want);
    }

    pub fn iter(&self) -> impl Iterator<Item = (BackendId, &Backend)> {
        self.dense
            .iter()
            .enumerate()
            .filter(|(_, b)| b.family != 0)
            .map(|(i, b)| (BackendId(i as u32), b))
            .chain(self.sparse.iter().map(|(id, b)| (*id, b)))
    }

    pub fn keys(&self) -> impl Iterator<Item = BackendId> + '_ {
        self.iter().map(|(id, _)| id)
    }

    pub fn values(&self) -> impl Iterator<Item = &Backend> {
        self.iter().map(|(_, b)| b)
    }
}

impl BackendLookup for BackendTable {
    fn backend(&self, id: BackendId) -> Option<&Backend> {
        self.get(&id)
    }
}

impl PartialEq for BackendTable {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(id, b)| other.get(&id) == Some(b))
    }
}

impl Eq for BackendTable {}

impl std::fmt::Debug for BackendTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sorted: Vec<_> = self.iter().collect();
        sorted.sort_by_key(|(id, _)| *id);
        f.debug_map().entries(sorted).finish()
    }
}

impl FromIterator<(BackendId, Backend)> for BackendTable {
    fn from_iter<I: IntoIterator<Item = (BackendId, Backend)>>(iter: I) -> Self {
        let mut table = Self::default();
        for (id, b) in iter {
            table.insert(id, b);
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::FAMILY_V4;

    fn b(port: u16) -> Backend {
        Backend {
            port,
            family: FAMILY_V4,
            ..Backend::default()
        }
    }

    #[test]
    fn behaves_as_a_map_of_ids() {
        let mut t = BackendTable::default();
        assert!(t.is_empty());
        assert_eq!(t.insert(BackendId(3), b(1)), None);
        assert_eq!(t.insert(BackendId(3), b(2)), Some(b(1)));
        assert_eq!(t.insert(BackendId(1), b(3)), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(&BackendId(3)), Some(&b(2)));
        assert_eq!(t.get(&BackendId(2)), None);
        assert_eq!(t.get(&BackendId(99)), None);
        assert_eq!(t.remove(&BackendId(3)), Some(b(2)));
        assert_eq!(t.remove(&BackendId(3)), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.keys().collect::<Vec<_>>(), vec![BackendId(1)]);
    }

    #[test]
    fn a_far_id_goes_beside_the_table_and_the_table_stays_small() {
        let mut t = BackendTable::default();
        t.insert(BackendId(1), b(1));
        t.insert(BackendId(4_000_000_000), b(2));
        assert!(t.dense.len() < 10, "{}", t.dense.len());
        assert_eq!(t.get(&BackendId(4_000_000_000)), Some(&b(2)));
        assert_eq!(t.len(), 2);
        // A backend without family cannot live in the flat part.
        t.insert(BackendId(2), Backend::default());
        assert_eq!(t.get(&BackendId(2)), Some(&Backend::default()));
        assert_eq!(t.len(), 3);
        let all: BackendTable = t.iter().map(|(id, b)| (id, *b)).collect();
        assert_eq!(all, t);
        assert_eq!(t.remove(&BackendId(4_000_000_000)), Some(b(2)));
        assert_eq!(t.remove(&BackendId(2)), Some(Backend::default()));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn an_id_moved_into_the_table_is_found_once() {
        let mut t = BackendTable::default();
        t.insert(BackendId(10_000), b(1));
        assert!(t.sparse.contains_key(&BackendId(10_000)));
        for i in 1..=6_000 {
            t.insert(BackendId(i), b(2));
        }
        // Now within reach of the table: rewriting it moves it there.
        t.insert(BackendId(10_000), b(3));
        assert!(t.sparse.is_empty());
        assert_eq!(t.len(), 6_001);
        assert_eq!(t.iter().filter(|(id, _)| id.0 == 10_000).count(), 1);
        assert_eq!(t.get(&BackendId(10_000)), Some(&b(3)));
    }

    #[test]
    fn equality_ignores_where_and_in_what_order_entries_live() {
        let a: BackendTable = [(BackendId(1), b(1)), (BackendId(2), b(2))]
            .into_iter()
            .collect();
        let mut c = BackendTable::default();
        c.insert(BackendId(2), b(2));
        c.insert(BackendId(1), b(1));
        c.insert(BackendId(50), b(5));
        c.remove(&BackendId(50));
        assert_eq!(a, c);
        c.insert(BackendId(1), b(9));
        assert_ne!(a, c);
    }
}
