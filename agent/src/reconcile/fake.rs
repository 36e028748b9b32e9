//! A fake of the datapath maps for the agent's unit tests: it holds what
//! the real maps would, records every write, and checks on every write the
//! invariant the datapath relies on (`frontend.rs`): a slot names an
//! existing backend, a master entry covers only existing slots and flags
//! only an existing Maglev table, a table names only existing backends,
//! a socket programs' entry names only existing active backends of its
//! frontend's service port; removals go in the reverse order; the loaded programs' filters pass
//! every frontend address and backend port the maps hold (once written).
//! A violation panics with the write that broke it.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use sluice_common::{
    filter, picks::takes_picks, service::SVC_F_MAGLEV, Affinity4Key, Affinity6Key, AffinityValue,
    Backend, Config, Ct4Key, Ct6Key, CtEntry, MaglevTable, SockEntry, SockRevKey, Stat, SvcValue,
    SvcnetSummary4,
};

use super::{endpoint_of, BackendId, MapState, SourceRange, SvcId};
use crate::{
    conntrack::SocketEntries,
    datapath::{
        DatapathError, Entry, EntryKey, Filter, MapReads, MapWrites, PicksEntry, ServiceKey,
        WriteError,
    },
    model::{Endpoint, FrontendKey},
};

/// One recorded write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    Config,
    /// `sl_svcnetsum4` (one entry, no key).
    SvcnetSummary,
    /// `sl_sockmark`'s validity word.
    SockMarksValid(bool),
    Put(EntryKey),
    Delete(EntryKey),
}

/// Entries each map holds at most; a put of a new key beyond it fails
/// with `WriteError::Full`, as E2BIG does.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Each of `sl_svc4` and `sl_svc6`.
    pub services: usize,
    pub backends: usize,
    /// Each of `sl_maglev4` and `sl_maglev6`.
    pub maglev: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            services: usize::MAX,
            backends: usize::MAX,
            maglev: usize::MAX,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct FakeMaps {
    pub config: Config,
    pub services: BTreeMap<(FrontendKey, u16), SvcValue>,
    /// Service-map keys of no frontend the agent knows.
    pub foreign: Vec<ServiceKey>,
    pub backends: BTreeMap<BackendId, Backend>,
    pub maglev: BTreeMap<FrontendKey, Vec<BackendId>>,
    /// `sl_sockfe4` and `sl_sockfe6`, by frontend.
    pub picks: BTreeMap<FrontendKey, PicksEntry>,
    pub source_ranges: BTreeSet<(SvcId, SourceRange)>,
    pub local_sources: BTreeSet<SourceRange>,
    pub local_ifaces: BTreeSet<u32>,
    pub service_nets: BTreeMap<SourceRange, u8>,
    pub svcnet_summary_v4: SvcnetSummary4,
    pub conntrack4: Vec<(Ct4Key, CtEntry)>,
    pub conntrack6: Vec<(Ct6Key, CtEntry)>,
    pub sockets: Vec<(u64, SockEntry)>,
    pub sock_revs: Vec<SockRevKey>,
    /// `sl_sockmark`: the counts by slot (empty: all zero) and the
    /// validity word.
    pub sock_marks: Vec<u64>,
    pub sock_marks_valid: bool,
    pub affinities4: Vec<(Affinity4Key, AffinityValue)>,
    pub affinities6: Vec<(Affinity6Key, AffinityValue)>,
    pub stats: BTreeMap<usize, u64>,
    pub limits: Limits,
    /// Every successful write, in order.
    pub log: Vec<Write>,
    /// The write with this index (counting `attempts` from 0) fails once.
    pub fail_at: Option<usize>,
    pub attempts: usize,
    /// The loaded programs' filters: words written (absent: never).
    pub fe_filter: BTreeMap<u32, u64>,
    pub port_filter: BTreeMap<u32, u64>,
    /// Filter words written.
    pub filter_writes: usize,
    /// Every filter write fails (the other writes count `attempts`).
    pub fail_filters: bool,
    /// Every Maglev table write fails.
    pub fail_tables: bool,
    /// The datapath's stores of the config word that land after the next
    /// writes of it, one each (a pod's flow on the TC path that read the
    /// word before the agent's write): the flags it stores.
    pub racing_stores: Vec<u32>,
}

fn frontend_of(key: ServiceKey) -> (FrontendKey, u16) {
    match key.frontend() {
        Some(f) => f,
        None => panic!("service key {key:?} names no frontend the agent knows"),
    }
}

impl FakeMaps {
    pub fn new() -> Self {
        Self::default()
    }

    /// The same maps, as a restarted agent finds them: nothing recorded,
    /// and its programs' filters unwritten.
    pub fn restarted(&self) -> Self {
        Self {
            log: Vec::new(),
            fail_at: None,
            attempts: 0,
            fe_filter: BTreeMap::new(),
            port_filter: BTreeMap::new(),
            filter_writes: 0,
            ..self.clone()
        }
    }

    /// Whether the frontend filter passes `addr` (a word never written
    /// passes everything).
    pub fn filter_passes_addr(&self, addr: IpAddr) -> bool {
        let (w, b) = super::filters::addr_slot(addr);
        filter::passes(self.fe_filter.get(&w).copied().unwrap_or(0), b)
    }

    /// Whether the port filter passes `port`.
    pub fn filter_passes_port(&self, port: u16) -> bool {
        let (w, b) = filter::port_slot(port);
        filter::passes(self.port_filter.get(&w).copied().unwrap_or(0), b)
    }

    /// Checks that every frontend and backend still passes its filter.
    fn check_filters(&self, which: Filter) {
        match which {
            Filter::Frontends => {
                for (fe, _) in self.services.keys() {
                    assert!(
                        self.filter_passes_addr(fe.addr),
                        "frontend filter stops passing {} while {fe} is programmed",
                        fe.addr
                    );
                }
            }
            Filter::Ports => {
                for (id, b) in &self.backends {
                    assert!(
                        self.filter_passes_port(b.port),
                        "port filter stops passing {} while backend {id} is programmed",
                        b.port
                    );
                }
            }
        }
    }

    fn family_count<T>(map: &BTreeMap<(FrontendKey, u16), T>, v6: bool) -> usize {
        map.keys().filter(|(k, _)| k.addr.is_ipv6() == v6).count()
    }

    /// Entries of one family's service map.
    pub fn service_entries(&self, v6: bool) -> usize {
        Self::family_count(&self.services, v6)
    }

    fn check_put(&self, entry: &Entry<'_>) {
        match entry {
            Entry::Backend(id, b) => {
                assert!(
                    self.filter_passes_port(b.port),
                    "backend {id} written before the port filter passes {}",
                    b.port
                );
            }
            Entry::Service(key, value) => {
                let (fe, slot) = frontend_of(*key);
                assert!(
                    self.filter_passes_addr(fe.addr),
                    "{fe} written before the frontend filter passes {}",
                    fe.addr
                );
                if slot > 0 {
                    assert!(
                        self.backends.contains_key(&BackendId(value.backend_id)),
                        "slot {slot} of {fe} names backend {} before it exists",
                        value.backend_id
                    );
                    return;
                }
                for i in 1..=value.total {
                    assert!(
                        self.services.contains_key(&(fe, i)),
                        "master of {fe} covers {} slots before slot {i} exists",
                        value.total
                    );
                }
                if value.flags & SVC_F_MAGLEV != 0 {
                    assert!(
                        self.maglev.contains_key(&fe),
                        "master of {fe} flags a Maglev table before it exists"
                    );
                }
            }
            Entry::Maglev(key, table) => {
                let (fe, _) = frontend_of(*key);
                for id in table.backends.iter().filter(|id| **id != 0) {
                    assert!(
                        self.backends.contains_key(&BackendId(*id)),
                        "Maglev table of {fe} names backend {id} before it exists"
                    );
                }
            }
            Entry::SockPicks(entry) => {
                let (fe, slot) = frontend_of(entry.key());
                assert_eq!(slot, 0, "socket picks of {fe} keyed by a slot");
                for (id, svc, ep) in picks_named(entry) {
                    let b = self.backends.get(&id).unwrap_or_else(|| {
                        panic!("socket picks of {fe} name backend {id} before it exists")
                    });
                    assert!(
                        b.svc_id == svc
                            && b.state == sluice_common::BackendState::Active as u8
                            && endpoint_of(b) == ep,
                        "socket picks of {fe} name backend {id} as active {ep} of service port {svc}, the map holds {b:?}"
                    );
                }
            }
            _ => {}
        }
    }

    fn check_delete(&self, key: &EntryKey) {
        match key {
            EntryKey::Backend(id) => {
                if let Some(((fe, slot), _)) = self
                    .services
                    .iter()
                    .find(|((_, slot), v)| *slot > 0 && BackendId(v.backend_id) == *id)
                {
                    panic!("backend {id} deleted while slot {slot} of {fe} names it");
                }
                if let Some((fe, _)) = self.maglev.iter().find(|(_, t)| t.contains(id)) {
                    panic!("backend {id} deleted while the Maglev table of {fe} names it");
                }
                if let Some((fe, _)) = self
                    .picks
                    .iter()
                    .find(|(_, e)| picks_named(e).any(|(b, _, _)| b == *id))
                {
                    panic!("backend {id} deleted while the socket picks of {fe} name it");
                }
            }
            EntryKey::Service(key) => {
                let (fe, slot) = frontend_of(*key);
                if slot == 0 {
                    return;
                }
                if let Some(master) = self.services.get(&(fe, 0)) {
                    assert!(
                        master.total < slot,
                        "slot {slot} of {fe} deleted while its master covers {}",
                        master.total
                    );
                }
            }
            EntryKey::Maglev(key) => {
                let (fe, _) = frontend_of(*key);
                if let Some(master) = self.services.get(&(fe, 0)) {
                    assert!(
                        master.flags & SVC_F_MAGLEV == 0,
                        "Maglev table of {fe} deleted while its master flags it"
                    );
                }
            }
            _ => {}
        }
    }

    /// Fails the write if it is the one `fail_at` names.
    fn attempt(&mut self, map: &'static str) -> Result<(), WriteError> {
        let n = self.attempts;
        self.attempts += 1;
        if self.fail_at == Some(n) {
            self.fail_at = None;
            return Err(WriteError::Full { map });
        }
        Ok(())
    }

    fn record(entry: &Entry<'_>) -> Write {
        Write::Put(match *entry {
            Entry::Config(_) => return Write::Config,
            Entry::SvcnetSummary4(_) => return Write::SvcnetSummary,
            Entry::SockMarksValid(valid) => return Write::SockMarksValid(valid),
            Entry::Socket(c, _) => EntryKey::Socket(c),
            Entry::Backend(id, _) => EntryKey::Backend(id),
            Entry::Service(k, _) => EntryKey::Service(k),
            Entry::Maglev(k, _) => EntryKey::Maglev(k),
            Entry::SourceRange(svc, r) => EntryKey::SourceRange(svc, r),
            Entry::LocalSource(n) => EntryKey::LocalSource(n),
            Entry::LocalIface(i) => EntryKey::LocalIface(i),
            Entry::ServiceNet(n, _) => EntryKey::ServiceNet(n),
            Entry::SockPicks(e) => EntryKey::SockPicks(e.key()),
        })
    }

    /// Whether the map of `entry` is full for a new key.
    fn full(&self, entry: &Entry<'_>) -> Option<&'static str> {
        use sluice_common::maps as names;
        match entry {
            Entry::Service(key, _) => {
                let (fe, slot) = frontend_of(*key);
                let v6 = fe.addr.is_ipv6();
                (!self.services.contains_key(&(fe, slot))
                    && self.service_entries(v6) >= self.limits.services)
                    .then_some(if v6 {
                        names::SERVICES_V6
                    } else {
                        names::SERVICES_V4
                    })
            }
            Entry::Backend(id, _) => (!self.backends.contains_key(id)
                && self.backends.len() >= self.limits.backends)
                .then_some(names::BACKENDS),
            Entry::Maglev(key, _) => {
                let (fe, _) = frontend_of(*key);
                let v6 = fe.addr.is_ipv6();
                let n = self
                    .maglev
                    .keys()
                    .filter(|k| k.addr.is_ipv6() == v6)
                    .count();
                (!self.maglev.contains_key(&fe) && n >= self.limits.maglev).then_some(if v6 {
                    names::MAGLEV_V6
                } else {
                    names::MAGLEV_V4
                })
            }
            _ => None,
        }
    }

    /// A socket programs' entry gives what the master entry and slots give,
    /// at every write: the master's service port, and its active slots'
    /// backends in slot order (a backend's state may have changed under
    /// both: the caller writes backends first).
    fn check_picks_follow_slots(&self, fe: &FrontendKey) {
        let Some(entry) = self.picks.get(fe) else {
            return;
        };
        let master = self
            .services
            .get(&(*fe, 0))
            .unwrap_or_else(|| panic!("socket picks of {fe} without its master entry"));
        // The datapath takes an entry before the master's flags: one left
        // in place while the master gains affinity, Maglev, source ranges
        // or an internal scope would answer sockets without them.
        assert!(
            takes_picks(master.flags, master.active),
            "socket picks of {fe} beside a master (flags {:#x}, {} active) that takes none",
            master.flags,
            master.active
        );
        let named: Vec<(BackendId, u32)> =
            picks_named(entry).map(|(id, svc, _)| (id, svc)).collect();
        let slots: Vec<(BackendId, u32)> = (1..=master.active)
            .map(|i| {
                let slot = self.services.get(&(*fe, i));
                (BackendId(slot.map_or(0, |s| s.backend_id)), master.svc_id)
            })
            .collect();
        assert_eq!(
            named, slots,
            "socket picks of {fe} differ from its master's active slots"
        );
    }

    /// Puts and deletions recorded, without the config entry and
    /// `sl_sockmark`'s validity word.
    pub fn map_writes(&self) -> Vec<Write> {
        self.log
            .iter()
            .filter(|w| !matches!(w, Write::Config | Write::SockMarksValid(_)))
            .copied()
            .collect()
    }
}

impl MapReads for FakeMaps {
    fn config(&self) -> Result<Config, DatapathError> {
        Ok(self.config)
    }

    fn state(&self) -> Result<(MapState, Vec<ServiceKey>), DatapathError> {
        let mut state = MapState::default();
        for ((fe, slot), v) in &self.services {
            let f = state.frontends.get_or_default(*fe);
            if *slot == 0 {
                f.svc_id = SvcId(v.svc_id);
                f.flags = v.flags;
                f.active = v.active;
                f.fallback = v.fallback;
                f.affinity_s = v.affinity_s;
            } else {
                f.set_slot(usize::from(*slot) - 1, BackendId(v.backend_id));
            }
        }
        state.backends = self.backends.iter().map(|(k, v)| (*k, *v)).collect();
        for (svc, range) in &self.source_ranges {
            state.source_ranges.entry(*svc).or_default().insert(*range);
        }
        state.local_sources = self.local_sources.clone();
        state.local_ifaces = self.local_ifaces.clone();
        state.service_nets = self.service_nets.clone();
        state.svcnet_summary_v4 = self.svcnet_summary_v4;
        // Tables are read back as `read_map_state` reads them: their
        // distinct backends, an unknown one as an endpoint nobody wants.
        for (fe, ids) in &self.maglev {
            let mut members: Vec<_> = ids
                .iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .map(|id| {
                    let ep = self.backends.get(id).map_or(
                        Endpoint {
                            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                            port: 0,
                        },
                        endpoint_of,
                    );
                    (*id, ep)
                })
                .collect();
            members.sort_by_key(|(_, ep)| *ep);
            state.frontends.get_or_default(*fe).maglev = members.into();
        }
        // As `read_map_state`: `sock_picks` is the adoption's to set.
        Ok((state, self.foreign.clone()))
    }

    fn conntrack4(&self) -> Result<Vec<(Ct4Key, CtEntry)>, DatapathError> {
        Ok(self.conntrack4.clone())
    }

    fn conntrack6(&self) -> Result<Vec<(Ct6Key, CtEntry)>, DatapathError> {
        Ok(self.conntrack6.clone())
    }

    fn sockets(&self) -> Result<SocketEntries, DatapathError> {
        Ok((self.sockets.clone(), self.sock_revs.clone()))
    }

    fn sock_mark(&self, slot: u32) -> Result<u64, DatapathError> {
        Ok(self.sock_marks.get(slot as usize).copied().unwrap_or(0))
    }

    fn sock_table_held(&self) -> usize {
        0
    }

    fn socket(&self, cookie: u64) -> Result<Option<SockEntry>, DatapathError> {
        Ok(self
            .sockets
            .iter()
            .find(|(c, _)| *c == cookie)
            .map(|(_, e)| *e))
    }

    fn sock_marks(&self) -> Result<Vec<u64>, DatapathError> {
        let mut marks = self.sock_marks.clone();
        marks.resize(sluice_common::maps::SOCK_MARK_SLOTS as usize, 0);
        Ok(marks)
    }

    fn affinities4(&self) -> Result<Vec<(Affinity4Key, AffinityValue)>, DatapathError> {
        Ok(self.affinities4.clone())
    }

    fn affinities6(&self) -> Result<Vec<(Affinity6Key, AffinityValue)>, DatapathError> {
        Ok(self.affinities6.clone())
    }

    fn stat(&self, stat: Stat) -> Result<u64, DatapathError> {
        Ok(self.stats.get(&(stat as usize)).copied().unwrap_or(0))
    }

    fn sock_picks(&self) -> Result<Vec<PicksEntry>, DatapathError> {
        Ok(self.picks.values().copied().collect())
    }
}

impl MapWrites for FakeMaps {
    fn put_filter(
        &mut self,
        which: Filter,
        words: &[(u32, u64)],
    ) -> Result<(), (usize, WriteError)> {
        for (i, (index, word)) in words.iter().enumerate() {
            if self.fail_filters {
                return Err((
                    i,
                    WriteError::Full {
                        map: which.map_name(),
                    },
                ));
            }
            let map = match which {
                Filter::Frontends => &mut self.fe_filter,
                Filter::Ports => &mut self.port_filter,
            };
            map.insert(*index, *word);
            self.filter_writes += 1;
            self.check_filters(which);
        }
        Ok(())
    }

    fn put(&mut self, entry: Entry<'_>) -> Result<(), WriteError> {
        if let Some(map) = self.full(&entry) {
            return Err(WriteError::Full { map });
        }
        if self.fail_tables && matches!(entry, Entry::Maglev(..)) {
            // Not a full map (that makes the service balance without its
            // table): an I/O error.
            return Err(WriteError::Map {
                map: sluice_common::maps::MAGLEV_V4,
                source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_elem",
                    io_error: std::io::Error::from_raw_os_error(libc::EIO),
                }),
            });
        }
        self.attempt("fake")?;
        self.check_put(&entry);
        self.log.push(Self::record(&entry));
        let touched = match entry {
            Entry::Service(k, _) => Some(frontend_of(k).0),
            Entry::SockPicks(e) => Some(frontend_of(e.key()).0),
            _ => None,
        };
        match entry {
            Entry::Config(c) => {
                self.config = *c;
                if !self.racing_stores.is_empty() {
                    let flags = self.racing_stores.remove(0);
                    self.config.set_flags(flags);
                }
            }
            Entry::Backend(id, b) => {
                self.backends.insert(id, *b);
            }
            Entry::Service(k, v) => {
                self.services.insert(frontend_of(k), *v);
            }
            Entry::Maglev(k, t) => {
                let table: &MaglevTable = t;
                self.maglev
                    .insert(frontend_of(k).0, table.backends.map(BackendId).to_vec());
            }
            Entry::SourceRange(svc, r) => {
                self.source_ranges.insert((svc, r));
            }
            Entry::LocalSource(n) => {
                self.local_sources.insert(n);
            }
            Entry::LocalIface(i) => {
                self.local_ifaces.insert(i);
            }
            Entry::ServiceNet(n, kind) => {
                self.service_nets.insert(n, kind);
            }
            Entry::SvcnetSummary4(summary) => self.svcnet_summary_v4 = *summary,
            Entry::SockMarksValid(valid) => self.sock_marks_valid = valid,
            // In place only: a socket that closed meanwhile stays gone.
            Entry::Socket(c, e) => {
                if let Some(slot) = self.sockets.iter_mut().find(|(x, _)| *x == c) {
                    slot.1 = *e;
                }
            }
            Entry::SockPicks(e) => {
                self.picks.insert(frontend_of(e.key()).0, *e);
            }
        }
        if let Some(fe) = touched {
            self.check_picks_follow_slots(&fe);
        }
        Ok(())
    }

    fn delete(&mut self, key: EntryKey) -> Result<(), WriteError> {
        self.attempt("fake")?;
        self.check_delete(&key);
        let found = match key {
            EntryKey::Backend(id) => self.backends.remove(&id).is_some(),
            EntryKey::Service(k) => match k.frontend() {
                Some(f) => self.services.remove(&f).is_some(),
                None => {
                    let before = self.foreign.len();
                    self.foreign.retain(|f| *f != k);
                    before != self.foreign.len()
                }
            },
            EntryKey::Maglev(k) => self.maglev.remove(&frontend_of(k).0).is_some(),
            EntryKey::SourceRange(svc, r) => self.source_ranges.remove(&(svc, r)),
            EntryKey::LocalSource(n) => self.local_sources.remove(&n),
            EntryKey::LocalIface(i) => self.local_ifaces.remove(&i),
            EntryKey::ServiceNet(n) => self.service_nets.remove(&n).is_some(),
            EntryKey::Conntrack4(k) => remove(&mut self.conntrack4, |(x, _)| *x == k),
            EntryKey::Conntrack6(k) => remove(&mut self.conntrack6, |(x, _)| *x == k),
            EntryKey::Affinity4(k) => remove(&mut self.affinities4, |(x, _)| *x == k),
            EntryKey::Affinity6(k) => remove(&mut self.affinities6, |(x, _)| *x == k),
            EntryKey::Socket(c) => remove(&mut self.sockets, |(x, _)| *x == c),
            EntryKey::SockRev(k) => remove(&mut self.sock_revs, |x| *x == k),
            EntryKey::SockPicks(k) => self.picks.remove(&frontend_of(k).0).is_some(),
        };
        if found {
            self.log.push(Write::Delete(key));
        }
        if let EntryKey::Service(k) = key {
            if let Some((fe, _)) = k.frontend() {
                self.check_picks_follow_slots(&fe);
            }
        }
        Ok(())
    }

    fn writes(&self) -> u64 {
        self.log.len() as u64
    }
}

/// The backends a socket programs' entry names: id, the service port it
/// says they serve, endpoint.
fn picks_named(entry: &PicksEntry) -> impl Iterator<Item = (BackendId, u32, Endpoint)> {
    let svc = entry.svc_id();
    entry
        .backends()
        .into_iter()
        .map(move |(id, ep)| (BackendId(id), svc, ep))
}

fn remove<T>(list: &mut Vec<T>, matches: impl Fn(&T) -> bool) -> bool {
    let before = list.len();
    list.retain(|x| !matches(x));
    before != list.len()
}

/// One frontend in terms free of ids: master fields, then each slot's
/// backend (endpoint, state, whether it belongs to the frontend's service
/// port), then the Maglev table as endpoints.
pub type CanonicalFrontend = (u16, u16, u16, u32, Vec<(Endpoint, u8, bool)>, Vec<Endpoint>);

/// What the maps hold with every id replaced by what it names (service
/// ports by their first frontend), so that two agents that handed out
/// ids in different orders compare equal when they program the same.
#[derive(Debug, PartialEq, Eq)]
pub struct Canonical {
    pub frontends: BTreeMap<FrontendKey, CanonicalFrontend>,
    pub backends: BTreeSet<(Option<FrontendKey>, Endpoint, u8)>,
    pub source_ranges: BTreeSet<(Option<FrontendKey>, SourceRange)>,
    pub local_sources: BTreeSet<SourceRange>,
    pub local_ifaces: BTreeSet<u32>,
    pub service_nets: BTreeMap<SourceRange, u8>,
    /// Each socket programs' entry: the backends it names, in order.
    pub picks: BTreeMap<FrontendKey, Vec<Endpoint>>,
}

impl FakeMaps {
    pub fn canonical(&self) -> Canonical {
        let mut owner: BTreeMap<SvcId, FrontendKey> = BTreeMap::new();
        for ((fe, slot), v) in &self.services {
            if *slot == 0 {
                owner.entry(SvcId(v.svc_id)).or_insert(*fe);
            }
        }
        let ep = |id: &BackendId| self.backends.get(id).map(endpoint_of);
        let mut frontends = BTreeMap::new();
        for ((fe, slot), m) in &self.services {
            if *slot != 0 {
                continue;
            }
            let slots = (1..=m.total)
                .filter_map(|i| self.services.get(&(*fe, i)))
                .filter_map(|s| {
                    let b = self.backends.get(&BackendId(s.backend_id))?;
                    Some((endpoint_of(b), b.state, b.svc_id == m.svc_id))
                })
                .collect();
            let table = self
                .maglev
                .get(fe)
                .map(|t| t.iter().filter_map(ep).collect())
                .unwrap_or_default();
            frontends.insert(
                *fe,
                (m.flags, m.active, m.fallback, m.affinity_s, slots, table),
            );
        }
        Canonical {
            frontends,
            backends: self
                .backends
                .values()
                .map(|b| (owner.get(&SvcId::of(b)).copied(), endpoint_of(b), b.state))
                .collect(),
            source_ranges: self
                .source_ranges
                .iter()
                .map(|(svc, r)| (owner.get(svc).copied(), *r))
                .collect(),
            local_sources: self.local_sources.clone(),
            local_ifaces: self.local_ifaces.clone(),
            service_nets: self.service_nets.clone(),
            picks: self
                .picks
                .iter()
                .map(|(fe, e)| (*fe, picks_named(e).map(|(_, _, ep)| ep).collect()))
                .collect(),
        }
    }

    /// Whether the socket programs' entries are exactly those the service
    /// maps give (`picks::entry` of each frontend's master and slots), or
    /// none when they are off (`on`: `Reconciler::sock_picks`).
    pub fn picks_match_services(&self, on: bool) -> Result<(), String> {
        let (state, _) = self.state().map_err(|e| e.to_string())?;
        let mut want = BTreeMap::new();
        for (fe, record) in state.frontends.iter().filter(|_| on) {
            if let Some(e) = super::picks::entry(&fe, record, &state.backends) {
                want.insert(fe, e);
            }
        }
        if want == self.picks {
            return Ok(());
        }
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !self.picks.contains_key(k))
            .collect();
        let extra: Vec<_> = self
            .picks
            .keys()
            .filter(|k| !want.contains_key(k))
            .collect();
        let differ: Vec<_> = want
            .iter()
            .filter(|(k, e)| self.picks.get(k).is_some_and(|p| p != *e))
            .map(|(k, _)| k)
            .collect();
        Err(format!(
            "socket picks: missing {missing:?}, extra {extra:?}, different {differ:?}"
        ))
    }
}
