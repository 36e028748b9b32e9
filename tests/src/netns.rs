//! Network namespaces created for one test, deleted on drop.
//!
//! Code runs inside a namespace on its own thread (`setns` is per thread),
//! like aya's `NetNsGuard`. Sockets keep the namespace they were created
//! in, so a socket made by [`Netns::run`] can be used from any thread.
//! Child processes enter with `setns` in `pre_exec`, not `ip netns exec`,
//! which would remount `/sys` and hide bpffs and cgroup2.

use std::{
    fs::File,
    io,
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
    thread,
};

use anyhow::{bail, Context, Result};

/// Prefix of every namespace and bpffs directory the tests create, followed
/// by the creating process id (see [`crate::sweep`]).
pub const PREFIX: &str = "sluice-t";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process: `sluice-t<pid>-<n>-<role>`.
pub fn unique_name(role: &str) -> String {
    format!(
        "{PREFIX}{}-{}-{role}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub struct Netns {
    name: String,
}

/// Runs a command, failing with its stderr when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

impl Netns {
    /// Creates a namespace with its loopback up.
    pub fn create(role: &str) -> Result<Self> {
        crate::sweep::once();
        let ns = Self {
            name: unique_name(role),
        };
        run(Command::new("ip").args(["netns", "add", &ns.name]))?;
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Moves the calling thread into this namespace (for good).
    pub fn enter(&self) -> io::Result<()> {
        enter_path(&self.path())
    }

    /// Runs `f` inside the namespace, on a scoped thread; a panic in `f`
    /// propagates.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let path = self.path();
        thread::scope(|s| {
            let handle = s.spawn(move || -> io::Result<T> {
                enter_path(&path)?;
                Ok(f())
            });
            match handle.join() {
                Ok(result) => result.with_context(|| format!("entering netns {}", self.name)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Starts a thread that lives inside the namespace; threads it spawns
    /// inherit the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<io::Result<T>> {
        let path = self.path();
        thread::spawn(move || {
            enter_path(&path)?;
            Ok(f())
        })
    }

    /// A command that runs inside the namespace (and keeps the host's
    /// mounts, so bpffs stays visible).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let path = self.path();
        // SAFETY: only async-signal-safe calls (sigprocmask, open, setns,
        // close) happen between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // A child must not inherit a mask that blocks SIGTERM (the
                // demo blocks it to handle it on one thread).
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                enter_path(&path)
            });
        }
        cmd
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let out = run(Command::new("ip").arg("-n").arg(&self.name).args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let value = value.to_owned();
        self.run(move || std::fs::write(&path, value).with_context(|| format!("writing {path}")))?
    }
}

fn enter_path(path: &std::path::Path) -> io::Result<()> {
    let file = File::open(path)?;
    // SAFETY: setns on a namespace fd we hold open.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes still inside would keep the namespace alive.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: sending a signal has no memory-safety effect.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
