//! Embeds the eBPF objects that `cargo xtask build-ebpf` writes to
//! `target/bpf/sluice.bpf.o` and `target/bpf/sluice-prealloc.bpf.o` (or
//! `$SLUICE_BPF_OBJECT`, `$SLUICE_BPF_OBJECT_PREALLOC`). Without it the agent
//! still builds, so that the user side compiles on the stable toolchain
//! alone, but it refuses to load a datapath and says how to build one.

use std::{env, error::Error, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../target/bpf");
    // The default object, and the one whose service and backend maps are
    // preallocated (`--preallocate-maps`).
    embed(
        "SLUICE_BPF_OBJECT",
        dir.join("sluice.bpf.o"),
        "sluice.bpf.o",
    )?;
    embed(
        "SLUICE_BPF_OBJECT_PREALLOC",
        dir.join("sluice-prealloc.bpf.o"),
        "sluice-prealloc.bpf.o",
    )
}

/// Copies the object at `$var` (or `default`) to `OUT_DIR/name`; an empty
/// file when there is none.
fn embed(var: &str, default: PathBuf, name: &str) -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-env-changed={var}");
    let object = env::var_os(var).map_or(default, PathBuf::from);
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var("OUT_DIR")?).join(name);
    match fs::read(&object) {
        Ok(bytes) => fs::write(&out, bytes)?,
        Err(_) => {
            println!(
                "cargo:warning=no eBPF object at {}: this sluice cannot load its datapath (run `cargo xtask build-ebpf`)",
                object.display()
            );
            fs::write(&out, [])?;
        }
    }
    Ok(())
}
