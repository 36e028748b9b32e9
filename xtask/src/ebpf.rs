//! Building and linting the kernel-side crate.

use std::{fs, path::Path};

use anyhow::{Context, Result};

use crate::{
    exec::{root, run},
    toolchain::Toolchain,
};

const TARGET: &str = "bpfel-unknown-none";

fn common_args_in(cmd: &mut std::process::Command, dir: &str) {
    let target_dir = root().join("target").join(dir);
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
        )
        // The workspace's release profile builds the agent with fat LTO
        // in one codegen unit (`lto` cannot be set per package): the eBPF
        // object and its `core` keep cargo's defaults, as they were built
        // and measured before that (`sluice-ebpf`'s own codegen-units
        // override still applies).
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");
}

/// The objects the agent embeds: cargo features, target directory (under
/// `target/`) and where the object lands. The second has the service and
/// backend maps preallocated (`sluice agent --preallocate-maps`).
const OBJECTS: [(&[&str], &str, &str); 2] = [
    (&[], "ebpf", "target/bpf/sluice.bpf.o"),
    (
        &["prealloc"],
        "ebpf-prealloc",
        "target/bpf/sluice-prealloc.bpf.o",
    ),
];

/// Builds the eBPF objects; cargo's own change tracking picks up source
/// edits, and a copy is only rewritten when the bytes changed (so the
/// agent is only re-embedded when needed).
pub fn build(tc: &Toolchain) -> Result<()> {
    for (features, dir, dest) in OBJECTS {
        build_variant(tc, features, dir, &root().join(dest))?;
    }
    Ok(())
}

/// Builds the object with `features` (in `target/<dir>`) to `dest`.
pub fn build_variant(tc: &Toolchain, features: &[&str], dir: &str, dest: &Path) -> Result<()> {
    let mut cmd = tc.cargo();
    cmd.arg("build");
    common_args_in(&mut cmd, dir);
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    run(&mut cmd)?;
    let built = root()
        .join("target")
        .join(dir)
        .join(TARGET)
        .join("release/sluice");
    let bytes = fs::read(&built).with_context(|| format!("reading {}", built.display()))?;
    if fs::read(dest).ok().as_deref() != Some(bytes.as_slice()) {
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(dest, &bytes).with_context(|| format!("writing {}", dest.display()))?;
    }
    eprintln!("eBPF object: {} ({} bytes)", dest.display(), bytes.len());
    Ok(())
}

/// Clippy on the kernel side, warnings as errors, as each object is built.
pub fn clippy(tc: &Toolchain) -> Result<()> {
    for (features, dir, _) in OBJECTS {
        let mut cmd = tc.cargo();
        cmd.arg("clippy");
        common_args_in(&mut cmd, dir);
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        cmd.args(["--", "-D", "warnings"]);
        run(&mut cmd)?;
    }
    Ok(())
}
