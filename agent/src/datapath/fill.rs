//! How full each pinned map is, for `sluice status`: every map of the
//! declaration table that holds entries (arrays are always full), counted
//! key by key from the pins, so it works whatever layout they have.

use std::{io, os::fd::AsFd, path::Path};

use sluice_common::abi::{MapKind, MAPS};

use super::{migrate::MIGRATE_DIR, sys};

/// One map's fill.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MapFill {
    pub map: &'static str,
    pub entries: usize,
    pub capacity: u32,
}

/// Fill of every pinned map under `root` that has entries to count.
pub fn map_fill(root: &Path) -> io::Result<Vec<MapFill>> {
    let mut out = Vec::new();
    for decl in &MAPS {
        if matches!(
            decl.kind,
            MapKind::Array | MapKind::PerCpuArray | MapKind::ProgArray
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
