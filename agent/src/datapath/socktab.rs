//! `sl_socktab` read and handed back through a shared mapping of its
//! memory (`BPF_F_MMAPABLE`): a scan reads 3.5 MiB in place instead of
//! making 65,536 lookups, and a slot's cookie changes only by an atomic
//! compare-and-swap, on this side as in the programs
//! (`sluice_common::socket`).

use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::{addr_of, addr_of_mut, NonNull},
    sync::atomic::{fence, AtomicU64, Ordering},
};

use aya::maps::{HashMap, Map, MapData, MapError};
use sluice_common::{
    maps::{self as names, SOCK_TABLE_SLOTS},
    socket::{table_slot, SOCK_SLOT_BUSY, SOCK_SLOT_MOVING},
    SockEntry, SockSlot,
};
use tracing::warn;

use super::{sys::NOEXIST, DatapathError};

/// The mapped `sl_socktab`.
pub struct SockTable {
    base: NonNull<SockSlot>,
    bytes: usize,
    /// Mapped for writing (the agent's writer; an inspection maps it
    /// read-only).
    writable: bool,
    /// The map, held for as long as its memory is mapped.
    _map: MapData,
}

// SAFETY: the mapping is shared memory that the kernel's programs write
// concurrently anyway; every access goes through atomics or volatile
// copies, never through a reference held across calls.
unsafe impl Send for SockTable {}
// SAFETY: as above.
unsafe impl Sync for SockTable {}

impl SockTable {
    /// Maps `map` (which must be `sl_socktab`: an array of
    /// `SOCK_TABLE_SLOTS` `SockSlot`s, memory-mappable), for writing only
    /// when `writable`.
    pub fn new(map: Map, writable: bool) -> Result<Self, DatapathError> {
        let name = names::SOCK_TABLE;
        let Map::Array(data) = map else {
            return Err(DatapathError::Map {
                name,
                source: MapError::InvalidMapType { map_type: 0 },
            });
        };
        let info = data
            .info()
            .map_err(|source| DatapathError::Map { name, source })?;
        if info.value_size() as usize != size_of::<SockSlot>() {
            return Err(DatapathError::Map {
                name,
                source: MapError::InvalidValueSize {
                    size: info.value_size() as usize,
                    expected: size_of::<SockSlot>(),
                },
            });
        }
        if info.max_entries() != SOCK_TABLE_SLOTS {
            return Err(DatapathError::Io {
                path: name.into(),
                source: std::io::Error::other(format!(
                    "{} slots, not {SOCK_TABLE_SLOTS}",
                    info.max_entries()
                )),
            });
        }
        let bytes = (SOCK_TABLE_SLOTS as usize * size_of::<SockSlot>()).next_multiple_of(4096);
        // SAFETY: a shared mapping of the map's own memory, as long as the
        // kernel allows (it refuses one of a map created without
        // `BPF_F_MMAPABLE`); unmapped in `drop`.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                },
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(DatapathError::Io {
                path: names::SOCK_TABLE.into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(base.cast::<SockSlot>()).ok_or_else(|| DatapathError::Io {
            path: names::SOCK_TABLE.into(),
            source: std::io::Error::other("mmap returned null"),
        })?;
        Ok(Self {
            base,
            bytes,
            writable,
            _map: data,
        })
    }

    fn slot(&self, index: u32) -> *mut SockSlot {
        debug_assert!(index < SOCK_TABLE_SLOTS);
        // SAFETY: `index` is below the slot count, within the mapping.
        unsafe { self.base.as_ptr().add((index % SOCK_TABLE_SLOTS) as usize) }
    }

    fn cookie(&self, index: u32) -> &AtomicU64 {
        // SAFETY: the cookie word of a slot in the mapping: 8-aligned (the
        // mapping is page-aligned, a slot 56 bytes), shared with the
        // programs, which change it only atomically.
        unsafe { AtomicU64::from_ptr(addr_of_mut!((*self.slot(index)).cookie)) }
    }

    /// The entry of slot `index` and the cookie holding it, if one does
    /// and held it, not busy, across the copy (a socket writes its entry
    /// with `SOCK_SLOT_BUSY` set: a slot being taken, written again or
    /// given back meanwhile reads as free).
    fn read(&self, index: u32) -> Option<(u64, SockEntry)> {
        let cookie = self.cookie(index).load(Ordering::Acquire) & !SOCK_SLOT_MOVING;
        if cookie == 0 || cookie & SOCK_SLOT_BUSY != 0 {
            return None;
        }
        // SAFETY: a slot in the mapping; copied whole, without a reference.
        let entry = unsafe { std::ptr::read_volatile(addr_of!((*self.slot(index)).entry)) };
        // The copy before the second read of the cookie.
        fence(Ordering::Acquire);
        (self.cookie(index).load(Ordering::Relaxed) & !SOCK_SLOT_MOVING == cookie)
            .then_some((cookie, entry))
    }

    /// Every socket that holds its slot, with its entry.
    pub fn entries(&self) -> Vec<(u64, SockEntry)> {
        (0..SOCK_TABLE_SLOTS).filter_map(|i| self.read(i)).collect()
    }

    /// The entry of the socket with `cookie`, if it holds its slot.
    pub fn get(&self, cookie: u64) -> Option<SockEntry> {
        self.read(table_slot(cookie))
            .filter(|(c, _)| *c == cookie)
            .map(|(_, e)| e)
    }

    /// How many slots a socket holds.
    pub fn occupied(&self) -> usize {
        (0..SOCK_TABLE_SLOTS)
            .filter(|i| self.cookie(*i).load(Ordering::Relaxed) != 0)
            .count()
    }

    /// Moves every entry into `sockets` (`sl_sock`), counted, and frees
    /// its slot: called once `sl_sockmark`'s counts are not valid, so that
    /// an older release finds the sockets in `sl_sock`. The agent owns a
    /// slot while it moves it (`SOCK_SLOT_MOVING`: a connect passes it by,
    /// its entry stays put and readable), copies the entry without
    /// overwriting (a connect of the same socket wrote a newer one), then
    /// frees the slot. A close may take the slot meanwhile and then
    /// deletes the copy itself; if the copy came after that, the failed
    /// compare-and-swap here says so and the copy goes. A connect that
    /// takes a slot meanwhile (or is writing one, busy, and passed by
    /// here) sees the validity gone and moves its entry itself. Returns
    /// how many moved (none on a read-only mapping).
    pub fn move_into(&self, sockets: &mut HashMap<MapData, u64, SockEntry>) -> usize {
        if !self.writable {
            return 0;
        }
        // The validity word, cleared before this call, is seen by every
        // connect whose slot the reads below miss (a connect reads it
        // again after its compare-and-swap, a full barrier too).
        fence(Ordering::SeqCst);
        let mut moved = 0;
        for index in 0..SOCK_TABLE_SLOTS {
            let word = self.cookie(index);
            let now = word.load(Ordering::Acquire);
            if now == 0 || now & SOCK_SLOT_BUSY != 0 {
                continue;
            }
            let cookie = now & !SOCK_SLOT_MOVING;
            let moving = cookie | SOCK_SLOT_MOVING;
            // A slot already moving is one an agent that crashed while it
            // moved it left behind (one agent moves at a time): taken up.
            if now != moving
                && word
                    .compare_exchange(cookie, moving, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                // Given back or being written again: its socket's close or
                // connect sees to it.
                continue;
            }
            // SAFETY: a slot in the mapping, ours while it is moving (its
            // socket's connect passes it by); copied whole.
            let entry = unsafe { std::ptr::read_volatile(addr_of!((*self.slot(index)).entry)) };
            let copied = match sockets.insert(cookie, entry, NOEXIST) {
                Ok(()) => true,
                Err(e) if exists(&e) => false,
                Err(error) => {
                    warn!(cookie, %error, "a socket of sl_socktab could not move into sl_sock: it stays in its slot");
                    let _ =
                        word.compare_exchange(moving, cookie, Ordering::AcqRel, Ordering::Acquire);
                    continue;
                }
            };
            match word.compare_exchange(moving, 0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => moved += 1,
                Err(_) => {
                    // Its close took the slot (and its count), and deleted
                    // what `sl_sock` held then: a copy made after that goes.
                    if copied {
                        let _ = sockets.remove(&cookie);
                    }
                }
            }
        }
        moved
    }
}

/// Whether an insert failed because the key was there (`BPF_NOEXIST`).
fn exists(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(sys) if sys.io_error.raw_os_error() == Some(libc::EEXIST))
}

impl Drop for SockTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length; nothing
        // refers into it past this point.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}
