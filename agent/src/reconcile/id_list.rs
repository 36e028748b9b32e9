//! A list of backend ids that holders of the same ids share.
//!
//! A frontend's slots and its unit's backends are, in the steady state,
//! the same ids in the same order (a unit's backends are listed in id
//! order, and a first sync hands a frontend's backends ascending ids in
//! its slot order). Each held its own boxed slice: two allocations of
//! the same ids per service port, 8 MB at 100,000 service ports of ten
//! backends (docs/performance.md, issue 17). Shared, the two hold one,
//! behind one thin pointer (8 bytes in each record, where a boxed slice
//! or an `Arc<[T]>` takes 16). A holder that changes its list gets a
//! copy of its own first.

use triomphe::ThinArc;

use super::ids::BackendId;

/// Backend ids, shared by whoever holds the same ones (`share`). Empty
/// takes no allocation.
#[derive(Clone, Default)]
pub struct IdList(Option<ThinArc<(), BackendId>>);

impl IdList {
    /// Changes the ids in place, copied first if another holder shares
    /// them.
    pub fn update(&mut self, change: impl FnOnce(&mut [BackendId])) {
        let Some(ids) = &mut self.0 else {
            return change(&mut []);
        };
        if ThinArc::strong_count(ids) > 1 {
            *ids = ThinArc::from_header_and_slice((), &ids.slice);
        }
        ids.with_arc_mut(|arc| {
            if let Some(unique) = triomphe::Arc::get_mut(arc) {
                change(unique.slice_mut());
            }
        });
    }

    /// Resizes to `len` ids (new ones `BackendId(0)`), in a list of its
    /// own holding exactly that many.
    pub fn resize(&mut self, len: usize) {
        if self.len() != len {
            let mut ids = self.to_vec();
            ids.resize(len, BackendId::default());
            *self = Self::from(ids);
        }
    }

    /// Holds `other`'s list instead of its own when both hold the same
    /// ids.
    pub fn share(&mut self, other: &IdList) {
        if let (Some(mine), Some(theirs)) = (&self.0, &other.0) {
            if mine.as_ptr() != theirs.as_ptr() && mine.slice == theirs.slice {
                self.0 = Some(theirs.clone());
            }
        }
    }

    /// Whether `self` and `other` hold one list.
    #[cfg(test)]
    pub fn shares_with(&self, other: &IdList) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => a.as_ptr() == b.as_ptr(),
            _ => false,
        }
    }
}

impl std::ops::Deref for IdList {
    type Target = [BackendId];

    fn deref(&self) -> &[BackendId] {
        self.0.as_ref().map_or(&[], |ids| &ids.slice)
    }
}

impl From<Vec<BackendId>> for IdList {
    fn from(ids: Vec<BackendId>) -> Self {
        Self((!ids.is_empty()).then(|| ThinArc::from_header_and_slice((), &ids)))
    }
}

impl FromIterator<BackendId> for IdList {
    fn from_iter<I: IntoIterator<Item = BackendId>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a IdList {
    type Item = &'a BackendId;
    type IntoIter = std::slice::Iter<'a, BackendId>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for IdList {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl Eq for IdList {}

impl std::fmt::Debug for IdList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(raw: &[u32]) -> IdList {
        raw.iter().copied().map(BackendId).collect()
    }

    #[test]
    fn equal_lists_are_shared_and_a_change_copies_first() {
        let unit = ids(&[1, 2, 3]);
        let mut slots = ids(&[1, 2, 3]);
        assert!(!slots.shares_with(&unit));
        slots.share(&unit);
        assert!(slots.shares_with(&unit), "the same ids: one list");
        slots.update(|ids| ids[0] = BackendId(9));
        assert!(!slots.shares_with(&unit));
        assert_eq!(unit, ids(&[1, 2, 3]), "the other holder's ids unchanged");
        assert_eq!(slots, ids(&[9, 2, 3]));
        // Different ids, or another order: each keeps its own.
        let mut other = ids(&[3, 2, 1]);
        other.share(&unit);
        assert!(!other.shares_with(&unit));
    }

    #[test]
    fn a_list_is_one_thin_pointer() {
        assert_eq!(std::mem::size_of::<IdList>(), 8);
    }

    #[test]
    fn resizing_keeps_the_ids_and_never_changes_a_shared_list() {
        let unit = ids(&[4, 5]);
        let mut slots = unit.clone();
        slots.resize(3);
        assert_eq!(slots, ids(&[4, 5, 0]));
        assert_eq!(unit, ids(&[4, 5]));
        slots.resize(0);
        assert!(slots.is_empty());
        slots.update(|ids| assert!(ids.is_empty()));
        assert_eq!(IdList::from(Vec::new()), IdList::default());
    }
}
