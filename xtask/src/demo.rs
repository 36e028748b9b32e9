//! `cargo xtask demo`: builds what is needed, then runs the demo binary.

use std::process::Command;

use anyhow::{bail, Result};

use crate::{
    ebpf,
    exec::{is_root, root, run, run_reading},
    toolchain,
};

pub fn run_demo() -> Result<()> {
    if !is_root() {
        bail!("the demo creates network namespaces and loads BPF programs: run `cargo xtask demo` as root");
    }
    let tc = toolchain::setup()?;
    ebpf::build(&tc)?;
    eprintln!("building the agent and the demo (the first build takes a few minutes)");
    run(Command::new("cargo").current_dir(root()).args([
        "build",
        "-p",
        "sluice",
        "--bin",
        "sluice",
        "-p",
        "sluice-tests",
        "--bin",
        "sluice-demo",
    ]))?;
    let demo = root().join("target/debug/sluice-demo");
    run_reading(
        Command::new(demo)
            .arg(root().join("deploy/demo"))
            .env("SLUICE_AGENT_BIN", root().join("target/debug/sluice")),
    )
}
