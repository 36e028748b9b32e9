//! How much CPU other processes used while a measurement ran: the
//! machine's busy time (user, nice, system and steal, from /proc/stat)
//! minus this process's own (/proc/self/stat). Network softirq work is
//! accounted separately by the kernel and not counted, so the benchmark's
//! own packet processing does not show up as foreign.

use std::{fs, time::Instant};

/// Clock ticks per second of /proc/stat and /proc/self/stat.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn machine_busy_ticks() -> u64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0;
    };
    // cpu user nice system idle iowait irq softirq steal ...
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    get(0) + get(1) + get(2) + get(7)
}

fn own_ticks() -> u64 {
    let stat = fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name may contain spaces: fields start after the ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let get = |field: usize| {
        f.get(field - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

pub struct Probe {
    busy: u64,
    own: u64,
    at: Instant,
}

impl Probe {
    pub fn start() -> Self {
        Self {
            busy: machine_busy_ticks(),
            own: own_ticks(),
            at: Instant::now(),
        }
    }

    /// CPUs' worth of time other processes (and steal) used since
    /// `start`, as a share of one CPU (0.5 = half a CPU on average).
    pub fn foreign_cpus(&self) -> f64 {
        let busy = machine_busy_ticks().saturating_sub(self.busy);
        let own = own_ticks().saturating_sub(self.own);
        let secs = self.at.elapsed().as_secs_f64().max(1e-3);
        busy.saturating_sub(own) as f64 / ticks_per_second() / secs
    }
}
