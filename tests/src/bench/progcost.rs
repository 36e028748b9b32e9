//! What each BPF program of a sluice variant costs per run, from the
//! kernel's run-time statistics (`kernel.bpf_stats_enabled`, bpftool's
//! `run_time_ns`/`run_cnt`), for service packets and for non-service
//! packets separately; and `InCgroup`, which puts the benchmark process in
//! the cgroup the `sluice-sock` variant's socket programs are attached to.
//!
//! The statistics are enabled only around the two measurements and set
//! back to what they were (they cost a little on every program run).
//!
//! `isolated` times the TC programs alone on a non-service packet with
//! `BPF_PROG_TEST_RUN` (repeat 200,000): the same frame run many times on
//! one CPU, without the statistics' clock reads or the machine's other
//! traffic. A service packet cannot be timed this way (its first run
//! rewrites the frame, which the next runs reuse); `service_paths` times
//! those one run at a time.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{env::Env, services::ServiceSet, traffic};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// One program's cost under one kind of traffic.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProgCost {
    pub variant: String,
    pub program: String,
    /// `service` (connections to the service address) or `non-service`
    /// (connections to the pods themselves).
    pub traffic: String,
    pub runs: u64,
    pub ns_per_run: f64,
}

/// Connections per measurement (each a few packets on every hook).
pub const CONNECTS: usize = 2000;

/// The process, moved into `cgroup` (v2) for as long as this lives, then
/// back where it was: sockets it creates meanwhile belong to `cgroup`.
pub struct InCgroup {
    back: PathBuf,
}

impl InCgroup {
    pub fn enter(cgroup: &Path) -> Result<Self> {
        let mount = sluice::datapath::cgroup2_mount().context("no cgroup2 mount")?;
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .context("no cgroup v2 line in /proc/self/cgroup")?;
        let back = mount.join(rel.trim_start_matches('/'));
        move_self(cgroup)?;
        Ok(Self { back })
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let _ = move_self(&self.back);
    }
}

fn move_self(cgroup: &Path) -> Result<()> {
    fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())
        .with_context(|| format!("moving the benchmark into {}", cgroup.display()))
}

/// `kernel.bpf_stats_enabled` on for as long as this lives, then back to
/// its earlier value.
struct StatsOn {
    before: String,
}

impl StatsOn {
    fn enable() -> Result<Self> {
        let before = fs::read_to_string(STATS_SYSCTL)?.trim().to_owned();
        fs::write(STATS_SYSCTL, "1")?;
        Ok(Self { before })
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        let _ = fs::write(STATS_SYSCTL, &self.before);
    }
}

fn bpftool_json(args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new("bpftool").arg("-j").args(args).output()?;
    if !out.status.success() {
        bail!(
            "bpftool {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The programs that use a map pinned directly under `root` (this
/// variant's datapath, and no other on the machine): id -> name.
fn programs_of(root: &Path) -> Result<BTreeMap<u64, String>> {
    let mut maps = BTreeSet::new();
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let path = entry.path();
        let path = path.to_string_lossy();
        if let Ok(v) = bpftool_json(&["map", "show", "pinned", &path]) {
            if let Some(id) = v["id"].as_u64() {
                maps.insert(id);
            }
        }
    }
    let progs = bpftool_json(&["prog", "show"])?;
    Ok(progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["map_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m.as_u64().is_some_and(|m| maps.contains(&m)))
        })
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str()?.to_owned())))
        .collect())
}

/// The name of `tc-floor`'s empty program (`Env::attach_floor`), as the
/// tables show it.
pub(super) const FLOOR: &str = "tc_floor";

/// The programs of `env` by id: sluice's, or the empty ones of
/// `tc-floor` and `sock-floor`.
pub(super) fn programs(env: &Env) -> Result<BTreeMap<u64, String>> {
    let Some(floor) = &env.floor else {
        return programs_of(env.topo.bpf.path());
    };
    let mut ids: BTreeMap<u64, String> = [(floor.prog_id()?, FLOOR.to_owned())].into();
    if let Some(sock) = &env.sock_floor {
        for (id, name) in sock.prog_ids()? {
            ids.insert(id, name.to_owned());
        }
    }
    Ok(ids)
}

/// (run_time_ns, run_cnt) of each of `ids`.
fn snapshot(ids: &BTreeMap<u64, String>) -> Result<BTreeMap<u64, (u64, u64)>> {
    let progs = bpftool_json(&["prog", "show"])?;
    Ok(progs
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let id = p["id"].as_u64()?;
            ids.contains_key(&id).then(|| {
                (
                    id,
                    (
                        p["run_time_ns"].as_u64().unwrap_or(0),
                        p["run_cnt"].as_u64().unwrap_or(0),
                    ),
                )
            })
        })
        .collect())
}

fn costs(
    variant: &str,
    traffic: &str,
    ids: &BTreeMap<u64, String>,
    before: &BTreeMap<u64, (u64, u64)>,
    after: &BTreeMap<u64, (u64, u64)>,
) -> Vec<ProgCost> {
    ids.iter()
        .filter_map(|(id, name)| {
            let (t0, c0) = before.get(id).copied().unwrap_or_default();
            let (t1, c1) = after.get(id).copied()?;
            let runs = c1.saturating_sub(c0);
            Some(ProgCost {
                variant: variant.to_owned(),
                program: name.clone(),
                traffic: traffic.to_owned(),
                runs,
                ns_per_run: if runs == 0 {
                    0.0
                } else {
                    t1.saturating_sub(t0) as f64 / runs as f64
                },
            })
        })
        .collect()
}

/// Runs per `BPF_PROG_TEST_RUN`.
const TEST_RUNS: u32 = 200_000;

/// An Ethernet + IPv4 + TCP ACK frame from `src` to `dst:port`.
fn tcp_frame(src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<u8> {
    tcp_segment(src, 40_000, dst, port, 0x10)
}

/// An Ethernet + IPv4 + TCP frame from `src:sport` to `dst:dport` with
/// TCP flags `flags` (SYN 0x02, ACK 0x10).
fn tcp_segment(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp[..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    f
}

/// The average duration of `TEST_RUNS` test runs of program `id` on
/// `frame`, in ns.
fn test_run(id: u64, frame: &[u8]) -> Result<f64> {
    let prog = crate::bpf::prog_fd_by_id(id)?;
    Ok(f64::from(crate::bpf::test_run(&prog, frame, TEST_RUNS)?.ns))
}

/// `sl_ingress` and `sl_egress` (or `sl_egress_pod`) of `env` timed alone
/// on a TCP packet from the client pod to a backend pod (not a service
/// address): the non-service path; the egress programs also on the
/// backend's answer (`pod reply`: from a backend's port, to a flow no
/// service made).
pub fn isolated(env: &Env) -> Result<Vec<ProgCost>> {
    let ids = programs(env)?;
    let client = env.topo.clients[0].ip;
    let backend = env.topo.backends[0].ip;
    let frame = tcp_frame(client, backend, super::services::TARGET_PORT);
    // The backend's answer on the same direct connection: from a
    // backend's port, so the egress programs may look for a reply entry.
    let reply = tcp_segment(backend, super::services::TARGET_PORT, client, 40_000, 0x10);
    let mut out = Vec::new();
    for (id, name) in &ids {
        if !["sl_ingress", "sl_egress", "sl_egress_pod", FLOOR].contains(&name.as_str()) {
            continue;
        }
        let mut frames = vec![("non-service (test run)", &frame)];
        if name != "sl_ingress" {
            frames.push(("pod reply (test run)", &reply));
        }
        for (traffic, frame) in frames {
            out.push(ProgCost {
                variant: env.variant.name().to_owned(),
                program: name.clone(),
                traffic: traffic.to_owned(),
                runs: u64::from(TEST_RUNS),
                ns_per_run: test_run(*id, frame)?,
            });
        }
    }
    Ok(out)
}

/// Client ports of the flows `service_paths` makes up: above the
/// client's local port range (1024-65000, `Env::new`), so no real
/// connection of the client ever meets their conntrack entries.
const MADE_UP_PORTS: std::ops::RangeInclusive<u16> = 65_001..=65_400;

/// `sl_ingress` of the TC path (`sluice`) timed alone on service packets,
/// one `BPF_PROG_TEST_RUN` each, on the variant's own maps: a SYN from the
/// client pod to service `set.last` for each of `MADE_UP_PORTS` (a new
/// flow: the pick and both conntrack entries), then an ACK of each of
/// those flows (established: its conntrack entry and the translation),
/// and an ACK to a pod of the same flows (no service: the early return,
/// and what one test run costs on its own). Each run's frame is checked:
/// a service packet leaves DNATed to a backend, its source untouched; a
/// pod's leaves as it came. The median of each kind, as `service SYN
/// (test run)`, `service ACK (test run)` and `pod ACK (test run)`: where
/// the TC path's cost per service packet goes, without the statistics'
/// clock or the other traffic. (A test run enters through no device, so
/// host routing's route lookup and redirect would not run: not timed for
/// `sluice-host-routing`.)
pub fn service_paths(env: &Env, set: &ServiceSet) -> Result<Vec<ProgCost>> {
    let ids = programs(env)?;
    let Some((&id, _)) = ids.iter().find(|(_, name)| name.as_str() == "sl_ingress") else {
        bail!("no sl_ingress in this datapath");
    };
    let prog = crate::bpf::prog_fd_by_id(id)?;
    let client = env.topo.clients[0].ip;
    let vip = set.vip(set.last);
    let pod = env.topo.backends[0].ip;
    let backends: Vec<[u8; 4]> = env.topo.backends.iter().map(|b| b.ip.octets()).collect();
    let mut out = Vec::new();
    for (kind, dst, dport, flags) in [
        (
            "service SYN (test run)",
            vip,
            super::services::SERVICE_PORT,
            0x02,
        ),
        (
            "service ACK (test run)",
            vip,
            super::services::SERVICE_PORT,
            0x10,
        ),
        (
            "pod ACK (test run)",
            pod,
            super::services::TARGET_PORT,
            0x10,
        ),
    ] {
        let mut times = Vec::new();
        for sport in MADE_UP_PORTS {
            let frame = tcp_segment(client, sport, dst, dport, flags);
            let run = crate::bpf::test_run(&prog, &frame, 1)?;
            let (src_out, dst_out) = (run.frame.get(26..30), run.frame.get(30..34));
            let translated = dst != pod
                && src_out == Some(&client.octets()[..])
                && dst_out.is_some_and(|d| backends.iter().any(|b| d == b));
            let untouched = dst == pod && run.frame == frame;
            // TCX_NEXT (-1): passed on.
            if run.verdict != u32::MAX || !(translated || untouched) {
                bail!(
                    "{kind} from port {sport}: verdict {}, left as {src_out:?} -> {dst_out:?}",
                    run.verdict as i32
                );
            }
            times.push(run.ns);
        }
        times.sort_unstable();
        out.push(ProgCost {
            variant: env.variant.name().to_owned(),
            program: "sl_ingress".to_owned(),
            traffic: kind.to_owned(),
            runs: times.len() as u64,
            ns_per_run: f64::from(times[times.len() / 2]),
        });
    }
    Ok(out)
}

/// Per-program costs of `env`'s sluice datapath: `CONNECTS` connections to
/// service `set.last` (its address), then as many to its pods directly.
/// For `sluice-sock`, the caller has put the process in the variant's
/// cgroup.
pub fn measure(env: &Env, set: &ServiceSet) -> Result<Vec<ProgCost>> {
    let ids = programs(env)?;
    if ids.is_empty() {
        bail!("no program of this datapath found");
    }
    let variant = env.variant.name();
    let service = vec![traffic::addr(
        set.vip(set.last),
        super::services::SERVICE_PORT,
    )];
    let pods: Vec<_> = env
        .topo
        .backends
        .iter()
        .map(|b| traffic::addr(b.ip, super::services::TARGET_PORT))
        .collect();
    let _on = StatsOn::enable()?;
    let mut out = Vec::new();
    for (kind, targets) in [("service", &service), ("non-service", &pods)] {
        if kind == "service" && env.floor.is_some() {
            // No service there: the empty program sees pod traffic only.
            continue;
        }
        let before = snapshot(&ids)?;
        let run = traffic::connects(env.client(), targets, 0, CONNECTS, std::time::Duration::MAX)?;
        // A few connects may time out on a loaded machine; the programs
        // ran for them all the same.
        if run.errors > CONNECTS / 10 {
            bail!(
                "{kind} traffic: {} errors ({})",
                run.errors,
                run.first_error.unwrap_or_default()
            );
        }
        let after = snapshot(&ids)?;
        out.extend(costs(variant, kind, &ids, &before, &after));
    }
    Ok(out)
}
