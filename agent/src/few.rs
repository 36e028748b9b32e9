//! `Few<T>`: a short list that holds one item in place; `Rare<T>`: a
//! list that is usually empty, in 8 bytes.
//!
//! Most services have one port name, one slice: a `Vec` for each costs
//! its 24 bytes and an allocation. One item is held inline; more share
//! one boxed slice. Never empty: the owner drops the entry instead.

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

/// A list that is usually empty, behind one thin pointer: 8 bytes where
/// an empty boxed slice takes 16 (a frontend's Maglev members, a slice's
/// problems). Empty holds no allocation; items take a box of the boxed
/// slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rare<T>(Option<Box<Box<[T]>>>);

impl<T> Default for Rare<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> std::ops::Deref for Rare<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.0.as_deref().map_or(&[], |items| items)
    }
}

impl<T> From<Vec<T>> for Rare<T> {
    fn from(items: Vec<T>) -> Self {
        Self((!items.is_empty()).then(|| Box::new(items.into_boxed_slice())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
