//! The reconciler: the single owner of the datapath maps.
//!
//! It keeps an exact record of what is programmed (read back from the
//! pinned maps when it starts, so a restarted agent adopts its
//! predecessor's state) and works one service port (a "unit": its
//! frontends and its backends) at a time: plan what the unit's entries
//! should be (`plan.rs`, pure), check the maps have room, and write only
//! the difference, in an order that never lets a packet see a slot without
//! its backend. A change to one service costs work proportional to that
//! service; an unchanged desired state costs no syscall at all.

mod backends;
mod drain;
#[cfg(test)]
pub(crate) mod fake;
mod filters;
mod frontend;
mod frontend_table;
mod id_list;
mod ids;
pub mod maglev;
mod picks;
mod plan;
pub mod pods;
mod state;
#[cfg(test)]
mod tests;
mod units;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::{Duration, Instant},
};

pub use backends::{BackendLookup, BackendTable};
pub use drain::{drains, Drain, FlowCounts};
pub use ids::{BackendId, SvcId};
pub use plan::{endpoint_of, Refusal, UnitPlan};
pub use state::{FrontendState, MaglevMembers, MapState, SourceRange};
use tracing::{debug, info, warn};

use crate::{
    conntrack,
    datapath::{
        DatapathError, Entry, EntryKey, MapReads, MapSizes, MapWriter, MapWrites, Occupancy,
        PicksEntry, ServiceKey, WriteError,
    },
    model::{DesiredState, FrontendKey, ServicePortName},
};
use filters::Filters;
use ids::Ids;
use pods::PodFlows;
use sluice_common::{
    config::{CFG_F_PODS_ON_SOCKETS, CFG_F_SOCK_PICKS},
    maps::{self as names, MAX_SLOTS, SVCNET_CIDR, SVCNET_CLUSTER_IP},
    Backend, Config, Ct4Key, Ct6Key, SvcnetSummary4, ABI_VERSION,
};
use units::Units;

/// Entries the maps can hold.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// Entries of each service map (`sl_svc4`, and `sl_svc6` alike:
    /// masters plus slots).
    pub service_entries: usize,
    pub backends: usize,
    /// Maglev tables of each table map (`sl_maglev4`, and `sl_maglev6`).
    pub maglev_tables: usize,
}

/// Which service ports a reconcile looks at, and what the desired state
/// handed to it holds.
///
/// With `All` the desired state is complete. The other scopes take a
/// partial one, so that the caller never holds every service's
/// translation at once: it must hold every desired service port of the
/// scope's set (one it lacks is no longer desired), and for `Changed`
/// and `Sweep` every one of [`Reconciler::wanted`] that is still desired
/// (one it lacks is left for a later reconcile).
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every desired and every programmed service port (start-up, resyncs).
    All,
    /// Only these (changed) service ports, plus those whose draining
    /// backends may now go and those waiting for room.
    Changed(&'a BTreeSet<ServicePortName>),
    /// One part of a full reconcile done in parts: only these service
    /// ports. The service address space, the filters' clearing, draining
    /// backends and units nobody desires wait for the `Sweep`.
    Part(&'a BTreeSet<ServicePortName>),
    /// The end of a full reconcile done in `Part`s: these service ports
    /// (those held but no longer desired, and the wanted ones), then every
    /// unit nobody desires, the service address space and the filters, as
    /// `All` does.
    Sweep(&'a BTreeSet<ServicePortName>),
}

impl Scope<'_> {
    /// Whether this reconcile ends a full one: every unit nobody desires
    /// goes, the service address space is compared whole, the filters are
    /// rewritten.
    fn ends_full(&self) -> bool {
        matches!(self, Scope::All | Scope::Sweep(_))
    }
}

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct Report {
    /// Map updates and deletions issued.
    pub writes: u64,
    /// Service ports refused in this reconcile.
    pub refused: Vec<(ServicePortName, Refusal)>,
    pub errors: Vec<WriteError>,
    pub backends_removed: usize,
    /// Service ports balanced without their Maglev tables in this
    /// reconcile because the table maps are full.
    pub maglev_fallback: Vec<ServicePortName>,
    /// Cluster IPs left out of a full `sl_svcnet4/6` (not an error: see
    /// `sync_service_nets`).
    pub service_nets_left_out: usize,
}

impl Report {
    /// Adds what another reconcile did (the parts of a full one).
    pub fn add(&mut self, other: Report) {
        self.writes += other.writes;
        self.refused.extend(other.refused);
        self.errors.extend(other.errors);
        self.backends_removed += other.backends_removed;
        self.maglev_fallback.extend(other.maglev_fallback);
        self.service_nets_left_out += other.service_nets_left_out;
    }
}

/// What one conntrack scan did.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// Entries read: both conntrack maps, and each.
    pub entries: usize,
    pub entries_v4: usize,
    pub entries_v6: usize,
    /// `sl_socktab` slots a socket holds.
    pub sock_table: usize,
    pub deleted: usize,
    pub errors: Vec<WriteError>,
    pub took: Duration,
}

pub struct Reconciler<W = MapWriter> {
    writer: W,
    programmed: MapState,
    /// Per service-port id: its live holder, the frontends it claimed, and
    /// the frontends and backends the maps hold under the id (`SvcId(0)`
    /// for frontends whose master entry is missing).
    units: Units,
    /// Service-map entries in `programmed`, per family.
    service_entries: FamilyCount,
    /// Maglev tables in `programmed`, per family.
    maglev_tables: FamilyCount,
    /// Service ports that asked for Maglev but got the flow hash, for want
    /// of room in the table maps.
    maglev_fallback: BTreeSet<ServicePortName>,
    /// Frontends a desired service port claims whose master entry is not
    /// recorded under that port's id: before its first write, while it is
    /// refused for want of room, after a failed write. Every other claim
    /// is read from the record (the frontend's `svc_id`, and that unit's
    /// claimed frontends: see `owner`), where a map of every claim held
    /// 4.3 MB at 100,000 service ports (issue 17).
    claims_aside: crate::fast_hash::HashMap<FrontendKey, ServicePortName>,
    refused: BTreeMap<ServicePortName, Refusal>,
    foreign: Vec<ServiceKey>,
    ids: Ids,
    drain: Drain,
    capacity: Capacity,
    /// `DesiredState::nets_version` that `sl_svcnet4/6` were last brought
    /// to without error (the comparison walks every cluster IP: skipped
    /// while the version stays).
    nets_synced: Option<u64>,
    /// Cluster IPs left out of a full `sl_svcnet4/6` (reported once).
    nets_left_out: usize,
    /// What the loaded programs' filters hold.
    filters: Filters,
    /// Programmed frontends the socket programs leave to the TC path for
    /// pods (`pods::left_to_tc`).
    left_to_tc: usize,
    /// `CFG_F_PODS_ON_SOCKETS` as written (see `pods.rs`).
    pods: PodFlows<Ct4Key, Ct6Key>,
    /// Whether this agent found `sl_sockmark`'s counts complete and wrote
    /// its validity word (the loader clears it at every start).
    marks_valid: bool,
    /// Whether frontends get their `sl_sockfe4`/`sl_sockfe6` entries: not
    /// under `--socket-lb=off`, where no socket program reads them.
    sock_picks: bool,
    /// Entries adoption found stale, for `start_picks` to delete.
    stale_picks: Vec<ServiceKey>,
}

/// Service-map entries per address family (`sl_svc4`, `sl_svc6`).
#[derive(Clone, Copy, Debug, Default)]
struct FamilyCount {
    v4: usize,
    v6: usize,
}

impl FamilyCount {
    fn slot(&mut self, key: &FrontendKey) -> &mut usize {
        if key.addr.is_ipv6() {
            &mut self.v6
        } else {
            &mut self.v4
        }
    }

    fn add(&mut self, key: &FrontendKey, n: usize) {
        *self.slot(key) += n;
    }

    fn sub(&mut self, key: &FrontendKey, n: usize) {
        let slot = self.slot(key);
        *slot = slot.saturating_sub(n);
    }
}

/// The entry, and the key, of one member of a set-like map.
type Member<T> = (fn(T) -> Entry<'static>, fn(T) -> EntryKey);

/// Brings a map that holds a set of keys from `have` (what it holds, kept
/// up to date write by write) to `want`, with `entry` and `key_of` making
/// the entry to put and the key to delete: the new keys first, then the
/// stale ones.
fn sync_set<T: Ord + Copy, W: MapWrites>(
    writer: &mut W,
    have: &mut BTreeSet<T>,
    want: &BTreeSet<T>,
    (entry, key_of): Member<T>,
    report: &mut Report,
) {
    if have == want {
        return;
    }
    for key in want.difference(&have.clone()) {
        match writer.put(entry(*key)) {
            Ok(()) => {
                have.insert(*key);
            }
            Err(e) => report.errors.push(e),
        }
    }
    let stale: Vec<T> = have.difference(want).copied().collect();
    for key in stale {
        match writer.delete(key_of(key)) {
            Ok(()) => {
                have.remove(&key);
            }
            Err(e) => report.errors.push(e),
        }
    }
}

fn random_seed() -> u32 {
    let mut buf = [0u8; 4];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == 4 {
        u32::from_ne_bytes(buf)
    } else {
        // Not secret, only unpredictable enough to spread clients.
        conntrack::monotonic_ns() as u32 ^ std::process::id()
    }
}

/// Service nets added in one reconcile above which they join their
/// record in full B-tree nodes (`BTreeMap::append`), not one by one.
const COMPACT_AFTER: usize = 4096;

/// Service nets written in one `bpf()` call.
const NETS_BATCH: usize = 1024;

/// The bits of `Config::flags` that belong to socket-level balancing.
/// The socket-balancing bits `set_socket_lb` writes (`CFG_F_PODS_ON_SOCKETS`
/// is `pods.rs`'s, `CFG_F_SOCK_PICKS` the adoption's).
const CFG_SOCK_MASK: u32 = 0x0000_ff00 & !CFG_F_PODS_ON_SOCKETS & !CFG_F_SOCK_PICKS;

/// Marks each adopted frontend whose `sl_sockfe4`/`sl_sockfe6` entry is the
/// one its record gives (`picks::entry`) and returns the keys of every
/// other entry: an entry of a frontend the maps no longer hold, or one a
/// release that does not keep these maps left behind while it changed
/// the frontend (a rollback to 0.1.0, then an upgrade again).
fn adopt_picks(
    reads: &impl MapReads,
    programmed: &mut MapState,
) -> Result<Vec<ServiceKey>, DatapathError> {
    let mut stale = Vec::new();
    for entry in reads.sock_picks()? {
        let key = entry.key();
        let frontend = key
            .frontend()
            .filter(|(fe, slot)| {
                *slot == 0
                    && programmed.frontends.get(fe).is_some_and(|state| {
                        picks::entry(fe, state, &programmed.backends) == Some(entry)
                    })
            })
            .map(|(fe, _)| fe);
        match frontend.and_then(|fe| programmed.frontends.get_mut(&fe)) {
            Some(state) => state.sock_picks = true,
            None => stale.push(key),
        }
    }
    Ok(stale)
}

/// What an agent starting on `reads` adopts (for the tests' comparisons of
/// the record with the maps): their state, with the frontends whose
/// socket entries it keeps marked.
#[cfg(test)]
pub(crate) fn adopted_state(reads: &impl MapReads) -> Result<MapState, DatapathError> {
    let (mut state, _) = reads.state()?;
    adopt_picks(reads, &mut state)?;
    Ok(state)
}

impl<W: MapWrites> Reconciler<W> {
    /// Adopts what the maps hold now and makes sure the config entry is set,
    /// with the socket programs' one-lookup entries (`picks.rs`).
    pub fn new(
        writer: W,
        sizes: &MapSizes,
        drain_timeout: Duration,
    ) -> Result<Self, DatapathError> {
        Self::with_sock_picks(writer, sizes, drain_timeout, true)
    }

    /// `new`, with the frontends' `sl_sockfe4`/`sl_sockfe6` entries kept
    /// (`sock_picks`) or not: without socket-level balancing
    /// (`--socket-lb=off`) no program reads them, so the entries an earlier
    /// agent wrote go at start-up and none is written (the memory and the
    /// writes of one per frontend).
    pub fn with_sock_picks(
        mut writer: W,
        sizes: &MapSizes,
        drain_timeout: Duration,
        sock_picks: bool,
    ) -> Result<Self, DatapathError> {
        let config = writer.config()?;
        if config.abi_version != ABI_VERSION {
            // First start (all zero), or pins another release wrote and this
            // one migrated: the seed and the rest are kept.
            let fresh = config.abi_version == 0;
            writer.write_config(&Config {
                abi_version: ABI_VERSION,
                hash_seed: if fresh {
                    random_seed()
                } else {
                    config.hash_seed
                },
                snat_port_min: if fresh {
                    sluice_common::config::SNAT_PORT_MIN
                } else {
                    config.snat_port_min
                },
                snat_port_max: if fresh {
                    sluice_common::config::SNAT_PORT_MAX
                } else {
                    config.snat_port_max
                },
                _pad: config.flags(),
                netns_cookie: config.netns_cookie,
            })?;
        }
        let (mut programmed, foreign) = writer.state()?;
        let stale_picks = if sock_picks {
            adopt_picks(&writer, &mut programmed)?
        } else {
            writer.sock_picks()?.iter().map(PicksEntry::key).collect()
        };
        let ids = Ids::adopt(&programmed);
        let mut r = Self {
            writer,
            programmed: MapState::default(),
            units: Units::default(),
            service_entries: FamilyCount::default(),
            maglev_tables: FamilyCount::default(),
            maglev_fallback: BTreeSet::new(),
            claims_aside: Default::default(),
            refused: BTreeMap::new(),
            foreign,
            ids,
            drain: Drain::new(drain_timeout),
            capacity: Capacity {
                service_entries: sizes.services as usize,
                backends: sizes.backends as usize,
                maglev_tables: sizes.maglev as usize,
            },
            nets_synced: None,
            nets_left_out: 0,
            filters: Filters::new(),
            left_to_tc: 0,
            pods: PodFlows::new(),
            marks_valid: false,
            sock_picks,
            stale_picks: Vec::new(),
        };
        // Each unit's backends indexed at once (one slice per unit).
        r.units.index_backends(
            programmed
                .backends
                .iter()
                .map(|(id, b)| (SvcId::of(&b), id))
                .collect(),
        );
        r.programmed.backends = programmed.backends;
        for (key, fe) in programmed.frontends {
            r.set_frontend(key, fe);
        }
        r.programmed.source_ranges = programmed.source_ranges;
        r.programmed.local_sources = programmed.local_sources;
        r.programmed.local_ifaces = programmed.local_ifaces;
        r.programmed.service_nets = programmed.service_nets;
        r.programmed.svcnet_summary_v4 = programmed.svcnet_summary_v4;
        // Before the programs are attached: from their first packet the
        // filters pass every frontend and backend the maps hold. A filter
        // that could not be written passes everything (and costs only the
        // lookups it would have saved); the next full reconcile retries.
        if let Err(e) = r.filters.fill(&mut r.writer, &r.programmed) {
            warn!(error = %e, "datapath filters not written: every packet takes the service lookups");
        }
        // The socket programs read no `sl_sockfe4`/`sl_sockfe6` entry until
        // the sync task starts (`start_picks`): an agent that fails before
        // then leaves the bit clear, as a clean stop does (the bit costs
        // a write only after an agent that did not stop cleanly).
        r.stale_picks = stale_picks;
        r.clear_picks_bit(false)?;
        Ok(r)
    }

    /// As the sync task starts, once every pinned link runs this build's
    /// programs and a migration of the pins has finished (its late copy
    /// would bring back what is deleted before): deletes the socket
    /// programs' entries that adoption found stale (every entry with
    /// `--socket-lb=off`), then lets the programs read
    /// `sl_sockfe4`/`sl_sockfe6` (`CFG_F_SOCK_PICKS`), which `new` left
    /// clear: without the bit they make the general lookups only, which
    /// are right whatever these maps hold. A delete that fails leaves the
    /// bit clear for this agent's life (with a warning).
    pub fn start_picks(&mut self) -> Result<(), DatapathError> {
        let stale = std::mem::take(&mut self.stale_picks);
        if !stale.is_empty() {
            if self.sock_picks {
                info!(entries = stale.len(), "deleting socket pick entries that disagree with the service maps (a release that does not keep them ran, or an agent stopped mid-write)");
            } else {
                info!(
                    entries = stale.len(),
                    "deleting the socket programs' one-lookup entries (--socket-lb=off)"
                );
            }
        }
        for key in stale {
            if let Err(e) = self.writer.delete(EntryKey::SockPicks(key)) {
                warn!(error = %e, "an sl_sockfe4/sl_sockfe6 entry could not be deleted: sockets take the general lookups until the next start");
                return Ok(());
            }
        }
        if !self.sock_picks {
            return Ok(());
        }
        if let Err(e) = self.write_flags_after_start(CFG_F_SOCK_PICKS, CFG_F_SOCK_PICKS) {
            warn!(error = %e, "the socket programs' one-lookup entries could not be turned on: sockets take the general lookups");
        }
        Ok(())
    }

    /// Stops the socket programs reading `sl_sockfe4`/`sl_sockfe6`, as the
    /// agent stops: the next agent may be one that does not keep them (a
    /// rollback to 0.1.0) while this build's programs are still attached.
    pub fn stop_picks(&mut self) -> Result<(), DatapathError> {
        self.clear_picks_bit(true)
    }

    /// Clears `CFG_F_SOCK_PICKS`. The datapath stores the config word too
    /// (a pod's flow on the TC path clears `CFG_F_PODS_ON_SOCKETS`, reading
    /// and writing the whole word): a store that read the word before this
    /// write and lands after it would set the bit again, so the word is
    /// read back until it holds. `pods_settled`: the pods' bit is this
    /// agent's to keep right (`write_flags_after_start`); before that,
    /// `allow_pods_on_sockets` reads conntrack after every earlier write.
    fn clear_picks_bit(&mut self, pods_settled: bool) -> Result<(), DatapathError> {
        for _ in 0..3 {
            if pods_settled {
                self.write_flags_after_start(CFG_F_SOCK_PICKS, 0)?;
            } else {
                self.set_config_flags(CFG_F_SOCK_PICKS, 0)?;
            }
            if self.writer.config()?.flags() & CFG_F_SOCK_PICKS == 0 {
                std::thread::sleep(Duration::from_millis(1));
                if self.writer.config()?.flags() & CFG_F_SOCK_PICKS == 0 {
                    return Ok(());
                }
            }
        }
        Err(DatapathError::BitReturns("CFG_F_SOCK_PICKS"))
    }

    /// `set_config_flags` once the datapath runs with the pods' bit
    /// settled (`allow_pods_on_sockets`): a pod's flow that began between
    /// the read and the write had its clearing of `CFG_F_PODS_ON_SOCKETS`
    /// overwritten, so with the bit kept set conntrack is read once more
    /// and the bit goes if a pod's flow is there (also when the read
    /// fails), as `set_pods_bit` does.
    fn write_flags_after_start(&mut self, mask: u32, bits: u32) -> Result<(), DatapathError> {
        let written = self.write_config_flags(mask, bits)?;
        if written.is_some_and(|f| f & CFG_F_PODS_ON_SOCKETS != 0)
            && self.pod_flows_in_maps().unwrap_or(true)
        {
            self.write_pods_bit(pods::Action::Clear)?;
        }
        Ok(())
    }

    /// Sets what the socket-level programs serve: the node's network
    /// namespace (`cookie`, 0: none) and the socket-balancing bits of
    /// `Config::flags` (`CFG_F_SOCK_*`, bits 8-15; the others are kept).
    /// Written only when something changes, so a restart writes nothing.
    pub fn set_socket_lb(&mut self, cookie: u64, sock_flags: u32) -> Result<(), DatapathError> {
        let mut config = self.writer.config()?;
        let flags = (config.flags() & !CFG_SOCK_MASK) | (sock_flags & CFG_SOCK_MASK);
        if config.netns_cookie == cookie && config.flags() == flags {
            return Ok(());
        }
        config.netns_cookie = cookie;
        config.set_flags(flags);
        self.writer
            .write_config(&config)
            .map_err(DatapathError::from)
    }

    /// Whether `CFG_F_PODS_ON_SOCKETS` may be set: the socket programs serve
    /// every pod of the node and some device is a pod's (`pods.rs`); `kept`:
    /// a set bit is still true (the pods' devices run `sl_egress_pod`, so no
    /// other agent ran since it was set). A bit set that may not be, is not
    /// kept, or while a frontend is left to the TC path, is cleared now;
    /// else the conntrack scans set it when they may.
    pub fn allow_pods_on_sockets(
        &mut self,
        allowed: bool,
        kept: bool,
    ) -> Result<(), DatapathError> {
        let set = self.pods_bit_in_map()?;
        let mut action = self.pods.start(allowed, set, kept, self.left_to_tc);
        // A kept bit holds unless a pod's flow on the TC path lives (one
        // that began while a write of the config raced the datapath's).
        if set && action == pods::Action::None && self.pod_flows_in_maps()? {
            action = pods::Action::Clear;
        }
        self.write_pods_bit(action).map_err(DatapathError::from)
    }

    /// Sets `CFG_F_PODS_ON_SOCKETS`, then reads conntrack once more: a pod's
    /// flow that began between the scan's read and the write found the bit
    /// clear and did not take it away, so the bit goes again (also when
    /// the read fails).
    fn set_pods_bit(&mut self, report: &mut ScanReport) {
        if let Err(e) = self.write_pods_bit(pods::Action::Set) {
            report.errors.push(e);
            return;
        }
        if self.pod_flows_in_maps().unwrap_or(true) {
            if let Err(e) = self.write_pods_bit(pods::Action::Clear) {
                report.errors.push(e);
            }
        } else {
            info!("every pod's flows are the socket programs': the pods' devices pass replies without a look");
        }
    }

    /// Whether the config map holds `CFG_F_PODS_ON_SOCKETS` set.
    fn pods_bit_in_map(&self) -> Result<bool, DatapathError> {
        Ok(self.writer.config()?.flags() & CFG_F_PODS_ON_SOCKETS != 0)
    }

    /// Whether conntrack holds a pod's flow on the TC path (`pods::pod_flows`).
    fn pod_flows_in_maps(&self) -> Result<bool, DatapathError> {
        Ok(pods::pod_flows(&self.writer.conntrack4()?)
            || pods::pod_flows(&self.writer.conntrack6()?))
    }

    /// Whether `CFG_F_PODS_ON_SOCKETS` is set.
    pub fn pods_on_sockets(&self) -> bool {
        self.pods.is_set()
    }

    /// Writes `CFG_F_PODS_ON_SOCKETS` as `action` says, and records it.
    fn write_pods_bit(&mut self, action: pods::Action) -> Result<(), WriteError> {
        let bits = match action {
            pods::Action::None => return Ok(()),
            pods::Action::Set => CFG_F_PODS_ON_SOCKETS,
            pods::Action::Clear => 0,
        };
        let mut config = self.writer.config().map_err(|e| WriteError::Map {
            map: names::CONFIG,
            source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_lookup_elem",
                io_error: std::io::Error::other(e),
            }),
        })?;
        config.set_flags((config.flags() & !CFG_F_PODS_ON_SOCKETS) | bits);
        self.writer.write_config(&config)?;
        self.pods.written(action);
        if action == pods::Action::Clear {
            info!("the pods' devices look at replies again: a frontend is left to the TC path for pods, or pods' sockets are not all balanced");
        }
        Ok(())
    }

    /// Writes `sl_sockmark`'s validity word once its counts are complete
    /// (`conntrack::marks_shortfall`): from then on a closing TCP socket
    /// whose slot counts none skips the `sl_sock` lookup. Until then
    /// (after an upgrade from 0.1.0, while a socket it balanced lives)
    /// every release looks. The counts are read before the entries, so a
    /// slot falls short only of a socket that connected between the two
    /// reads (or of a copy that lost an update): such a slot's count is
    /// read again, then its cookies looked up again, and a socket closed
    /// meanwhile is not held against it.
    fn validate_sock_marks(&mut self, report: &mut ScanReport) {
        match self.sock_marks_complete() {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                debug!(error = %e, "sl_sockmark unread: its counts stay untrusted");
                return;
            }
        }
        match self.writer.put(Entry::SockMarksValid(true)) {
            Ok(()) => {
                self.marks_valid = true;
                debug!("sl_sockmark counts every TCP socket: releases of sockets never balanced skip the sl_sock lookup");
            }
            Err(e) => report.errors.push(e),
        }
    }

    /// Whether `sl_sockmark`'s counts hold every TCP socket of `sl_sock`
    /// (see `validate_sock_marks`).
    fn sock_marks_complete(&self) -> Result<bool, DatapathError> {
        let marks = self.writer.sock_marks()?;
        let (sockets, _) = self.writer.sockets()?;
        let Some(short) = conntrack::marks_shortfall(&sockets, &marks) else {
            debug!("a TCP socket of sl_sock is not counted in sl_sockmark: every socket release looks it up until it closes");
            return Ok(false);
        };
        for (slot, cookies) in short {
            let count = self.writer.sock_mark(slot)?;
            let mut held = 0u64;
            for cookie in cookies {
                if self.writer.socket(cookie)?.is_some() {
                    held += 1;
                }
            }
            if count < held {
                debug!(slot, count, held, "an sl_sockmark slot counts fewer sockets than sl_sock holds: its counts stay untrusted");
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Takes `sl_sockmark`'s validity away, as the agent stops: the next
    /// agent may be one that does not count (a rollback to 0.1.0, whose
    /// connect programs write uncounted entries while this build's release
    /// program is still attached), and it validates them again itself.
    pub fn distrust_sock_marks(&mut self) -> Result<(), WriteError> {
        self.writer.put(Entry::SockMarksValid(false))?;
        self.marks_valid = false;
        Ok(())
    }

    /// Sets the bits of `Config::flags` under `mask` to `bits` (written only
    /// when they change, so a restart with the same flags writes nothing).
    pub fn set_config_flags(&mut self, mask: u32, bits: u32) -> Result<(), DatapathError> {
        self.write_config_flags(mask, bits).map(|_| ())
    }

    /// `set_config_flags`, returning the flags it wrote (`None`: they were
    /// already so, nothing written).
    fn write_config_flags(&mut self, mask: u32, bits: u32) -> Result<Option<u32>, DatapathError> {
        let mut config = self.writer.config()?;
        let flags = (config.flags() & !mask) | (bits & mask);
        if config.flags() == flags {
            return Ok(None);
        }
        config.set_flags(flags);
        self.writer.write_config(&config)?;
        Ok(Some(flags))
    }

    /// What the maps hold.
    pub fn programmed(&self) -> &MapState {
        &self.programmed
    }

    /// Service ports currently refused, and why.
    pub fn refused(&self) -> &BTreeMap<ServicePortName, Refusal> {
        &self.refused
    }

    /// Backends waiting for their flows to end.
    pub fn draining(&self) -> usize {
        self.drain.pending()
    }

    /// Live flows per backend at the last conntrack scan.
    pub fn flows(&self) -> Option<&HashMap<BackendId, u32>> {
        self.drain.flows()
    }

    /// Whether frontends get their socket programs' entries (`with_sock_picks`).
    pub fn sock_picks(&self) -> bool {
        self.sock_picks
    }

    /// Read access to the maps (conntrack listing, counters).
    pub fn writer(&self) -> &W {
        &self.writer
    }

    #[cfg(test)]
    pub(crate) fn writer_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    /// Map writes issued since this reconciler started.
    pub fn total_writes(&self) -> u64 {
        self.writer.writes()
    }

    // -- the record of what is programmed, and its indexes --

    /// Records written backends (a unit's batch: indexed at once).
    fn set_backends(&mut self, written: &[(BackendId, Backend)]) {
        for (id, b) in written {
            if let Some(old) = self.programmed.backends.insert(*id, *b) {
                if old.svc_id != b.svc_id {
                    self.units.remove_backend(SvcId::of(&old), *id);
                }
            }
        }
        self.units
            .index_backends(written.iter().map(|(id, b)| (SvcId::of(b), *id)).collect());
    }

    fn drop_backend(&mut self, id: BackendId) {
        if let Some(old) = self.programmed.backends.remove(&id) {
            let unit = SvcId::of(&old);
            self.units.remove_backend(unit, id);
            self.ids.release_backend(id);
            // A drained backend gone, the unit's backends may be its
            // frontends' slots again: one list (see `IdList`).
            for key in self.units.frontends(unit) {
                if let Some(fe) = self.programmed.frontends.get_mut(key) {
                    self.units.share_backends(unit, &mut fe.slots);
                }
            }
        }
        self.drain.forget(id);
    }

    /// The desired service port that claims frontend `key`, if any.
    fn owner(&self, key: &FrontendKey) -> Option<&ServicePortName> {
        if let Some(name) = self.claims_aside.get(key) {
            return Some(name);
        }
        let id = self.programmed.frontends.get(key)?.svc_id;
        if self.units.claims(id, key) {
            self.units.holder(id)
        } else {
            None
        }
    }

    fn take_frontend(&mut self, key: &FrontendKey) -> Option<FrontendState> {
        let old = self.programmed.frontends.remove(key)?;
        // A claim the record said goes aside while the record does not.
        if self.units.claims(old.svc_id, key) {
            if let Some(name) = self.units.holder(old.svc_id) {
                self.claims_aside.insert(*key, name.clone());
            }
        }
        if pods::left_to_tc(key, old.flags) {
            self.left_to_tc = self.left_to_tc.saturating_sub(1);
        }
        self.service_entries.sub(key, 1 + old.slots.len());
        if !old.maglev.is_empty() {
            self.maglev_tables.sub(key, 1);
        }
        self.units.remove_frontend(old.svc_id, key);
        Some(old)
    }

    fn set_frontend(&mut self, key: FrontendKey, mut fe: FrontendState) {
        self.take_frontend(&key);
        self.units.share_backends(fe.svc_id, &mut fe.slots);
        self.service_entries.add(&key, 1 + fe.slots.len());
        if !fe.maglev.is_empty() {
            self.maglev_tables.add(&key, 1);
        }
        self.units.add_frontend(fe.svc_id, key);
        if pods::left_to_tc(&key, fe.flags) {
            self.left_to_tc += 1;
        }
        // Recorded under its claimer's id, the claim is read from here.
        if self.units.claims(fe.svc_id, &key) {
            self.claims_aside.remove(&key);
        }
        self.programmed.frontends.insert(key, fe);
    }

    /// Whether every claim reads as its unit's (tests).
    #[cfg(test)]
    pub(crate) fn claims_consistent(&self) -> Result<(), String> {
        let mut claimed = std::collections::HashSet::new();
        for (holder, keys) in self.units.all_claims() {
            for key in keys {
                claimed.insert(*key);
                if self.owner(key) != Some(holder) {
                    return Err(format!(
                        "{key} claimed by {holder}, owner says {:?}",
                        self.owner(key)
                    ));
                }
            }
        }
        match self.claims_aside.keys().find(|k| !claimed.contains(*k)) {
            Some(k) => Err(format!("{k} aside but claimed by nobody")),
            None => Ok(()),
        }
    }

    /// Grows the record's hash tables once to what `desired` needs,
    /// instead of doubling them as a first reconcile fills them.
    fn reserve_for(&mut self, desired: &DesiredState) {
        let keys = || desired.services.values().flat_map(|s| &s.frontends);
        let v4 = keys().filter(|f| f.key.addr.is_ipv4()).count();
        let v6 = keys().count() - v4;
        self.programmed.frontends.reserve_each(v4, v6);
        self.units.reserve(desired.services.len());
    }

    fn unit_backends(&self, svc_id: SvcId) -> Vec<(BackendId, Backend)> {
        self.units
            .backends(svc_id)
            .iter()
            .filter_map(|id| self.programmed.backends.get(id).map(|b| (*id, b)))
            .collect()
    }

    /// The unit's frontends, in key order.
    fn unit_frontends(&self, svc_id: SvcId) -> Vec<FrontendKey> {
        self.units.frontends(svc_id).to_vec()
    }

    fn entries_of(&self, key: &FrontendKey) -> usize {
        self.programmed
            .frontends
            .get(key)
            .map_or(0, |f| 1 + f.slots.len())
    }

    // -- reconciling --

    /// Brings the maps to what `desired` asks for, within `scope`.
    pub fn reconcile(&mut self, desired: &DesiredState, scope: Scope<'_>, now: Instant) -> Report {
        let before = self.writer.writes();
        let mut report = Report::default();
        self.delete_foreign(&mut report);
        // The cluster's own sources first: a frontend that masquerades
        // outside sources must not take pods for outsiders.
        self.sync_local_sources(&desired.local_sources, &mut report);
        self.sync_local_ifaces(&desired.local_ifaces, &mut report);

        let part = matches!(scope, Scope::Part(_));
        let removable = if part {
            HashSet::new()
        } else {
            self.drain.removable(now)
        };
        // Units whose draining backends may go are revisited, whoever
        // holds them.
        let mut leftovers: BTreeSet<SvcId> = removable
            .iter()
            .filter_map(|id| self.programmed.backends.get(id).map(|b| SvcId::of(&b)))
            .collect();
        let mut names: BTreeSet<ServicePortName> = match scope {
            Scope::All => desired
                .services
                .keys()
                .chain(self.units.names())
                .chain(self.refused.keys())
                .cloned()
                .collect(),
            Scope::Changed(set) | Scope::Part(set) | Scope::Sweep(set) => set.clone(),
        };
        // Service ports waiting for room (refused, or balanced without
        // their Maglev tables) are retried in every reconcile, after the
        // others: what this one frees is theirs at once. Not in a part,
        // and only those the desired state holds: a partial one holds
        // what its caller asked `wanted` for.
        let waiting: BTreeSet<ServicePortName> = if part {
            BTreeSet::new()
        } else {
            self.waiting()
                .filter(|name| desired.services.contains_key(*name))
                .cloned()
                .collect()
        };
        names.extend(waiting.iter().cloned());
        names.extend(
            leftovers
                .iter()
                .filter_map(|id| self.units.holder(*id))
                .filter(|name| matches!(scope, Scope::All) || desired.services.contains_key(*name))
                .cloned(),
        );
        if matches!(scope, Scope::All) {
            self.reserve_for(desired);
        }
        if scope.ends_full() {
            leftovers.extend(self.units.with_entries());
            leftovers.extend(self.programmed.source_ranges.keys().copied());
        }

        // A: the reprocessed service ports let go of their frontends; the
        // ones no longer desired let go of their ids too.
        for name in &names {
            for key in self.units.take_claimed(name) {
                self.claims_aside.remove(&key);
            }
        }
        for name in &names {
            if !desired.services.contains_key(name) {
                self.refused.remove(name);
                self.maglev_fallback.remove(name);
                if let Some(id) = self.units.release(name) {
                    leftovers.insert(id);
                }
            }
        }

        // B: desired service ports claim ids and frontends.
        let mut units: Vec<(&ServicePortName, SvcId)> = Vec::new();
        for (name, svc) in names
            .iter()
            .filter_map(|n| desired.services.get_key_value(n))
        {
            let keys: Vec<FrontendKey> = svc.frontends.iter().map(|f| f.key).collect();
            if let Some((fe, owner)) = keys
                .iter()
                .find_map(|k| self.owner(k).map(|o| (*k, o.clone())))
            {
                self.refuse(
                    name,
                    Refusal::FrontendTaken {
                        frontend: fe,
                        owner,
                    },
                    &mut report,
                );
                continue;
            }
            let id = self
                .units
                .service(name, &keys, &self.programmed, &mut self.ids);
            for k in &keys {
                if self.programmed.frontends.get(k).map(|f| f.svc_id) != Some(id) {
                    self.claims_aside.insert(*k, name.clone());
                }
            }
            self.units.set_claimed(id, keys);
            units.push((name, id));
        }

        // The filters pass what the units below may write, in one batch
        // for all of them (`apply_unit` checks its own again).
        let addrs = units
            .iter()
            .filter_map(|(name, _)| desired.services.get(*name))
            .flat_map(|svc| svc.frontends.iter());
        if let Err(e) = self
            .filters
            .admit_addrs(&mut self.writer, addrs.clone().map(|f| f.key.addr))
            .and_then(|()| {
                self.filters.admit_ports(
                    &mut self.writer,
                    addrs.flat_map(|f| f.backends.iter().map(|b| b.endpoint.port)),
                )
            })
        {
            report.errors.push(e);
        }

        // C: units nobody desires drain, then go.
        for id in leftovers {
            if self.units.holder(id).is_some() {
                continue;
            }
            let frontends: Vec<(FrontendKey, u16)> = self
                .unit_frontends(id)
                .into_iter()
                .filter(|k| self.owner(k).is_none())
                .filter_map(|k| self.programmed.frontends.get(&k).map(|f| (k, f.flags)))
                .collect();
            let plan = plan::plan_leftover(id, &frontends, &self.unit_backends(id), &removable);
            self.apply_unit(id, plan, now, &mut report);
        }

        // D: desired units, in name order, those waiting for room last.
        units.sort_by_key(|(name, _)| waiting.contains(*name));
        for (name, id) in units {
            let Some(svc) = desired.services.get(name) else {
                continue;
            };
            let existing = self.unit_backends(id);
            let (programmed, ids) = (&self.programmed, &mut self.ids);
            let mut fresh = HashSet::new();
            let plan = plan::plan_desired(id, svc, &existing, &removable, || {
                let id =
                    ids.backend(|b| programmed.backends.contains_key(&b) || fresh.contains(&b));
                fresh.insert(id);
                id
            });
            let slots = plan
                .frontends
                .iter()
                .map(|(_, f)| f.slots.len())
                .max()
                .unwrap_or(0);
            if slots > MAX_SLOTS as usize {
                self.ids.unclaim_backends(fresh);
                self.refuse(name, Refusal::TooManyBackends(slots), &mut report);
                continue;
            }
            if !self.fits(id, &plan) {
                self.ids.unclaim_backends(fresh);
                self.refuse(name, Refusal::MapsFull, &mut report);
                continue;
            }
            let mut plan = plan;
            if !self.tables_fit(id, &plan) {
                // Balanced like a service without the annotation, rather
                // than refused: reported once, retried as room frees.
                for (key, fe) in &mut plan.frontends {
                    fe.maglev = MaglevMembers::default();
                    fe.flags &= !sluice_common::service::SVC_F_MAGLEV;
                    fe.sock_picks = picks::qualifies(key, fe);
                }
                if self.maglev_fallback.insert(name.clone()) {
                    warn!(service = %name, capacity = self.capacity.maglev_tables, "Maglev table maps full: balanced by flow hash until room frees");
                }
                report.maglev_fallback.push(name.clone());
            } else if self.maglev_fallback.remove(name) {
                info!(service = %name, "Maglev tables programmed");
            }
            self.refused.remove(name);
            self.apply_unit(id, plan, now, &mut report);
        }

        // E: the service address space, once the frontends serve.
        if !part {
            self.sync_service_nets(desired, scope.ends_full(), &mut report);
        }

        // F: a full reconcile clears the filters' bits of what went (or
        // writes them whole if `new` could not).
        if scope.ends_full() {
            if let Err(e) = self.filters.fill(&mut self.writer, &self.programmed) {
                report.errors.push(e);
            }
        }

        report.writes = self.writer.writes() - before;
        // A reconcile of everything from empty maps puts every claim aside
        // until its writes: the room goes again once they are recorded.
        let aside = self.claims_aside.len();
        if self.claims_aside.capacity() > 1024 && aside * 4 < self.claims_aside.capacity() {
            self.claims_aside.shrink_to(aside * 2);
        }
        // Every test that reconciles checks the claims read from the record.
        #[cfg(test)]
        if let Err(e) = self.claims_consistent() {
            panic!("claims after a reconcile: {e}");
        }
        report
    }

    /// Whether a reconcile would compare the service address space with
    /// the desired one of `version` (0: unversioned, always).
    pub fn nets_stale(&self, version: u64) -> bool {
        version == 0 || self.nets_synced != Some(version)
    }

    /// Service ports waiting for room: refused for want of it, or
    /// balanced without their Maglev tables.
    fn waiting(&self) -> impl Iterator<Item = &ServicePortName> {
        self.refused
            .iter()
            .filter(|(_, why)| matches!(why, Refusal::MapsFull))
            .map(|(name, _)| name)
            .chain(&self.maglev_fallback)
    }

    /// The service ports a `Changed` or `Sweep` reconcile at `now` looks
    /// at beyond its set, whose desired state it needs: those waiting for
    /// room, those whose draining backends may go, and (`full`, for a
    /// `Sweep`) every refused one.
    pub fn wanted(&self, now: Instant, full: bool) -> BTreeSet<ServicePortName> {
        let refused = self.refused.keys().filter(|_| full);
        let draining = self
            .drain
            .removable(now)
            .into_iter()
            .filter_map(|id| self.programmed.backends.get(&id).map(|b| SvcId::of(&b)))
            .filter_map(|svc| self.units.holder(svc));
        self.waiting()
            .chain(refused)
            .chain(draining.collect::<Vec<_>>())
            .cloned()
            .collect()
    }

    /// Every service port the reconciler holds something for: an id
    /// (programmed, or about to be) or a refusal. A full reconcile in
    /// parts sweeps those no longer desired.
    pub fn held(&self) -> impl Iterator<Item = &ServicePortName> {
        self.units.names().chain(self.refused.keys())
    }

    /// Whether the maps hold no service (started on empty maps, nothing
    /// adopted): a partial desired state can then take nothing away.
    pub fn programs_nothing(&self) -> bool {
        self.programmed.frontends.is_empty() && self.programmed.backends.is_empty()
    }

    /// Grows the record's hash tables once to hold about `frontends`
    /// frontends and `units` service ports (a full reconcile in parts
    /// does not see the whole desired state at once); the frontends'
    /// room goes to the family most of them are in (IPv4 when none is
    /// programmed yet). The backends' table grows a chunk at a time and
    /// needs no room ahead.
    pub fn reserve(&mut self, frontends: usize, units: usize) {
        self.programmed.frontends.reserve(frontends);
        self.units.reserve(units);
    }

    fn refuse(&mut self, name: &ServicePortName, why: Refusal, report: &mut Report) {
        if self.refused.get(name) != Some(&why) {
            warn!(service = %name, reason = why.reason(), "service port refused: {why}");
        }
        self.refused.insert(name.clone(), why.clone());
        report.refused.push((name.clone(), why));
    }

    /// Whether the Maglev table maps have room for the tables of `plan`
    /// in place of those the unit holds now.
    fn tables_fit(&self, id: SvcId, plan: &UnitPlan) -> bool {
        let mut freed = FamilyCount::default();
        for k in self.unit_frontends(id) {
            if self
                .programmed
                .frontends
                .get(&k)
                .is_some_and(|f| !f.maglev.is_empty())
            {
                freed.add(&k, 1);
            }
        }
        let mut wanted = FamilyCount::default();
        for (k, f) in &plan.frontends {
            if !f.maglev.is_empty() {
                wanted.add(k, 1);
            }
            // A table taken over from another unit frees its own.
            if self
                .programmed
                .frontends
                .get(k)
                .is_some_and(|p| p.svc_id != id && !p.maglev.is_empty())
            {
                freed.add(k, 1);
            }
        }
        let after = |now: usize, freed: usize, wanted: usize| now - freed.min(now) + wanted;
        after(self.maglev_tables.v4, freed.v4, wanted.v4) <= self.capacity.maglev_tables
            && after(self.maglev_tables.v6, freed.v6, wanted.v6) <= self.capacity.maglev_tables
    }

    /// Entries of the service, backend and Maglev maps, each family's
    /// under its own map (from the counts kept write by write).
    pub fn occupancy(&self) -> [Occupancy; 5] {
        [
            (names::SERVICES_V4, self.service_entries.v4),
            (names::SERVICES_V6, self.service_entries.v6),
            (names::BACKENDS, self.programmed.backends.len()),
            (names::MAGLEV_V4, self.maglev_tables.v4),
            (names::MAGLEV_V6, self.maglev_tables.v6),
        ]
    }

    /// Service ports balanced without their Maglev tables for want of room.
    pub fn maglev_fallback(&self) -> &BTreeSet<ServicePortName> {
        &self.maglev_fallback
    }

    /// Whether the maps have room for `plan` in place of what the unit
    /// holds now (each service map on its own).
    fn fits(&self, id: SvcId, plan: &UnitPlan) -> bool {
        let mut freed = FamilyCount::default();
        for k in self.unit_frontends(id) {
            freed.add(&k, self.entries_of(&k));
        }
        // Frontends the plan takes over from a leftover free their entries.
        for (k, _) in &plan.frontends {
            if self
                .programmed
                .frontends
                .get(k)
                .is_some_and(|f| f.svc_id != id)
            {
                freed.add(k, self.entries_of(k));
            }
        }
        let mut wanted = FamilyCount::default();
        for (k, f) in &plan.frontends {
            wanted.add(k, 1 + f.slots.len());
        }
        let after = |now: usize, freed: usize, wanted: usize| now - freed.min(now) + wanted;
        let v4 = after(self.service_entries.v4, freed.v4, wanted.v4);
        let v6 = after(self.service_entries.v6, freed.v6, wanted.v6);
        let current_backends = self.units.backends(id).len();
        let backends = self.programmed.backends.len() - current_backends + plan.backends.len();
        v4 <= self.capacity.service_entries
            && v6 <= self.capacity.service_entries
            && backends <= self.capacity.backends
    }

    /// Brings `sl_svcnet4`/`sl_svcnet6` to the service CIDRs and cluster
    /// IPs of `desired`. Runs after the frontends are written: a new
    /// service's cluster IP is a host route only once its ports are
    /// served. Skipped (it walks every cluster IP) unless `full` or the
    /// inputs' version changed. A full map leaves the remaining cluster
    /// IPs out (their unserved ports then pass as before these maps
    /// existed; served ports are unaffected): reported, not an error.
    fn sync_service_nets(&mut self, desired: &DesiredState, full: bool, report: &mut Report) {
        let version = desired.nets_version;
        if !full && version != 0 && self.nets_synced == Some(version) {
            return;
        }
        let errors = report.errors.len();
        // The desired entries are walked, never collected: at 100,000
        // services a map of them, a list of both sides' keys and the
        // cluster IPs' set were 7.7 MB at the agent's peak, the end of
        // its first sync (docs/performance.md, issue 17).
        let want = || service_nets(desired);
        let programmed = &self.programmed.service_nets;
        if programmed.iter().map(|(k, v)| (*k, *v)).eq(want())
            && self.programmed.svcnet_summary_v4 == svcnet_summary(want().map(|(k, _)| k))
        {
            self.nets_synced = Some(version);
            return;
        }
        // The summary widens first (what is programmed and what comes),
        // so a new cluster IP is never outside it while it is in the LPM.
        let widened = svcnet_summary(programmed.keys().copied().chain(want().map(|(k, _)| k)));
        self.sync_svcnet_summary(widened, report);
        let mut left_out = 0;
        // What went in is recorded after the loop, merged in whole B-tree
        // nodes: added one by one in key order, the record's nodes were
        // half empty until compacted, 4 MB at the end of a first sync
        // that adds every cluster IP (the agent's peak, issue 17).
        let mut added = if self.programmed.service_nets.is_empty() {
            Vec::with_capacity(want().count())
        } else {
            Vec::new()
        };
        // In batches: a first sync adds a host route per cluster IP, one
        // `bpf()` call each before.
        let mut batch = Vec::with_capacity(NETS_BATCH);
        let mut nets = want();
        loop {
            batch.clear();
            for (net, kind) in nets.by_ref() {
                if self.programmed.service_nets.get(&net) != Some(&kind) {
                    batch.push((net, kind));
                    if batch.len() == NETS_BATCH {
                        break;
                    }
                }
            }
            if batch.is_empty() {
                break;
            }
            left_out += self.put_service_nets(&batch, &mut added, report);
        }
        if added.len() > COMPACT_AFTER {
            let mut fresh: BTreeMap<SourceRange, u8> = added.into_iter().collect();
            self.programmed.service_nets.append(&mut fresh);
        } else {
            self.programmed.service_nets.extend(added);
        }
        let stale: Vec<SourceRange> = self
            .programmed
            .service_nets
            .keys()
            .filter(|net| wanted_net(desired, net).is_none())
            .copied()
            .collect();
        for net in stale {
            match self.writer.delete(EntryKey::ServiceNet(net)) {
                Ok(()) => {
                    self.programmed.service_nets.remove(&net);
                }
                Err(e) => report.errors.push(e),
            }
        }
        // Then it narrows to what the LPM holds (a cluster IP left out
        // of a full map needs no cover).
        let summary = svcnet_summary(self.programmed.service_nets.keys().copied());
        self.sync_svcnet_summary(summary, report);
        report.service_nets_left_out = left_out;
        if left_out != self.nets_left_out {
            if left_out > 0 {
                warn!(
                    left_out,
                    "sl_svcnet4/6 full: cluster IPs left out (their unserved ports are not rejected)"
                );
            }
            self.nets_left_out = left_out;
        }
        self.nets_synced = (report.errors.len() == errors).then_some(version);
    }

    /// Puts `nets` (in batches, see `MapWrites::put_each`) and adds what
    /// went in to `added`, for the caller to record. How many cluster IPs
    /// found the map full (left out, not an error).
    fn put_service_nets(
        &mut self,
        nets: &[(SourceRange, u8)],
        added: &mut Vec<(SourceRange, u8)>,
        report: &mut Report,
    ) -> usize {
        let entries: Vec<Entry<'_>> = nets
            .iter()
            .map(|(net, kind)| Entry::ServiceNet(*net, *kind))
            .collect();
        let mut failed = self.writer.put_each(&entries).into_iter().peekable();
        let mut left_out = 0;
        for (i, (net, kind)) in nets.iter().enumerate() {
            match failed.next_if(|(at, _)| *at == i) {
                Some((_, WriteError::Full { .. })) if *kind == SVCNET_CLUSTER_IP => left_out += 1,
                Some((_, e)) => report.errors.push(e),
                None => added.push((*net, *kind)),
            }
        }
        left_out
    }

    /// Writes `sl_svcnetsum4` when it changes.
    fn sync_svcnet_summary(&mut self, summary: SvcnetSummary4, report: &mut Report) {
        if summary == self.programmed.svcnet_summary_v4 {
            return;
        }
        match self.writer.put(Entry::SvcnetSummary4(&summary)) {
            Ok(()) => self.programmed.svcnet_summary_v4 = summary,
            Err(e) => report.errors.push(e),
        }
    }

    /// Brings `sl_local4`/`sl_local6` to `want`: new networks first, then
    /// the stale ones (a source is never briefly outside the cluster when
    /// a CIDR is replaced by a wider one).
    fn sync_local_sources(&mut self, want: &BTreeSet<SourceRange>, report: &mut Report) {
        sync_set(
            &mut self.writer,
            &mut self.programmed.local_sources,
            want,
            (Entry::LocalSource, EntryKey::LocalSource),
            report,
        );
    }

    /// Brings `sl_localif` to `want`: new devices first, then the stale
    /// ones.
    fn sync_local_ifaces(&mut self, want: &BTreeSet<u32>, report: &mut Report) {
        sync_set(
            &mut self.writer,
            &mut self.programmed.local_ifaces,
            want,
            (Entry::LocalIface, EntryKey::LocalIface),
            report,
        );
    }

    /// Writes one unit's difference: its backends first, then its frontends
    /// (slots, master, trims), then the frontends and backends it no longer
    /// has.
    fn apply_unit(&mut self, id: SvcId, mut plan: UnitPlan, now: Instant, report: &mut Report) {
        if !self.sock_picks {
            for (_, fe) in &mut plan.frontends {
                fe.sock_picks = false;
            }
        }
        // Source ranges a frontend is about to enforce exist before it does.
        for range in &plan.source_ranges {
            if self
                .programmed
                .source_ranges
                .get(&id)
                .is_some_and(|s| s.contains(range))
            {
                continue;
            }
            match self.writer.put(Entry::SourceRange(id, *range)) {
                Ok(()) => {
                    self.programmed
                        .source_ranges
                        .entry(id)
                        .or_default()
                        .insert(*range);
                }
                Err(e) => report.errors.push(e),
            }
        }
        let changed: Vec<(BackendId, Backend)> = plan
            .backends
            .iter()
            .filter(|(bid, b)| self.programmed.backends.get(bid) != Some(*b))
            .copied()
            .collect();
        // The filters pass the unit's frontends and backends before any is
        // written (a no-op when the reconcile admitted them already).
        let admitted = self
            .filters
            .admit_ports(&mut self.writer, changed.iter().map(|(_, b)| b.port))
            .and_then(|()| {
                self.filters
                    .admit_addrs(&mut self.writer, plan.frontends.iter().map(|(k, _)| k.addr))
            });
        if let Err(e) = admitted {
            report.errors.push(e);
            return;
        }
        let entries: Vec<Entry<'_>> = changed
            .iter()
            .map(|(bid, b)| Entry::Backend(*bid, b))
            .collect();
        let failed = self.writer.put_each(&entries);
        let mut changed = changed;
        for (i, _) in failed.iter().rev() {
            changed.remove(*i);
        }
        report.errors.extend(failed.into_iter().map(|(_, e)| e));
        self.set_backends(&changed);
        let mut frontends: Vec<&(FrontendKey, FrontendState)> = plan
            .frontends
            .iter()
            .filter(|(k, t)| self.programmed.frontends.get(k) != Some(t))
            .collect();
        // Shrinking frontends first: the map never holds more than the
        // larger of before and after.
        frontends.sort_by_key(|(k, t)| (t.slots.len() as isize - self.entries_of(k) as isize, *k));
        for (key, want) in frontends {
            if let Some(missing) = want
                .slots
                .iter()
                .find(|b| !self.programmed.backends.contains_key(b))
            {
                debug!(frontend = %key, backend = %missing, "frontend waits: its backend is not written");
                continue;
            }
            // The pods' egress looks at replies again before a pod's flow
            // can be the TC path's.
            if pods::left_to_tc(key, want.flags) && self.pods.must_clear() {
                if let Err(e) = self.write_pods_bit(pods::Action::Clear) {
                    report.errors.push(e);
                    continue;
                }
            }
            let mut current = self.take_frontend(key).unwrap_or_default();
            if let Err(e) = frontend::sync(
                &mut self.writer,
                key,
                &mut current,
                want,
                &self.programmed.backends,
            ) {
                report.errors.push(e);
            }
            self.set_frontend(*key, current);
        }
        let keep: HashSet<&FrontendKey> = plan.frontends.iter().map(|(k, _)| k).collect();
        for key in self.unit_frontends(id) {
            if keep.contains(&key) {
                continue;
            }
            let Some(mut current) = self.take_frontend(&key) else {
                continue;
            };
            if let Err(e) = frontend::delete(&mut self.writer, &key, &mut current) {
                report.errors.push(e);
                self.set_frontend(key, current);
            }
        }
        let wanted: HashSet<BackendId> = plan.backends.iter().map(|(b, _)| *b).collect();
        let unwanted: Vec<BackendId> = self
            .units
            .backends(id)
            .iter()
            .copied()
            .filter(|b| !wanted.contains(b))
            .collect();
        // A backend stays while a programmed slot or Maglev table names
        // it: the unit's frontends', and those of frontends a failed
        // write left unknown (`svc_id` 0, filed under no unit until
        // rewritten; a delete that failed after the master went leaves
        // one, its slots still naming this unit's backends). Looked at
        // only when some backend may go (most reconciles remove none).
        let referenced: HashSet<BackendId> = if unwanted.is_empty() {
            HashSet::new()
        } else {
            let unknown = self.units.frontends(SvcId::default());
            self.units
                .frontends(id)
                .iter()
                .chain(unknown)
                .filter_map(|k| self.programmed.frontends.get(k))
                .flat_map(|f| {
                    let table = f.maglev.iter().map(|(b, _)| *b);
                    f.slots.iter().copied().chain(table)
                })
                .collect()
        };
        for bid in unwanted {
            if referenced.contains(&bid) {
                continue;
            }
            match self.writer.delete(EntryKey::Backend(bid)) {
                Ok(()) => {
                    self.drop_backend(bid);
                    report.backends_removed += 1;
                }
                Err(e) => report.errors.push(e),
            }
        }
        // Source ranges no frontend enforces any more go last.
        let stale: Vec<_> = self
            .programmed
            .source_ranges
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|r| !plan.source_ranges.contains(r))
            .copied()
            .collect();
        for range in stale {
            match self.writer.delete(EntryKey::SourceRange(id, range)) {
                Ok(()) => {
                    if let Some(set) = self.programmed.source_ranges.get_mut(&id) {
                        set.remove(&range);
                        if set.is_empty() {
                            self.programmed.source_ranges.remove(&id);
                        }
                    }
                }
                Err(e) => report.errors.push(e),
            }
        }
        self.drain.track(&plan.backends, now);
    }

    /// Entries of a protocol the agent does not know cannot be its to keep.
    fn delete_foreign(&mut self, report: &mut Report) {
        for key in std::mem::take(&mut self.foreign) {
            if let Err(e) = self.writer.delete(EntryKey::Service(key)) {
                self.foreign.push(key);
                report.errors.push(e);
            }
        }
    }

    /// Scans conntrack: deletes stale entries (including every entry of a
    /// removed backend) and records live flows per backend for the drain
    /// manager. `now` must be taken before the scan starts.
    pub fn scan_conntrack(&mut self, now: Instant) -> Result<ScanReport, DatapathError> {
        let ids = self.ids.scan_begins();
        let result = self.scan_conntrack_inner(now);
        let cleared = matches!(&result, Ok(report) if report.errors.is_empty());
        self.ids.scan_done(ids, cleared);
        result
    }

    fn scan_conntrack_inner(&mut self, now: Instant) -> Result<ScanReport, DatapathError> {
        let now_ns = conntrack::monotonic_ns();
        // The bit as the datapath left it, read before conntrack: a flow
        // that took it away after this read is in the entries read next.
        let pods_set = self.pods_bit_in_map()?;
        let backends = &self.programmed.backends;
        let ct4 = self.writer.conntrack4()?;
        let ct6 = self.writer.conntrack6()?;
        let scan4 = conntrack::scan(&ct4, backends, now_ns);
        let scan6 = conntrack::scan(&ct6, backends, now_ns);
        let mut report = ScanReport {
            entries: scan4.entries + scan6.entries,
            entries_v4: scan4.entries,
            entries_v6: scan6.entries,
            sock_table: self.writer.sock_table_held(),
            ..ScanReport::default()
        };
        for key in &scan4.stale {
            match self.writer.delete(EntryKey::Conntrack4(*key)) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        for key in &scan6.stale {
            match self.writer.delete(EntryKey::Conntrack6(*key)) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        let mut flows = scan4.flows;
        conntrack::add_flows(&mut flows, scan6.flows);
        let (sockets, revs) = self.writer.sockets()?;
        let socks = conntrack::scan_sockets(&sockets, &revs, &self.programmed.backends);
        for cookie in &socks.stale_sockets {
            match self.writer.delete(EntryKey::Socket(*cookie)) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        for (cookie, entry) in &socks.orphans {
            if let Err(e) = self.writer.put(Entry::Socket(*cookie, entry)) {
                report.errors.push(e);
            }
        }
        for key in &socks.stale_revs {
            match self.writer.delete(EntryKey::SockRev(*key)) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        conntrack::add_flows(&mut flows, socks.flows);
        if !self.marks_valid {
            self.validate_sock_marks(&mut report);
        }
        let now_ns = conntrack::monotonic_ns();
        let affinities = self.writer.affinities4()?;
        for key in conntrack::stale_affinities(&affinities, &self.programmed.backends, now_ns) {
            match self.writer.delete(EntryKey::Affinity4(key)) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        let affinities = self.writer.affinities6()?;
        for key in conntrack::stale_affinities(&affinities, &self.programmed.backends, now_ns) {
            match self.writer.delete(EntryKey::Affinity6(key)) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        let taken = !pods_set && self.pods.taken_away();
        if taken {
            info!("a pod's flow began on the TC path: the pods' devices look at replies again until it ends");
        }
        match self.pods.step(self.left_to_tc, &ct4, &ct6) {
            // Not in the scan that found it taken away.
            pods::Action::Set if taken => {}
            pods::Action::Set => self.set_pods_bit(&mut report),
            action => {
                if let Err(e) = self.write_pods_bit(action) {
                    report.errors.push(e);
                }
            }
        }
        if self.pods.awaited() > 0 {
            debug!(
                flows = self.pods.awaited(),
                "the pods' devices look at replies until these flows of the TC path end"
            );
        }
        self.drain.record_scan(FlowCounts {
            started: now,
            flows,
        });
        report.took = now.elapsed();
        Ok(report)
    }
}

/// The `sl_svcnetsum4` value for IPv4 service nets among `nets`; with
/// none, a written summary of no prefix (no address can be in an empty
/// `sl_svcnet4`, so every packet skips its lookup).
fn svcnet_summary(nets: impl Iterator<Item = SourceRange>) -> SvcnetSummary4 {
    let mut v4: Vec<([u8; 4], u8)> = nets
        .filter_map(|(ip, len)| match ip {
            std::net::IpAddr::V4(a) => Some((a.octets(), len)),
            std::net::IpAddr::V6(_) => None,
        })
        .collect();
    SvcnetSummary4::of(&mut v4)
}

/// The entries of `sl_svcnet4`/`sl_svcnet6` for `desired`, in key
/// order: each service CIDR, and each cluster IP as a host route (a
/// cluster IP wins over a CIDR of the same address and length). Both
/// sets are sorted: merged as they are walked.
pub fn service_nets(desired: &DesiredState) -> impl Iterator<Item = (SourceRange, u8)> + '_ {
    let mut cidrs = desired.service_cidrs.iter().copied().peekable();
    let mut hosts = desired
        .cluster_ips
        .iter()
        .map(|ip| (ip, host_len(&ip)))
        .peekable();
    std::iter::from_fn(move || match (cidrs.peek(), hosts.peek()) {
        (None, None) => None,
        (Some(c), Some(h)) if c == h => {
            cidrs.next();
            hosts.next().map(|h| (h, SVCNET_CLUSTER_IP))
        }
        (Some(c), Some(h)) if h < c => hosts.next().map(|h| (h, SVCNET_CLUSTER_IP)),
        (Some(_), _) => cidrs.next().map(|c| (c, SVCNET_CIDR)),
        (None, Some(_)) => hosts.next().map(|h| (h, SVCNET_CLUSTER_IP)),
    })
}

/// The kind `service_nets(desired)` gives `net`, if it gives it at all.
fn wanted_net(desired: &DesiredState, (ip, len): &SourceRange) -> Option<u8> {
    if *len == host_len(ip) && desired.cluster_ips.contains(ip) {
        return Some(SVCNET_CLUSTER_IP);
    }
    desired
        .service_cidrs
        .contains(&(*ip, *len))
        .then_some(SVCNET_CIDR)
}

/// The prefix length of a host route to `ip`.
fn host_len(ip: &std::net::IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

#[cfg(test)]
mod service_net_tests {
    use super::*;

    #[test]
    fn cluster_ips_are_host_routes_over_their_cidrs() {
        let desired = DesiredState {
            service_cidrs: [
                ("10.96.0.0".parse().unwrap(), 16),
                ("10.96.0.1".parse().unwrap(), 32),
                ("fd00:96::".parse().unwrap(), 108),
            ]
            .into(),
            cluster_ips: [
                "10.96.0.1".parse().unwrap(),
                "10.200.0.1".parse().unwrap(),
                "fd00:96::a".parse().unwrap(),
            ]
            .into(),
            ..DesiredState::default()
        };
        let got: Vec<(SourceRange, u8)> = service_nets(&desired).collect();
        let want: Vec<(SourceRange, u8)> = vec![
            (("10.96.0.0".parse().unwrap(), 16), SVCNET_CIDR),
            (("10.96.0.1".parse().unwrap(), 32), SVCNET_CLUSTER_IP),
            (("10.200.0.1".parse().unwrap(), 32), SVCNET_CLUSTER_IP),
            (("fd00:96::".parse().unwrap(), 108), SVCNET_CIDR),
            (("fd00:96::a".parse().unwrap(), 128), SVCNET_CLUSTER_IP),
        ];
        assert_eq!(got, want, "merged in key order, a cluster IP over its CIDR");
        for (net, kind) in &want {
            assert_eq!(wanted_net(&desired, net), Some(*kind), "{net:?}");
        }
        for net in [
            ("10.96.0.0".parse().unwrap(), 32),
            ("10.200.0.1".parse().unwrap(), 24),
            ("fd00:96::a".parse().unwrap(), 108),
        ] {
            assert_eq!(wanted_net(&desired, &net), None, "{net:?}");
        }
    }
}
