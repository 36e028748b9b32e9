//! Finding, and if need be installing, a toolchain that builds aya eBPF
//! code: `core` for `bpfel-unknown-none` (`-Z build-std=core`, which needs
//! the standard library's sources) and `bpf-linker` built against the same
//! LLVM major as that rustc.
//!
//! Two routes, in order of preference:
//! 1. rustup's nightly with the `rust-src` component (the usual route);
//! 2. Debian/Ubuntu's `rustc-web` + `rust-web-src` (rustc 1.96, LLVM 22 on
//!    bookworm-security), installed with apt when missing. This is the
//!    verified route on machines whose rustup cannot download components.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::exec::{is_root, output, run, show};

/// How to invoke cargo for the eBPF crate.
pub struct Toolchain {
    /// The cargo program and its leading arguments (e.g. `+nightly`).
    pub cargo: Vec<String>,
    /// `RUSTC` to set, if any.
    pub rustc: Option<PathBuf>,
    /// Prepended to PATH so that `cargo clippy` finds the matching driver.
    pub path_prefix: Option<PathBuf>,
    pub description: String,
}

impl Toolchain {
    /// A command for this toolchain's cargo with a clean environment (no
    /// variables leaked from the outer `cargo run` or its rustup proxy).
    pub fn cargo(&self) -> Command {
        let mut cmd = Command::new(&self.cargo[0]);
        cmd.args(&self.cargo[1..]);
        for var in [
            "RUSTUP_TOOLCHAIN",
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO",
            "LD_LIBRARY_PATH",
            "CARGO_TARGET_DIR",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
        ] {
            cmd.env_remove(var);
        }
        if let Some(rustc) = &self.rustc {
            cmd.env("RUSTC", rustc).env("RUSTC_BOOTSTRAP", "1");
        }
        if let Some(prefix) = &self.path_prefix {
            let path = env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![prefix.clone()];
            paths.extend(env::split_paths(&path));
            if let Ok(joined) = env::join_paths(paths) {
                cmd.env("PATH", joined);
            }
        }
        cmd
    }
}

const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const BPF_LINKER_VERSION: &str = "0.13.0";

fn rustup_nightly() -> Option<Toolchain> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    installed
        .lines()
        .any(|l| l.starts_with("rust-src"))
        .then(|| Toolchain {
            cargo: vec!["cargo".into(), "+nightly".into()],
            rustc: None,
            path_prefix: None,
            description: "rustup nightly with rust-src".into(),
        })
}

fn sysroot_has_core_src(rustc: &str) -> bool {
    output(Command::new(rustc).args(["--print", "sysroot"])).is_some_and(|root| {
        Path::new(root.trim())
            .join("lib/rustlib/src/rust/library/core/Cargo.toml")
            .exists()
    })
}

fn debian() -> Option<Toolchain> {
    (Path::new(DEBIAN_CARGO).exists()
        && Path::new("/usr/bin/cargo-clippy").exists()
        && sysroot_has_core_src(DEBIAN_RUSTC))
    .then(|| Toolchain {
        cargo: vec![DEBIAN_CARGO.into()],
        rustc: Some(DEBIAN_RUSTC.into()),
        path_prefix: Some("/usr/bin".into()),
        description: "Debian rustc-web with rust-web-src".into(),
    })
}

/// LLVM major version a rustc was built with (`rustc -vV`).
fn llvm_major(rustc: &str) -> Option<u32> {
    output(Command::new(rustc).arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))?
        .split('.')
        .next()?
        .parse()
        .ok()
}

fn apt_install(packages: &[&str]) -> Result<()> {
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!("apt-get is not available to install {}", packages.join(" "));
    }
    if !is_root() {
        bail!(
            "installing {} needs root: run `sudo cargo xtask setup`",
            packages.join(" ")
        );
    }
    run(Command::new("apt-get").args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn dpkg_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|s| s.contains("install ok installed"))
}

fn cargo_home_bin() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

/// The LLVM major a bpf-linker binary is linked against (from its libLLVM
/// soname), if it is dynamically linked.
fn linker_llvm_major(linker: &Path) -> Option<u32> {
    let ldd = output(Command::new("ldd").arg(linker))?;
    ldd.lines().find_map(|l| {
        let lib = l.split_whitespace().next()?;
        let v = lib.strip_prefix("libLLVM")?;
        let v = v.trim_start_matches(['-', '.']).trim_start_matches("so.");
        v.split(['.', '-']).next()?.parse().ok()
    })
}

fn find_bpf_linker() -> Option<PathBuf> {
    let in_cargo = cargo_home_bin().join("bpf-linker");
    if in_cargo.exists() {
        return Some(in_cargo);
    }
    output(Command::new("which").arg("bpf-linker")).map(|p| PathBuf::from(p.trim()))
}

fn ensure_bpf_linker(llvm: Option<u32>) -> Result<()> {
    if let Some(linker) = find_bpf_linker() {
        let version = output(Command::new(&linker).arg("--version")).unwrap_or_default();
        let linked = linker_llvm_major(&linker);
        let matches = llvm.is_none() || linked.is_none() || linked == llvm;
        if version.contains(BPF_LINKER_VERSION) && matches {
            return Ok(());
        }
        eprintln!(
            "bpf-linker at {} ({}, LLVM {linked:?}) does not match LLVM {llvm:?}: reinstalling",
            linker.display(),
            version.trim()
        );
    }
    let mut cmd = Command::new("cargo");
    cmd.args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--force",
    ]);
    if let Some(major) = llvm {
        let prefix = format!("/usr/lib/llvm-{major}");
        if !Path::new(&prefix).join("lib/libLLVM.so").exists()
            && !Path::new(&prefix).join("bin/llvm-config").exists()
        {
            apt_install(&[&format!("llvm-{major}-dev")])?;
        }
        cmd.env("LLVM_PREFIX", &prefix).args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ]);
    }
    eprintln!("building bpf-linker (about a minute)");
    run(&mut cmd).with_context(|| format!("installing bpf-linker: {}", show(&cmd)))
}

fn bpffs_mounted() -> bool {
    fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "))
    })
}

fn ensure_bpffs() -> Result<()> {
    if bpffs_mounted() {
        return Ok(());
    }
    if !is_root() {
        eprintln!("note: bpffs is not mounted at /sys/fs/bpf; running sluice needs `mount -t bpf bpf /sys/fs/bpf` as root");
        return Ok(());
    }
    run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
}

/// Tools the tests, demo and docs use besides the compiler.
const RUNTIME_PACKAGES: &[(&str, &str)] = &[
    ("bpftool", "bpftool"),
    ("ip", "iproute2"),
    ("iptables-legacy", "iptables"),
    ("nft", "nftables"),
    // Tests turn off TX checksum offload on veths (strict checksums); the
    // bench's north-south scenario reads veth XDP counters.
    ("ethtool", "ethtool"),
    // The bench's source-line profile of the programs (`perf record`).
    ("perf", "linux-perf"),
];

fn ensure_runtime_tools() -> Result<()> {
    let missing: Vec<&str> = RUNTIME_PACKAGES
        .iter()
        .filter(|(bin, _)| output(Command::new("which").arg(bin)).is_none())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing)
}

/// Makes the machine able to build and run sluice's eBPF code and returns
/// the toolchain to use. Quick when everything is already there.
pub fn setup() -> Result<Toolchain> {
    let toolchain = build_toolchain()?;
    ensure_runtime_tools()?;
    ensure_bpffs()?;
    Ok(toolchain)
}

/// Only what building the eBPF object needs: the compiler and bpf-linker.
/// `build-ebpf` stops here, so that it also works in a container image
/// build, which can neither mount bpffs nor use the runtime tools.
pub fn build_toolchain() -> Result<Toolchain> {
    let toolchain = match rustup_nightly().or_else(debian) {
        Some(tc) => tc,
        None if Path::new("/usr/bin/apt-get").exists() && is_root() => {
            eprintln!("no BPF-capable Rust toolchain found: installing Debian's rustc-web route");
            apt_install(&["rustc-web", "rust-web-src", "cargo-web", "rust-web-clippy"])?;
            debian().context("rustc-web was installed but its library sources were not found")?
        }
        None => bail!(
            "no Rust toolchain that can build eBPF code was found. Either:\n  \
             - rustup: `rustup toolchain install nightly --component rust-src`, or\n  \
             - Debian/Ubuntu (as root): `apt-get install rustc-web rust-web-src cargo-web rust-web-clippy`\n\
             then run `cargo xtask setup` again (it also builds bpf-linker)."
        ),
    };
    let llvm = match &toolchain.rustc {
        Some(rustc) => llvm_major(&rustc.to_string_lossy()),
        None => None,
    };
    if let Some(major) = llvm {
        if !dpkg_installed(&format!("llvm-{major}-dev")) {
            apt_install(&[&format!("llvm-{major}-dev")])?;
        }
    }
    ensure_bpf_linker(llvm)?;
    eprintln!("eBPF toolchain: {}", toolchain.description);
    Ok(toolchain)
}
