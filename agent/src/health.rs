//! What `/healthz` and `/readyz` report.
//!
//! Healthy means the sync loop keeps up: no update has waited longer than
//! the pending threshold without reaching the maps, and no watch has been
//! failing for longer than the API threshold. A stalled sync loop (the
//! failure of incident 3) therefore turns `/healthz` red. Ready means the
//! first complete sync reached the maps.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

#[derive(Debug, Default)]
struct State {
    sent: u64,
    done: u64,
    oldest_pending: Option<Instant>,
    last_sync: Option<SystemTime>,
    first_sync: bool,
    /// When each failing watch (by the name of the kind it watches) began
    /// failing.
    api_down_since: BTreeMap<&'static str, Instant>,
}

#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
    pending_threshold: Duration,
    api_threshold: Duration,
}

/// A snapshot for the HTTP endpoints and `sluice status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub healthy: bool,
    pub ready: bool,
    pub reasons: Vec<String>,
    #[serde(skip)]
    pub last_sync: Option<SystemTime>,
    pub pending_seconds: Option<f64>,
    pub api_down_seconds: Option<f64>,
}

impl Health {
    pub fn new(pending_threshold: Duration, api_threshold: Duration) -> Self {
        Self {
            state: Mutex::new(State::default()),
            pending_threshold,
            api_threshold,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// A source handed an update to the sync task.
    pub fn update_sent(&self) {
        self.with(|s| {
            s.sent += 1;
            s.oldest_pending.get_or_insert_with(Instant::now);
        });
    }

    /// The sync task programmed everything up to `n` more updates.
    pub fn updates_done(&self, n: u64) {
        self.with(|s| {
            s.done += n;
            s.oldest_pending = (s.done < s.sent).then(Instant::now);
        });
    }

    /// The maps now equal the desired state.
    pub fn synced(&self) {
        self.with(|s| {
            s.last_sync = Some(SystemTime::now());
            s.first_sync = true;
        });
    }

    /// The watch of `kind` (a kind's name) works.
    pub fn api_ok(&self, kind: impl Into<&'static str>) {
        let kind = kind.into();
        self.with(|s| s.api_down_since.remove(kind));
    }

    /// The API answered: every watch may resume.
    pub fn api_ok_all(&self) {
        self.with(|s| s.api_down_since.clear());
    }

    /// No watch is failing.
    pub fn api_healthy(&self) -> bool {
        self.with(|s| s.api_down_since.is_empty())
    }

    /// The watch of `kind` (a kind's name) failed.
    pub fn api_error(&self, kind: impl Into<&'static str>) {
        let kind = kind.into();
        self.with(|s| {
            s.api_down_since.entry(kind).or_insert_with(Instant::now);
        });
    }

    pub fn last_sync(&self) -> Option<SystemTime> {
        self.with(|s| s.last_sync)
    }

    pub fn report(&self) -> Report {
        self.report_at(Instant::now())
    }

    /// The report as of `now`.
    fn report_at(&self, now: Instant) -> Report {
        self.with(|s| {
            let pending = s.oldest_pending.map(|t| now.duration_since(t));
            let api_down = s
                .api_down_since
                .values()
                .min()
                .map(|t| now.duration_since(*t));
            let mut reasons = Vec::new();
            if let Some(p) = pending.filter(|p| *p > self.pending_threshold) {
                reasons.push(format!(
                    "changes pending for {:.1}s (threshold {:?}): the sync loop is not keeping up",
                    p.as_secs_f64(),
                    self.pending_threshold
                ));
            }
            if let Some(d) = api_down.filter(|d| *d > self.api_threshold) {
                reasons.push(format!(
                    "Kubernetes API unreachable for {:.1}s (threshold {:?})",
                    d.as_secs_f64(),
                    self.api_threshold
                ));
            }
            Report {
                healthy: reasons.is_empty(),
                ready: s.first_sync,
                reasons,
                last_sync: s.last_sync,
                pending_seconds: pending.map(|d| d.as_secs_f64()),
                api_down_seconds: api_down.map(|d| d.as_secs_f64()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_updates_turn_unhealthy() {
        let h = Health::new(Duration::from_millis(20), Duration::from_secs(60));
        h.update_sent();
        assert!(h.report().healthy);
        let r = h.report_at(Instant::now() + Duration::from_millis(30));
        assert!(!r.healthy, "{r:?}");
        h.updates_done(1);
        assert!(h.report().healthy);
    }

    #[test]
    fn api_outage_turns_unhealthy_after_threshold() {
        let h = Health::new(Duration::from_secs(60), Duration::from_millis(20));
        h.api_error("Service");
        assert!(h.report().healthy);
        let later = Instant::now() + Duration::from_millis(30);
        assert!(!h.report_at(later).healthy);
        h.api_ok("Service");
        assert!(h.report().healthy);
    }

    #[test]
    fn ready_after_first_sync() {
        let h = Health::new(Duration::from_secs(1), Duration::from_secs(1));
        assert!(!h.report().ready);
        h.synced();
        assert!(h.report().ready);
    }
}
