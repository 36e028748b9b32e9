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

/// The test binaries run a second time with `SLUICE_TEST_XDP=native`.
const XDP_PASS: &str =
    "binary(service_types) | binary(kube_proxy_cases) | binary(datapath_fragments)";

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
        let all = run(cargo()
            .env("SLUICE_RELEASES_BIN", &releases)
            .args(["nextest", "run", "--no-fail-fast"])
            .args(&args.runner_args));
        // The tests that send traffic from outside hosts and between
        // nodes, again with sl_xdp natively on those devices: every
        // verdict must be the same whether XDP or TC makes it.
        let xdp = if args.runner_args.is_empty() {
            run(cargo()
                .env("SLUICE_RELEASES_BIN", &releases)
                .env("SLUICE_TEST_XDP", "native")
                .args(["nextest", "run", "--no-fail-fast", "-E"])
                .arg(XDP_PASS))
        } else {
            Ok(())
        };
        all.and(xdp)
    } else {
        eprintln!("cargo-nextest not found: falling back to cargo test");
        run(cargo()
            .env("SLUICE_RELEASES_BIN", &releases)
            .args(["test", "--no-fail-fast"])
            .args(&args.runner_args))
    }
}
