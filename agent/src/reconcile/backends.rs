//! The programmed backends by id, as a flat table.
//!
//! Backend ids are dense (`ids.rs` hands out the lowest free one), so the
//! record of `sl_backends` is a flat table indexed by id, where a hash map of a
//! million entries held 61 MB (2^21 buckets of 28 bytes and a control
//! byte). Each slot holds a backend in 11 bytes: the IPv4 address in
//! place, an IPv6 one in a table beside it (16 more bytes), the
//! service-port id, the port, and the family and state in one byte (11 MB
//! at a million backends, against 24 MB for the map value itself; slots
//! with a byte each for family and state and their padding took 12).
//! Ids far above the table (adopted from maps an agent with other habits
//! wrote), and a backend the slot cannot rebuild exactly (a state above
//! 63, bytes past an IPv4 address), go to a small hash map beside it, so
//! no id can make the table huge and nothing read back is changed. The table grows a
//! chunk at a time and never moves what it holds (see [`Chunks`]).

use crate::fast_hash::HashMap;

use sluice_common::{Backend, FAMILY_V4, FAMILY_V6};

use super::ids::BackendId;

/// Slots an id may add to the table beyond twice the backends it holds
/// (a fresh node's first ids, and room for churn).
const SLACK: usize = 4096;

/// Read access to backends by id: the table, or a plain map (tests,
/// inspection).
pub trait BackendLookup {
    fn backend(&self, id: BackendId) -> Option<Backend>;
}

impl<S: std::hash::BuildHasher> BackendLookup for std::collections::HashMap<BackendId, Backend, S> {
    fn backend(&self, id: BackendId) -> Option<Backend> {
        self.get(&id).copied()
    }
}

/// One slot of the table: a backend in 11 bytes (byte arrays: no
/// padding).
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// IPv4: the address; IPv6: the index of the address in `v6`.
    addr: [u8; 4],
    svc_id: [u8; 4],
    port: [u8; 2],
    /// The family in the top two bits (0: an empty slot, whose id may be
    /// in `sparse`; 1: IPv4; 2: IPv6), the state below them.
    kind: u8,
}

const KIND_V4: u8 = 1 << 6;
const KIND_V6: u8 = 2 << 6;
const KIND_FAMILY: u8 = 3 << 6;

impl Slot {
    fn family(&self) -> u8 {
        match self.kind & KIND_FAMILY {
            KIND_V4 => FAMILY_V4,
            KIND_V6 => FAMILY_V6,
            _ => 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.kind & KIND_FAMILY == 0
    }
}

/// Slots per chunk of the flat table (16,384 slots, 176 KiB).
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

/// The flat table's slots, in chunks that never move. A `Vec` grows by
/// copying everything into a larger allocation, and both are resident
/// while it copies: at a million backends each step of the 11 MB table
/// held up to 11 MB more for a moment, and those moments set the agent's
/// high-water mark (docs/performance.md, issue 17). A chunk is added
/// whole, and nothing is copied.
#[derive(Clone, Default)]
struct Chunks {
    chunks: Vec<Box<[Slot]>>,
}

impl Chunks {
    /// Slots held (a whole number of chunks).
    fn len(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    fn get(&self, i: usize) -> Option<&Slot> {
        self.chunks
            .get(i >> CHUNK_BITS)
            .map(|chunk| &chunk[i & (CHUNK - 1)])
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Slot> {
        self.chunks
            .get_mut(i >> CHUNK_BITS)
            .map(|chunk| &mut chunk[i & (CHUNK - 1)])
    }

    /// Adds chunks until slot `i` exists.
    fn grow_to(&mut self, i: usize) {
        while self.len() <= i {
            self.chunks
                .push(vec![Slot::default(); CHUNK].into_boxed_slice());
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> + '_ {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }
}

/// `sl_backends` as programmed: id -> backend.
#[derive(Clone, Default)]
pub struct BackendTable {
    /// Index = id.
    dense: Chunks,
    /// The IPv6 addresses of slots, by the index their `addr` holds.
    v6: Vec<[u8; 16]>,
    /// Indexes of `v6` no slot uses.
    v6_free: Vec<u32>,
    sparse: HashMap<BackendId, Backend>,
    len: usize,
}

/// The backend of a slot's fields, IPv6 address `v6` given (any field
/// a test build adds to `Backend` left at its default).
#[allow(clippy::needless_update)]
fn rebuilt(slot: &Slot, v6: Option<&[u8; 16]>) -> Backend {
    let mut addr = [0u8; 16];
    match v6 {
        Some(a) => addr = *a,
        None => addr[..4].copy_from_slice(&slot.addr),
    }
    Backend {
        addr,
        port: u16::from_le_bytes(slot.port),
        family: slot.family(),
        state: slot.kind & !KIND_FAMILY,
        svc_id: u32::from_le_bytes(slot.svc_id),
        ..Backend::default()
    }
}

impl BackendTable {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn unpack(&self, slot: &Slot) -> Backend {
        let v6 = (slot.family() == FAMILY_V6)
            .then(|| self.v6.get(u32::from_ne_bytes(slot.addr) as usize))
            .flatten();
        rebuilt(slot, v6)
    }

    pub fn get(&self, id: &BackendId) -> Option<Backend> {
        match self.dense.get(id.0 as usize) {
            Some(slot) if !slot.is_empty() => Some(self.unpack(slot)),
            _ => self.sparse.get(id).copied(),
        }
    }

    pub fn contains_key(&self, id: &BackendId) -> bool {
        match self.dense.get(id.0 as usize) {
            Some(slot) if !slot.is_empty() => true,
            _ => self.sparse.contains_key(id),
        }
    }

    /// `b` in a slot, if one rebuilds it exactly (its address index not
    /// yet set for IPv6).
    fn slot_of(b: &Backend) -> Option<Slot> {
        let family = match b.family {
            FAMILY_V4 => KIND_V4,
            FAMILY_V6 => KIND_V6,
            _ => return None,
        };
        // A state above 63 does not fit: it comes back different, and
        // the check below refuses the slot.
        let slot = Slot {
            addr: [b.addr[0], b.addr[1], b.addr[2], b.addr[3]],
            svc_id: b.svc_id.to_le_bytes(),
            port: b.port.to_le_bytes(),
            kind: family | (b.state & !KIND_FAMILY),
        };
        let v6 = (b.family == FAMILY_V6).then_some(&b.addr);
        (rebuilt(&slot, v6) == *b).then_some(slot)
    }

    /// Whether `id` belongs in the flat part (growing it if need be).
    fn dense_slot(&self, id: BackendId) -> bool {
        let i = id.0 as usize;
        i < self.dense.len() || i <= 2 * self.len + SLACK
    }

    pub fn insert(&mut self, id: BackendId, b: Backend) -> Option<Backend> {
        let old = self.remove(&id);
        match Self::slot_of(&b).filter(|_| self.dense_slot(id)) {
            Some(mut slot) => {
                let i = id.0 as usize;
                self.dense.grow_to(i);
                if b.family == FAMILY_V6 {
                    let at = match self.v6_free.pop() {
                        Some(at) => {
                            self.v6[at as usize] = b.addr;
                            at
                        }
                        None => {
                            self.v6.push(b.addr);
                            (self.v6.len() - 1) as u32
                        }
                    };
                    slot.addr = at.to_ne_bytes();
                }
                if let Some(at) = self.dense.get_mut(i) {
                    *at = slot;
                }
            }
            None => {
                self.sparse.insert(id, b);
            }
        }
        self.len += 1;
        old
    }

    pub fn remove(&mut self, id: &BackendId) -> Option<Backend> {
        let old = match self.dense.get(id.0 as usize).copied() {
            Some(slot) if !slot.is_empty() => {
                let b = self.unpack(&slot);
                if slot.family() == FAMILY_V6 {
                    self.v6_free.push(u32::from_ne_bytes(slot.addr));
                }
                if let Some(at) = self.dense.get_mut(id.0 as usize) {
                    *at = Slot::default();
                }
                Some(b)
            }
            _ => self.sparse.remove(id),
        };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub fn iter(&self) -> impl Iterator<Item = (BackendId, Backend)> + '_ {
        self.dense
            .iter()
            .enumerate()
            .filter(|(_, slot)| !slot.is_empty())
            .map(|(i, slot)| (BackendId(i as u32), self.unpack(slot)))
            .chain(self.sparse.iter().map(|(id, b)| (*id, *b)))
    }

    pub fn keys(&self) -> impl Iterator<Item = BackendId> + '_ {
        self.iter().map(|(id, _)| id)
    }

    pub fn values(&self) -> impl Iterator<Item = Backend> + '_ {
        self.iter().map(|(_, b)| b)
    }
}

impl BackendLookup for BackendTable {
    fn backend(&self, id: BackendId) -> Option<Backend> {
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
        assert_eq!(t.get(&BackendId(3)), Some(b(2)));
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
        assert_eq!(t.dense.chunks.len(), 1, "one chunk for the low ids");
        assert_eq!(t.get(&BackendId(4_000_000_000)), Some(b(2)));
        assert_eq!(t.len(), 2);
        // A backend without family cannot live in the flat part.
        t.insert(BackendId(2), Backend::default());
        assert_eq!(t.get(&BackendId(2)), Some(Backend::default()));
        assert_eq!(t.len(), 3);
        let all: BackendTable = t.iter().collect();
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
        assert_eq!(t.get(&BackendId(10_000)), Some(b(3)));
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

    #[allow(clippy::needless_update)] // not needless in the `abi-probe` build
    fn b6(last: u8, svc_id: u32) -> Backend {
        let mut addr = [0u8; 16];
        addr[0] = 0xfd;
        addr[15] = last;
        Backend {
            addr,
            port: 8080,
            family: FAMILY_V6,
            state: 1,
            svc_id,
            ..Backend::default()
        }
    }

    #[test]
    #[allow(clippy::needless_update)] // not needless in the `abi-probe` build
    fn a_slot_holds_a_backend_in_eleven_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 11);
        let v4 = Backend {
            addr: [10, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            port: 8080,
            family: FAMILY_V4,
            state: 2,
            svc_id: 77,
            ..Backend::default()
        };
        let mut t = BackendTable::default();
        t.insert(BackendId(1), v4);
        assert!(t.sparse.is_empty(), "an IPv4 backend fits its slot");
        assert_eq!(t.get(&BackendId(1)), Some(v4));
    }

    #[test]
    fn what_a_slot_cannot_hold_goes_beside_the_table_unchanged() {
        let mut t = BackendTable::default();
        let mut edge = b6(1, u32::MAX);
        edge.state = 63;
        let mut odd_state = b(7);
        odd_state.state = 64;
        t.insert(BackendId(1), edge);
        t.insert(BackendId(2), odd_state);
        assert_eq!(
            t.sparse.keys().copied().collect::<Vec<_>>(),
            [BackendId(2)],
            "the largest id and state have their slot; state 64 does not"
        );
        assert_eq!(t.get(&BackendId(1)), Some(edge));
        assert_eq!(t.get(&BackendId(2)), Some(odd_state));
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn ipv6_addresses_live_beside_the_slots_and_their_room_is_reused() {
        let mut t = BackendTable::default();
        t.insert(BackendId(1), b6(1, 5));
        t.insert(BackendId(2), b6(2, 5));
        assert!(t.sparse.is_empty());
        assert_eq!(t.get(&BackendId(1)), Some(b6(1, 5)));
        assert_eq!(t.get(&BackendId(2)), Some(b6(2, 5)));
        assert_eq!(t.remove(&BackendId(1)), Some(b6(1, 5)));
        // Rewritten in place, and a new one takes the freed address room.
        assert_eq!(t.insert(BackendId(2), b6(3, 6)), Some(b6(2, 5)));
        t.insert(BackendId(4), b6(4, 6));
        assert_eq!(t.v6.len(), 2, "no address room leaks");
        assert_eq!(t.get(&BackendId(2)), Some(b6(3, 6)));
        assert_eq!(t.get(&BackendId(4)), Some(b6(4, 6)));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn growing_adds_chunks_and_moves_nothing() {
        let mut t = BackendTable::default();
        t.insert(BackendId(1), b(1));
        let first = t.dense.chunks[0].as_ptr();
        // Ids across several chunks, as a first sync hands them out.
        for i in 2..(3 * CHUNK as u32 + 5) {
            t.insert(BackendId(i), b((i % 60_000) as u16));
        }
        assert_eq!(t.dense.chunks.len(), 4);
        assert_eq!(
            t.dense.chunks[0].as_ptr(),
            first,
            "the first chunk stayed where it was"
        );
        assert!(t.sparse.is_empty());
        assert_eq!(t.get(&BackendId(1)), Some(b(1)));
        let edge = CHUNK as u32;
        assert_eq!(t.get(&BackendId(edge)), Some(b((edge % 60_000) as u16)));
        assert_eq!(t.get(&BackendId(3 * CHUNK as u32 + 5)), None);
        assert_eq!(t.remove(&BackendId(edge)), Some(b((edge % 60_000) as u16)));
        assert_eq!(t.get(&BackendId(edge)), None);
        assert_eq!(t.len(), 3 * CHUNK + 3);
        assert_eq!(t.iter().count(), t.len());
    }

    #[test]
    fn a_backend_no_slot_rebuilds_is_kept_whole_beside_the_table() {
        // Read back from maps another writer filled: bytes past an IPv4
        // address are not zero. The record keeps what the map holds.
        let mut odd = b(9);
        odd.addr[4] = 1;
        let mut t = BackendTable::default();
        t.insert(BackendId(1), odd);
        assert_eq!(t.get(&BackendId(1)), Some(odd));
        assert!(t.sparse.contains_key(&BackendId(1)));
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(BackendId(1), odd)]);
        assert_eq!(t.remove(&BackendId(1)), Some(odd));
        assert!(t.is_empty());
    }
}
