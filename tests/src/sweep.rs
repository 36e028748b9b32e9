//! Removes namespaces and bpffs directories left by test processes that
//! no longer exist (a test run killed with SIGKILL cannot clean up after
//! itself). Names carry the creating pid: `sluice-t<pid>-...`.

use std::{fs, path::Path, process::Command, sync::Once};

use crate::netns::PREFIX;

/// The bpffs directory tests pin under.
pub const BPFFS: &str = "/sys/fs/bpf";

fn owner_alive(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return true;
    };
    let pid = rest.split('-').next().unwrap_or("");
    match pid.parse::<u32>() {
        Ok(pid) => Path::new("/proc").join(pid.to_string()).exists(),
        Err(_) => true,
    }
}

/// Deletes everything this process created (namespaces, bpffs
/// directories, temporary manifest directories): the last resort of a
/// signal handler that cannot run destructors.
pub fn sweep_own() {
    let own = format!("{PREFIX}{}-", std::process::id());
    for entry in fs::read_dir("/run/netns").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&own) {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", &name]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: sending a signal has no memory-safety effect.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
    for dir in [Path::new(BPFFS).to_owned(), std::env::temp_dir()]
        .into_iter()
        .chain(cgroup2_mount())
    {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&own) {
                remove(&entry.path());
            }
        }
    }
}

/// Removes a directory (a cgroup only with rmdir), tree or file.
fn remove(path: &Path) {
    if fs::remove_dir(path).is_ok() || fs::remove_file(path).is_ok() {
        return;
    }
    let _ = fs::remove_dir_all(path);
}

/// Where cgroup v2 is mounted.
fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, path, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| std::path::PathBuf::from(path))
    })
}

/// Sweeps once per process.
pub fn once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(sweep);
}

/// Deletes every stale namespace and bpffs directory.
pub fn sweep() {
    for entry in fs::read_dir("/run/netns").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(PREFIX) && !owner_alive(&name) {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
    for dir in [Path::new(BPFFS).to_owned(), std::env::temp_dir()]
        .into_iter()
        .chain(cgroup2_mount())
    {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(PREFIX) && !owner_alive(&name) {
                remove(&entry.path());
            }
        }
    }
}
