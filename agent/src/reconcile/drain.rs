//! The drain manager: when may a non-selectable backend go?
//!
//! A backend that turns terminating or disappears stays in the maps (never
//! selected for new flows) until a conntrack scan that started after it
//! stopped being selectable finds no live flow on it, or until the drain
//! timeout passes. A backend that comes back is simply selectable again.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use sluice_common::{Backend, BackendState};

use super::ids::BackendId;

/// A scan only judges a backend if it started this long after the backend
/// stopped being selectable: a packet that picked the backend just before
/// may still be inserting its conntrack entry.
pub const SETTLE: Duration = Duration::from_millis(100);

/// Live flows per backend, from one conntrack scan.
#[derive(Debug, Clone)]
pub struct FlowCounts {
    /// When the scan started: only backends that stopped being selectable
    /// before this instant can be judged by it.
    pub started: Instant,
    pub flows: HashMap<BackendId, u32>,
}

#[derive(Debug)]
pub struct Drain {
    timeout: Duration,
    since: HashMap<BackendId, Instant>,
    last_scan: Option<FlowCounts>,
}

/// States that drain (and then leave the maps).
pub fn drains(state: u8) -> bool {
    matches!(
        BackendState::from_u8(state),
        BackendState::Terminating | BackendState::Draining
    )
}

impl Drain {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            since: HashMap::new(),
            last_scan: None,
        }
    }

    /// Backends whose drain is over.
    pub fn removable(&self, now: Instant) -> HashSet<BackendId> {
        self.since
            .iter()
            .filter(|(id, since)| {
                now.duration_since(**since) >= self.timeout
                    || self.last_scan.as_ref().is_some_and(|scan| {
                        scan.started >= **since + SETTLE
                            && scan.flows.get(id).copied().unwrap_or(0) == 0
                    })
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Starts the clock for backends that just began draining, stops it for
    /// those that became selectable again.
    pub fn track(&mut self, backends: &[(BackendId, Backend)], now: Instant) {
        for (id, backend) in backends {
            if drains(backend.state) {
                self.since.entry(*id).or_insert(now);
            } else {
                self.since.remove(id);
            }
        }
    }

    /// A backend left the maps.
    pub fn forget(&mut self, id: BackendId) {
        self.since.remove(&id);
    }

    pub fn record_scan(&mut self, counts: FlowCounts) {
        self.last_scan = Some(counts);
    }

    /// Backends currently draining.
    pub fn pending(&self) -> usize {
        self.since.len()
    }

    /// Live flows per backend at the last scan.
    pub fn flows(&self) -> Option<&HashMap<BackendId, u32>> {
        self.last_scan.as_ref().map(|s| &s.flows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_backend(id: u32, state: BackendState) -> Vec<(BackendId, Backend)> {
        vec![(
            BackendId(id),
            Backend {
                state: state as u8,
                ..Backend::default()
            },
        )]
    }

    #[test]
    fn needs_a_scan_after_the_drain_began() {
        let t0 = Instant::now();
        let mut d = Drain::new(Duration::from_secs(60));
        // A scan from before the drain began says nothing.
        d.record_scan(FlowCounts {
            started: t0,
            flows: HashMap::new(),
        });
        let t1 = t0 + Duration::from_millis(10);
        d.track(&with_backend(7, BackendState::Draining), t1);
        assert!(d.removable(t1).is_empty());
        // A scan right after the drain began is too early to judge.
        d.record_scan(FlowCounts {
            started: t1 + Duration::from_millis(1),
            flows: HashMap::new(),
        });
        assert!(d.removable(t1 + Duration::from_millis(2)).is_empty());
        // A later scan with a live flow keeps it.
        let t2 = t1 + SETTLE;
        d.record_scan(FlowCounts {
            started: t2,
            flows: HashMap::from([(BackendId(7), 1)]),
        });
        assert!(d.removable(t2).is_empty());
        // A later scan without flows releases it.
        d.record_scan(FlowCounts {
            started: t2 + Duration::from_millis(1),
            flows: HashMap::new(),
        });
        assert_eq!(
            d.removable(t2 + Duration::from_millis(2)),
            HashSet::from([BackendId(7)])
        );
    }

    #[test]
    fn timeout_releases_even_with_flows() {
        let t0 = Instant::now();
        let mut d = Drain::new(Duration::from_secs(5));
        d.track(&with_backend(1, BackendState::Terminating), t0);
        d.record_scan(FlowCounts {
            started: t0 + Duration::from_secs(1),
            flows: HashMap::from([(BackendId(1), 3)]),
        });
        assert!(d.removable(t0 + Duration::from_secs(4)).is_empty());
        assert_eq!(
            d.removable(t0 + Duration::from_secs(5)),
            HashSet::from([BackendId(1)])
        );
    }

    #[test]
    fn revived_backend_stops_draining() {
        let t0 = Instant::now();
        let mut d = Drain::new(Duration::from_secs(5));
        d.track(&with_backend(1, BackendState::Draining), t0);
        assert_eq!(d.pending(), 1);
        d.track(&with_backend(1, BackendState::Active), t0);
        assert_eq!(d.pending(), 0);
        assert!(d.removable(t0 + Duration::from_secs(10)).is_empty());
    }
}
