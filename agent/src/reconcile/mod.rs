//! The reconciler: the single owner of the datapath maps.
//!
//! It keeps an exact record of what is programmed (read back from the
//! pinned maps when it starts, so a restarted agent adopts its
//! predecessor's state), computes the target content from the desired
//! state, and writes only the difference, in an order that never lets a
//! packet see a slot without its backend. An unchanged desired state costs
//! no syscall at all.

mod drain;
mod ids;
mod target;

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

pub use drain::{Drain, FlowCounts};
pub use target::{endpoint_of, Capacity, Refusal};
use tracing::{debug, warn};

use crate::{
    conntrack,
    datapath::{read_map_state, DatapathError, MapSizes, MapWriter, WriteError},
    model::{DesiredState, ServicePortName},
    state::MapState,
};
use ids::Ids;
use sluice_common::{Config, Svc4Key, ABI_VERSION};

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct Report {
    /// Map updates and deletions issued.
    pub writes: u64,
    pub refused: Vec<(ServicePortName, Refusal)>,
    pub errors: Vec<WriteError>,
    pub backends_removed: usize,
}

/// What one conntrack scan did.
#[derive(Debug, Default)]
pub struct ScanReport {
    pub entries: usize,
    pub deleted: usize,
    pub errors: Vec<WriteError>,
}

pub struct Reconciler {
    writer: MapWriter,
    programmed: MapState,
    foreign: Vec<Svc4Key>,
    ids: Ids,
    drain: Drain,
    capacity: Capacity,
}

impl Reconciler {
    /// Adopts what the maps hold now and makes sure the config entry is set.
    pub fn new(
        mut writer: MapWriter,
        sizes: &MapSizes,
        drain_timeout: Duration,
    ) -> Result<Self, DatapathError> {
        let config = writer.maps().config()?;
        if config.abi_version == 0 {
            writer
                .write_config(&Config {
                    abi_version: ABI_VERSION,
                    hash_seed: random_seed(),
                })
                .map_err(|e| DatapathError::Io {
                    path: sluice_common::maps::CONFIG.into(),
                    source: std::io::Error::other(e),
                })?;
        }
        let (programmed, foreign) = read_map_state(writer.maps())?;
        let ids = Ids::adopt(&programmed);
        Ok(Self {
            writer,
            programmed,
            foreign,
            ids,
            drain: Drain::new(drain_timeout),
            capacity: Capacity {
                service_entries: sizes.services as usize,
                backends: sizes.backends as usize,
            },
        })
    }

    /// What the maps hold.
    pub fn programmed(&self) -> &MapState {
        &self.programmed
    }

    /// Backends waiting for their flows to end.
    pub fn draining(&self) -> usize {
        self.drain.pending()
    }

    /// Live flows per backend at the last conntrack scan.
    pub fn flows(&self) -> Option<&std::collections::HashMap<u32, u32>> {
        self.drain.flows()
    }

    /// Read access to the maps (conntrack listing, counters).
    pub fn writer(&self) -> &MapWriter {
        &self.writer
    }

    /// Brings the maps to the target computed from `desired`.
    pub fn reconcile(&mut self, desired: &DesiredState, now: Instant) -> Report {
        let removable = self.drain.removable(now);
        let target = target::compute(
            desired,
            &self.programmed,
            &mut self.ids,
            &removable,
            self.capacity,
        );
        self.ids.retain(|name| desired.services.contains_key(name));
        self.drain.track(&target.maps, now);

        let before = self.writer.writes();
        let mut report = Report {
            refused: target.refused,
            ..Report::default()
        };
        self.apply(&target.maps, &mut report);
        report.writes = self.writer.writes() - before;
        for (name, why) in &report.refused {
            warn!(service = %name, reason = why.reason(), "service port refused: {why}");
        }
        report
    }

    fn apply(&mut self, target: &MapState, report: &mut Report) {
        // Entries of a protocol we do not know cannot be ours to keep.
        for key in std::mem::take(&mut self.foreign) {
            match self.writer.delete_service_entry(key) {
                Ok(()) => {}
                Err(e) => {
                    self.foreign.push(key);
                    report.errors.push(e);
                }
            }
        }
        // 1. Frontends that go: master first, then slots.
        let gone: Vec<_> = self
            .programmed
            .frontends
            .keys()
            .filter(|k| !target.frontends.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            let Some(mut current) = self.programmed.frontends.remove(&key) else {
                continue;
            };
            match self.writer.delete_frontend(&key, &mut current) {
                Ok(()) => {}
                Err(e) => {
                    report.errors.push(e);
                    self.programmed.frontends.insert(key, current);
                }
            }
        }
        // 2. New and changed backends, before any slot names them.
        for (id, backend) in &target.backends {
            if self.programmed.backends.get(id) == Some(backend) {
                continue;
            }
            match self.writer.put_backend(*id, backend) {
                Ok(()) => {
                    self.programmed.backends.insert(*id, *backend);
                }
                Err(e) => report.errors.push(e),
            }
        }
        // 3. Frontends: shrinking ones first so the service map never holds
        //    more than the larger of before and after.
        let mut changed: Vec<_> = target
            .frontends
            .iter()
            .filter(|(k, t)| self.programmed.frontends.get(k) != Some(t))
            .collect();
        changed.sort_by_key(|(k, t)| {
            let now = self
                .programmed
                .frontends
                .get(k)
                .map_or(0, |c| c.slots.len());
            (t.slots.len() as isize - now as isize, **k)
        });
        for (key, want) in changed {
            if let Some(missing) = want
                .slots
                .iter()
                .find(|id| !self.programmed.backends.contains_key(id))
            {
                debug!(frontend = %key, backend = missing, "skipping frontend: its backend is not written");
                continue;
            }
            let mut current = self.programmed.frontends.remove(key).unwrap_or_default();
            if let Err(e) = self.writer.sync_frontend(key, &mut current, want) {
                report.errors.push(e);
            }
            self.programmed.frontends.insert(*key, current);
        }
        // 4. Backends that go, once no slot names them.
        let referenced: HashSet<u32> = self
            .programmed
            .frontends
            .values()
            .flat_map(|f| f.slots.iter().copied())
            .collect();
        let gone: Vec<u32> = self
            .programmed
            .backends
            .keys()
            .filter(|id| !target.backends.contains_key(id) && !referenced.contains(id))
            .copied()
            .collect();
        for id in gone {
            match self.writer.delete_backend(id) {
                Ok(()) => {
                    self.programmed.backends.remove(&id);
                    report.backends_removed += 1;
                }
                Err(e) => report.errors.push(e),
            }
        }
    }

    /// Scans conntrack: deletes stale entries (including every entry of a
    /// removed backend) and records live flows per backend for the drain
    /// manager. `now` must be taken before the scan starts.
    pub fn scan_conntrack(&mut self, now: Instant) -> Result<ScanReport, DatapathError> {
        let entries = conntrack::read_all(self.writer.maps())?;
        let scan = conntrack::scan(
            &entries,
            &self.programmed.backends,
            conntrack::monotonic_ns(),
        );
        let mut report = ScanReport {
            entries: scan.entries,
            ..ScanReport::default()
        };
        for key in &scan.stale {
            match self.writer.delete_conntrack(key) {
                Ok(()) => report.deleted += 1,
                Err(e) => report.errors.push(e),
            }
        }
        self.drain.record_scan(FlowCounts {
            started: now,
            flows: scan.flows,
        });
        Ok(report)
    }

    /// Map writes issued since this reconciler started.
    pub fn total_writes(&self) -> u64 {
        self.writer.writes()
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
