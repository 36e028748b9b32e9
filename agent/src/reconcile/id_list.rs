//! A list of backend ids that holders of the same ids share.
//!
//! A frontend's slots and its unit's backends are, in the steady state,
//! the same ids in the same order (a unit's backends are listed in id
//! order, and a first sync hands a frontend's backends ascending ids in
//! its slot order). Each held its own boxed slice: two allocations of
//! the same ids per service port, 8 MB at 100,000 service ports of ten
//! backends (docs/performance.md, issue 17). Shared, the two hold one,
//! behind one thin pointer (8 bytes in each record, where a boxed slice
//! or an `Arc<[T]>` takes 16; `few::Thin`). A holder that changes its
//! list gets a copy of its own first.

use super::ids::BackendId;

/// Backend ids, shared by whoever holds the same ones
/// ([`Thin::share`](crate::few::Thin::share)). Empty takes no allocation.
pub type IdList = crate::few::Thin<BackendId>;

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
