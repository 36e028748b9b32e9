//! `sluice-bench`: the benchmark behind `cargo xtask bench` (needs root).
//! See `docs/performance.md`.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Result};
use clap::Parser;
use sluice_tests::bench::{self, control::AgentSource, env::Variant, Config};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "sluice vs direct, iptables (legacy, nft) and nftables kube-proxy layouts"
)]
struct Args {
    /// A smoke run of about a minute (1 and 1000 services, few samples).
    #[arg(long)]
    quick: bool,
    /// Output directory for results.json, report.md and connect.svg.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Numbers of services, comma separated (default: 1,1000,10000,100000;
    /// --quick: 1,1000).
    #[arg(long, value_delimiter = ',')]
    services: Vec<usize>,
    /// Variants to run, comma separated (default: all).
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Rounds of interleaved measurements.
    #[arg(long)]
    rounds: Option<usize>,
    /// Recorded connects per target service per round.
    #[arg(long)]
    connects: Option<usize>,
    /// Blocks each round's connects are measured in, every variant in
    /// turn within each block pass.
    #[arg(long)]
    blocks: Option<usize>,
    /// Seconds allowed for loading one ruleset.
    #[arg(long)]
    load_budget: Option<u64>,
    /// Skip the real agent binary (control plane through the reconciler only).
    #[arg(long)]
    no_agent: bool,
    /// Do not pin the client to CPU 0 and the servers to CPU 1.
    #[arg(long)]
    no_pin: bool,
    /// Only re-render report.md and connect.svg from this results.json
    /// into --out (no measurement, no root needed).
    #[arg(long)]
    render: Option<PathBuf>,
    /// Only the control plane (programming, agent runs, endpoint changes):
    /// no data-plane rounds.
    #[arg(long)]
    control_only: bool,
    /// Agent sources to run, comma separated: dir, kube, kube-prealloc (the
    /// API source with `--preallocate-maps`); default all three.
    #[arg(long, value_delimiter = ',')]
    agent_sources: Vec<String>,
    /// Background endpoint-change rates (changes/s, comma separated) for
    /// the API-fed agent's latency under churn; 0 disables.
    #[arg(long, value_delimiter = ',')]
    churn_rates: Vec<u32>,
    /// Seed of the random target service.
    #[arg(long)]
    seed: Option<u64>,
    /// Only the datapath events scenario (events off vs on).
    #[arg(long)]
    events_only: bool,
    /// Skip the datapath events scenario.
    #[arg(long)]
    no_events: bool,
    /// Skip the north-south scenario (XDP, TC, iptables, nftables
    /// forwarding a NodePort to another node, fed by the kernel's XDP generator).
    #[arg(long)]
    no_north_south: bool,
    /// Skip the source-line profile of the programs (`perf record`).
    #[arg(long)]
    no_profile: bool,
    /// Run only the north-south scenario.
    #[arg(long)]
    north_south_only: bool,
    /// Seconds per variant and round of the north-south scenario.
    #[arg(long)]
    north_south_seconds: Option<f64>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(json) = &args.render {
        let text = std::fs::read_to_string(json)?;
        let results: bench::Results = serde_json::from_str(&text)?;
        std::fs::create_dir_all(&args.out)?;
        bench::report::write_all(&results, &args.out)?;
        eprintln!("rendered {} into {}", json.display(), args.out.display());
        return Ok(());
    }
    let mut cfg = if args.quick {
        Config::quick(args.out)
    } else {
        Config::full(args.out)
    };
    if !args.services.is_empty() {
        cfg.sizes = args.services;
    }
    if !args.variants.is_empty() {
        cfg.variants = args
            .variants
            .iter()
            .map(|v| Variant::parse(v).ok_or_else(|| anyhow::anyhow!("unknown variant {v}")))
            .collect::<Result<_>>()?;
        cfg.variants.sort();
        cfg.variants.dedup();
    }
    if args.no_profile {
        cfg.profile_connects = 0;
    }
    if let Some(r) = args.rounds {
        cfg.rounds = r;
    }
    if let Some(c) = args.connects {
        cfg.connects = c;
    }
    if let Some(b) = args.blocks {
        cfg.blocks = b;
    }
    if let Some(b) = args.load_budget {
        cfg.load_budget = Duration::from_secs(b);
    }
    if let Some(s) = args.seed {
        cfg.seed = s;
    }
    if args.no_north_south {
        cfg.north_south = None;
    }
    cfg.north_south_only = args.north_south_only;
    if let (Some(ns), Some(secs)) = (cfg.north_south.as_mut(), args.north_south_seconds) {
        ns.seconds = secs;
    }
    if let (Some(ns), Some(r)) = (cfg.north_south.as_mut(), args.rounds) {
        ns.rounds = r;
    }
    cfg.agent = !args.no_agent;
    if args.events_only {
        cfg.sizes.clear();
        cfg.north_south = None;
    }
    if args.north_south_only {
        cfg.events_rounds = 0;
    }
    if args.no_events {
        cfg.events_rounds = 0;
    }
    cfg.control_only = args.control_only;
    if cfg.control_only {
        // The events and north-south scenarios are data-plane measurements.
        cfg.events_rounds = 0;
        cfg.north_south = None;
    }
    if !args.agent_sources.is_empty() {
        cfg.agent_sources = args
            .agent_sources
            .iter()
            .map(|s| match s.as_str() {
                "dir" => Ok(AgentSource::Dir),
                "kube" => Ok(AgentSource::Kube),
                "kube-prealloc" => Ok(AgentSource::KubePrealloc),
                other => Err(anyhow::anyhow!(
                    "unknown agent source {other} (dir, kube, kube-prealloc)"
                )),
            })
            .collect::<Result<_>>()?;
    }
    if !args.churn_rates.is_empty() {
        cfg.churn_rates = args.churn_rates.into_iter().filter(|r| *r > 0).collect();
    }
    cfg.pin = !args.no_pin;
    if cfg.sizes.iter().any(|n| *n == 0 || *n >= 1_000_000)
        || cfg.rounds == 0
        || cfg.connects == 0
        || cfg.blocks == 0
        || cfg.blocks > cfg.connects
    {
        bail!("services must be 1..999999, rounds, connects and blocks at least 1, blocks at most connects");
    }
    bench::install_signal_handlers();
    bench::run(&cfg)?;
    Ok(())
}
