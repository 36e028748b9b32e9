//! Endpoint-change latency while the cluster churns: a background thread
//! changes the EndpointSlices of other services at a fixed rate (a rolling
//! update of many deployments at once) through the test API server, while
//! the churned target service's changes are timed as in the quiet series.
//! Each rate runs for a window; afterwards the bench waits for the last
//! background change to show in the maps: that lag grows with the backlog
//! when the agent cannot keep up. The sustainable rate is the highest one
//! whose p99 stays under the goal with no backlog left.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use sluice::datapath::Maps;
use sluice_common::{Svc4Key, IPPROTO_TCP};

use super::{
    control::slice_json,
    services::{ServiceSet, ENDPOINTS, SERVICE_PORT},
    stats::Latency,
};
use crate::apiserver::ApiHandle;

/// The endpoint-change goal under churn (p99).
pub const GOAL_P99_MS: f64 = 5.0;
/// Lag of the last background change above which the agent is taken to
/// have fallen behind.
pub const BACKLOG_MS: f64 = 50.0;

/// One background rate.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RatePoint {
    /// Changes per second asked for.
    pub rate: u32,
    /// Changes per second the bench actually published.
    pub achieved: f64,
    /// The target service's changes, timed during the window.
    pub latency: Option<Latency>,
    /// After the window: how long the last background change took to show.
    pub lag_ms: Option<f64>,
    pub error: Option<String>,
}

impl RatePoint {
    /// Whether the agent kept up at this rate.
    pub fn sustained(&self) -> bool {
        let p99_ok = self
            .latency
            .as_ref()
            .is_some_and(|l| l.p99_us / 1e3 < GOAL_P99_MS);
        p99_ok
            && self.lag_ms.is_some_and(|l| l < BACKLOG_MS)
            && self.achieved >= 0.9 * f64::from(self.rate)
    }
}

/// The highest rate kept up with (the rates are tried in increasing
/// order; the first one missed ends the run).
pub fn sustained_rate(points: &[RatePoint]) -> Option<u32> {
    points
        .iter()
        .take_while(|p| p.sustained())
        .map(|p| p.rate)
        .last()
}

fn key(set: &ServiceSet, i: usize) -> Svc4Key {
    Svc4Key::new(set.vip(i).octets(), SERVICE_PORT, IPPROTO_TCP, 0)
}

fn active(maps: &Maps, key: &Svc4Key) -> Option<u16> {
    maps.services_v4.get(key, 0).ok().map(|v| v.active)
}

/// Polls until `key`'s master shows `want` active backends.
fn wait_for(maps: &Maps, key: &Svc4Key, want: u16, budget: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if active(maps, key) == Some(want) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > budget {
            bail!("a change did not reach the maps within {budget:?}");
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Background churn state: which services currently have endpoint 0 not
/// ready.
struct Background {
    not_ready: Vec<bool>,
    next: usize,
}

impl Background {
    /// The next service to change (a stride through every service but the
    /// target), and whether endpoint 0 becomes not ready.
    fn step(&mut self, set: &ServiceSet, target: usize) -> (usize, bool) {
        loop {
            // A prime stride visits every service before repeating.
            let i = (self.next * 7919) % set.n;
            self.next += 1;
            if i != target {
                self.not_ready[i] = !self.not_ready[i];
                return (i, self.not_ready[i]);
            }
        }
    }
}

/// Runs every rate of `rates` (increasing) for `window`, stopping after the
/// first rate the agent does not keep up with.
pub fn rate_series(
    api: &ApiHandle,
    maps: &Maps,
    set: &ServiceSet,
    target: usize,
    rates: &[u32],
    window: Duration,
) -> Vec<RatePoint> {
    let mut bg = Background {
        not_ready: vec![false; set.n],
        next: 1,
    };
    let mut target_not_ready = false;
    let mut out = Vec::new();
    if set.n < 3 {
        return out;
    }
    for &rate in rates {
        let point = one_rate(
            api,
            maps,
            set,
            target,
            &mut target_not_ready,
            &mut bg,
            rate,
            window,
        )
        .unwrap_or_else(|e| RatePoint {
            rate,
            error: Some(format!("{e:#}")),
            ..RatePoint::default()
        });
        let kept_up = point.sustained();
        out.push(point);
        if !kept_up {
            break;
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn one_rate(
    api: &ApiHandle,
    maps: &Maps,
    set: &ServiceSet,
    target: usize,
    target_not_ready: &mut bool,
    bg: &mut Background,
    rate: u32,
    window: Duration,
) -> Result<RatePoint> {
    let full = ENDPOINTS as u16;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    type Published = (usize, Option<(usize, bool)>);
    let ((published, last), samples) = std::thread::scope(|s| -> Result<(Published, Vec<u64>)> {
        let publisher = s.spawn(|| -> Result<Published> {
            let t0 = Instant::now();
            let mut n = 0usize;
            let mut last = None;
            while !stop.load(Ordering::Relaxed) {
                let due = t0 + Duration::from_secs_f64(n as f64 / f64::from(rate));
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let (i, not_ready) = bg.step(set, target);
                api.apply_json(slice_json(set, i, not_ready.then_some(0)))?;
                last = Some((i, not_ready));
                n += 1;
            }
            Ok((n, last))
        });
        let mut samples = Vec::new();
        let mut failed = None;
        while started.elapsed() < window {
            *target_not_ready = !*target_not_ready;
            let want = if *target_not_ready { full - 1 } else { full };
            // Timed from the server's commit, as `control`'s series.
            let slice = slice_json(set, target, target_not_ready.then_some(ENDPOINTS - 1));
            let t = match api.apply_json_timed(slice) {
                Ok((_, Some(at))) => at,
                Ok((_, None)) => {
                    failed = Some(anyhow::anyhow!("the target's change changed nothing"));
                    break;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            match wait_for(maps, &key(set, target), want, Duration::from_secs(30)) {
                Ok(_) => samples.push(t.elapsed().as_nanos() as u64),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        let published = publisher
            .join()
            .map_err(|_| anyhow::anyhow!("publisher panicked"))??;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok((published, samples))
    })?;
    let elapsed = started.elapsed();
    let lag_ms = match last {
        Some((i, not_ready)) => {
            let want = if not_ready { full - 1 } else { full };
            Some(wait_for(maps, &key(set, i), want, Duration::from_secs(60))?.as_secs_f64() * 1e3)
        }
        None => None,
    };
    Ok(RatePoint {
        rate,
        achieved: published as f64 / elapsed.as_secs_f64(),
        latency: (!samples.is_empty()).then(|| Latency::from_ns(samples)),
        lag_ms,
        error: None,
    })
}
