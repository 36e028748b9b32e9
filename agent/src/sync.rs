//! The sync task: the one task that writes the datapath maps.
//!
//! It owns the stores (trimmed objects) and the reconciler. A batch of
//! updates marks the services it touched; only those are retranslated, and
//! only the service ports whose desired state changed are reconciled, so an
//! endpoint change costs work proportional to its service, not to the
//! cluster. Nothing is written before every kind has been listed once (a
//! restarted agent must not delete what it has not yet seen), and a full
//! reconcile runs then and every `resync_interval` as a safety net.
//! Between changes it scans conntrack: every `gc_interval` to collect
//! expired entries, every `drain_interval` while backends drain, so a
//! backend leaves the maps soon after its last flow ends.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::{
    datapath::{fill_ratios, MapSizes, MapWriter, MapWrites, Occupancy},
    health::Health,
    healthcheck::HealthChecks,
    metrics::{MapLabel, Metrics, ReasonLabel},
    model::{DesiredState, ServicePortName},
    reconcile::{Reconciler, Refusal, Scope},
    sources::Envelope,
    stores::{Dirty, Stores},
    translate::{
        translate_service, wanted_service_cidrs, HealthCheck, NodeContext, ObjectKey, Problem,
        ProblemReason, TranslateConfig,
    },
};

pub struct SyncConfig {
    pub translate: TranslateConfig,
    pub sizes: MapSizes,
    pub gc_interval: Duration,
    pub drain_interval: Duration,
    pub resync_interval: Duration,
}

/// The desired state, kept up to date service by service.
#[derive(Default)]
struct Desired {
    state: DesiredState,
    /// Service ports and problems each service contributed.
    ports_of: HashMap<ObjectKey, Vec<ServicePortName>>,
    problems_of: HashMap<ObjectKey, Vec<Problem>>,
    wants_node_ports: BTreeSet<ObjectKey>,
    health_checks: BTreeMap<ObjectKey, HealthCheck>,
    node: NodeContext,
    /// Cluster IPs each service contributed, and how many services hold
    /// each (two may claim one in a manifest directory).
    cluster_ips_of: HashMap<ObjectKey, Vec<std::net::IpAddr>>,
    cluster_ip_holders: HashMap<std::net::IpAddr, usize>,
}

impl Desired {
    /// Retranslates `services` (all when `dirty.all`); returns the service
    /// ports whose desired state changed (none when `full`: a full
    /// reconcile follows, which looks at every one; at 100,000 services
    /// the set would hold them all), and whether the problems the services
    /// contribute changed.
    fn update(
        &mut self,
        stores: &Stores,
        dirty: &Dirty,
        config: &TranslateConfig,
        full: bool,
    ) -> (BTreeSet<ServicePortName>, bool) {
        let mut changed = BTreeSet::new();
        let wanted_node_ports = !self.wants_node_ports.is_empty();
        let mut problems_changed = dirty.all;
        if dirty.all || dirty.cidrs {
            let objects: Vec<_> = stores.service_cidrs().into_iter().collect();
            let cidrs = wanted_service_cidrs(&objects, config);
            if cidrs != self.state.service_cidrs || self.state.nets_version == 0 {
                self.state.service_cidrs = cidrs;
                self.state.nets_version += 1;
            }
        }
        let keys: Vec<ObjectKey> = if dirty.all {
            self.node = NodeContext::new(stores.node(&config.node_name), config);
            self.state.local_sources = self.node.local_sources.clone();
            stores
                .services
                .keys()
                .chain(self.ports_of.keys())
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        } else {
            dirty.services.iter().cloned().collect()
        };
        for key in keys {
            let old: BTreeMap<ServicePortName, _> = self
                .ports_of
                .remove(&key)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|name| self.state.services.remove(&name).map(|svc| (name, svc)))
                .collect();
            let old_problems = self.problems_of.remove(&key);
            // Released after the new translation holds its own: an
            // unchanged cluster IP never leaves the set.
            let old_ips = self.cluster_ips_of.remove(&key).unwrap_or_default();
            self.wants_node_ports.remove(&key);
            self.health_checks.remove(&key);
            let mut new_names = Vec::new();
            if let Some(svc) = stores.services.get(&key) {
                let t = translate_service(&key, svc, &stores.slices_of(&key), &self.node, config);
                if t.wants_node_ports {
                    self.wants_node_ports.insert(key.clone());
                }
                for ip in &t.cluster_ips {
                    *self.cluster_ip_holders.entry(*ip).or_default() += 1;
                    if self.state.cluster_ips.insert(*ip) {
                        self.state.nets_version += 1;
                    }
                }
                if !t.cluster_ips.is_empty() {
                    self.cluster_ips_of
                        .insert(key.clone(), t.cluster_ips.clone());
                }
                if let Some(hc) = t.health_check {
                    self.health_checks.insert(key.clone(), hc);
                }
                if !t.problems.is_empty() {
                    self.problems_of.insert(key.clone(), t.problems);
                }
                new_names.reserve_exact(t.ports.len());
                for (name, desired) in t.ports {
                    if !full && old.get(&name) != Some(&desired) {
                        changed.insert(name.clone());
                    }
                    new_names.push(name.clone());
                    self.state.services.insert(name, desired);
                }
            }
            for ip in old_ips {
                self.release_cluster_ip(ip);
            }
            for name in old.into_keys() {
                if !full && !self.state.services.contains_key(&name) {
                    changed.insert(name);
                }
            }
            problems_changed |= old_problems.as_ref() != self.problems_of.get(&key);
            if !new_names.is_empty() {
                self.ports_of.insert(key, new_names);
            }
        }
        if dirty.all {
            // Translated in key order: 7 MB less at 100,000 services.
            crate::stores::compact(&mut self.state.services);
        }
        problems_changed |= wanted_node_ports == self.wants_node_ports.is_empty();
        (changed, problems_changed)
    }

    /// One service less holds cluster IP `ip`.
    fn release_cluster_ip(&mut self, ip: std::net::IpAddr) {
        if let Some(n) = self.cluster_ip_holders.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.cluster_ip_holders.remove(&ip);
                self.state.cluster_ips.remove(&ip);
                self.state.nets_version += 1;
            }
        }
    }

    /// The health check node ports to serve (the first service wins a port).
    fn health_checks(&self) -> HealthChecks {
        let mut out = HealthChecks::new();
        for (svc, hc) in &self.health_checks {
            out.entry(hc.port)
                .or_insert_with(|| (svc.clone(), hc.local_endpoints));
        }
        out
    }

    /// Every current problem: the node's, the services', the slices', and
    /// the objects that could not be used.
    fn problems(&self, stores: &Stores, config: &TranslateConfig) -> BTreeSet<Problem> {
        let mut all: BTreeSet<Problem> = self.node.problems.iter().cloned().collect();
        if !self.wants_node_ports.is_empty() {
            all.extend(self.node.node_port_problems(config));
        }
        all.extend(self.problems_of.values().flatten().cloned());
        all.extend(
            stores
                .slices
                .values()
                .flat_map(|s| s.problems.iter().cloned()),
        );
        all.extend(
            stores
                .service_cidrs
                .values()
                .flat_map(|c| c.problems.iter().cloned()),
        );
        all.extend(stores.rejected.values().cloned());
        all
    }
}

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
        }
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
        loop {
            let wait = due
                .scan
                .min(due.resync)
                .min(self.gauges_due.unwrap_or(due.scan))
                .saturating_duration_since(Instant::now());
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
        if translated {
            let (changed, problems_changed) =
                self.desired
                    .update(&self.stores, &dirty, &self.config.translate, resync_due);
            self.pending.extend(changed);
            self.problems_dirty |= problems_changed || dirty.rejected || dirty.cidrs;
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
        let work = resync_due
            || scan_due
            || self.ifaces_dirty
            || !self.pending.is_empty()
            || !self.unsynced.is_empty();
        // The problem report walks every stored object: after the map
        // writes, so that it never delays a change reaching the maps.
        let ok = !work || tokio::task::block_in_place(|| self.reconcile(resync_due));
        if translated && self.problems_dirty {
            self.problems_dirty = false;
            self.refresh_problems();
        }
        if self.gauges_due.is_some_and(|t| Instant::now() >= t) {
            self.update_gauges();
        }
        if work {
            if !ok {
                // Retry soon; `/healthz` turns red if this persists.
                due.scan = Instant::now() + Duration::from_secs(1);
                return;
            }
            if resync_due {
                due.resync = Instant::now() + self.config.resync_interval;
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
        let dirty = self.stores.apply(update);
        self.dirty.merge(dirty);
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
        let scope = if full {
            Scope::All
        } else {
            Scope::Changed(&pending)
        };
        let report = self
            .reconciler
            .reconcile(&self.desired.state, scope, started);
        self.ifaces_dirty = false;
        let elapsed = started.elapsed();
        self.metrics.sync_duration.observe(elapsed.as_secs_f64());
        self.metrics.map_writes.inc_by(report.writes);
        self.metrics
            .map_write_errors
            .inc_by(report.errors.len() as u64);
        for e in &report.errors {
            warn!(error = %e, "map write failed");
        }
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
                service_ports = self.desired.state.services.len(),
                writes = report.writes,
                took = ?elapsed,
                "first full sync programmed"
            );
        } else if report.writes > 0 {
            debug!(writes = report.writes, took = ?elapsed, "synced");
        }
        true
    }

    fn scan_conntrack(&mut self) {
        match self.reconciler.scan_conntrack(Instant::now()) {
            Ok(scan) => {
                self.metrics.conntrack_entries.set(scan.entries as i64);
                self.metrics.conntrack_deleted.inc_by(scan.deleted as u64);
                let counts = [
                    (sluice_common::maps::CONNTRACK_V4, scan.entries_v4),
                    (sluice_common::maps::CONNTRACK_V6, scan.entries_v6),
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

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
