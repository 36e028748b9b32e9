//! Building workspace binaries from a running test or benchmark, so that
//! nothing ever runs a stale build.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use anyhow::Result;

/// `target/<profile>` of the running executable: test binaries live in
/// `target/<profile>/deps/`, other binaries (the benchmark) directly in
/// `target/<profile>/`.
fn profile_dir() -> std::result::Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("unexpected executable location")?;
    let dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().ok_or("unexpected executable location")?
    } else {
        dir
    };
    Ok(dir.to_owned())
}

/// Path of binary `bin` of workspace package `package`, built (once per
/// process; a no-op when up to date) with the running executable's target
/// directory and profile.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    static BUILT: Mutex<Option<HashMap<String, std::result::Result<PathBuf, String>>>> =
        Mutex::new(None);
    let key = format!("{package}/{bin}");
    let mut guard = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let built = guard.get_or_insert_with(HashMap::new);
    if let Some(done) = built.get(&key) {
        return done.clone().map_err(anyhow::Error::msg);
    }
    let result = build(package, bin);
    built.insert(key, result.clone());
    result.map_err(anyhow::Error::msg)
}

fn build(package: &str, bin: &str) -> std::result::Result<PathBuf, String> {
    let profile_dir = profile_dir()?;
    let target_dir = profile_dir.parent().ok_or("no target dir")?;
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "build",
        "--quiet",
        "-p",
        package,
        "--bin",
        bin,
        "--target-dir",
    ])
    .arg(target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .map_err(|e| format!("running cargo build: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build -p {package} --bin {bin} failed ({status})"
        ));
    }
    Ok(Path::new(&profile_dir).join(bin))
}
