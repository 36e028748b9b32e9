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
    let bytes = match without_dwarf(&built) {
        Some(bytes) => bytes,
        None => fs::read(&built).with_context(|| format!("reading {}", built.display()))?,
    };
    if fs::read(dest).ok().as_deref() != Some(bytes.as_slice()) {
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(dest, &bytes).with_context(|| format!("writing {}", dest.display()))?;
    }
    eprintln!("eBPF object: {} ({} bytes)", dest.display(), bytes.len());
    Ok(())
}

/// The object at `built` without its DWARF sections, if an
/// `llvm-objcopy` is at hand: the one on PATH, else that of the newest
/// `/usr/lib/llvm-<N>` (the LLVM installed for bpf-linker brings one).
/// The DWARF only feeds bpf-linker's BTF: the loader reads `.BTF` and
/// `.BTF.ext` (which carry the line info bpftool shows), never `.debug_*`.
/// It was three quarters of the 2.4 MB object that the agent embeds, and
/// 0.9 MB of its resident memory at 100,000 services (issue 17). Without
/// the tool the object stays whole, with a warning.
fn without_dwarf(built: &Path) -> Option<Vec<u8>> {
    let tool = std::iter::once(std::path::PathBuf::from("llvm-objcopy"))
        .chain(newest_llvm_objcopy())
        .find(|t| {
            std::process::Command::new(t)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(tool) = tool else {
        eprintln!("warning: no llvm-objcopy: the eBPF object keeps its DWARF sections");
        return None;
    };
    let out = built.with_extension("stripped");
    let stripped = std::process::Command::new(&tool)
        .arg("--strip-debug")
        .arg(built)
        .arg(&out)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        eprintln!(
            "warning: {} --strip-debug failed: the eBPF object keeps its DWARF sections",
            tool.display()
        );
        return None;
    }
    match fs::read(&out) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            eprintln!(
                "warning: reading {}: {e}: the eBPF object keeps its DWARF sections",
                out.display()
            );
            None
        }
    }
}

/// `/usr/lib/llvm-<N>/bin/llvm-objcopy` of the highest N there is.
fn newest_llvm_objcopy() -> Option<std::path::PathBuf> {
    let mut found: Vec<(u32, std::path::PathBuf)> = fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let major: u32 = name.strip_prefix("llvm-")?.parse().ok()?;
            let tool = e.path().join("bin/llvm-objcopy");
            tool.exists().then_some((major, tool))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, tool)| tool)
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
