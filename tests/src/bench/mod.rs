//! `cargo xtask bench`: sluice against direct connections and kube-proxy's
//! iptables (legacy and nft backends) and nftables layouts, in the same
//! namespace topology the tests use, at 1 to 100,000 services.
//!
//! For each number of services N, every variant gets its own node
//! namespace (see [`env`]) and is programmed once, which is where the
//! control-plane figures come from; then the data-plane measurements run
//! in rounds, every round measuring every variant in turn (in a fresh
//! random order each block pass), so that machine noise hits all variants
//! alike. A round's
//! connections are measured in short blocks, every variant in turn within
//! each block pass. Figures are aggregated over blocks: rates are the
//! median of the per-block rates, latency percentiles come from all
//! samples of all blocks.

pub mod churn;
pub mod control;
pub mod cpu;
pub mod env;
pub mod events;
pub mod kubeproxy;
pub mod mapwrites;
pub mod north_south;
pub mod profile;
pub mod progcost;
pub mod report;
pub mod services;
pub mod stats;
pub mod traffic;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    net::Ipv4Addr,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sluice::datapath::MapSizes;

use control::{AgentRun, AgentSource, Churn};
use env::{run_timed, Env, TempFile, Timed, Variant};
use kubeproxy::Layout;
use services::{ServiceSet, ENDPOINTS};
use stats::{Latency, Rate};

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    if INTERRUPTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        // A second signal: leave now (the next run sweeps what is left).
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// Makes SIGINT and SIGTERM stop the run at the next measurement
/// boundary, so that namespaces, pins and rules are removed on the way
/// out; a second signal exits at once.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches an atomic and calls _exit.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        anyhow::bail!("interrupted");
    }
    Ok(())
}

/// What one run measures and how hard.
#[derive(Clone, Debug)]
pub struct Config {
    pub quick: bool,
    pub sizes: Vec<usize>,
    pub variants: Vec<Variant>,
    pub rounds: usize,
    /// Unrecorded rounds before the recorded ones.
    pub warmup_rounds: usize,
    /// Recorded connections per target service per round.
    pub connects: usize,
    /// Blocks a round is measured in (connections, request/response and
    /// bulk transfer, each its share), every variant in turn within each
    /// block pass.
    pub blocks: usize,
    /// Unrecorded connections before each series.
    pub warmup: usize,
    /// A connect series stops early after this long (with at least a
    /// tenth of `connects` recorded).
    pub connect_limit: Duration,
    /// Pin the client to CPU 0 and the servers to CPU 1.
    pub pin: bool,
    /// A round of one variant during which other processes used more
    /// than this share of one CPU is measured again (at most
    /// `max_retries` times); the share is recorded either way.
    pub foreign_limit: f64,
    pub max_retries: usize,
    pub rr: Duration,
    pub bulk: Duration,
    /// Time allowed for loading one ruleset.
    pub load_budget: Duration,
    /// Time allowed for the agent to become ready.
    pub agent_budget: Duration,
    /// Whether to run the real agent binary.
    pub agent: bool,
    /// Endpoint changes per series: at most `churn_samples`, at least
    /// `churn_min`, and no more once `churn_budget` is spent.
    pub churn_samples: usize,
    pub churn_min: usize,
    pub churn_budget: Duration,
    /// Background endpoint-change rates (changes/s) under which the
    /// API-fed agent's endpoint-change latency is measured (empty: none).
    pub churn_rates: Vec<u32>,
    /// How long each background churn rate runs.
    pub churn_rate_window: Duration,
    /// Only the control plane: no data-plane rounds.
    pub control_only: bool,
    /// Which agent sources run (default both).
    pub agent_sources: Vec<AgentSource>,
    pub seed: u64,
    pub out: PathBuf,
    /// Rounds of the datapath events scenario (`events`; 0: skipped).
    pub events_rounds: usize,
    /// Profile the sluice variants' programs by source line (`profile`),
    /// over this many connections each (0: no profile).
    pub profile_connects: usize,
    /// The north-south scenario (`north_south`), if asked for.
    pub north_south: Option<north_south::NsConfig>,
    /// Only the north-south scenario (no service-count sizes).
    pub north_south_only: bool,
}

impl Config {
    /// The full run (about 15-25 minutes on 2 cores).
    pub fn full(out: PathBuf) -> Self {
        Self {
            quick: false,
            sizes: vec![1, 1000, 10_000, 100_000],
            variants: Variant::ALL.to_vec(),
            rounds: 5,
            warmup_rounds: 1,
            connects: 2000,
            blocks: 10,
            warmup: 200,
            connect_limit: Duration::from_secs(3),
            pin: true,
            foreign_limit: 0.15,
            max_retries: 2,
            rr: Duration::from_millis(500),
            bulk: Duration::from_secs(1),
            load_budget: Duration::from_secs(240),
            agent_budget: Duration::from_secs(180),
            agent: true,
            // The issue asks for p50/p99 over 1,000 changes at 10,000
            // services; the budget stops the slow directory source.
            churn_samples: 1000,
            churn_min: 5,
            churn_budget: Duration::from_secs(40),
            churn_rates: vec![250, 500, 1000, 2000, 4000],
            churn_rate_window: Duration::from_secs(4),
            control_only: false,
            agent_sources: vec![
                AgentSource::Dir,
                AgentSource::Kube,
                AgentSource::KubePrealloc,
            ],
            seed: 0x5eed,
            out,
            events_rounds: 5,
            profile_connects: 40_000,
            north_south: Some(north_south::NsConfig {
                seconds: 3.0,
                rounds: 3,
            }),
            north_south_only: false,
        }
    }

    /// A smoke run: about a minute.
    pub fn quick(out: PathBuf) -> Self {
        Self {
            quick: true,
            sizes: vec![1, 1000],
            rounds: 2,
            warmup_rounds: 0,
            connects: 300,
            blocks: 2,
            warmup: 50,
            connect_limit: Duration::from_secs(1),
            rr: Duration::from_millis(200),
            bulk: Duration::from_millis(250),
            load_budget: Duration::from_secs(10),
            agent_budget: Duration::from_secs(60),
            churn_samples: 20,
            churn_min: 3,
            churn_budget: Duration::from_secs(3),
            events_rounds: 2,
            profile_connects: 20_000,
            churn_rates: vec![500],
            churn_rate_window: Duration::from_secs(1),
            north_south: Some(north_south::NsConfig {
                seconds: 1.0,
                rounds: 1,
            }),
            ..Self::full(out)
        }
    }
}

/// A duration, or why it was not measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measure {
    pub seconds: Option<f64>,
    pub not_measured: Option<String>,
    pub note: Option<String>,
}

impl Measure {
    pub fn done(d: Duration) -> Self {
        Self {
            seconds: Some(d.as_secs_f64()),
            ..Self::default()
        }
    }

    pub fn skipped(reason: String) -> Self {
        Self {
            not_measured: Some(reason),
            ..Self::default()
        }
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConnectResult {
    /// New connections per second (connect + reset, sequential).
    pub rate: Rate,
    /// Time `connect()` took (SYN to SYN-ACK received).
    pub latency: Latency,
    pub errors: usize,
    pub first_error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RrResult {
    /// Round trips per second on one established connection.
    pub rate: Rate,
    pub latency: Latency,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: String,
    /// For kube-proxy layouts: "full" or "collapsed" (see `kubeproxy`).
    pub ruleset: Option<String>,
    pub error: Option<String>,
    pub connect_last: ConnectResult,
    pub connect_random: ConnectResult,
    pub rr: RrResult,
    /// Bulk throughput of one connection, Gbit/s.
    pub bulk_gbit: Rate,
    /// CPU other processes used during each recorded round of this
    /// variant (share of one CPU), and how many rounds were repeated
    /// because it exceeded the limit.
    pub foreign_cpu: Vec<f64>,
    pub repeated_rounds: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Control {
    /// Time to program N services (x10 endpoints) from empty, by path:
    /// `sluice-reconciler`, `iptables-legacy-noflush`,
    /// `iptables-legacy-restore`, `iptables-nft-noflush`,
    /// `iptables-nft-restore`, `nftables`.
    pub programming: BTreeMap<String, Measure>,
    pub sluice_reconciler_writes: u64,
    /// The agent fed by the (test) Kubernetes API server: what a cluster
    /// runs. Its memory and endpoint-change figures are the ones judged.
    pub agent: Option<AgentRun>,
    /// The agent fed from a manifest directory (the demo's source).
    #[serde(default)]
    pub agent_dir: Option<AgentRun>,
    /// The API-fed agent with `--preallocate-maps`.
    #[serde(default)]
    pub agent_prealloc: Option<AgentRun>,
    pub reconciler_churn: Option<Churn>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SizeResult {
    pub services: usize,
    pub last_index: usize,
    pub random_index: usize,
    pub control: Control,
    pub variants: Vec<VariantResult>,
    /// What each program of `sluice` and `sluice-sock` costs per run, for
    /// service and non-service traffic (`progcost`).
    #[serde(default)]
    pub prog_costs: Vec<progcost::ProgCost>,
    /// Where each program's time goes, by source line (`profile`).
    #[serde(default)]
    pub profiles: Vec<profile::ProgProfile>,
    /// How the new flows of each sluice variant's rounds started
    /// (datapath counters, read after the rounds).
    #[serde(default)]
    pub flows: Vec<FlowCounts>,
    pub seconds: f64,
}

/// A variant's new flows on the TC path during its rounds: on a fresh
/// tuple (two conntrack inserts), or on the tuple of a finished flow
/// (the bench's client resets each connection and reuses its ports
/// within a run, with no agent collecting closed entries), and of those
/// the ones that took over the finished flow's entries in place.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FlowCounts {
    pub variant: String,
    pub fresh: u64,
    pub reselected: u64,
    pub taken_over: u64,
}

impl FlowCounts {
    /// The counters of `env`'s datapath, if it is sluice's.
    fn of(env: &Env) -> Option<Self> {
        let maps = env.lb.as_ref()?.maps().ok()?;
        let stat = |s| maps.stat(s).ok();
        Some(Self {
            variant: env.variant.name().to_owned(),
            fresh: stat(sluice_common::Stat::NewFlow)?,
            reselected: stat(sluice_common::Stat::Reselected)?,
            taken_over: stat(sluice_common::Stat::CtReused)?,
        })
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub mem_total_kb: u64,
    pub iptables: String,
    pub nft: String,
    pub loadavg_start: String,
    pub loadavg_end: String,
}

impl Machine {
    fn probe() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let version = |cmd: &str, arg: &str| {
            std::process::Command::new(cmd)
                .arg(arg)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default()
        };
        Self {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_default(),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            mem_total_kb: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            iptables: version("iptables-legacy", "--version")
                + " / "
                + &version("iptables-nft", "--version"),
            nft: version("nft", "--version"),
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConfigSummary {
    pub quick: bool,
    /// `--control-only`: no data-plane rounds.
    #[serde(default)]
    pub control_only: bool,
    pub sizes: Vec<usize>,
    pub variants: Vec<String>,
    pub endpoints_per_service: usize,
    pub rounds: usize,
    pub warmup_rounds: usize,
    pub connects_per_target_per_round: usize,
    /// Blocks each round's connections were measured in (0 in results
    /// written before blocks: one block).
    #[serde(default)]
    pub connect_blocks_per_round: usize,
    pub warmup_connects: usize,
    pub connect_series_limit_s: f64,
    /// Client on CPU 0, servers on CPU 1.
    pub pinned: bool,
    pub foreign_limit: f64,
    pub rr_seconds_per_round: f64,
    pub bulk_seconds_per_round: f64,
    pub load_budget_s: f64,
    pub agent_budget_s: f64,
    pub churn_samples_max: usize,
    pub churn_budget_s: f64,
    pub seed: u64,
    pub services_map_size: u32,
    pub backends_map_size: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    pub config: ConfigSummary,
    pub started_unix: u64,
    pub seconds: f64,
    pub complete: bool,
    pub sizes: Vec<SizeResult>,
    /// The cost of datapath events (`events`).
    #[serde(default)]
    pub events: Option<events::EventsCost>,
    /// The north-south scenario (`north_south`).
    #[serde(default)]
    pub north_south: Option<north_south::NorthSouth>,
    /// The kernel's cost of writing map entries (`mapwrites`).
    #[serde(default)]
    pub map_writes: Option<mapwrites::MapWriteCost>,
}

/// Mixed into `--seed` for the order of the block passes.
const PASS_ORDER_SEED: u64 = 0x0b1c_40d3;

/// The order of one block pass over `n` variants: a fresh permutation
/// each pass (Fisher-Yates, reproducible from `--seed`). With a rotation
/// each variant always followed the same one, and what a block leaves
/// behind (warm code paths, caches, the cgroup the socket variants run
/// in) could favour or penalise its successor in every pass alike.
fn pass_order(n: usize, rng: &mut services::Rng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

/// Maps big enough for the largest N of the run, used at every N (a real
/// node sizes them once; only their content changes with N).
pub fn map_sizes(max_n: usize) -> MapSizes {
    let d = MapSizes::default();
    let round = |v: usize| (v.div_ceil(1024) * 1024) as u32;
    let n = max_n + 2;
    MapSizes {
        services: d.services.max(round(n * (ENDPOINTS + 1) * 11 / 10)),
        backends: d.backends.max(round(n * ENDPOINTS * 11 / 10)),
        conntrack: d.conntrack,
        affinity: d.affinity,
        maglev: d.maglev,
        preallocate: false,
    }
}

/// Load times of earlier sizes, to skip loads that cannot fit the budget.
#[derive(Default)]
struct History {
    done: HashMap<String, (usize, f64)>,
    over: HashMap<String, usize>,
}

impl History {
    /// Why a load of `n` services should not be tried, if it should not:
    /// it went over the budget at a smaller size, or its measured growth
    /// (about quadratic for every kube-proxy layout here) predicts it.
    fn skip(&self, key: &str, n: usize, budget: Duration) -> Option<String> {
        if let Some(n0) = self.over.get(key) {
            return Some(format!(
                "already over the {}s budget at {n0} services",
                budget.as_secs()
            ));
        }
        let (n0, t0) = *self.done.get(key)?;
        if t0 < 1.0 || n0 >= n {
            return None;
        }
        let predicted = t0 * (n as f64 / n0 as f64).powi(2);
        (predicted > budget.as_secs_f64()).then(|| {
            format!(
                "predicted ~{predicted:.0} s from {t0:.1} s at {n0} services (load time grows about quadratically), over the {}s budget",
                budget.as_secs()
            )
        })
    }

    fn record(&mut self, key: &str, n: usize, outcome: &Timed) {
        match outcome {
            Timed::Done(d) => {
                self.done.insert(key.to_owned(), (n, d.as_secs_f64()));
            }
            Timed::OverBudget(_) => {
                self.over.insert(key.to_owned(), n);
            }
        }
    }
}

fn timed_measure(outcome: &Timed, budget: Duration) -> Measure {
    match outcome {
        Timed::Done(d) => Measure::done(*d),
        Timed::OverBudget(d) => Measure::skipped(format!(
            "over the {}s budget (killed after {:.0} s)",
            budget.as_secs(),
            d.as_secs_f64()
        )),
    }
}

/// Loads kube-proxy's iptables layout into `env`. Measures kube-proxy's
/// own load path (`iptables-restore -w --noflush`, in a scratch namespace)
/// and the plain restore that installs the rules the data plane uses.
fn program_iptables(
    env: &mut Env,
    set: &ServiceSet,
    cfg: &Config,
    history: &mut History,
    control: &mut Control,
) -> Result<()> {
    let variant = env.variant;
    let Some(restore) = variant.restore_binary() else {
        return Ok(());
    };
    let mut full: Option<TempFile> = None;
    let mut full_file = |set: &ServiceSet| -> Result<PathBuf> {
        if full.is_none() {
            full = Some(TempFile::write(
                "iptables",
                &kubeproxy::iptables_restore(set, Layout::Full),
            )?);
        }
        Ok(full
            .as_ref()
            .map(|f| f.path().to_owned())
            .unwrap_or_default())
    };

    let key = format!("{}-noflush", variant.name());
    measure_load(key, set, cfg, history, control, || {
        let path = full_file(set)?;
        let scratch = crate::Netns::create("ipt-scratch")?;
        let mut cmd = scratch.command(restore);
        cmd.args(["-w", "--noflush"]);
        let outcome = run_timed(cmd, Some(&path), cfg.load_budget);
        let _ = env::flush_rules(variant, &scratch);
        outcome
    })?;

    let key = format!("{}-restore", variant.name());
    let loaded = measure_load(key, set, cfg, history, control, || {
        let path = full_file(set)?;
        let mut cmd = env.node().command(restore);
        cmd.arg("-w");
        run_timed(cmd, Some(&path), cfg.load_budget)
    })?;
    if loaded {
        env.layout = Some(Layout::Full);
    }
    drop(full);

    if env.layout.is_none() {
        env.flush()?;
        let file = TempFile::write(
            "iptables-collapsed",
            &kubeproxy::iptables_restore(set, Layout::Collapsed),
        )?;
        let mut cmd = env.node().command(restore);
        cmd.arg("-w");
        load_collapsed(env, cmd, Some(file.path()), cfg.load_budget)?;
    }
    Ok(())
}

/// Times one load of a full ruleset, unless the loads of smaller sizes say
/// it cannot fit the budget, and records the figure under `key`; true when
/// the ruleset is now loaded.
fn measure_load(
    key: String,
    set: &ServiceSet,
    cfg: &Config,
    history: &mut History,
    control: &mut Control,
    load: impl FnOnce() -> Result<Timed>,
) -> Result<bool> {
    let mut loaded = false;
    let measure = match history.skip(&key, set.n, cfg.load_budget) {
        Some(why) => Measure::skipped(why),
        None => {
            let outcome = load()?;
            history.record(&key, set.n, &outcome);
            loaded = matches!(outcome, Timed::Done(_));
            timed_measure(&outcome, cfg.load_budget)
        }
    };
    eprintln!("  {key}: {}", report::measure_text(&measure));
    control.programming.insert(key, measure);
    Ok(loaded)
}

/// When no full ruleset could be loaded: the collapsed one, so that the
/// data plane can still be measured.
fn load_collapsed(
    env: &mut Env,
    cmd: std::process::Command,
    input: Option<&std::path::Path>,
    budget: Duration,
) -> Result<()> {
    match run_timed(cmd, input, budget)? {
        Timed::Done(d) => {
            eprintln!(
                "  {}: collapsed ruleset loaded in {:.1} s",
                env.variant.name(),
                d.as_secs_f64()
            );
            env.layout = Some(Layout::Collapsed);
            Ok(())
        }
        Timed::OverBudget(_) => {
            anyhow::bail!("even the collapsed ruleset did not load in time")
        }
    }
}

/// Loads kube-proxy's nftables layout into `env` with `nft -f` (one
/// transaction, as kube-proxy's full sync).
fn program_nftables(
    env: &mut Env,
    set: &ServiceSet,
    cfg: &Config,
    history: &mut History,
    control: &mut Control,
) -> Result<()> {
    let loaded = measure_load("nftables".to_owned(), set, cfg, history, control, || {
        let file = TempFile::write("nft", &kubeproxy::nftables(set, Layout::Full))?;
        let mut cmd = env.node().command("nft");
        cmd.arg("-f").arg(file.path());
        run_timed(cmd, None, cfg.load_budget)
    })?;
    if loaded {
        env.layout = Some(Layout::Full);
    }
    if env.layout.is_none() {
        env.flush()?;
        let file = TempFile::write(
            "nft-collapsed",
            &kubeproxy::nftables(set, Layout::Collapsed),
        )?;
        let mut cmd = env.node().command("nft");
        cmd.arg("-f").arg(file.path());
        load_collapsed(env, cmd, None, cfg.load_budget)?;
    }
    Ok(())
}

fn program_sluice(
    env: &mut Env,
    set: &ServiceSet,
    sizes: MapSizes,
    cfg: &Config,
    control: &mut Control,
) -> Result<()> {
    let desired = set.desired();
    let lb = env.load_sluice(sizes)?;
    lb.desired = desired;
    let start = Instant::now();
    let report = lb.apply();
    let took = start.elapsed();
    if !report.errors.is_empty() || !report.refused.is_empty() {
        anyhow::bail!(
            "sluice refused or failed: {:?} {:?}",
            report.refused.first(),
            report.errors.first()
        );
    }
    let measure = Measure::done(took).with_note(format!("{} map writes", report.writes));
    eprintln!("  sluice-reconciler: {}", report::measure_text(&measure));
    control.sluice_reconciler_writes = report.writes;
    control
        .programming
        .insert("sluice-reconciler".into(), measure);
    let churn = control::reconciler_churn(lb, set, cfg).unwrap_or_else(|e| Churn {
        not_measured: Some(format!("{e:#}")),
        ..Churn::default()
    });
    eprintln!(
        "  endpoint change, in-process reconciler: {}",
        report::churn_text(&churn)
    );
    control.reconciler_churn = Some(churn);
    Ok(())
}

fn program_passthrough(env: &mut Env, set: &ServiceSet, sizes: MapSizes) -> Result<()> {
    let desired = set.desired();
    let lb = env.load_sluice(sizes)?;
    lb.desired = desired;
    let report = lb.apply();
    if !report.errors.is_empty() || !report.refused.is_empty() {
        anyhow::bail!("sluice refused or failed: {:?}", report.errors.first());
    }
    Ok(())
}

#[derive(Default)]
struct Acc {
    last: Vec<u64>,
    last_rates: Vec<f64>,
    last_errors: usize,
    random: Vec<u64>,
    random_rates: Vec<f64>,
    random_errors: usize,
    first_error: Option<String>,
    rr: Vec<u64>,
    rr_rates: Vec<f64>,
    bulk: Vec<f64>,
    foreign: Vec<f64>,
    repeated: usize,
    error: Option<String>,
}

impl Acc {
    /// One line for the round that just ended: the medians of its
    /// `blocks` blocks.
    fn print_round(&self, variant: &str, blocks: usize) {
        let round = |v: &[f64]| stats::median(&v[v.len().saturating_sub(blocks)..]);
        eprintln!(
            "    {:<19} {:>9.0} conn/s last, {:>9.0} conn/s random, {:>8.0} rr/s, {:>6.2} Gbit/s (medians of the round's {} blocks)",
            variant,
            round(&self.last_rates),
            round(&self.random_rates),
            round(&self.rr_rates),
            round(&self.bulk),
            blocks,
        );
    }

    fn merge(&mut self, other: Acc) {
        self.last.extend(other.last);
        self.last_rates.extend(other.last_rates);
        self.last_errors += other.last_errors;
        self.random.extend(other.random);
        self.random_rates.extend(other.random_rates);
        self.random_errors += other.random_errors;
        self.first_error = self.first_error.take().or(other.first_error);
        self.rr.extend(other.rr);
        self.rr_rates.extend(other.rr_rates);
        self.bulk.extend(other.bulk);
        self.foreign.extend(other.foreign);
    }
}

/// Measures one block of `env` once, again (at most `cfg.max_retries`
/// times) while other processes used more than `cfg.foreign_limit` of a
/// CPU, and adds it to `acc` unless this is a warm-up round. An error is
/// recorded in `acc` (the variant is then skipped); only an interrupt is
/// returned.
fn measure_block(
    env: &Env,
    acc: &mut Acc,
    set: &ServiceSet,
    cfg: &Config,
    warmup: bool,
) -> Result<()> {
    check_interrupted()?;
    if acc.error.is_some() {
        return Ok(());
    }
    let mut attempt = 0;
    loop {
        let mut this = Acc::default();
        let probe = cpu::Probe::start();
        let measured = env
            .enter()
            .and_then(|_in| measure_one_block(env, set, cfg, &mut this));
        let foreign = probe.foreign_cpus();
        if let Err(e) = measured {
            eprintln!("    {}: {e:#}", env.variant.name());
            acc.error = Some(format!("{e:#}"));
            return Ok(());
        }
        if foreign > cfg.foreign_limit && attempt < cfg.max_retries {
            attempt += 1;
            eprintln!(
                "      other processes used {:.0}% of a CPU: measuring {} again",
                foreign * 100.0,
                env.variant.name()
            );
            if !warmup {
                acc.repeated += 1;
            }
            continue;
        }
        if !warmup {
            this.foreign.push(foreign);
            acc.merge(this);
        }
        return Ok(());
    }
}

/// One block: `cfg.connects / cfg.blocks` connections to the last
/// service and as many to the random one (each series after its share of
/// the warm-up connections), then request/response and bulk transfer to
/// the last service for their share of the round's time.
fn measure_one_block(env: &Env, set: &ServiceSet, cfg: &Config, acc: &mut Acc) -> Result<()> {
    let client = env.client();
    let n = cfg.connects.div_ceil(cfg.blocks);
    let warm = (cfg.warmup / cfg.blocks).max(cfg.warmup.min(BLOCK_WARMUP_MIN));
    let last = traffic::connects(
        client,
        &env.targets(set, set.last),
        warm,
        n,
        cfg.connect_limit,
    )?;
    let random = traffic::connects(
        client,
        &env.targets(set, set.random),
        warm,
        n,
        cfg.connect_limit,
    )?;
    acc.last_rates.push(last.rate());
    acc.last_errors += last.errors;
    acc.first_error = acc
        .first_error
        .take()
        .or(last.first_error.clone())
        .or(random.first_error.clone());
    acc.last.extend(last.latencies_ns);
    acc.random_rates.push(random.rate());
    acc.random_errors += random.errors;
    acc.random.extend(random.latencies_ns);
    let blocks = u32::try_from(cfg.blocks).unwrap_or(u32::MAX);
    let target = env.targets(set, set.last)[0];
    let rr = traffic::request_response(client, target, cfg.rr / blocks)?;
    let bulk = traffic::bulk(client, target, cfg.bulk / blocks)?;
    acc.rr_rates.push(rr.rate());
    acc.rr.extend(rr.rtts_ns);
    acc.bulk.push(bulk.gbit_per_s());
    Ok(())
}

/// Unrecorded connections before a block's series, at least (the caches
/// and the neighbour entries of the variant's namespaces go cold while
/// the other variants run).
const BLOCK_WARMUP_MIN: usize = 20;

fn finish(env: &Env, acc: Acc) -> VariantResult {
    VariantResult {
        variant: env.variant.name().into(),
        ruleset: env.layout.map(|l| l.as_str().to_owned()),
        error: acc.error,
        connect_last: ConnectResult {
            rate: Rate::from_rounds(&acc.last_rates),
            latency: Latency::from_ns(acc.last),
            errors: acc.last_errors,
            first_error: acc.first_error.clone(),
        },
        connect_random: ConnectResult {
            rate: Rate::from_rounds(&acc.random_rates),
            latency: Latency::from_ns(acc.random),
            errors: acc.random_errors,
            first_error: acc.first_error,
        },
        rr: RrResult {
            rate: Rate::from_rounds(&acc.rr_rates),
            latency: Latency::from_ns(acc.rr),
        },
        bulk_gbit: Rate::from_rounds(&acc.bulk),
        foreign_cpu: acc.foreign,
        repeated_rounds: acc.repeated,
    }
}

fn run_size(n: usize, cfg: &Config, sizes: MapSizes, history: &mut History) -> Result<SizeResult> {
    let started = Instant::now();
    let mut envs = cfg
        .variants
        .iter()
        .map(|v| Env::new(*v))
        .collect::<Result<Vec<_>>>()?;
    let backends: Vec<Ipv4Addr> = envs[0].topo.backends.iter().map(|b| b.ip).collect();
    let set = ServiceSet::new(n, backends, cfg.seed);
    eprintln!(
        "== {n} services x {ENDPOINTS} endpoints (targets: last #{}, random #{}) ==",
        set.last, set.random
    );
    let mut control = Control::default();
    let mut errors: HashMap<Variant, String> = HashMap::new();
    for env in &mut envs {
        check_interrupted()?;
        let programmed = match env.variant {
            Variant::Direct | Variant::DirectAgain => Ok(()),
            Variant::Sluice | Variant::SluiceHostRouting => {
                program_sluice(env, &set, sizes, cfg, &mut control)
            }
            Variant::SluicePassthrough | Variant::SluiceSock | Variant::SluiceSockPassthrough => {
                program_passthrough(env, &set, sizes)
            }
            Variant::TcFloor | Variant::SockFloor => env.attach_floor(),
            Variant::IptablesLegacy | Variant::IptablesNft => {
                program_iptables(env, &set, cfg, history, &mut control)
            }
            Variant::Nftables => program_nftables(env, &set, cfg, history, &mut control),
        };
        if let Err(e) = programmed {
            eprintln!("  {}: {e:#}", env.variant.name());
            errors.insert(env.variant, format!("programming failed: {e:#}"));
        }
    }
    check_interrupted()?;
    if cfg.agent && cfg.variants.contains(&Variant::Sluice) {
        for &source in &cfg.agent_sources {
            check_interrupted()?;
            let run = control::agent_run(&set, cfg, sizes, source).unwrap_or_else(|e| AgentRun {
                start_to_ready: Measure::skipped(format!("{e:#}")),
                ..AgentRun::default()
            });
            eprintln!(
                "  agent ({source:?} source): start to ready {} (agent CPU {}), first sync {}, VmHWM {} kB; endpoint change: {}",
                report::measure_text(&run.start_to_ready),
                run.cpu_to_ready_s.map_or("-".into(), |c| format!("{c:.2} s")),
                report::measure_text(&run.first_sync_reconcile),
                run.vm_hwm_kb.unwrap_or(0),
                report::churn_text(&run.churn)
            );
            for p in &run.churn_rates {
                eprintln!("    under churn: {}", report::rate_text(p));
            }
            if let Some(r) = &run.relist {
                eprintln!("    relist: {}", report::relist_text(r));
            }
            match source {
                AgentSource::Dir => control.agent_dir = Some(run),
                AgentSource::Kube => control.agent = Some(run),
                AgentSource::KubePrealloc => control.agent_prealloc = Some(run),
            }
        }
    }

    if cfg.control_only {
        for v in &cfg.variants {
            errors
                .entry(*v)
                .or_insert_with(|| "not measured: control plane only".into());
        }
    }
    // Every variant must reach the targets before anything is measured.
    for env in &envs {
        if errors.contains_key(&env.variant) {
            continue;
        }
        let _in = env.enter()?;
        for i in [set.last, set.random] {
            let probe =
                traffic::connects(env.client(), &env.targets(&set, i), 0, 20, Duration::MAX)?;
            if probe.errors > 0 {
                let why = format!(
                    "target #{i} unreachable: {}",
                    probe.first_error.unwrap_or_default()
                );
                eprintln!("  {}: {why}", env.variant.name());
                errors.insert(env.variant, why);
                break;
            }
        }
    }
    // Let kernel clean-up after the loads (RCU, workqueues) finish.
    if !cfg.control_only {
        std::thread::sleep(Duration::from_secs(if cfg.quick { 1 } else { 3 }));
    }

    let mut accs: Vec<Acc> = envs
        .iter()
        .map(|e| Acc {
            error: errors.get(&e.variant).cloned(),
            ..Acc::default()
        })
        .collect();
    let rounds = if cfg.control_only {
        0
    } else {
        cfg.warmup_rounds + cfg.rounds
    };
    let mut order = services::Rng::new(cfg.seed ^ PASS_ORDER_SEED);
    for round in 0..rounds {
        let warmup = round < cfg.warmup_rounds;
        if warmup {
            eprintln!("  warm-up round (not recorded)");
        } else {
            eprintln!("  round {}/{}", round + 1 - cfg.warmup_rounds, cfg.rounds);
        }
        // The round in short blocks, every variant in turn within each
        // pass: a burst of machine noise (on a VM, tens of milliseconds)
        // then spoils one block of a variant, which the median over all
        // blocks leaves out, not the variant's whole round.
        for block in 0..cfg.blocks {
            let last_block = block + 1 == cfg.blocks;
            for i in pass_order(envs.len(), &mut order) {
                measure_block(&envs[i], &mut accs[i], &set, cfg, warmup)?;
                if !warmup && last_block {
                    accs[i].print_round(envs[i].variant.name(), cfg.blocks);
                }
            }
        }
    }
    // Per-program costs of the two sluice variants and of the empty
    // program, after the rounds.
    let flows: Vec<_> = envs
        .iter()
        .zip(&accs)
        .filter(|(_, acc)| acc.error.is_none())
        .filter_map(|(env, _)| FlowCounts::of(env))
        .filter(|f| f.fresh + f.reselected > 0)
        .collect();
    let mut prog_costs = Vec::new();
    for (env, acc) in envs.iter().zip(&accs) {
        if acc.error.is_some()
            || !matches!(
                env.variant,
                Variant::Sluice
                    | Variant::SluiceHostRouting
                    | Variant::SluiceSock
                    | Variant::TcFloor
                    | Variant::SockFloor
            )
        {
            continue;
        }
        check_interrupted()?;
        match env.enter().and_then(|_in| progcost::measure(env, &set)) {
            Ok(costs) => prog_costs.extend(costs),
            Err(e) => eprintln!("  {} program costs: {e:#}", env.variant.name()),
        }
        match progcost::isolated(env) {
            Ok(costs) => prog_costs.extend(costs),
            Err(e) => eprintln!("  {} isolated program costs: {e:#}", env.variant.name()),
        }
        if env.variant == Variant::Sluice {
            match progcost::service_paths(env, &set) {
                Ok(costs) => prog_costs.extend(costs),
                Err(e) => eprintln!("  {} service paths: {e:#}", env.variant.name()),
            }
        }
    }
    if !prog_costs.is_empty() {
        eprint!("{}", report::prog_cost_table(&prog_costs));
    }
    let profiles = profile_programs(&envs, &accs, &set, cfg)?;
    let variants = envs
        .iter()
        .zip(accs)
        .map(|(env, acc)| finish(env, acc))
        .collect();
    for env in &mut envs {
        if env.layout.is_some() {
            env.flush()?;
        }
    }
    drop(envs);
    Ok(SizeResult {
        services: n,
        last_index: set.last,
        random_index: set.random,
        control,
        variants,
        prog_costs,
        profiles,
        flows,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The source-line profile of each sluice variant's programs under
/// service traffic (`profile`), after the rounds: empty without `perf`
/// (the run says so) or with `--no-profile`.
fn profile_programs(
    envs: &[Env],
    accs: &[Acc],
    set: &ServiceSet,
    cfg: &Config,
) -> Result<Vec<profile::ProgProfile>> {
    let mut out = Vec::new();
    if cfg.profile_connects == 0 || cfg.control_only {
        return Ok(out);
    }
    if !profile::available() {
        eprintln!("  no source-line profile: perf is not installed (Debian's linux-perf)");
        return Ok(out);
    }
    for (env, acc) in envs.iter().zip(accs) {
        if acc.error.is_some()
            || !matches!(
                env.variant,
                Variant::Sluice | Variant::SluiceHostRouting | Variant::SluiceSock
            )
        {
            continue;
        }
        check_interrupted()?;
        let measured = env.enter().and_then(|_in| {
            let ids = progcost::programs(env)?;
            profile::measure(env, set, &ids, cfg.profile_connects, &cfg.out)
        });
        match measured {
            Ok(p) => out.extend(p),
            Err(e) => eprintln!("  {} profile: {e:#}", env.variant.name()),
        }
    }
    Ok(out)
}

/// Runs the benchmark, writing results.json, connect.svg and report.md
/// to `cfg.out` after every size; returns the results.
pub fn run(cfg: &Config) -> Result<Results> {
    crate::require_root()?;
    fs::create_dir_all(&cfg.out).with_context(|| format!("creating {}", cfg.out.display()))?;
    let max_n = cfg.sizes.iter().copied().max().unwrap_or(1);
    let sizes = map_sizes(max_n);
    let started = Instant::now();
    let mut results = Results {
        machine: Machine::probe(),
        config: ConfigSummary {
            quick: cfg.quick,
            control_only: cfg.control_only,
            sizes: cfg.sizes.clone(),
            variants: cfg.variants.iter().map(|v| v.name().to_owned()).collect(),
            endpoints_per_service: ENDPOINTS,
            rounds: cfg.rounds,
            warmup_rounds: cfg.warmup_rounds,
            connects_per_target_per_round: cfg.connects,
            connect_blocks_per_round: cfg.blocks,
            warmup_connects: cfg.warmup,
            connect_series_limit_s: cfg.connect_limit.as_secs_f64(),
            pinned: cfg.pin,
            foreign_limit: cfg.foreign_limit,
            rr_seconds_per_round: cfg.rr.as_secs_f64(),
            bulk_seconds_per_round: cfg.bulk.as_secs_f64(),
            load_budget_s: cfg.load_budget.as_secs_f64(),
            agent_budget_s: cfg.agent_budget.as_secs_f64(),
            churn_samples_max: cfg.churn_samples,
            churn_budget_s: cfg.churn_budget.as_secs_f64(),
            seed: cfg.seed,
            services_map_size: sizes.services,
            backends_map_size: sizes.backends,
        },
        started_unix: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ..Results::default()
    };
    eprintln!(
        "machine: {} x {}, kernel {}, load {}",
        results.machine.cpus,
        results.machine.cpu_model,
        results.machine.kernel,
        results.machine.loadavg_start
    );
    let cpus = results.machine.cpus;
    traffic::set_pinning((cfg.pin && cpus >= 2).then_some((0, 1)));
    if cfg.events_rounds > 0 {
        eprintln!("datapath events: sl_ingress ns per packet, events off and on");
        let cost = events::run(cfg.events_rounds, 20_000)?;
        for c in &cost.cases {
            eprintln!("  {}: {:.1} ns", c.case, c.ns_per_packet);
        }
        results.events = Some(cost);
        report::write_all(&results, &cfg.out)?;
    }
    let mut history = History::default();
    let sizes_to_run: &[usize] = if cfg.north_south_only {
        &[]
    } else {
        &cfg.sizes
    };
    if !sizes_to_run.is_empty() {
        // As many entries as the largest N's backends.
        let entries = (max_n * ENDPOINTS).max(10_000);
        eprintln!("map writes: kernel cost per entry, {entries} entries");
        match mapwrites::run(entries) {
            Ok(cost) => {
                for c in &cost.cases {
                    eprintln!("  {} batch {}: {:.0} ns", c.map, c.batch, c.ns_per_entry);
                }
                results.map_writes = Some(cost);
            }
            Err(e) => eprintln!("map writes not measured: {e:#}"),
        }
    }
    for &n in sizes_to_run {
        let size = run_size(n, cfg, sizes, &mut history)?;
        results.sizes.push(size);
        results.seconds = started.elapsed().as_secs_f64();
        results.machine.loadavg_end = loadavg();
        report::write_all(&results, &cfg.out)?;
    }
    if let Some(ns) = &cfg.north_south {
        traffic::set_pinning(None);
        results.north_south = Some(match north_south::run(ns) {
            Ok(ns) => ns,
            Err(e) if e.to_string() == "interrupted" => return Err(e),
            Err(e) => {
                eprintln!("north-south scenario not measured: {e:#}");
                north_south::NorthSouth {
                    error: Some(format!("{e:#}")),
                    ..Default::default()
                }
            }
        });
        results.seconds = started.elapsed().as_secs_f64();
        results.machine.loadavg_end = loadavg();
    }
    results.complete = true;
    results.seconds = started.elapsed().as_secs_f64();
    report::write_all(&results, &cfg.out)?;
    Ok(results)
}
