//! Small lists that cost little where most holders have one item or none.
//!
//! - `Few<T>`: one item in place, several in a boxed slice; never empty
//!   (the owner drops the entry instead). Most services have one port
//!   name, one slice: a `Vec` for each cost its 24 bytes and an
//!   allocation.
//! - `Thin<T>`: any number behind one thin pointer, shareable between
//!   holders of the same items (a frontend's slots and its unit's
//!   backends, `reconcile/id_list.rs`); `Rare<T>` when usually empty (a
//!   frontend's Maglev members, a slice's problems).
//! - `Inline<T>`: one item in place, any other number in a `Thin<T>`;
//!   may be empty (a Service's ports and cluster IPs, a slice's ports).

use triomphe::ThinArc;

/// One item in place, or several in a boxed slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Few<T> {
    One(T),
    Many(Box<[T]>),
}

impl<T> Few<T> {
    /// `items` in their order; `None` for none.
    pub fn new(mut items: Vec<T>) -> Option<Self> {
        match items.len() {
            0 => None,
            1 => items.pop().map(Few::One),
            _ => Some(Few::Many(items.into_boxed_slice())),
        }
    }

    pub fn as_slice(&self) -> &[T] {
        match self {
            Few::One(item) => std::slice::from_ref(item),
            Few::Many(items) => items,
        }
    }
}

impl<T: Ord + Clone> Few<T> {
    /// Adds `item` in order, if absent (the list kept sorted).
    pub fn insert_sorted(&mut self, item: &T) {
        if let Err(at) = self.as_slice().binary_search(item) {
            let mut items = self.as_slice().to_vec();
            items.insert(at, item.clone());
            *self = Few::Many(items.into_boxed_slice());
        }
    }

    /// Removes `item` from a sorted list; true when nothing is left (the
    /// owner then drops the entry).
    pub fn remove_sorted(&mut self, item: &T) -> bool {
        let Ok(at) = self.as_slice().binary_search(item) else {
            return false;
        };
        let mut items = self.as_slice().to_vec();
        items.remove(at);
        match Few::new(items) {
            Some(rest) => {
                *self = rest;
                false
            }
            None => true,
        }
    }
}

/// A list behind one thin pointer (8 bytes, where a boxed slice takes
/// 16): a count and the length beside the items, in one allocation of
/// exactly their room; empty holds no allocation. Holders of the same
/// items may hold one list (`share`); a holder that changes its items
/// gets a copy of its own first (`update`).
pub struct Thin<T>(Option<ThinArc<(), T>>);

/// A list that is usually empty (a frontend's Maglev members, a slice's
/// problems).
pub type Rare<T> = Thin<T>;

impl<T> Thin<T> {
    /// Whether `self` and `other` hold one list.
    #[cfg(test)]
    pub fn shares_with(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => a.as_ptr() == b.as_ptr(),
            _ => false,
        }
    }
}

impl<T: Clone> Thin<T> {
    /// Changes the items in place, copied first if another holder shares
    /// them.
    pub fn update(&mut self, change: impl FnOnce(&mut [T])) {
        let Some(items) = &mut self.0 else {
            return change(&mut []);
        };
        if ThinArc::strong_count(items) > 1 {
            *items = ThinArc::from_header_and_iter((), items.slice.iter().cloned());
        }
        items.with_arc_mut(|arc| {
            if let Some(unique) = triomphe::Arc::get_mut(arc) {
                change(unique.slice_mut());
            }
        });
    }

    /// Resizes to `len` items (new ones at their default), in a list of
    /// its own holding exactly that many.
    pub fn resize(&mut self, len: usize)
    where
        T: Default,
    {
        if self.len() != len {
            let mut items = self.to_vec();
            items.resize(len, T::default());
            *self = Self::from(items);
        }
    }
}

impl<T: PartialEq> Thin<T> {
    /// Holds `other`'s list instead of its own when both hold the same
    /// items.
    pub fn share(&mut self, other: &Self) {
        if let (Some(mine), Some(theirs)) = (&self.0, &other.0) {
            if mine.as_ptr() != theirs.as_ptr() && mine.slice == theirs.slice {
                self.0 = Some(theirs.clone());
            }
        }
    }
}

impl<T> Clone for Thin<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Default for Thin<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> std::ops::Deref for Thin<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.0.as_ref().map_or(&[], |items| &items.slice)
    }
}

impl<T> From<Vec<T>> for Thin<T> {
    fn from(items: Vec<T>) -> Self {
        Self((!items.is_empty()).then(|| ThinArc::from_header_and_iter((), items.into_iter())))
    }
}

impl<T> FromIterator<T> for Thin<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a, T> IntoIterator for &'a Thin<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: PartialEq> PartialEq for Thin<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for Thin<T> {}

impl<T: std::fmt::Debug> std::fmt::Debug for Thin<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A list that most holders have one item of: that one in place, any
/// other number in a [`Thin`] list. 24 bytes for an `IpAddr`, and for an
/// item with a spare value of its own (an enum's) no more than the item:
/// 16 for a slice's port, where a boxed slice took 16 and an allocation
/// of 16-32 more for its one item (a stored Service's ports and cluster
/// IPs, a slice's ports; docs/performance.md, issue 17).
#[derive(Clone, Debug)]
pub enum Inline<T> {
    One(T),
    Other(Thin<T>),
}

impl<T> Inline<T> {
    /// Whether the items are on the heap (more than one).
    pub fn spilled(&self) -> bool {
        matches!(self, Self::Other(items) if !items.is_empty())
    }
}

impl<T> Default for Inline<T> {
    fn default() -> Self {
        Self::Other(Thin::default())
    }
}

impl<T> std::ops::Deref for Inline<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::One(item) => std::slice::from_ref(item),
            Self::Other(items) => items,
        }
    }
}

impl<T> From<Vec<T>> for Inline<T> {
    fn from(mut items: Vec<T>) -> Self {
        match (items.pop(), items.is_empty()) {
            (Some(one), true) => Self::One(one),
            (last, _) => {
                items.extend(last);
                Self::Other(Thin::from(items))
            }
        }
    }
}

impl<'a, T> IntoIterator for &'a Inline<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: PartialEq> PartialEq for Inline<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for Inline<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Inline<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_list_holds_one_item_in_place_and_more_in_exactly_their_room() {
        assert_eq!(std::mem::size_of::<Inline<std::net::IpAddr>>(), 24);
        assert_eq!(std::mem::size_of::<Inline<(u64, u64)>>(), 24);
        let mut roomy = Vec::with_capacity(8);
        roomy.push(7u16);
        let one = Inline::from(roomy);
        assert!(matches!(one, Inline::One(7)) && !one.spilled());
        let three = Inline::from(vec![1u16, 2, 3]);
        assert!(three.spilled());
        assert_eq!(&*three, &[1, 2, 3]);
        let none = Inline::<u16>::from(Vec::new());
        assert!(none.is_empty() && !none.spilled());
        assert_eq!(none, Inline::default());
        let spilled_one = Inline::Other(Thin::from(vec![7u16]));
        assert_eq!(spilled_one, one, "equal as lists");
        let hash = |l: &Inline<u16>| {
            std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::default(), l)
        };
        assert_eq!(hash(&spilled_one), hash(&one), "and hashed alike");
        // An item with a spare value holds the pointer around it.
        #[derive(Clone, Copy)]
        #[allow(dead_code)]
        enum Proto {
            A,
            B,
        }
        assert_eq!(std::mem::size_of::<Inline<(u64, u16, Proto)>>(), 16);
    }

    #[test]
    fn a_rare_list_is_one_thin_pointer_and_empty_without_an_allocation() {
        assert_eq!(std::mem::size_of::<Rare<u64>>(), 8);
        assert_eq!(Rare::<u8>::from(Vec::new()), Rare::default());
        assert!(Rare::<u8>::default().0.is_none());
        let items = Rare::from(vec![3, 1]);
        assert_eq!(&*items, &[3, 1]);
    }

    #[test]
    fn one_item_is_held_in_place_and_more_stay_sorted() {
        let mut few = Few::One(5);
        few.insert_sorted(&5);
        assert_eq!(few, Few::One(5), "present: nothing added");
        few.insert_sorted(&1);
        few.insert_sorted(&9);
        assert_eq!(few.as_slice(), &[1, 5, 9]);
        assert!(!few.remove_sorted(&5));
        assert!(!few.remove_sorted(&7), "absent: nothing removed");
        assert!(!few.remove_sorted(&1));
        assert_eq!(few, Few::One(9));
        assert!(few.remove_sorted(&9), "the last item goes: nothing left");
    }

    #[test]
    fn new_keeps_the_order_it_is_given() {
        assert_eq!(Few::<u8>::new(vec![]), None);
        assert_eq!(Few::new(vec![2]), Some(Few::One(2)));
        assert_eq!(Few::new(vec![3, 1]).unwrap().as_slice(), &[3, 1]);
    }
}
