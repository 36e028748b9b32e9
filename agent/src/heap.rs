//! The process heap: mimalloc, freed memory given back to the kernel at
//! once and after the large transient work of a full reconcile; and
//! B-trees rebuilt with full nodes.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

/// Rebuilds `map` with full B-tree nodes, never holding a second copy of
/// it. A list (or a translation of everything) fills a map in key order,
/// which leaves every node about half empty: at 100,000 services the
/// services' and slices' maps held 28 MB of nothing. Appending a map to a
/// non-empty one merges both into nodes filled whole and frees the old
/// nodes as it goes; collecting into a new map (what this did before)
/// first gathered every entry in one `Vec`, a second copy of the map at
/// the agent's peak. `tests/compact.rs` holds the standard library to
/// both (a toolchain whose `append` stopped filling nodes fails it).
pub fn compact<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    let mut rest = std::mem::take(map);
    if let Some((key, value)) = rest.pop_first() {
        map.insert(key, value);
        map.append(&mut rest);
    }
}

/// The agent's allocator: mimalloc, in `main.rs` as the global one
/// (glibc's malloc with `--features system-alloc`, for heaptrack).
///
/// glibc's malloc had three costs here (docs/performance.md, issue 17):
/// its arenas' locks (three threads allocate at once during a first
/// list: two decode pages, one programs), which one arena made a
/// bottleneck and one arena per thread answered by stranding freed memory
/// in each; its per-allocation overhead; and freed pages it keeps until
/// `malloc_trim`. mimalloc's per-thread heaps need no lock, and it gives
/// free pages back on its own. At 100,000 services (API-fed, the same
/// day): start to ready 7.40 s with glibc (two arenas), 5.08-5.36 s with
/// mimalloc, for the same VmHWM (158-160 MB); with mimalloc's default
/// purge delay (1 s) freed pages outlived the transients that freed them
/// and VmHWM was 215 MB, and a relist added 34 MB. mimalloc v2, not v3:
/// side by side on 2026-11-27 (API agent, 100,000 services, the bench's
/// VmHWM in MiB) v2 held 140-143 MB where v3 held 149-153 MB, with start
/// to ready 4.52-4.68 s against 4.73-4.94 s.
pub type Allocator = mimalloc::MiMalloc;

/// mimalloc's option number of `purge_delay` (its `mi_option_t`; the same
/// in its v2 and v3).
#[cfg(not(feature = "system-alloc"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets the allocator's parameters; run first in `main`. Freed pages
/// are given back at once: the agent's transients (a list's pages, a
/// full reconcile's plans) are large and rare, and a delay keeps them
/// resident on top of what the next one allocates. `MIMALLOC_PURGE_DELAY`
/// in the environment still wins (mimalloc reads it at start-up).
pub fn configure() {
    #[cfg(not(feature = "system-alloc"))]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mi_option_set only stores an option's value.
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        }
    }
    #[cfg(all(feature = "system-alloc", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; `main` runs this
    // before the runtime starts any thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Gives free pages back to the kernel, and says how long that took. A
/// full reconcile frees its translations, plan buffers and the
/// reconciler's reserved room when it ends; given back, the resident set
/// after a full reconcile is what the agent holds, and a later transient
/// (a relist's pages) stays under the first sync's high-water mark
/// instead of adding to it. mimalloc collects the calling thread's heap
/// (the sync thread's: the reconciler's transients) and purges what its
/// arenas hold free; pages other threads own go back as they free them.
pub fn give_back_free_pages() -> Duration {
    let started = Instant::now();
    #[cfg(not(feature = "system-alloc"))]
    // SAFETY: mi_collect only walks the allocator's own free lists.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(all(feature = "system-alloc", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    started.elapsed()
}
