//! `heap::compact` rebuilds a B-tree with full nodes and never holds a
//! second copy of it, and a first list keeps its store compact as it
//! fills. All depend on how the standard library's `BTreeMap::append`
//! works, so this binary counts every byte its heap hands out (its own
//! global allocator; one test, so no other thread allocates meanwhile).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::BTreeMap,
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(live, Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: the caller's pointer and layout, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn maps_filled_in_key_order_are_kept_compact_without_a_second_copy() {
    a_map_filled_in_key_order_is_rebuilt_smaller_without_a_second_copy();
    a_first_list_keeps_its_store_compact_while_it_fills();
}

fn a_map_filled_in_key_order_is_rebuilt_smaller_without_a_second_copy() {
    // A store's shape: 100,000 entries of a 32-byte key and 64 bytes.
    let mut map: BTreeMap<[u64; 4], [u64; 8]> = BTreeMap::new();
    let before_fill = LIVE.load(Relaxed);
    for i in 0..100_000u64 {
        map.insert([0, 0, 0, i], [i; 8]);
    }
    let filled = LIVE.load(Relaxed) - before_fill;
    let entries = 100_000 * (32 + 64);
    PEAK.store(LIVE.load(Relaxed), Relaxed);
    let peak_before = PEAK.load(Relaxed);

    sluice::heap::compact(&mut map);

    let compacted = LIVE.load(Relaxed) - before_fill;
    let over = PEAK.load(Relaxed) - peak_before;
    assert_eq!(map.len(), 100_000);
    assert!(map
        .iter()
        .enumerate()
        .all(|(i, (k, v))| k[3] == i as u64 && v[0] == i as u64));
    // Filled in order, nodes are about 60% full; rebuilt, nearly whole.
    assert!(
        filled > entries * 3 / 2,
        "filled in order: {filled} bytes for {entries} of entries"
    );
    assert!(
        compacted < entries * 6 / 5,
        "compacted: {compacted} bytes for {entries} of entries (was {filled})"
    );
    // Never more than a few nodes above what the map held before.
    assert!(
        over < 64 * 1024,
        "compacting went {over} bytes above the map it rebuilt"
    );
}

/// A first list of 32,700 Services in pages of 100: before its end
/// compacts the store, the store's nodes hold at most a quarter more than
/// after (left to fill in key order, about 80% more). The size is the one
/// just before a store compacted only when it doubled would compact
/// (at 32,800, after 16,400): such a store would hold about 40% more.
fn a_first_list_keeps_its_store_compact_while_it_fills() {
    use sluice::{
        sources::{Change, Converted, Update},
        stores::Stores,
        translate::{ObjectKey, ServiceInfo},
    };
    let n = 32_700;
    let names: Vec<ObjectKey> = (0..n)
        .map(|i| ObjectKey::new("default", format!("svc-{i:06}").as_str()))
        .collect();
    let mut stores = Stores::default();
    drop(stores.apply(Update::Services(Change::ListStart)));
    let before = LIVE.load(Relaxed);
    let mut pages = 0;
    for chunk in names.chunks(100) {
        let page: Vec<Converted<ServiceInfo>> = chunk
            .iter()
            .map(|key| Converted {
                key: key.clone(),
                value: Ok(Some(ServiceInfo::default())),
            })
            .collect();
        drop(stores.apply(Update::Services(Change::ListPage(page))));
        pages += 1;
    }
    let filled = LIVE.load(Relaxed) - before;
    drop(stores.apply(Update::Services(Change::ListEnd)));
    let compacted = LIVE.load(Relaxed) - before;
    assert_eq!((pages, stores.services.len()), (327, n));
    assert!(
        filled * 4 < compacted * 5,
        "{filled} bytes before the list's end, {compacted} after"
    );
}
