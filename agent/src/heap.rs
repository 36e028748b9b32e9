//! The process heap (glibc's allocator): two arenas, large blocks mapped on
//! their own, and freed memory given back to the kernel after the large
//! transient work of a full reconcile; and B-trees rebuilt with full nodes.

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

/// Two glibc malloc arenas for the whole process, set before any thread
/// exists. With one per thread (glibc's default), the list decoded on one
/// thread and applied on another left freed memory stranded in each
/// arena: at 100,000 services VmHWM was 363-376 MB after the first sync
/// and a relist added 30 MB; with one arena 333 MB and 15 MB. One arena
/// has one lock, though, and three threads allocate at once during a
/// first list (two decode pages, one programs): a profile at 100,000
/// services had the agent spend 14-22% of each thread's time waiting for
/// that lock or waking its waiters, on top of 14-25% in the allocator.
/// With two, start to ready went from 9.4-10.7 s to 6.8 s (agent CPU
/// 11.5-13.3 s to 8.7 s) for 5.8 MB more VmHWM; three arenas were no
/// faster and held 10.5 MB more (docs/performance.md, issue 17). A
/// relist still adds nothing to VmHWM with two (every run of that
/// session).
///
/// Blocks of 1 MiB and more are mapped on their own and unmapped when
/// freed. glibc's default threshold starts at 128 kB and rises to 32 MB
/// as mapped blocks are freed, after which the reconciler's hash tables,
/// outgrown and freed as they double, stayed resident in the heap: with
/// services programmed while the first list streams in, VmHWM at 100,000
/// services went from 210 to 247-254 MB; with the threshold fixed, 212 MB.
pub fn arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; the caller runs it
    // before the runtime starts any thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Gives the heap's free pages back to the kernel (`malloc_trim`), and
/// says how long that took. A full reconcile frees its translations, plan
/// buffers and the reconciler's reserved room when it ends; glibc keeps
/// such pages resident inside the heap, where only a later allocation
/// reuses them. Given back, the resident set after a full reconcile is
/// what the agent holds, and a later transient (a relist's pages) stays
/// under the first sync's high-water mark instead of adding to it.
pub fn give_back_free_pages() -> Duration {
    let started = Instant::now();
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    started.elapsed()
}
