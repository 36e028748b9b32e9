//! `cargo xtask test`: what must pass before a change lands.

use std::process::Command;

use anyhow::{bail, Result};
use clap::Args;

use crate::{
    ebpf,
    exec::{is_root, output, root, run},
    releases, toolchain,
};

#[derive(Args)]
pub struct TestArgs {
    /// Extra arguments for the test runner (e.g. a test name filter).
    #[arg(trailing_var_arg = true)]
    pub runner_args: Vec<String>,
}

fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root());
    cmd
}

/// Formatting and clippy on both sides.
pub fn lint(tc: &toolchain::Toolchain) -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    ebpf::clippy(tc)
}

pub fn run_tests(args: &TestArgs) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask test runs privileged integration tests (network namespaces, BPF programs): run it as root"
        );
    }
    let tc = toolchain::setup()?;
    lint(&tc)?;
    ebpf::build(&tc)?;
    // The agents of earlier releases and the abi-probe build, for the
    // upgrade and rollback tests.
    let releases = releases::build_all(&tc)?;
    let nextest = output(Command::new("cargo").args(["nextest", "--version"])).is_some();
    if nextest {
        run(cargo().args(["test", "--doc", "--quiet"]))?;
        run(cargo()
            .env("SLUICE_RELEASES_BIN", &releases)
            .args(["nextest", "run", "--no-fail-fast"])
            .args(&args.runner_args))
    } else {
        eprintln!("cargo-nextest not found: falling back to cargo test");
        run(cargo()
            .env("SLUICE_RELEASES_BIN", &releases)
            .args(["test", "--no-fail-fast"])
            .args(&args.runner_args))
    }
}
