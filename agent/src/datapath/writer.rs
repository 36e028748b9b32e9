//! The only code that writes the datapath maps.
//!
//! The reconciler writes through [`MapWrites`]: one entry at a time, put or
//! deleted, in the order it chooses (see `reconcile/frontend.rs` for the
//! ordering that keeps the datapath consistent at every instant).
//! [`MapWriter`] is the real implementation over the pinned maps; the
//! agent's unit tests use a fake that records every write and checks the
//! ordering invariant. The writer writes what it is handed: it builds
//! nothing (Maglev tables come built).

use std::net::IpAddr;

use std::os::fd::AsFd;

use aya::{
    maps::{lpm_trie::Key, IterableMap, MapError},
    sys::SyscallError,
};
use sluice_common::{
    maps as names, socket::MARKS_VALID, Affinity4Key, Affinity6Key, AffinityValue, Backend, Config,
    Ct4Key, Ct6Key, CtEntry, MaglevTable, SockEntry, SockPicks4, SockPicks6, SockRevKey, SrcRange4,
    SrcRange6, Stat, Svc4Key, Svc6Key, SvcValue, SvcnetSummary4,
};

use super::{maps::ServiceKey, read_map_state, sys, DatapathError, Maps, WriteError};
use crate::{
    conntrack::{self, SocketEntries},
    model::Endpoint,
    reconcile::{BackendId, MapState, SourceRange, SvcId},
};

/// One entry to write (insert or overwrite).
#[derive(Clone, Copy, Debug)]
pub enum Entry<'a> {
    Config(&'a Config),
    Backend(BackendId, &'a Backend),
    /// A master entry (slot 0) or a slot of a frontend.
    Service(ServiceKey, &'a SvcValue),
    /// The Maglev table of a frontend (keyed like its master entry).
    Maglev(ServiceKey, &'a MaglevTable),
    SourceRange(SvcId, SourceRange),
    LocalSource(SourceRange),
    LocalIface(u32),
    /// A service CIDR or cluster IP with its `SVCNET_*` kind.
    ServiceNet(SourceRange, u8),
    /// The prefixes covering the IPv4 service address space.
    SvcnetSummary4(&'a SvcnetSummary4),
    /// `sl_sockmark`'s validity word (`sluice_common::socket`).
    SockMarksValid(bool),
    /// An `sl_sock` entry rewritten in place (`BPF_EXIST`): a socket that
    /// closed meanwhile is not brought back, and that is no error.
    Socket(u64, &'a SockEntry),
    /// A frontend's entry in `sl_sockfe4` or `sl_sockfe6`.
    SockPicks(&'a PicksEntry),
}

/// A frontend's entry in `sl_sockfe4`/`sl_sockfe6`
/// (`sluice_common::picks`), keyed like its master entry. (Built one at a
/// time and written at once, never stored in bulk: the variants' sizes,
/// 212 and 416 bytes, cost nothing.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum PicksEntry {
    V4(Svc4Key, SockPicks4),
    V6(Svc6Key, SockPicks6),
}

impl PicksEntry {
    pub fn key(&self) -> ServiceKey {
        match self {
            Self::V4(k, _) => ServiceKey::V4(*k),
            Self::V6(k, _) => ServiceKey::V6(*k),
        }
    }

    /// The service port it names (`SvcValue::svc_id`).
    pub fn svc_id(&self) -> u32 {
        match self {
            Self::V4(_, v) => v.svc_id,
            Self::V6(_, v) => v.svc_id,
        }
    }

    /// The backends it names, in slot order: id and endpoint (at most
    /// the entry's room, whatever its count says).
    pub fn backends(&self) -> Vec<(u32, Endpoint)> {
        let ep = |addr: IpAddr, port| Endpoint { addr, port };
        match self {
            Self::V4(_, v) => v
                .picks
                .iter()
                .take(usize::from(v.count))
                .map(|p| (p.backend_id, ep(IpAddr::from(p.addr), p.port)))
                .collect(),
            Self::V6(_, v) => v
                .picks
                .iter()
                .take(usize::from(v.count))
                .map(|p| (p.backend_id, ep(IpAddr::from(p.addr), p.port)))
                .collect(),
        }
    }
}

/// The key of one entry to delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKey {
    Backend(BackendId),
    Service(ServiceKey),
    Maglev(ServiceKey),
    SourceRange(SvcId, SourceRange),
    LocalSource(SourceRange),
    LocalIface(u32),
    ServiceNet(SourceRange),
    Conntrack4(Ct4Key),
    Conntrack6(Ct6Key),
    Affinity4(Affinity4Key),
    Affinity6(Affinity6Key),
    Socket(u64),
    SockRev(SockRevKey),
    /// A frontend's entry in `sl_sockfe4`/`sl_sockfe6` (by its master key).
    SockPicks(ServiceKey),
}

/// What the reconciler reads of the maps: its state at start-up (adoption)
/// and the flow tables it scans.
pub trait MapReads {
    /// The config entry (all zero before the agent first wrote it).
    fn config(&self) -> Result<Config, DatapathError>;
    /// The service, backend and address maps in the reconciler's terms,
    /// and the service-map keys it cannot interpret.
    fn state(&self) -> Result<(MapState, Vec<ServiceKey>), DatapathError>;
    fn conntrack4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, DatapathError>;
    fn conntrack6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, DatapathError>;
    fn sockets(&self) -> Result<SocketEntries, DatapathError>;
    /// `sl_sockmark`'s counts by slot (without the validity word).
    fn sock_marks(&self) -> Result<Vec<u64>, DatapathError>;
    /// One slot's count of `sl_sockmark`.
    fn sock_mark(&self, slot: u32) -> Result<u64, DatapathError>;
    /// The entry of socket `cookie` in `sl_socktab` or `sl_sock`, if any.
    fn socket(&self, cookie: u64) -> Result<Option<SockEntry>, DatapathError>;
    /// How many `sl_socktab` slots a socket holds.
    fn sock_table_held(&self) -> usize;
    fn affinities4(&self) -> Result<Vec<(Affinity4Key, AffinityValue)>, DatapathError>;
    fn affinities6(&self) -> Result<Vec<(Affinity6Key, AffinityValue)>, DatapathError>;
    /// The sum over CPUs of one datapath counter.
    fn stat(&self, stat: Stat) -> Result<u64, DatapathError>;
    /// Every entry of `sl_sockfe4` and `sl_sockfe6`.
    fn sock_picks(&self) -> Result<Vec<PicksEntry>, DatapathError>;
}

/// The map writes: one entry at a time.
pub trait MapWrites: MapReads {
    fn put(&mut self, entry: Entry<'_>) -> Result<(), WriteError>;
    /// Deletes one entry; a missing one counts as deleted (and is not a
    /// write).
    fn delete(&mut self, key: EntryKey) -> Result<(), WriteError>;
    /// Successful puts and deletions so far.
    fn writes(&self) -> u64;

    /// Puts `entries` in their order, as if one by one (the real writer
    /// hands each run of entries of one map to the kernel in one
    /// `BPF_MAP_UPDATE_BATCH`). On failure: how many went in (every entry
    /// before the one that failed, none after it), and the error.
    fn put_batch(&mut self, entries: &[Entry<'_>]) -> Result<(), (usize, WriteError)> {
        for (i, entry) in entries.iter().enumerate() {
            self.put(*entry).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Puts every entry it can, in order: all in one batch, and after an
    /// entry that fails, the rest as a batch again. The entries that did
    /// not go in, by index (ascending), with their errors; every other one
    /// did.
    fn put_each(&mut self, entries: &[Entry<'_>]) -> Vec<(usize, WriteError)> {
        let mut failed = Vec::new();
        let mut start = 0;
        while start < entries.len() {
            let Err((n, e)) = self.put_batch(&entries[start..]) else {
                break;
            };
            // A count past the batch is taken as the last entry failing:
            // writing an entry again is harmless, a record claiming one
            // the map lacks is not.
            let at = (start + n).min(entries.len() - 1);
            failed.push((at, e));
            start = at + 1;
        }
        failed
    }

    /// Writes the config entry (`sl_config`).
    fn write_config(&mut self, config: &Config) -> Result<(), WriteError> {
        self.put(Entry::Config(config))
    }

    /// Writes words (index, value) of one of the loaded programs' filters
    /// (`sluice_common::filter`), in one batch. These maps belong to the
    /// program generation, not to the pins: not counted in `writes`. On
    /// failure: how many went in, and the error.
    fn put_filter(
        &mut self,
        filter: Filter,
        words: &[(u32, u64)],
    ) -> Result<(), (usize, WriteError)>;
}

/// Which filter of the loaded programs (`sluice_common::filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// `sl_fe_filter`: frontend addresses.
    Frontends,
    /// `sl_port_filter`: backend ports.
    Ports,
}

impl Filter {
    pub fn map_name(self) -> &'static str {
        match self {
            Filter::Frontends => names::FE_FILTER,
            Filter::Ports => names::PORT_FILTER,
        }
    }
}

pub struct MapWriter {
    maps: Maps,
    writes: u64,
}

fn is_missing(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound | MapError::ElementNotFound => true,
        MapError::SyscallError(sys) => sys.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

impl MapWriter {
    pub fn new(maps: Maps) -> Self {
        Self { maps, writes: 0 }
    }

    /// One `BPF_MAP_UPDATE_BATCH` for `entries`, all of `run`'s map.
    fn put_run(&mut self, run: Run, entries: &[Entry<'_>]) -> Result<(), (usize, WriteError)> {
        let (map, fd) = match run {
            Run::Backends => (names::BACKENDS, self.maps.backends.map().fd().as_fd()),
            Run::Services4 => (names::SERVICES_V4, self.maps.services_v4.map().fd().as_fd()),
            Run::Services6 => (names::SERVICES_V6, self.maps.services_v6.map().fd().as_fd()),
            Run::Svcnet4 => (names::SVCNET_V4, self.maps.svcnet_v4.map().fd().as_fd()),
            Run::Svcnet6 => (names::SVCNET_V6, self.maps.svcnet_v6.map().fd().as_fd()),
        };
        let mut keys = Vec::new();
        let mut values = Vec::new();
        for entry in entries {
            pack(entry, &mut keys, &mut values);
        }
        let result = update_batch(map, fd, &keys, &values, entries.len());
        self.writes += result.as_ref().err().map_or(entries.len(), |(n, _)| *n) as u64;
        result
    }

    /// Read access to the maps.
    pub fn maps(&self) -> &Maps {
        &self.maps
    }
}

/// One `BPF_MAP_UPDATE_BATCH` of `count` entries into `map` (`fd`); on
/// failure, how many went in and the error.
fn update_batch(
    map: &'static str,
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[u8],
    values: &[u8],
    count: usize,
) -> Result<(), (usize, WriteError)> {
    sys::map_update_batch(fd, keys, values, count as u32).map_err(|(done, io_error)| {
        let source = MapError::SyscallError(SyscallError {
            call: "bpf_map_update_batch",
            io_error,
        });
        (
            (done as usize).min(count),
            WriteError::from_map(map, source),
        )
    })
}

/// The maps whose runs of entries go to the kernel in one batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    Backends,
    Services4,
    Services6,
    /// The service address space (`sl_svcnet4/6`, LPM tries: a first sync
    /// writes a host route per cluster IP).
    Svcnet4,
    Svcnet6,
}

impl Run {
    fn of(entry: &Entry<'_>) -> Option<Self> {
        match entry {
            Entry::Backend(..) => Some(Run::Backends),
            Entry::Service(ServiceKey::V4(_), _) => Some(Run::Services4),
            Entry::Service(ServiceKey::V6(_), _) => Some(Run::Services6),
            Entry::ServiceNet((IpAddr::V4(_), _), _) => Some(Run::Svcnet4),
            Entry::ServiceNet((IpAddr::V6(_), _), _) => Some(Run::Svcnet6),
            _ => None,
        }
    }
}

/// Appends a batchable entry's key and value bytes (others have none).
fn pack(entry: &Entry<'_>, keys: &mut Vec<u8>, values: &mut Vec<u8>) {
    match entry {
        Entry::Backend(id, b) => {
            keys.extend_from_slice(&id.get().to_ne_bytes());
            values.extend_from_slice(bytes_of(*b));
        }
        Entry::Service(ServiceKey::V4(k), v) => {
            keys.extend_from_slice(bytes_of(k));
            values.extend_from_slice(bytes_of(*v));
        }
        Entry::Service(ServiceKey::V6(k), v) => {
            keys.extend_from_slice(bytes_of(k));
            values.extend_from_slice(bytes_of(*v));
        }
        // An LPM key: the prefix length (`u32`), then the address.
        Entry::ServiceNet((addr, len), kind) => {
            keys.extend_from_slice(&u32::from(*len).to_ne_bytes());
            match addr {
                IpAddr::V4(a) => keys.extend_from_slice(&a.octets()),
                IpAddr::V6(a) => keys.extend_from_slice(&a.octets()),
            }
            values.push(*kind);
        }
        _ => {}
    }
}

/// The bytes of a map key or value (`#[repr(C)]`, padding explicit).
fn bytes_of<T: aya::Pod>(value: &T) -> &[u8] {
    // SAFETY: `T: Pod` is plain old data without implicit padding; the
    // slice covers exactly the value and lives as long as the borrow.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

fn lpm4(net: SourceRange, a: std::net::Ipv4Addr) -> Key<[u8; 4]> {
    Key::new(u32::from(net.1), a.octets())
}

fn lpm6(net: SourceRange, a: std::net::Ipv6Addr) -> Key<[u8; 16]> {
    Key::new(u32::from(net.1), a.octets())
}

fn range4(svc: SvcId, range: SourceRange, a: std::net::Ipv4Addr) -> Key<SrcRange4> {
    Key::new(
        SrcRange4::prefix_len(range.1),
        SrcRange4::new(svc.get(), a.octets()),
    )
}

fn range6(svc: SvcId, range: SourceRange, a: std::net::Ipv6Addr) -> Key<SrcRange6> {
    Key::new(
        SrcRange6::prefix_len(range.1),
        SrcRange6::new(svc.get(), a.octets()),
    )
}

impl MapReads for MapWriter {
    fn config(&self) -> Result<Config, DatapathError> {
        self.maps.config()
    }

    fn state(&self) -> Result<(MapState, Vec<ServiceKey>), DatapathError> {
        read_map_state(&self.maps)
    }

    fn conntrack4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, DatapathError> {
        conntrack::read_all(&self.maps)
    }

    fn conntrack6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, DatapathError> {
        conntrack::read_all6(&self.maps)
    }

    fn sockets(&self) -> Result<SocketEntries, DatapathError> {
        conntrack::read_sockets(&self.maps)
    }

    fn sock_marks(&self) -> Result<Vec<u64>, DatapathError> {
        self.maps.sock_marks()
    }

    fn sock_mark(&self, slot: u32) -> Result<u64, DatapathError> {
        self.maps.sock_mark(slot)
    }

    fn sock_table_held(&self) -> usize {
        self.maps.sock_table.occupied()
    }

    fn socket(&self, cookie: u64) -> Result<Option<SockEntry>, DatapathError> {
        if let Some(e) = self.maps.sock_table.get(cookie) {
            return Ok(Some(e));
        }
        match self.maps.sockets.get(&cookie, 0) {
            Ok(e) => Ok(Some(e)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(source) => Err(DatapathError::Map {
                name: names::SOCKETS,
                source,
            }),
        }
    }

    fn affinities4(&self) -> Result<Vec<(Affinity4Key, AffinityValue)>, DatapathError> {
        conntrack::read_affinities(&self.maps.affinity_v4, names::AFFINITY_V4)
    }

    fn affinities6(&self) -> Result<Vec<(Affinity6Key, AffinityValue)>, DatapathError> {
        conntrack::read_affinities(&self.maps.affinity_v6, names::AFFINITY_V6)
    }

    fn stat(&self, stat: Stat) -> Result<u64, DatapathError> {
        self.maps.stat(stat)
    }

    fn sock_picks(&self) -> Result<Vec<PicksEntry>, DatapathError> {
        self.maps.sock_picks()
    }
}

impl MapWrites for MapWriter {
    fn put(&mut self, entry: Entry<'_>) -> Result<(), WriteError> {
        let m = &mut self.maps;
        let (map, result) = match entry {
            Entry::Config(c) => (names::CONFIG, m.config.set(0, c, 0)),
            Entry::Backend(id, b) => (names::BACKENDS, m.backends.insert(id.get(), b, 0)),
            Entry::Service(ServiceKey::V4(k), v) => {
                (names::SERVICES_V4, m.services_v4.insert(k, v, 0))
            }
            Entry::Service(ServiceKey::V6(k), v) => {
                (names::SERVICES_V6, m.services_v6.insert(k, v, 0))
            }
            Entry::Maglev(ServiceKey::V4(k), t) => (names::MAGLEV_V4, m.maglev_v4.insert(k, t, 0)),
            Entry::Maglev(ServiceKey::V6(k), t) => (names::MAGLEV_V6, m.maglev_v6.insert(k, t, 0)),
            Entry::SourceRange(svc, range) => match range.0 {
                IpAddr::V4(a) => (
                    names::SOURCE_RANGES_V4,
                    m.source_ranges_v4.insert(&range4(svc, range, a), 1, 0),
                ),
                IpAddr::V6(a) => (
                    names::SOURCE_RANGES_V6,
                    m.source_ranges_v6.insert(&range6(svc, range, a), 1, 0),
                ),
            },
            Entry::LocalSource(net) => match net.0 {
                IpAddr::V4(a) => (names::LOCAL_V4, m.local_v4.insert(&lpm4(net, a), 1, 0)),
                IpAddr::V6(a) => (names::LOCAL_V6, m.local_v6.insert(&lpm6(net, a), 1, 0)),
            },
            Entry::LocalIface(ifindex) => (names::LOCAL_IFS, m.local_ifs.insert(ifindex, 1, 0)),
            Entry::ServiceNet(net, kind) => match net.0 {
                IpAddr::V4(a) => (names::SVCNET_V4, m.svcnet_v4.insert(&lpm4(net, a), kind, 0)),
                IpAddr::V6(a) => (names::SVCNET_V6, m.svcnet_v6.insert(&lpm6(net, a), kind, 0)),
            },
            Entry::SvcnetSummary4(summary) => (
                names::SVCNET_SUMMARY_V4,
                m.svcnet_summary_v4.set(0, summary, 0),
            ),
            Entry::SockMarksValid(valid) => {
                let result = m.sock_marks.set(MARKS_VALID, u64::from(valid), 0);
                if result.is_ok() && !valid {
                    // No program takes a slot any more: the table's
                    // sockets go where an older release looks for them.
                    m.move_sock_table();
                }
                (names::SOCK_MARKS, result)
            }
            Entry::Socket(cookie, e) => match m.sockets.insert(cookie, e, sys::EXIST) {
                Err(e) if is_missing(&e) => return Ok(()),
                other => (names::SOCKETS, other),
            },
            Entry::SockPicks(PicksEntry::V4(k, v)) => {
                (names::SOCK_PICKS_V4, m.sock_picks_v4.insert(k, v, 0))
            }
            Entry::SockPicks(PicksEntry::V6(k, v)) => {
                (names::SOCK_PICKS_V6, m.sock_picks_v6.insert(k, v, 0))
            }
        };
        result.map_err(|e| WriteError::from_map(map, e))?;
        self.writes += 1;
        Ok(())
    }

    fn delete(&mut self, key: EntryKey) -> Result<(), WriteError> {
        let m = &mut self.maps;
        let (map, result) = match key {
            EntryKey::Backend(id) => (names::BACKENDS, m.backends.remove(&id.get())),
            EntryKey::Service(ServiceKey::V4(k)) => (names::SERVICES_V4, m.services_v4.remove(&k)),
            EntryKey::Service(ServiceKey::V6(k)) => (names::SERVICES_V6, m.services_v6.remove(&k)),
            EntryKey::Maglev(ServiceKey::V4(k)) => (names::MAGLEV_V4, m.maglev_v4.remove(&k)),
            EntryKey::Maglev(ServiceKey::V6(k)) => (names::MAGLEV_V6, m.maglev_v6.remove(&k)),
            EntryKey::SourceRange(svc, range) => match range.0 {
                IpAddr::V4(a) => (
                    names::SOURCE_RANGES_V4,
                    m.source_ranges_v4.remove(&range4(svc, range, a)),
                ),
                IpAddr::V6(a) => (
                    names::SOURCE_RANGES_V6,
                    m.source_ranges_v6.remove(&range6(svc, range, a)),
                ),
            },
            EntryKey::LocalSource(net) => match net.0 {
                IpAddr::V4(a) => (names::LOCAL_V4, m.local_v4.remove(&lpm4(net, a))),
                IpAddr::V6(a) => (names::LOCAL_V6, m.local_v6.remove(&lpm6(net, a))),
            },
            EntryKey::LocalIface(ifindex) => (names::LOCAL_IFS, m.local_ifs.remove(&ifindex)),
            EntryKey::ServiceNet(net) => match net.0 {
                IpAddr::V4(a) => (names::SVCNET_V4, m.svcnet_v4.remove(&lpm4(net, a))),
                IpAddr::V6(a) => (names::SVCNET_V6, m.svcnet_v6.remove(&lpm6(net, a))),
            },
            EntryKey::Conntrack4(k) => (names::CONNTRACK_V4, m.conntrack_v4.remove(&k)),
            EntryKey::Conntrack6(k) => (names::CONNTRACK_V6, m.conntrack_v6.remove(&k)),
            EntryKey::Affinity4(k) => (names::AFFINITY_V4, m.affinity_v4.remove(&k)),
            EntryKey::Affinity6(k) => (names::AFFINITY_V6, m.affinity_v6.remove(&k)),
            EntryKey::Socket(cookie) => (names::SOCKETS, m.sockets.remove(&cookie)),
            EntryKey::SockRev(k) => (names::SOCK_REV, m.sock_rev.remove(&k)),
            EntryKey::SockPicks(ServiceKey::V4(k)) => {
                (names::SOCK_PICKS_V4, m.sock_picks_v4.remove(&k))
            }
            EntryKey::SockPicks(ServiceKey::V6(k)) => {
                (names::SOCK_PICKS_V6, m.sock_picks_v6.remove(&k))
            }
        };
        match result {
            Ok(()) => {
                self.writes += 1;
                Ok(())
            }
            Err(e) if is_missing(&e) => Ok(()),
            Err(e) => Err(WriteError::from_map(map, e)),
        }
    }

    fn writes(&self) -> u64 {
        self.writes
    }

    fn put_filter(
        &mut self,
        filter: Filter,
        words: &[(u32, u64)],
    ) -> Result<(), (usize, WriteError)> {
        let map = filter.map_name();
        let Some(filters) = &self.maps.filters else {
            return Err((
                0,
                WriteError::Map {
                    map,
                    source: MapError::InvalidName {
                        name: map.to_owned(),
                    },
                },
            ));
        };
        let fd = match filter {
            Filter::Frontends => filters.frontends.map().fd().as_fd(),
            Filter::Ports => filters.ports.map().fd().as_fd(),
        };
        let mut keys = Vec::with_capacity(words.len() * 4);
        let mut values = Vec::with_capacity(words.len() * 8);
        for (index, word) in words {
            keys.extend_from_slice(&index.to_ne_bytes());
            values.extend_from_slice(&word.to_ne_bytes());
        }
        update_batch(map, fd, &keys, &values, words.len())
    }

    fn put_batch(&mut self, entries: &[Entry<'_>]) -> Result<(), (usize, WriteError)> {
        let mut start = 0;
        while start < entries.len() {
            let rest = &entries[start..];
            // A run of entries of one batchable map, or one other entry.
            let (len, result) = match Run::of(&rest[0]) {
                Some(run) => {
                    let len = rest.iter().take_while(|e| Run::of(e) == Some(run)).count();
                    (len, self.put_run(run, &rest[..len]))
                }
                None => (1, self.put(rest[0]).map_err(|e| (0, e))),
            };
            result.map_err(|(done, e)| (start + done, e))?;
            start += len;
        }
        Ok(())
    }
}
