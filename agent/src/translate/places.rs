//! Endpoint places (node name and topology hints), interned and named by
//! a small index. A cluster has few combinations (about one per node and
//! zone), and every endpoint names one: as an index (below 2^26, in the
//! 29 bits above the conditions) it shares one word with them, and an
//! IPv4 endpoint takes 8 bytes in the stores instead of 16 with an `Arc`
//! (8 MB at 1,000,000 endpoints). Like `model::intern`'s strings, places live as long as the
//! process; reading one is two lock-free loads.

use std::{
    num::NonZeroU32,
    sync::{Mutex, OnceLock},
};

use super::objects::Place;
use crate::fast_hash::HashMap;

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 1 << 14;
/// The most places the table names (2^26).
pub const MAX_PLACES: usize = CHUNK * CHUNKS;
/// Bits of an endpoint's word an id may take (`objects::Stored`: the
/// conditions take the low 3).
pub const ID_BITS: u32 = 29;
const _: () = assert!(MAX_PLACES < 1 << ID_BITS, "an id fits an endpoint's word");

/// A place's index in the table, from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlaceId(NonZeroU32);

impl PlaceId {
    /// The id's number (at most `MAX_PLACES`).
    pub fn get(self) -> u32 {
        self.0.get()
    }

    /// The id numbered `n`, if it is one.
    pub fn from_number(n: u32) -> Option<Self> {
        NonZeroU32::new(n)
            .filter(|n| n.get() as usize <= MAX_PLACES)
            .map(PlaceId)
    }

    /// The place it names.
    pub fn place(self) -> Option<&'static Place> {
        let i = self.0.get() as usize - 1;
        TABLE
            .get(i >> CHUNK_BITS)?
            .get()?
            .get(i & (CHUNK - 1))?
            .get()
            .copied()
    }
}

type Chunk = Box<[OnceLock<&'static Place>]>;

/// Places by id - 1, in chunks allocated as they fill.
static TABLE: [OnceLock<Chunk>; CHUNKS] = [const { OnceLock::new() }; CHUNKS];

/// Ids by place (the writers' side; readers use `TABLE`).
static POOL: Mutex<Option<HashMap<&'static Place, PlaceId>>> = Mutex::new(None);

/// The id of `place`, or `None` when it says nothing (no node, no hints)
/// or the table is full (2^26 places: not a cluster's; the endpoint then
/// has no place, as one without node and hints).
pub fn intern(place: Place) -> Option<PlaceId> {
    if place == Place::default() {
        return None;
    }
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let pool = pool.get_or_insert_with(HashMap::default);
    if let Some(id) = pool.get(&place) {
        return Some(*id);
    }
    let i = pool.len();
    if i >= MAX_PLACES {
        return None;
    }
    let chunk =
        TABLE[i >> CHUNK_BITS].get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
    let place: &'static Place = Box::leak(Box::new(place));
    // The slot is fresh (ids are handed out in order under the lock); if
    // it were not, the id would name another place: none is handed out.
    chunk[i & (CHUNK - 1)].set(place).ok()?;
    let id = PlaceId::from_number(i as u32 + 1)?;
    pool.insert(place, id);
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Name;

    fn place(node: &str) -> Place {
        Place {
            node_name: Some(Name::from(node)),
            ..Place::default()
        }
    }

    #[test]
    fn one_id_per_place_and_back() {
        let a = intern(place("places-test-a")).unwrap();
        let b = intern(place("places-test-b")).unwrap();
        assert_ne!(a, b);
        assert_eq!(intern(place("places-test-a")), Some(a));
        assert_eq!(a.place(), Some(&place("places-test-a")));
        assert_eq!(b.place(), Some(&place("places-test-b")));
        assert!(std::ptr::eq(a.place().unwrap(), a.place().unwrap()));
        assert_eq!(intern(Place::default()), None, "nothing to say, no id");
        assert!(PlaceId::from_number(0).is_none());
        assert!(PlaceId::from_number(MAX_PLACES as u32 + 1).is_none());
    }

    #[test]
    fn ids_past_a_chunk_resolve() {
        let ids: Vec<_> = (0..CHUNK + 10)
            .map(|i| intern(place(&format!("places-test-many-{i}"))).unwrap())
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                id.place().and_then(|p| p.node_name.as_deref()),
                Some(format!("places-test-many-{i}").as_str())
            );
        }
    }
}
