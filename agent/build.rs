//! Embeds the eBPF object that `cargo xtask build-ebpf` writes to
//! `target/bpf/sluice.bpf.o` (or `$SLUICE_BPF_OBJECT`). Without it the agent
//! still builds, so that the user side compiles on the stable toolchain
//! alone, but it refuses to load a datapath and says how to build one.

use std::{env, error::Error, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-env-changed=SLUICE_BPF_OBJECT");
    let object = match env::var_os("SLUICE_BPF_OBJECT") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../target/bpf/sluice.bpf.o"),
    };
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var("OUT_DIR")?).join("sluice.bpf.o");
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
