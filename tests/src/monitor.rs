//! `sluice monitor --json` run as a child process against a datapath's
//! pins, its events collected as they come.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// A running `sluice monitor --json`; killed on drop.
pub struct Monitor {
    child: Child,
    events: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<String>>,
}

impl Monitor {
    /// Starts it on the pins under `root` with `extra` arguments, and
    /// returns once it reads (events from then on are seen).
    pub fn start(root: &Path, extra: &[&str]) -> Result<Self> {
        let mut child = Command::new(crate::agent::binary()?)
            .args(["monitor", "--json", "--bpf-root"])
            .arg(root)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting sluice monitor")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().context("monitor stdout")?;
        let err = child.stderr.take().context("monitor stderr")?;
        {
            let events = events.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        if let Ok(mut e) = events.lock() {
                            e.push(v);
                        }
                    }
                }
            });
        }
        {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                    if let Ok(mut s) = stderr.lock() {
                        s.push_str(&line);
                        s.push('\n');
                    }
                }
            });
        }
        let mut monitor = Self {
            child,
            events,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !monitor.stderr().contains("reading ") {
            if let Some(status) = monitor.child.try_wait()? {
                bail!("sluice monitor exited ({status}): {}", monitor.stderr());
            }
            if Instant::now() > deadline {
                bail!("sluice monitor did not start: {}", monitor.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(monitor)
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Every event printed so far.
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// The first event for which `pred` holds, waiting up to `timeout`.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.events().into_iter().find(|v| pred(v)) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!(
                    "no event {what} in {timeout:?}; seen: {:#?}\nstderr: {}",
                    self.events(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until at least `n` events were printed.
    pub fn wait_count(&self, n: usize, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let have = self.events().len();
            if have >= n || Instant::now() > deadline {
                return Ok(have);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Interrupts it (Ctrl-C) and returns its stderr, with the counts per
    /// reason.
    pub fn interrupt(mut self) -> Result<String> {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("sluice monitor ignored SIGINT");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.stderr().contains(" events") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(self.stderr())
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
