//! The kernel's own cost of writing map entries (issue 17): what
//! programming N services from empty cannot go below, whatever the agent
//! does in user space. N entries shaped like `sl_backends` (a `u32` key, a
//! 24-byte value) are written into a fresh map of each kind, one
//! `BPF_MAP_UPDATE_ELEM` per entry and in `BPF_MAP_UPDATE_BATCH` calls of
//! a few sizes. The agent writes a unit's backends and a frontend's slots
//! as one batch (about 10 entries at 10 endpoints per service) into
//! hash maps without preallocation (`BPF_F_NO_PREALLOC`, as Cilium's
//! service maps: kernel memory follows the entries, not the map size).
//! Each figure includes creating the map (where a preallocated map
//! allocates its elements), for maps sized to the entries.

use std::{os::fd::AsRawFd, time::Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::bpf::{fd, put, sys_bpf};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_F_NO_PREALLOC: u32 = 1;
const VALUE_SIZE: usize = 24;

/// One way of writing the entries.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MapWriteCase {
    pub map: String,
    /// Entries per `bpf()` call: 1 is one `BPF_MAP_UPDATE_ELEM` each.
    pub batch: usize,
    pub ns_per_entry: f64,
}

/// The scenario's results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MapWriteCost {
    pub entries: usize,
    pub cases: Vec<MapWriteCase>,
}

fn create(map_type: u32, flags: u32, max_entries: u32) -> Result<std::os::fd::OwnedFd> {
    // union bpf_attr: map_type, key_size, value_size, max_entries,
    // map_flags (u32 each).
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &map_type.to_ne_bytes());
    put(&mut attr, 4, &4u32.to_ne_bytes());
    put(&mut attr, 8, &(VALUE_SIZE as u32).to_ne_bytes());
    put(&mut attr, 12, &max_entries.to_ne_bytes());
    put(&mut attr, 16, &flags.to_ne_bytes());
    Ok(fd(
        sys_bpf(BPF_MAP_CREATE, &mut attr).context("BPF_MAP_CREATE")?
    )?)
}

/// Writes every entry into a fresh map; nanoseconds per entry.
fn write_all(map_type: u32, flags: u32, batch: usize, keys: &[u32], values: &[u8]) -> Result<f64> {
    let n = keys.len();
    // Creating the map counts: a preallocated map allocates (and the
    // kernel zeroes) every element then. An array's keys are indexes
    // below max_entries.
    let start = Instant::now();
    let map = create(map_type, flags, n as u32 + 1)?;
    let map_fd = map.as_raw_fd() as u32;
    if batch == 1 {
        for (i, key) in keys.iter().enumerate() {
            // map_fd, then key and value pointers (u64 each), flags.
            let mut attr = [0u8; 128];
            put(&mut attr, 0, &map_fd.to_ne_bytes());
            put(&mut attr, 8, &(key as *const u32 as u64).to_ne_bytes());
            let value = values[i * VALUE_SIZE..].as_ptr() as u64;
            put(&mut attr, 16, &value.to_ne_bytes());
            sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr).context("BPF_MAP_UPDATE_ELEM")?;
        }
    } else {
        for (i, chunk) in keys.chunks(batch).enumerate() {
            // batch: in_batch, out_batch, keys, values (u64 each), count,
            // map_fd (u32 each), elem_flags, flags (u64 each).
            let mut attr = [0u8; 128];
            put(&mut attr, 16, &(chunk.as_ptr() as u64).to_ne_bytes());
            let value = values[i * batch * VALUE_SIZE..].as_ptr() as u64;
            put(&mut attr, 24, &value.to_ne_bytes());
            put(&mut attr, 32, &(chunk.len() as u32).to_ne_bytes());
            put(&mut attr, 36, &map_fd.to_ne_bytes());
            sys_bpf(BPF_MAP_UPDATE_BATCH, &mut attr).context("BPF_MAP_UPDATE_BATCH")?;
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / n as f64)
}

/// Writes `entries` entries each way (ids 1..=entries, as the agent's
/// backend ids).
pub fn run(entries: usize) -> Result<MapWriteCost> {
    let keys: Vec<u32> = (1..=entries as u32).collect();
    let values: Vec<u8> = (0..entries * VALUE_SIZE).map(|i| i as u8).collect();
    let cases = [
        (
            "hash, no prealloc (sluice)",
            BPF_MAP_TYPE_HASH,
            BPF_F_NO_PREALLOC,
            1,
        ),
        (
            "hash, no prealloc (sluice)",
            BPF_MAP_TYPE_HASH,
            BPF_F_NO_PREALLOC,
            10,
        ),
        (
            "hash, no prealloc (sluice)",
            BPF_MAP_TYPE_HASH,
            BPF_F_NO_PREALLOC,
            1024,
        ),
        ("hash, preallocated", BPF_MAP_TYPE_HASH, 0, 1024),
        ("array", BPF_MAP_TYPE_ARRAY, 0, 1024),
    ];
    let mut out = MapWriteCost {
        entries,
        cases: Vec::new(),
    };
    for (map, map_type, flags, batch) in cases {
        let ns_per_entry = write_all(map_type, flags, batch, &keys, &values)
            .with_context(|| format!("{map}, batches of {batch}"))?;
        out.cases.push(MapWriteCase {
            map: map.to_owned(),
            batch,
            ns_per_entry,
        });
    }
    Ok(out)
}
