//! How full each pinned map is: for `sluice status`, every map of the
//! declaration table that holds entries (arrays are always full), counted
//! key by key from the pins, so it works whatever layout they have; for
//! the agent's gauges, from the counts the agent keeps (no map walk).

use std::{io, os::fd::AsFd, path::Path};

use sluice_common::{
    abi::{MapKind, MAPS, NO_PREALLOC_FLAG},
    maps as names,
};

use super::{migrate::MIGRATE_DIR, sys, MapSizes};

/// One map's fill.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MapFill {
    pub map: &'static str,
    pub entries: usize,
    pub capacity: u32,
    /// A hash map created without `BPF_F_NO_PREALLOC` (`--preallocate-maps`
    /// for the service and backend maps; LRU maps always are).
    pub preallocated: bool,
}

/// Fill of every pinned map under `root` that has entries to count.
pub fn map_fill(root: &Path) -> io::Result<Vec<MapFill>> {
    let mut out = Vec::new();
    for decl in &MAPS {
        if matches!(
            decl.kind,
            MapKind::Array | MapKind::PerCpuArray | MapKind::ProgArray | MapKind::RingBuf
        ) {
            continue;
        }
        let fd = match sys::obj_get(&root.join(decl.name)) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let info = sys::map_info(fd.as_fd())?;
        let mut key = vec![0u8; info.key_size as usize];
        let mut next = key.clone();
        let mut entries = 0usize;
        let mut first = true;
        // Bounded: a hash walk restarts when its key vanishes meanwhile.
        for _ in 0..2 * info.max_entries as usize + 16 {
            if !sys::map_next_key(fd.as_fd(), (!first).then_some(&key[..]), &mut next)? {
                break;
            }
            first = false;
            entries += 1;
            std::mem::swap(&mut key, &mut next);
        }
        out.push(MapFill {
            map: decl.name,
            entries,
            capacity: info.max_entries,
            preallocated: decl.kind == MapKind::Hash && info.map_flags & NO_PREALLOC_FLAG == 0,
        });
    }
    Ok(out)
}

/// What `sluice status` says about a migration of the pins.
pub fn migration_state(root: &Path) -> &'static str {
    let dir = root.join(MIGRATE_DIR);
    if !dir.exists() {
        "none"
    } else if dir.join("committed").exists() {
        "committed, not finished (the next agent finishes it)"
    } else {
        "staged, not committed (the next agent discards it)"
    }
}

/// Entries of one map, by name, as the agent counts them.
pub type Occupancy = (&'static str, usize);

/// The capacity `sizes` gives map `map`, if the agent sizes it.
fn capacity(map: &str, sizes: &MapSizes) -> Option<u32> {
    Some(match map {
        names::SERVICES_V4 | names::SERVICES_V6 => sizes.services,
        names::BACKENDS => sizes.backends,
        names::MAGLEV_V4 | names::MAGLEV_V6 => sizes.maglev,
        names::CONNTRACK_V4 | names::CONNTRACK_V6 => sizes.conntrack,
        names::AFFINITY_V4 | names::AFFINITY_V6 => sizes.affinity,
        names::SOCK_TABLE => names::SOCK_TABLE_SLOTS,
        _ => return None,
    })
}

/// The fill ratio of each map in `entries` (each family's map under its
/// own name), for the `sluice_map_fill_ratio` gauges.
pub fn fill_ratios(entries: &[Occupancy], sizes: &MapSizes) -> Vec<(&'static str, f64)> {
    entries
        .iter()
        .filter_map(|(map, n)| {
            let cap = capacity(map, sizes)?;
            Some((*map, *n as f64 / f64::from(cap.max(1))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_counts_against_its_own_map() {
        let sizes = MapSizes {
            services: 100,
            backends: 10,
            conntrack: 1000,
            affinity: 50,
            maglev: 4,
            preallocate: false,
        };
        let got = fill_ratios(
            &[
                (names::SERVICES_V4, 50),
                (names::SERVICES_V6, 25),
                (names::BACKENDS, 5),
                (names::MAGLEV_V6, 1),
                (names::CONNTRACK_V6, 10),
                (names::STATS, 3),
                (names::SOCK_TABLE, 16_384),
            ],
            &sizes,
        );
        assert_eq!(
            got,
            vec![
                (names::SERVICES_V4, 0.5),
                (names::SERVICES_V6, 0.25),
                (names::BACKENDS, 0.5),
                (names::MAGLEV_V6, 0.25),
                (names::CONNTRACK_V6, 0.01),
                (names::SOCK_TABLE, 0.25),
            ]
        );
    }
}
