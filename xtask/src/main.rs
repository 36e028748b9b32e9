//! `cargo xtask`: the project's build, test and demo entry points.
//!
//! - `setup`: make this machine able to build eBPF code (idempotent).
//! - `build-ebpf`: build the kernel programs to `target/bpf/sluice.bpf.o`.
//! - `test`: everything a contributor runs before submitting.
//! - `lint`: the formatting and clippy part of `test` alone.
//! - `bench`: sluice against direct, iptables and nftables (needs root).
//! - `demo`: sluice's main job on an embedded default, in namespaces.

mod bench;
mod demo;
mod ebpf;
mod exec;
mod releases;
mod test;
mod toolchain;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "sluice's build, test and demo tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what building eBPF code needs (toolchain, bpf-linker, bpffs).
    Setup,
    /// Build the eBPF object to target/bpf/sluice.bpf.o.
    BuildEbpf,
    /// Build the agents the upgrade tests run: every release in
    /// releases.toml from its commit, and the abi-probe build (to
    /// target/releases/bin/).
    BuildReleases,
    /// Formatting, clippy (user and eBPF side), unit and integration tests.
    Test(test::TestArgs),
    /// Formatting and clippy (user and eBPF side) only: the quick part of
    /// `test`.
    Lint,
    /// sluice's main job on an embedded default: namespaces as node and pods.
    Demo,
    /// Benchmark sluice against direct connections and kube-proxy's
    /// iptables and nftables layouts (results in target/bench/).
    Bench(bench::BenchArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup => toolchain::setup().map(|_| ()),
        Command::BuildReleases => {
            let tc = toolchain::build_toolchain()?;
            releases::build_all(&tc).map(|_| ())
        }
        Command::BuildEbpf => {
            let tc = toolchain::build_toolchain()?;
            ebpf::build(&tc)
        }
        Command::Test(args) => test::run_tests(&args),
        Command::Lint => test::lint(&toolchain::setup()?),
        Command::Demo => demo::run_demo(),
        Command::Bench(args) => bench::run_bench(&args),
    }
}
