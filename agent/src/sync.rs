//! The sync task: the one task that writes the datapath maps.
//!
//! It owns the stores (trimmed objects) and the reconciler. Each batch of
//! updates that changes anything translation reads is translated and
//! reconciled; nothing is written before every kind has been listed once
//! (a restarted agent must not delete what it has not yet seen). Between
//! changes it scans conntrack: every `gc_interval` to collect expired
//! entries, every `drain_interval` while backends drain, so a backend
//! leaves the maps soon after its last flow ends.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::{
    datapath::MapSizes,
    health::Health,
    metrics::{MapLabel, Metrics, ReasonLabel},
    model::DesiredState,
    reconcile::Reconciler,
    sources::Envelope,
    stores::Stores,
    translate::{translate, Problem, TranslateConfig},
};

pub struct SyncConfig {
    pub translate: TranslateConfig,
    pub sizes: MapSizes,
    pub gc_interval: Duration,
    pub drain_interval: Duration,
}

pub struct Sync {
    config: SyncConfig,
    reconciler: Reconciler,
    stores: Stores,
    desired: DesiredState,
    problems: BTreeSet<Problem>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    /// Updates received but not yet in the maps, with when they were sent.
    unsynced: Vec<Instant>,
    first_sync: bool,
}

impl Sync {
    pub fn new(
        config: SyncConfig,
        reconciler: Reconciler,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            reconciler,
            stores: Stores::default(),
            desired: DesiredState::default(),
            problems: BTreeSet::new(),
            health,
            metrics,
            unsynced: Vec::new(),
            first_sync: false,
        }
    }

    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<Envelope>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut next_scan = Instant::now() + self.config.gc_interval;
        loop {
            let mut changed = false;
            let wait = next_scan.saturating_duration_since(Instant::now());
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                received = rx.recv() => {
                    let Some(first) = received else { break };
                    changed |= self.receive(first);
                    // Coalesce whatever else is already queued.
                    while let Ok(more) = rx.try_recv() {
                        changed |= self.receive(more);
                    }
                }
                _ = tokio::time::sleep(wait) => {}
            }
            if !self.stores.all_synced() {
                continue;
            }
            let scan_due = Instant::now() >= next_scan;
            if scan_due && self.first_sync {
                self.scan_conntrack();
            }
            if changed || !self.first_sync {
                self.translate();
            }
            if changed || scan_due || !self.first_sync {
                let ok = tokio::task::block_in_place(|| self.reconcile());
                if !ok {
                    // Retry soon; `/healthz` turns red if this persists.
                    next_scan = Instant::now() + Duration::from_secs(1);
                    continue;
                }
            }
            if scan_due || changed {
                let interval = if self.reconciler.draining() > 0 {
                    self.config.drain_interval
                } else {
                    self.config.gc_interval
                };
                next_scan = Instant::now() + interval;
            }
        }
        info!("sync task stopped; the datapath keeps running on its pinned maps");
    }

    fn receive(&mut self, (sent, update): Envelope) -> bool {
        self.unsynced.push(sent);
        self.stores.apply(update)
    }

    fn translate(&mut self) {
        let node = self.stores.node(&self.config.translate.node_name);
        let translation = translate(
            &self.stores.services,
            &self.stores.slices,
            node,
            &self.config.translate,
        );
        let mut problems: BTreeSet<Problem> = translation.problems.into_iter().collect();
        problems.extend(self.stores.rejected.values().cloned());
        for p in problems.difference(&self.problems) {
            warn!(problem = %p, "left out");
        }
        let mut by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
        for p in &problems {
            *by_reason.entry(p.reason.label()).or_default() += 1;
        }
        for reason in crate::translate::ProblemReason::ALL {
            let label = ReasonLabel {
                reason: reason.label().to_owned(),
            };
            self.metrics
                .rejected
                .get_or_create(&label)
                .set(by_reason.get(reason.label()).copied().unwrap_or(0));
        }
        self.problems = problems;
        self.desired = translation.desired;
    }

    /// Reconciles; true when the maps now equal the target.
    fn reconcile(&mut self) -> bool {
        let started = Instant::now();
        let report = self.reconciler.reconcile(&self.desired, started);
        let elapsed = started.elapsed();
        self.metrics.sync_duration.observe(elapsed.as_secs_f64());
        let mut refused: BTreeMap<&'static str, i64> = BTreeMap::new();
        for (_, why) in &report.refused {
            *refused.entry(why.reason()).or_default() += 1;
        }
        for reason in [
            "too_many_backends",
            "frontend_conflict",
            "ipv6_unsupported",
            "maps_full",
        ] {
            self.metrics
                .refused
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .set(refused.get(reason).copied().unwrap_or(0));
        }
        for e in &report.errors {
            warn!(error = %e, "map write failed");
        }
        self.metrics
            .map_write_errors
            .inc_by(report.errors.len() as u64);
        self.metrics.map_writes.inc_by(report.writes);
        self.update_gauges();
        if !report.errors.is_empty() {
            return false;
        }
        let now = Instant::now();
        let n = self.unsynced.len() as u64;
        for sent in self.unsynced.drain(..) {
            self.metrics
                .update_latency
                .observe(now.duration_since(sent).as_secs_f64());
        }
        self.health.updates_done(n);
        self.health.synced();
        if let Ok(t) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
            self.metrics.last_sync.set(t.as_secs_f64());
        }
        if !self.first_sync {
            self.first_sync = true;
            info!(
                service_ports = self.desired.services.len(),
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
                self.metrics
                    .map_fill
                    .get_or_create(&MapLabel {
                        map: "sl_ct4".into(),
                    })
                    .set(scan.entries as f64 / f64::from(self.config.sizes.conntrack.max(1)));
                self.metrics.conntrack_deleted.inc_by(scan.deleted as u64);
                for e in &scan.errors {
                    warn!(error = %e, "conntrack cleanup failed");
                }
            }
            Err(e) => warn!(error = %e, "conntrack scan failed"),
        }
    }

    fn update_gauges(&self) {
        let programmed = self.reconciler.programmed();
        let slots: usize = programmed.frontends.values().map(|f| f.slots.len()).sum();
        self.metrics
            .frontends
            .set(programmed.frontends.len() as i64);
        self.metrics.backends.set(programmed.backends.len() as i64);
        self.metrics.slots.set(slots as i64);
        self.metrics.draining.set(self.reconciler.draining() as i64);
        let fill = [
            (
                "sl_svc4",
                programmed.service_entries() as f64 / f64::from(self.config.sizes.services.max(1)),
            ),
            (
                "sl_backends",
                programmed.backends.len() as f64 / f64::from(self.config.sizes.backends.max(1)),
            ),
        ];
        for (map, ratio) in fill {
            self.metrics
                .map_fill
                .get_or_create(&MapLabel { map: map.into() })
                .set(ratio);
        }
        let maps = self.reconciler.writer().maps();
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
