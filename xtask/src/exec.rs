//! Running commands with their output visible, and the workspace root.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of xtask/).
pub fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Runs a command with inherited stdout and stderr (stdin closed: nothing
/// may stop to ask); fails when it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    run_reading(cmd.stdin(Stdio::null()))
}

/// `run` with stdin inherited too, for a command that may wait for the
/// user (the demo's `SLUICE_DEMO_HOLD`).
pub fn run_reading(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok(())
}

/// Runs a command quietly and returns its stdout, or None when it cannot
/// run or fails.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
