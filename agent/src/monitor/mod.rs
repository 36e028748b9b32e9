//! `sluice monitor`: the datapath's events (`sl_events`, see
//! `sluice_common::events`), read from the pinned ring buffer, filtered
//! and printed as they come. It only reads, so it works whether the agent
//! runs or not. A BPF ring buffer has one consumer position: two monitors
//! at once split the events between them.

mod filter;
mod record;

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::SocketAddr,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use aya::maps::{HashMap, Map, MapData, RingBuf};
use sluice_common::{config::CFG_F_EVENTS_DROPS, maps as names, Backend, Stat};
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

pub use filter::{Filter, FilterError};
pub use record::{line, parse, record, Record};

use crate::{cli::MonitorArgs, conntrack::monotonic_ns, datapath::Maps, reconcile::endpoint_of};

/// Opens the pinned ring buffer under `root`.
fn open_ring(root: &Path) -> Result<RingBuf<MapData>> {
    let path = root.join(names::EVENTS);
    if !path.exists() {
        bail!(
            "no {} under {}: no agent with datapath events (sluice monitor) has run here, or another --bpf-root is in use",
            names::EVENTS,
            root.display()
        );
    }
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    let map = Map::from_map_data(data).with_context(|| format!("opening {}", path.display()))?;
    RingBuf::try_from(map).with_context(|| format!("{} is not a ring buffer", path.display()))
}

/// The backends' addresses, looked up per event (a backend removed since
/// is shown by id only).
struct Backends(Option<HashMap<MapData, u32, Backend>>);

impl Backends {
    fn open(root: &Path) -> Self {
        let map = MapData::from_pin(root.join(names::BACKENDS))
            .ok()
            .and_then(|d| Map::from_map_data(d).ok())
            .and_then(|m| HashMap::try_from(m).ok());
        Self(map)
    }

    fn get(&self, id: u32) -> Option<SocketAddr> {
        if id == 0 {
            return None;
        }
        let b = self.0.as_ref()?.get(&id, 0).ok()?;
        let e = endpoint_of(&b);
        Some(SocketAddr::new(e.addr, e.port))
    }
}

/// `CLOCK_MONOTONIC` nanoseconds as UTC wall time, RFC 3339 with
/// milliseconds.
fn wall_time(mono_ns: u64, offset_ns: i128) -> String {
    let ns = i128::from(mono_ns) + offset_ns;
    let ns = u64::try_from(ns).unwrap_or(0);
    let secs = (ns / 1_000_000_000) as i64;
    let millis = (ns / 1_000_000) % 1000;
    // SAFETY: gmtime_r writes the zeroed struct we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = secs;
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::gmtime_r(&t, &mut tm) };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Wall time minus monotonic time, now.
fn clock_offset() -> i128 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as i128;
    wall - i128::from(monotonic_ns())
}

/// The counters that say how many events were not written.
fn missed(maps: Option<&Maps>) -> (u64, u64) {
    let get = |s| maps.and_then(|m| m.stat(s).ok()).unwrap_or(0);
    (get(Stat::EventsSuppressed), get(Stat::EventsLost))
}

pub async fn run(args: &MonitorArgs) -> Result<()> {
    let root = &args.bpf.bpf_root;
    let filter = Filter::new(&args.reason, args.frontend.as_deref(), args.addr, args.port)?;
    let ring = open_ring(root)?;
    let maps = Maps::open_pinned(root).ok();
    if let Some(m) = &maps {
        if m.config()
            .map(|c| c.flags() & CFG_F_EVENTS_DROPS == 0)
            .unwrap_or(false)
        {
            eprintln!(
                "sluice monitor: the datapath's events are off (agent flag --monitor-events=off): nothing will show until an agent turns them on"
            );
        }
    }
    let missed_before = missed(maps.as_ref());
    let backends = Backends::open(root);
    let offset = clock_offset();
    let start = monotonic_ns();
    // SAFETY: the ring buffer owns its map's fd for as long as the
    // `AsyncFd` holds it, and always returns that fd.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    eprintln!(
        "sluice monitor: reading {} (Ctrl-C to stop)",
        root.join(names::EVENTS).display()
    );
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut shown = 0u64;
    let limit = args.count.unwrap_or(u64::MAX);
    'outer: while shown < limit {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.context("polling the ring buffer")?;
                let rb = guard.get_inner_mut();
                while let Some(item) = rb.next() {
                    let Some(event) = parse(&item) else { continue };
                    drop(item);
                    if event.ts_ns < start {
                        // Written before we started: not what is asked.
                        continue;
                    }
                    let r = record(
                        &event,
                        wall_time(event.ts_ns, offset),
                        backends.get(event.backend_id),
                    );
                    if !filter.matches(&r) {
                        continue;
                    }
                    *counts.entry(r.reason.clone()).or_default() += 1;
                    let text = if args.json { serde_json::to_string(&r)? } else { line(&r) };
                    // A closed pipe (`| head`) ends the command quietly.
                    if writeln!(std::io::stdout(), "{text}").is_err() {
                        break 'outer;
                    }
                    shown += 1;
                    if shown >= limit {
                        break 'outer;
                    }
                }
                guard.clear_ready();
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let (suppressed, lost) = missed(maps.as_ref());
    let (s0, l0) = missed_before;
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!(
        "sluice monitor: {shown} events{}{}; meanwhile {} not written (rate limit), {} lost (ring full)",
        if summary.is_empty() { "" } else { ": " },
        summary.join(" "),
        suppressed.saturating_sub(s0),
        lost.saturating_sub(l0)
    );
    Ok(())
}
