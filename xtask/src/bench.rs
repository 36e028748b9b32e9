//! `cargo xtask bench`: builds the eBPF object and the agent, then runs the
//! benchmark binary in release mode (as root). See docs/performance.md.

use std::process::Command;

use anyhow::{bail, Result};
use clap::Args;

use crate::{
    ebpf,
    exec::{is_root, root, run},
    toolchain,
};

#[derive(Args)]
pub struct BenchArgs {
    /// A smoke run of about a minute (1 and 1000 services, few samples).
    #[arg(long)]
    pub quick: bool,
    /// Further arguments for sluice-bench (see `-- --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub bench_args: Vec<String>,
}

pub fn run_bench(args: &BenchArgs) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask bench creates network namespaces, loads BPF programs and netfilter rules: run it as root"
        );
    }
    let tc = toolchain::setup()?;
    ebpf::build(&tc)?;
    // The agent embeds the object; build it now so the benchmark's own
    // up-to-date check is a no-op.
    run(Command::new("cargo").current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "sluice",
        "--bin",
        "sluice",
    ]))?;
    let out = root().join("target/bench");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .args([
            "run",
            "--release",
            "-p",
            "sluice-tests",
            "--bin",
            "sluice-bench",
            "--",
        ])
        .arg("--out")
        .arg(&out);
    if args.quick {
        cmd.arg("--quick");
    }
    cmd.args(&args.bench_args);
    run(&mut cmd)
}
