//! The datapath ABI declared once: every pinned map with its key and value
//! sizes, kind, capacity flag, the ABI it appeared in and how an upgrade
//! carries it. The loader, the pin checks, the migration, `sluice status`
//! and the layout lock test (`agent/tests/abi_lock.rs` against
//! `ebpf/sluice-common/abi.lock`) all read this table; the kernel side
//! (`sluice-ebpf/src/maps.rs`) is checked against it by that test.

use core::mem::size_of;

use crate::{
    events::EVENTS_RING_BYTES,
    maps as names,
    stats::{STATS2_MAX, STAT_COUNT},
    Affinity4Key, Affinity6Key, AffinityValue, Backend, Config, Ct4Key, Ct6Key, CtEntry, Frag4Key,
    Frag6Key, FragPorts, MaglevTable, SockEntry, SockPicks4, SockPicks6, SockRevKey, SockRevValue,
    SrcRange4, SrcRange6, Svc4Key, Svc6Key, SvcValue, SvcnetSummary4,
};

/// The kernel map type (`enum bpf_map_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MapKind {
    Hash = 1,
    Array = 2,
    ProgArray = 3,
    PerCpuArray = 6,
    LruHash = 9,
    LpmTrie = 11,
    RingBuf = 27,
}

/// Which `--*-map-size` flag sizes a map, or a fixed capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    Services,
    Backends,
    Conntrack,
    Affinity,
    /// `--maglev-map-size` (Maglev tables, each 64 KiB).
    Maglev,
    Fixed(u32),
}

/// What an upgrade (or rollback, or resize) does with a map's entries
/// when its layout changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// Copied entry by entry, field by field, into the new layout.
    Entries,
    /// Never copied: the programs of one generation fill it for themselves
    /// (the tail-call array), so a new generation gets a fresh one.
    Fresh,
}

/// One pinned map.
#[derive(Clone, Copy, Debug)]
pub struct MapDecl {
    pub name: &'static str,
    pub kind: MapKind,
    pub key_size: usize,
    pub value_size: usize,
    pub capacity: Capacity,
    /// Created with `BPF_F_NO_PREALLOC`.
    pub no_prealloc: bool,
    /// Other creation flags (`BPF_F_MMAPABLE`).
    pub flags: u32,
    /// The ABI version that introduced it.
    pub since_abi: u32,
    pub carry: Carry,
}

const fn decl(
    name: &'static str,
    kind: MapKind,
    key_size: usize,
    value_size: usize,
    capacity: Capacity,
    no_prealloc: bool,
) -> MapDecl {
    MapDecl {
        name,
        kind,
        key_size,
        value_size,
        capacity,
        no_prealloc,
        flags: 0,
        since_abi: 4,
        carry: Carry::Entries,
    }
}

/// `BPF_F_NO_PREALLOC`.
pub const NO_PREALLOC_FLAG: u32 = 1;
/// `BPF_F_MMAPABLE`.
pub const MMAPABLE_FLAG: u32 = 1 << 10;

/// The maps `--preallocate-maps` creates preallocated (their kernel
/// memory taken whole at creation, each write then a copy into a
/// preallocated element instead of an allocation): the ones a first sync
/// fills with an entry per backend and slot.
pub const PREALLOCATABLE: [&str; 3] = [names::SERVICES_V4, names::SERVICES_V6, names::BACKENDS];

/// Every map the agent pins, in the order it creates them. (The per-CPU
/// scratch maps are per program generation and never pinned.)
pub const MAPS: [MapDecl; 30] = [
    decl(
        names::CONFIG,
        MapKind::Array,
        4,
        size_of::<Config>(),
        Capacity::Fixed(1),
        false,
    ),
    decl(
        names::STATS,
        MapKind::PerCpuArray,
        4,
        8,
        Capacity::Fixed(STAT_COUNT),
        false,
    ),
    decl(
        names::BACKENDS,
        MapKind::Hash,
        4,
        size_of::<Backend>(),
        Capacity::Backends,
        true,
    ),
    decl(
        names::SERVICES_V4,
        MapKind::Hash,
        size_of::<Svc4Key>(),
        size_of::<SvcValue>(),
        Capacity::Services,
        true,
    ),
    decl(
        names::CONNTRACK_V4,
        MapKind::LruHash,
        size_of::<Ct4Key>(),
        size_of::<CtEntry>(),
        Capacity::Conntrack,
        false,
    ),
    decl(
        names::SERVICES_V6,
        MapKind::Hash,
        size_of::<Svc6Key>(),
        size_of::<SvcValue>(),
        Capacity::Services,
        true,
    ),
    decl(
        names::CONNTRACK_V6,
        MapKind::LruHash,
        size_of::<Ct6Key>(),
        size_of::<CtEntry>(),
        Capacity::Conntrack,
        false,
    ),
    decl(
        names::AFFINITY_V4,
        MapKind::LruHash,
        size_of::<Affinity4Key>(),
        size_of::<AffinityValue>(),
        Capacity::Affinity,
        false,
    ),
    decl(
        names::SOURCE_RANGES_V4,
        MapKind::LpmTrie,
        4 + size_of::<SrcRange4>(),
        1,
        Capacity::Fixed(names::SOURCE_RANGES_MAX),
        true,
    ),
    decl(
        names::SOCKETS,
        MapKind::LruHash,
        8,
        size_of::<SockEntry>(),
        Capacity::Fixed(names::SOCKETS_MAX),
        false,
    ),
    decl(
        names::SOCK_REV,
        MapKind::LruHash,
        size_of::<SockRevKey>(),
        size_of::<SockRevValue>(),
        Capacity::Fixed(names::SOCKETS_MAX),
        false,
    ),
    decl(
        names::AFFINITY_V6,
        MapKind::LruHash,
        size_of::<Affinity6Key>(),
        size_of::<AffinityValue>(),
        Capacity::Affinity,
        false,
    ),
    decl(
        names::SOURCE_RANGES_V6,
        MapKind::LpmTrie,
        4 + size_of::<SrcRange6>(),
        1,
        Capacity::Fixed(names::SOURCE_RANGES_MAX),
        true,
    ),
    MapDecl {
        carry: Carry::Fresh,
        ..decl(
            names::PROGS,
            MapKind::ProgArray,
            4,
            4,
            Capacity::Fixed(names::PROGS_MAX),
            false,
        )
    },
    decl(
        names::MAGLEV_V4,
        MapKind::Hash,
        size_of::<Svc4Key>(),
        size_of::<MaglevTable>(),
        Capacity::Maglev,
        true,
    ),
    decl(
        names::MAGLEV_V6,
        MapKind::Hash,
        size_of::<Svc6Key>(),
        size_of::<MaglevTable>(),
        Capacity::Maglev,
        true,
    ),
    decl(
        names::LOCAL_V4,
        MapKind::LpmTrie,
        4 + 4,
        1,
        Capacity::Fixed(names::LOCAL_MAX),
        true,
    ),
    decl(
        names::LOCAL_V6,
        MapKind::LpmTrie,
        4 + 16,
        1,
        Capacity::Fixed(names::LOCAL_MAX),
        true,
    ),
    decl(
        names::STATS2,
        MapKind::PerCpuArray,
        4,
        8,
        Capacity::Fixed(STATS2_MAX),
        false,
    ),
    decl(
        names::LOCAL_IFS,
        MapKind::Hash,
        4,
        1,
        Capacity::Fixed(names::LOCAL_IFS_MAX),
        true,
    ),
    decl(
        names::FRAGMENTS_V4,
        MapKind::LruHash,
        size_of::<Frag4Key>(),
        size_of::<FragPorts>(),
        Capacity::Fixed(names::FRAGMENTS_MAX),
        false,
    ),
    decl(
        names::FRAGMENTS_V6,
        MapKind::LruHash,
        size_of::<Frag6Key>(),
        size_of::<FragPorts>(),
        Capacity::Fixed(names::FRAGMENTS_MAX),
        false,
    ),
    decl(
        names::SVCNET_V4,
        MapKind::LpmTrie,
        4 + 4,
        1,
        Capacity::Fixed(names::SVCNET_MAX),
        true,
    ),
    decl(
        names::SVCNET_V6,
        MapKind::LpmTrie,
        4 + 16,
        1,
        Capacity::Fixed(names::SVCNET_MAX),
        true,
    ),
    // A ring buffer has no keys or values (sizes 0); its capacity is bytes.
    // Nothing to copy: a new generation's ring starts empty.
    MapDecl {
        carry: Carry::Fresh,
        ..decl(
            names::EVENTS,
            MapKind::RingBuf,
            0,
            0,
            Capacity::Fixed(EVENTS_RING_BYTES),
            false,
        )
    },
    decl(
        names::SVCNET_SUMMARY_V4,
        MapKind::Array,
        4,
        size_of::<SvcnetSummary4>(),
        Capacity::Fixed(1),
        false,
    ),
    decl(
        names::SOCK_MARKS,
        MapKind::Array,
        4,
        8,
        Capacity::Fixed(names::SOCK_MARK_SLOTS + 1),
        false,
    ),
    MapDecl {
        flags: MMAPABLE_FLAG,
        ..decl(
            names::SOCK_TABLE,
            MapKind::Array,
            4,
            size_of::<crate::SockSlot>(),
            Capacity::Fixed(names::SOCK_TABLE_SLOTS),
            false,
        )
    },
    decl(
        names::SOCK_PICKS_V4,
        MapKind::Hash,
        size_of::<Svc4Key>(),
        size_of::<SockPicks4>(),
        Capacity::Services,
        true,
    ),
    decl(
        names::SOCK_PICKS_V6,
        MapKind::Hash,
        size_of::<Svc6Key>(),
        size_of::<SockPicks6>(),
        Capacity::Services,
        true,
    ),
];

/// The declaration of map `name`.
pub fn find(name: &str) -> Option<&'static MapDecl> {
    let mut i = 0;
    while i < MAPS.len() {
        if same(MAPS[i].name, name) {
            return Some(&MAPS[i]);
        }
        i += 1;
    }
    None
}

/// String equality usable in `const` assertions.
pub const fn same(a: &str, b: &str) -> bool {
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

/// Whether the table names `name` (usable in `const` assertions).
pub const fn declared(name: &str) -> bool {
    let mut i = 0;
    while i < MAPS.len() {
        if same(MAPS[i].name, name) {
            return true;
        }
        i += 1;
    }
    false
}
