//! The map definitions. Names and layouts come from `sluice_common`; the
//! sizes here are defaults that the agent overrides at load time.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use sluice_common::{
    maps as names,
    maps::{DEFAULT_BACKENDS_MAX, DEFAULT_CONNTRACK_MAX, DEFAULT_SERVICES_MAX},
    stats::STAT_COUNT,
    Backend, Config, Ct4Key, CtEntry, Stat, Svc4Key, SvcValue,
};

const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

#[btf_map(name = "sl_svc4")]
pub static SERVICES_V4: HashMap<Svc4Key, SvcValue, { DEFAULT_SERVICES_MAX as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "sl_backends")]
pub static BACKENDS: HashMap<u32, Backend, { DEFAULT_BACKENDS_MAX as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "sl_ct4")]
pub static CONNTRACK_V4: LruHashMap<Ct4Key, CtEntry, { DEFAULT_CONNTRACK_MAX as usize }> =
    LruHashMap::new();

#[btf_map(name = "sl_stats")]
pub static STATS: PerCpuArray<u64, { STAT_COUNT as usize }> = PerCpuArray::new();

#[btf_map(name = "sl_config")]
pub static CONFIG: Array<Config, 1> = Array::new();

// The literal names above must be the ABI's names.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
const _: () = assert!(same("sl_svc4", names::SERVICES_V4));
const _: () = assert!(same("sl_backends", names::BACKENDS));
const _: () = assert!(same("sl_ct4", names::CONNTRACK_V4));
const _: () = assert!(same("sl_stats", names::STATS));
const _: () = assert!(same("sl_config", names::CONFIG));

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn count(stat: Stat) {
    if let Some(p) = STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while we run.
        unsafe { *p += 1 };
    }
}

/// A copy of a frontend entry (master or slot).
#[inline(always)]
pub fn service(key: &Svc4Key) -> Option<SvcValue> {
    // SAFETY: the pointer comes from a successful lookup; we copy at once.
    SERVICES_V4.get_ptr(key).map(|p| unsafe { *p })
}

/// A copy of a backend.
#[inline(always)]
pub fn backend(id: u32) -> Option<Backend> {
    // SAFETY: as above.
    BACKENDS.get_ptr(id).map(|p| unsafe { *p })
}

/// The node's flow-hash seed (0 until the agent writes the config).
#[inline(always)]
pub fn hash_seed() -> u32 {
    // SAFETY: array slot 0 always exists.
    CONFIG
        .get_ptr(0)
        .map(|p| unsafe { (*p).hash_seed })
        .unwrap_or(0)
}
