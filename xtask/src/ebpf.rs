//! Building and linting the kernel-side crate.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result};

use crate::{
    exec::{root, run},
    toolchain::Toolchain,
};

/// Where the object lands; the agent embeds it from here.
pub fn object_path() -> PathBuf {
    root().join("target/bpf/sluice.bpf.o")
}

const TARGET: &str = "bpfel-unknown-none";

fn common_args(cmd: &mut std::process::Command) {
    let target_dir = root().join("target/ebpf");
    cmd.current_dir(root())
        .args([
            "-p",
            "sluice-ebpf",
            "--release",
            "--target",
            TARGET,
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        // BTF for bpftool and for BTF maps; full debug info feeds it.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\u{1f}-Clink-arg=--btf",
        );
}

/// Builds the eBPF object; cargo's own change tracking picks up source
/// edits, and the copy is only rewritten when the bytes changed (so the
/// agent is only re-embedded when needed).
pub fn build(tc: &Toolchain) -> Result<()> {
    let mut cmd = tc.cargo();
    cmd.arg("build");
    common_args(&mut cmd);
    run(&mut cmd)?;
    let built = root()
        .join("target/ebpf")
        .join(TARGET)
        .join("release/sluice");
    let bytes = fs::read(&built).with_context(|| format!("reading {}", built.display()))?;
    let dest = object_path();
    if fs::read(&dest).ok().as_deref() != Some(bytes.as_slice()) {
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(&dest, &bytes).with_context(|| format!("writing {}", dest.display()))?;
    }
    eprintln!("eBPF object: {} ({} bytes)", dest.display(), bytes.len());
    Ok(())
}

/// Clippy on the kernel side, warnings as errors.
pub fn clippy(tc: &Toolchain) -> Result<()> {
    let mut cmd = tc.cargo();
    cmd.arg("clippy");
    common_args(&mut cmd);
    cmd.args(["--", "-D", "warnings"]);
    run(&mut cmd)
}
