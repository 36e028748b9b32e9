//! The sync task: the one task that writes the datapath maps.
//!
//! It owns the stores (trimmed objects) and the reconciler. A batch of
//! updates marks the services it touched; only those are retranslated and
//! their service ports reconciled, so an endpoint change costs work
//! proportional to its service, not to the cluster. No translation
//! outlives its reconcile (`desired.rs`): a full reconcile goes through
//! the services a part at a time. An agent that adopted programmed maps
//! writes nothing before every kind has been listed once (a restarted
//! agent must not delete what it has not yet seen); one that started on
//! empty maps programs services while the first list streams in
//! (`first_list.rs`). A full reconcile runs at the first list's end and
//! every `resync_interval` as a safety net.
//! Between changes it scans conntrack: every `gc_interval` to collect
//! expired entries, every `drain_interval` while backends drain, so a
//! backend leaves the maps soon after its last flow ends.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Bound::{Excluded, Unbounded},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use desired::Desired;
use first_list::FirstList;

use crate::{
    datapath::{fill_ratios, MapSizes, MapWriter, MapWrites, Occupancy},
    health::Health,
    healthcheck::HealthChecks,
    heap,
    metrics::{MapLabel, Metrics, ReasonLabel},
    model::ServicePortName,
    reconcile::{Reconciler, Refusal, Report, Scope},
    sources::Envelope,
    stores::{Dirty, Stores},
    translate::{ObjectKey, Problem, ProblemReason, TranslateConfig},
};

pub struct SyncConfig {
    pub translate: TranslateConfig,
    pub sizes: MapSizes,
    pub gc_interval: Duration,
    pub drain_interval: Duration,
    pub resync_interval: Duration,
}

/// Services translated per part of a full reconcile: the desired state
/// held at once.
const PART: usize = 1024;

/// When the sync loop next scans conntrack and next reconciles everything.
struct Due {
    scan: Instant,
    resync: Instant,
}

pub struct Sync<W = MapWriter> {
    config: SyncConfig,
    reconciler: Reconciler<W>,
    stores: Stores,
    desired: Desired,
    problems: BTreeSet<Problem>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    /// When each update not yet in the maps was handed over.
    unsynced: Vec<Instant>,
    /// Service ports changed but not yet reconciled without error.
    pending: BTreeSet<ServicePortName>,
    dirty: Dirty,
    first_sync: bool,
    health_checks: watch::Sender<HealthChecks>,
    /// The pods' devices (interface-based local-traffic detection), from
    /// the device task.
    local_ifaces: Option<watch::Receiver<BTreeSet<u32>>>,
    /// `local_ifaces` changed and is not in the maps yet.
    ifaces_dirty: bool,
    /// The problem report may have changed (it walks every stored object:
    /// only then).
    problems_dirty: bool,
    /// When the gauges (which walk every programmed frontend) are to be
    /// refreshed next; `None` when they are current.
    gauges_due: Option<Instant>,
    gauges_at: Option<Instant>,
    /// This node's addresses (NodePort addresses, both families), for the
    /// device task's default `--xdp-devices`.
    node_addrs: Option<watch::Sender<Vec<std::net::IpAddr>>>,
    /// Services per part of a full reconcile.
    part: usize,
    /// The last full reconcile failed (a write error): the next one is
    /// full too.
    full_failed: bool,
    /// Until the first sync, when the agent started on empty maps: what
    /// the first list touched, programmed as it streams in.
    first_list: Option<FirstList>,
}

/// The gauges are refreshed at most this often while changes stream in.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

impl<W: MapWrites> Sync<W> {
    pub fn new(
        config: SyncConfig,
        reconciler: Reconciler<W>,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        health_checks: watch::Sender<HealthChecks>,
    ) -> Self {
        let first_list = reconciler.programs_nothing().then(FirstList::default);
        Self {
            config,
            reconciler,
            stores: Stores::default(),
            desired: Desired::default(),
            problems: BTreeSet::new(),
            health,
            metrics,
            unsynced: Vec::new(),
            pending: BTreeSet::new(),
            dirty: Dirty::default(),
            first_sync: false,
            health_checks,
            local_ifaces: None,
            node_addrs: None,
            ifaces_dirty: false,
            problems_dirty: true,
            gauges_due: None,
            gauges_at: None,
            part: PART,
            full_failed: false,
            first_list,
        }
    }

    /// Reconciles everything `services` services at a time (tests: the
    /// outcome must not depend on it).
    #[cfg(test)]
    pub(crate) fn with_part_size(mut self, services: usize) -> Self {
        self.part = services.max(1);
        self
    }

    /// Takes the pods' devices from `rx` into the desired state.
    pub fn with_local_interfaces(mut self, rx: watch::Receiver<BTreeSet<u32>>) -> Self {
        self.local_ifaces = Some(rx);
        self
    }

    /// Publishes this node's addresses to `tx` whenever they change.
    pub fn with_node_addresses(mut self, tx: watch::Sender<Vec<std::net::IpAddr>>) -> Self {
        self.node_addrs = Some(tx);
        self
    }

    /// Waits for the pods' devices to change (forever without detection
    /// by interface, or once the device task is gone).
    async fn local_ifaces_changed(rx: &mut Option<watch::Receiver<BTreeSet<u32>>>) {
        match rx {
            Some(r) => {
                if r.changed().await.is_err() {
                    *rx = None;
                }
            }
            None => std::future::pending().await,
        }
    }

    fn take_local_ifaces(&mut self) {
        if let Some(rx) = &mut self.local_ifaces {
            let ifaces = rx.borrow_and_update().clone();
            if ifaces != self.desired.state.local_ifaces {
                self.desired.state.local_ifaces = ifaces;
                self.ifaces_dirty = true;
            }
        }
    }

    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<Envelope>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut due = self.timers();
        self.take_local_ifaces();
        // Every link runs this build's programs now and a migration of the
        // pins has finished: the socket programs may read their entries.
        if let Err(e) = self.reconciler.start_picks() {
            warn!(error = %e, "the socket programs' one-lookup entries stay off: every connect takes the general lookups");
        }
        loop {
            let wait = if self.listed_waiting() {
                Duration::ZERO
            } else {
                due.scan
                    .min(due.resync)
                    .min(self.gauges_due.unwrap_or(due.scan))
                    .saturating_duration_since(Instant::now())
            };
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                received = rx.recv() => {
                    let Some(first) = received else { break };
                    self.receive(first);
                    // Coalesce whatever else is already queued.
                    while let Ok(more) = rx.try_recv() {
                        self.receive(more);
                    }
                }
                _ = Self::local_ifaces_changed(&mut self.local_ifaces) => self.take_local_ifaces(),
                _ = tokio::time::sleep(wait) => {}
            }
            self.step(&mut due);
        }
        // The next agent may not count balanced sockets (a rollback to
        // 0.1.0): until one that does finds the counts complete, every
        // socket's close looks it up. (After a crash the word stays: the
        // next agent's loader clears it, a window a rollback may hit.)
        if let Err(e) = self.reconciler.distrust_sock_marks() {
            warn!(error = %e, "sl_sockmark's validity could not be cleared");
        }
        // Nor keep the socket programs' entries (`sl_sockfe4`/`sl_sockfe6`)
        // while it changes the services under them.
        if let Err(e) = self.reconciler.stop_picks() {
            warn!(error = %e, "the socket programs could not be stopped reading sl_sockfe4/sl_sockfe6");
        }
        info!("sync task stopped; the datapath keeps running on its pinned maps");
    }

    /// The first scan and resync are one interval away.
    fn timers(&self) -> Due {
        let now = Instant::now();
        Due {
            scan: now + self.config.gc_interval,
            resync: now + self.config.resync_interval,
        }
    }

    /// What the loop does after each wake-up: translate what changed,
    /// reconcile, scan conntrack when due.
    fn step(&mut self, due: &mut Due) {
        if !self.stores.all_synced() {
            self.program_listed();
            return;
        }
        let now = Instant::now();
        let scan_due = self.first_sync && now >= due.scan;
        let resync_due = !self.first_sync || now >= due.resync;
        if scan_due {
            self.scan_conntrack();
        }
        let dirty = std::mem::take(&mut self.dirty);
        let translated = !dirty.is_empty() || !self.first_sync;
        // A change of the node retranslates every service: a full
        // reconcile, part by part; a full one that failed is done again.
        let full = resync_due || dirty.all || self.full_failed;
        if translated {
            let (changed, problems_changed) =
                self.desired
                    .update(&self.stores, &dirty, &self.config.translate, full);
            self.pending.extend(changed);
            self.problems_dirty |= problems_changed || dirty.rejected || dirty.cidrs;
        }
        let work = full
            || scan_due
            || self.ifaces_dirty
            || !self.pending.is_empty()
            || !self.unsynced.is_empty();
        // The problem report walks every stored object: after the map
        // writes, so that it never delays a change reaching the maps.
        let ok = !work || self.reconcile(full);
        self.desired.forget_translations();
        if translated {
            if let Some(tx) = &self.node_addrs {
                let node = &self.desired.node;
                let mut addrs: Vec<_> = node
                    .node_addrs
                    .iter()
                    .chain(&node.node_v6)
                    .copied()
                    .collect();
                addrs.sort();
                tx.send_if_modified(|current| {
                    let modified = *current != addrs;
                    *current = addrs;
                    modified
                });
            }
            let checks = self.desired.health_checks();
            self.health_checks.send_if_modified(|current| {
                let modified = *current != checks;
                *current = checks;
                modified
            });
        }
        if translated && self.problems_dirty {
            self.problems_dirty = false;
            self.refresh_problems();
        }
        if self.gauges_due.is_some_and(|t| Instant::now() >= t) {
            self.update_gauges();
        }
        if work {
            // A failed full reconcile keeps no list of what to retry (its
            // parts' names are gone with their translations): the retry
            // is a full one.
            self.full_failed = full && !ok;
            if !ok {
                // Retry soon; `/healthz` turns red if this persists.
                due.scan = Instant::now() + Duration::from_secs(1);
                return;
            }
            if full {
                due.resync = Instant::now() + self.config.resync_interval;
                let pruned = crate::model::prune_interned();
                let took = heap::give_back_free_pages();
                debug!(
                    ?took,
                    pruned, "free heap pages given back after a full reconcile"
                );
            }
        }
        // Scan again after the GC interval, or sooner while backends
        // wait for their flows to end.
        let now = Instant::now();
        if scan_due {
            due.scan = now + self.config.gc_interval;
        }
        if self.reconciler.draining() > 0 {
            due.scan = due.scan.min(now + self.config.drain_interval);
        }
    }

    fn receive(&mut self, (sent, update): Envelope) {
        self.unsynced.push(sent);
        let kind = update.kind();
        let mut dirty = self.stores.apply(update);
        if let Some(first) = &mut self.first_list {
            first.touched(kind, &dirty);
        }
        if !self.first_sync {
            // The first sync is a full reconcile: it translates every
            // service, or (a first list programmed as it streamed in) the
            // ones its own batch holds. Which services an update touched
            // is not kept until then: at 100,000 services the set of
            // every listed key held 2.8 MB at the agent's peak, the end of
            // that sync.
            dirty.services.clear();
        }
        self.dirty.merge(dirty);
    }

    /// While the first list streams in (an agent started on empty maps):
    /// programs the services it has brought with at least one of their
    /// slices, part by part. What fails or waits is done by the full
    /// reconcile at the list's end.
    fn program_listed(&mut self) {
        let Some(first) = &mut self.first_list else {
            return;
        };
        if !first.may_program(&self.stores.synced) {
            return;
        }
        let config = &self.config.translate;
        if !first.started() {
            let context = Dirty {
                all: true,
                ..Dirty::default()
            };
            self.desired.update(&self.stores, &context, config, true);
            first.start();
        }
        // The record's hash tables grow to the services listed so far
        // ahead of the programming (once the Services' list is whole, to
        // all of them), rather than doubling as they fill: each doubling
        // held the old and the new table at once. A no-op once they have
        // the room.
        let services = self.stores.services.len();
        self.reconciler.reserve(services, services);
        let stores = &self.stores;
        let ready = first.take_ready(self.part, |key| {
            stores.services.contains_key(key) && stores.has_slices(key)
        });
        if ready.is_empty() {
            return;
        }
        first.programmed += ready.len();
        let started = Instant::now();
        let mut names = BTreeSet::new();
        for key in &ready {
            self.problems_dirty |= self.desired.translate(key, stores, config, &mut names);
        }
        let report =
            self.reconciler
                .reconcile(&self.desired.state, Scope::Part(&names), Instant::now());
        self.desired.forget_translations();
        self.count_writes(&report, "while listing; the list's end retries it");
        debug!(services = ready.len(), took = ?started.elapsed(), "programmed while listing");
    }

    /// Counts a reconcile's writes and failed writes, and logs each
    /// failure (`when` says in which reconcile).
    fn count_writes(&self, report: &Report, when: &'static str) {
        self.metrics.map_writes.inc_by(report.writes);
        self.metrics
            .map_write_errors
            .inc_by(report.errors.len() as u64);
        for e in &report.errors {
            warn!(error = %e, when, "map write failed");
        }
    }

    /// Services the first list brought wait to be programmed: the loop
    /// wakes again at once.
    fn listed_waiting(&self) -> bool {
        !self.stores.all_synced()
            && self
                .first_list
                .as_ref()
                .is_some_and(|first| first.has_batch() && first.may_program(&self.stores.synced))
    }

    fn refresh_problems(&mut self) {
        let problems = self.desired.problems(&self.stores, &self.config.translate);
        for p in problems.difference(&self.problems) {
            warn!(problem = %p, "left out");
        }
        let mut by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
        for p in &problems {
            *by_reason.entry(p.reason.label()).or_default() += 1;
        }
        for reason in ProblemReason::ALL {
            let label = ReasonLabel {
                reason: reason.label().to_owned(),
            };
            self.metrics
                .rejected
                .get_or_create(&label)
                .set(by_reason.get(reason.label()).copied().unwrap_or(0));
        }
        self.problems = problems;
    }

    /// Reconciles the pending service ports (everything when `full`); true
    /// when the maps now equal the desired state.
    fn reconcile(&mut self, full: bool) -> bool {
        let started = Instant::now();
        let pending = std::mem::take(&mut self.pending);
        let report = if full {
            self.reconcile_all()
        } else {
            self.reconcile_changed(&pending)
        };
        self.ifaces_dirty = false;
        let elapsed = started.elapsed();
        self.metrics.sync_duration.observe(elapsed.as_secs_f64());
        self.count_writes(&report, "sync");
        if !report.errors.is_empty() {
            self.schedule_gauges();
            // Try these again.
            self.pending.extend(pending);
            return false;
        }
        let now = Instant::now();
        let n = self.unsynced.len() as u64;
        for sent in self.unsynced.drain(..) {
            self.metrics
                .update_latency
                .observe(now.duration_since(sent).as_secs_f64());
        }
        // Gauges walk every programmed frontend: after the latency is taken,
        // and at most once a GAUGES_EVERY while changes stream in.
        self.schedule_gauges();
        self.health.updates_done(n);
        self.health.synced();
        if let Ok(t) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
            self.metrics.last_sync.set(t.as_secs_f64());
        }
        if !self.first_sync {
            self.first_sync = true;
            self.metrics.first_sync.set(elapsed.as_secs_f64());
            info!(
                service_ports = self.desired.service_ports(),
                writes = report.writes,
                took = ?elapsed,
                "first full sync programmed"
            );
        } else if report.writes > 0 {
            debug!(writes = report.writes, took = ?elapsed, "synced");
        }
        true
    }

    /// Reconciles the service ports in `pending`, with those the
    /// reconciler wants besides, translated for it.
    fn reconcile_changed(&mut self, pending: &BTreeSet<ServicePortName>) -> Report {
        let now = Instant::now();
        let wanted = self.reconciler.wanted(now, false);
        self.translate_for(pending.iter().chain(&wanted));
        let config = &self.config.translate;
        self.desired
            .with_cluster_ips(&self.stores, config, &self.reconciler, false);
        self.reconciler
            .reconcile(&self.desired.state, Scope::Changed(pending), now)
    }

    /// Translates the services of `names` that this reconcile has not.
    fn translate_for<'a>(&mut self, names: impl Iterator<Item = &'a ServicePortName>) {
        for name in names {
            self.problems_dirty |=
                self.desired
                    .translate_for(name, &self.stores, &self.config.translate);
        }
    }

    /// A full reconcile: every service translated and reconciled part by
    /// part ([`PART`] services at a time, in key order), then a sweep of
    /// what no service desires any more. The translations of one part
    /// are dropped before the next.
    fn reconcile_all(&mut self) -> Report {
        let mut total = Report::default();
        // At the end of a first list programmed as it streamed in, only
        // the services touched since are translated again.
        let stores = &self.stores;
        let only = self.first_list.take().and_then(|first| {
            let programmed = first.programmed;
            let only = first.finish(
                stores
                    .services
                    .keys()
                    .filter(|k| !stores.has_slices(k))
                    .cloned(),
            );
            if only.is_some() {
                info!(
                    services = programmed,
                    "services programmed while the first list streamed in"
                );
                // The list's pages and their decoded objects are freed,
                // much of it where the decoding threads allocated, which
                // the full reconcile below may not reuse: give it back
                // before that reconcile, not only after (it met its peak).
                let took = heap::give_back_free_pages();
                debug!(?took, "free heap pages given back at the first list's end");
            }
            only
        });
        // Services gone from the stores that still contributed.
        let stored = |k: &ObjectKey| self.stores.services.contains_key(k);
        let mut gone: BTreeSet<ObjectKey> = self
            .desired
            .problems_of
            .keys()
            .chain(&self.desired.wants_node_ports)
            .chain(self.desired.health_checks.keys())
            .filter(|k| !stored(k))
            .cloned()
            .collect();
        gone.extend(self.desired.ports_of.keys().filter(|k| !stored(k)));
        // The record's tables are grown once for every service, unless the
        // first list's programming has grown them already: growing a
        // table that holds most of them would hold two copies at once.
        if only.is_none() {
            let services = self.stores.services.len();
            self.reconciler.reserve(services, services);
        }
        // The services gone from the stores go with the first part.
        let config = &self.config.translate;
        let mut names = BTreeSet::new();
        let mut problems = false;
        for key in &gone {
            problems |= self
                .desired
                .translate(key, &self.stores, config, &mut names);
        }
        let mut after: Option<ObjectKey> = None;
        loop {
            let from = after.as_ref().map_or(Unbounded, Excluded);
            let keys: Vec<ObjectKey> = match &only {
                Some(only) => only
                    .range::<ObjectKey, _>((from, Unbounded))
                    .take(self.part)
                    .cloned()
                    .collect(),
                None => self
                    .stores
                    .services
                    .range::<ObjectKey, _>((from, Unbounded))
                    .take(self.part)
                    .map(|(k, _)| k.clone())
                    .collect(),
            };
            for key in &keys {
                problems |= self
                    .desired
                    .translate(key, &self.stores, config, &mut names);
            }
            if !names.is_empty() {
                let report = self.reconciler.reconcile(
                    &self.desired.state,
                    Scope::Part(&names),
                    Instant::now(),
                );
                total.add(report);
            }
            self.desired.forget_translations();
            names.clear();
            if keys.len() < self.part {
                break;
            }
            after = keys.last().cloned();
        }
        self.problems_dirty |= problems;
        // The sweep: service ports held but no longer desired, and those
        // the reconciler wants again (waiting for room, refused, draining).
        let now = Instant::now();
        let wanted = self.reconciler.wanted(now, true);
        let mut names: BTreeSet<ServicePortName> = self
            .reconciler
            .held()
            .filter(|n| !self.desired.holds(n))
            .cloned()
            .collect();
        self.translate_for(wanted.iter());
        names.extend(wanted);
        let config = &self.config.translate;
        self.desired
            .with_cluster_ips(&self.stores, config, &self.reconciler, true);
        let report = self
            .reconciler
            .reconcile(&self.desired.state, Scope::Sweep(&names), now);
        total.add(report);
        total
    }

    fn scan_conntrack(&mut self) {
        match self.reconciler.scan_conntrack(Instant::now()) {
            Ok(scan) => {
                self.metrics.conntrack_entries.set(scan.entries as i64);
                self.metrics.conntrack_deleted.inc_by(scan.deleted as u64);
                let counts = [
                    (sluice_common::maps::CONNTRACK_V4, scan.entries_v4),
                    (sluice_common::maps::CONNTRACK_V6, scan.entries_v6),
                    (sluice_common::maps::SOCK_TABLE, scan.sock_table),
                ];
                self.set_fill(&counts);
                for e in &scan.errors {
                    warn!(error = %e, "conntrack cleanup failed");
                }
            }
            Err(e) => warn!(error = %e, "conntrack scan failed"),
        }
    }

    /// Sets the fill ratio gauge of each map in `counts`.
    fn set_fill(&self, counts: &[Occupancy]) {
        for (map, ratio) in fill_ratios(counts, &self.config.sizes) {
            self.metrics
                .map_fill
                .get_or_create(&MapLabel { map: map.into() })
                .set(ratio);
        }
    }

    /// Refreshes the gauges now if they were last refreshed more than
    /// `GAUGES_EVERY` ago (or never), else once that much has passed.
    fn schedule_gauges(&mut self) {
        let now = Instant::now();
        match self.gauges_at {
            Some(at) if now.duration_since(at) < GAUGES_EVERY => {
                self.gauges_due.get_or_insert(at + GAUGES_EVERY);
            }
            _ => self.update_gauges(),
        }
    }

    fn update_gauges(&mut self) {
        self.gauges_at = Some(Instant::now());
        self.gauges_due = None;
        let programmed = self.reconciler.programmed();
        let occupancy = self.reconciler.occupancy();
        let entries: usize = occupancy
            .iter()
            .filter(|(map, _)| {
                [
                    sluice_common::maps::SERVICES_V4,
                    sluice_common::maps::SERVICES_V6,
                ]
                .contains(map)
            })
            .map(|(_, n)| n)
            .sum();
        // Every frontend has one master entry; the rest are slots.
        let slots = entries.saturating_sub(programmed.frontends.len());
        self.metrics
            .frontends
            .set(programmed.frontends.len() as i64);
        self.metrics.backends.set(programmed.backends.len() as i64);
        self.metrics.slots.set(slots as i64);
        self.metrics.draining.set(self.reconciler.draining() as i64);
        self.set_fill(&occupancy);
        let mut refused: BTreeMap<&'static str, i64> = BTreeMap::new();
        for why in self.reconciler.refused().values() {
            *refused.entry(why.reason()).or_default() += 1;
        }
        for reason in Refusal::REASONS {
            self.metrics
                .refused
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .set(refused.get(reason).copied().unwrap_or(0));
        }
        self.metrics
            .maglev_fallback
            .set(self.reconciler.maglev_fallback().len() as i64);
        let maps = self.reconciler.writer();
        for stat in sluice_common::Stat::ALL {
            if let Ok(v) = maps.stat(stat) {
                self.metrics
                    .datapath
                    .get_or_create(&ReasonLabel {
                        reason: stat.name().into(),
                    })
                    .set(v as i64);
            }
        }
    }
}

mod desired;
mod first_list;
mod ports;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
