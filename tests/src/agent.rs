//! The real `sluice agent` binary, run inside a topology's node namespace
//! (entered with setns, so bpffs stays visible), with its log kept for
//! the failure message.

use std::{
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::{netns::unique_name, topology::Topology, Netns};

/// The node name agents in tests use.
pub const NODE_NAME: &str = "node-1";
const HEALTHZ: &str = "127.0.0.1:10256";
/// The devices agents attach to unless a test says otherwise.
const DEVICES: &str = "c*,b*,e*,u*";
const METRICS: &str = "127.0.0.1:10249";

/// Path of the `sluice` binary: `$SLUICE_AGENT_BIN` when set (`cargo xtask
/// test` and `demo` build it once and set it), else built once per process
/// with cargo (a no-op when up to date), so that tests never run a stale
/// agent.
pub fn binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SLUICE_AGENT_BIN") {
        return Ok(PathBuf::from(bin));
    }
    crate::build::workspace_binary("sluice", "sluice")
}

/// A directory of manifests for `--source dir:`, removed on drop.
pub struct ManifestDir {
    path: PathBuf,
}

impl ManifestDir {
    pub fn create() -> Result<Self> {
        let path = std::env::temp_dir().join(unique_name("manifests"));
        fs::create_dir_all(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes (atomically: temp file, then rename) one manifest file.
    pub fn write(&self, name: &str, yaml: &str) -> Result<()> {
        let tmp = self.path.join(format!(".{name}.tmp"));
        fs::write(&tmp, yaml)?;
        fs::rename(&tmp, self.path.join(name))?;
        Ok(())
    }

    pub fn remove(&self, name: &str) -> Result<()> {
        fs::remove_file(self.path.join(name))?;
        Ok(())
    }
}

impl Drop for ManifestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

pub struct Agent {
    /// The `sluice` binary this agent runs (`binary()` unless started
    /// with another release's).
    bin: PathBuf,
    /// Extra environment (`SLUICE_FAILPOINT` in crash tests).
    env: Vec<(String, String)>,
    child: Option<Child>,
    node: PathBuf,
    log: PathBuf,
    args: Vec<String>,
}

fn in_ns<T: Send>(node: &Path, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = fs::File::open(node)?;
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a namespace fd we hold.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("setns: {}", std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread panicked"))?
    })
}

/// One HTTP/1.1 GET inside the node namespace.
fn get(node: &Path, addr: &str, path: &str) -> Result<(u16, String)> {
    let addr: SocketAddr = addr.parse()?;
    let path = path.to_owned();
    in_ns(node, move || -> Result<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let code = resp
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("malformed response")?;
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((code, body))
    })?
}

impl Agent {
    /// Starts `sluice agent --source <source>` in `topo`'s node namespace,
    /// attached to every pod device, with the topology's bpffs root.
    pub fn start(topo: &Topology, source: &str, extra: &[&str]) -> Result<Self> {
        Self::start_on(topo, source, DEVICES, extra)
    }

    /// Like `start`, attached to the devices matching `devices` only.
    pub fn start_on(topo: &Topology, source: &str, devices: &str, extra: &[&str]) -> Result<Self> {
        Self::start_bin_on(&binary()?, topo, source, devices, extra)
    }

    /// `start` with another `sluice` binary (an earlier release's).
    pub fn start_bin(bin: &Path, topo: &Topology, source: &str, extra: &[&str]) -> Result<Self> {
        Self::start_bin_on(bin, topo, source, DEVICES, extra)
    }

    fn start_bin_on(
        bin: &Path,
        topo: &Topology,
        source: &str,
        devices: &str,
        extra: &[&str],
    ) -> Result<Self> {
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--source".into(),
            source.into(),
            "--devices".into(),
            devices.into(),
            "--bpf-root".into(),
            topo.bpf.path().display().to_string(),
            "--hostname-override".into(),
            NODE_NAME.into(),
            "--healthz-bind-address".into(),
            HEALTHZ.into(),
            "--metrics-bind-address".into(),
            METRICS.into(),
            "--cgroup-root".into(),
            topo.cgroup.path().display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let log = std::env::temp_dir().join(format!("{}.log", unique_name("agent")));
        let mut agent = Self {
            bin: bin.to_owned(),
            env: Vec::new(),
            child: None,
            node: topo.node.path(),
            log,
            args,
        };
        agent.spawn(&topo.node)?;
        Ok(agent)
    }

    fn spawn(&mut self, node: &Netns) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = node
            .command(&self.bin)
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting sluice agent")?;
        self.child = Some(child);
        Ok(())
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Replaces the agent the way a DaemonSet rollout does: SIGTERM, wait,
    /// then `bin` with the same arguments and `env`.
    pub fn replace(&mut self, node: &Netns, bin: &Path, env: &[(&str, &str)]) -> Result<()> {
        self.stop()?;
        self.bin = bin.to_owned();
        self.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.spawn(node)
    }

    /// Leaves the valued option `flag` out of the arguments of the agents
    /// `replace` starts from now on (`--flag value` or `--flag=value`); an
    /// error if this agent was not given it.
    pub fn drop_arg(&mut self, flag: &str) -> Result<()> {
        let joined = format!("{flag}=");
        if let Some(i) = self.args.iter().position(|a| a.starts_with(&joined)) {
            self.args.remove(i);
        } else if let Some(i) = self.args.iter().position(|a| a == flag) {
            ensure!(i + 1 < self.args.len(), "{flag} without its value");
            self.args.drain(i..i + 2);
        } else {
            bail!("the agent was not started with {flag}: {:?}", self.args);
        }
        Ok(())
    }

    /// Adds `extra` to the arguments of the agents `restart` and `replace`
    /// start from now on.
    pub fn add_args(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|a| (*a).to_owned()));
    }

    /// Waits for the agent to exit on its own (a failpoint) and returns its
    /// exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                self.child = None;
                return Ok(status.code());
            }
            if Instant::now() > deadline {
                bail!(
                    "agent still running after {timeout:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restarts the agent with the same arguments (after `kill9`/`stop`).
    pub fn restart(&mut self, node: &Netns) -> Result<()> {
        self.kill9();
        self.spawn(node)
    }

    /// Waits until `/readyz` answers 200 (the first full sync is in the maps).
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((200, _)) = get(&self.node, HEALTHZ, "/readyz") {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "agent exited ({status}) before it was ready:\n{}",
                        self.log_tail()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("agent not ready after {timeout:?}:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status, once the agent has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// One `/readyz` request: true when it answers 200.
    pub fn is_ready(&self) -> bool {
        matches!(get(&self.node, HEALTHZ, "/readyz"), Ok((200, _)))
    }

    /// `/healthz`: status code and JSON body.
    pub fn healthz(&self) -> Result<(u16, serde_json::Value)> {
        let (code, body) = get(&self.node, HEALTHZ, "/healthz")?;
        Ok((
            code,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        ))
    }

    /// `/metrics` text.
    pub fn metrics(&self) -> Result<String> {
        Ok(get(&self.node, METRICS, "/metrics")?.1)
    }

    /// The value of one metric sample (first line starting with `name`).
    pub fn metric(&self, name: &str) -> Result<f64> {
        let text = self.metrics()?;
        metric_in(&text, name).with_context(|| format!("metric {name} not found in:\n{text}"))
    }

    /// The sum of the samples of metric `name` whose labels contain
    /// `label` (e.g. `kind="Service"`).
    pub fn metric_sum(&self, name: &str, label: &str) -> Result<f64> {
        let text = self.metrics()?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// SIGKILL, as a node agent crash or OOM kill.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait, as a DaemonSet rolling update.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            child.wait()?;
        }
        Ok(())
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The lines of every agent's log (the file outlives `replace`) that
    /// tell the steps of start-up and migration, with their times: what
    /// a failure during a rollout is read against.
    pub fn migration_log(&self) -> String {
        const STEPS: [&str; 9] = [
            "migrat",
            "copied",
            "standing by",
            "replaced program",
            "attached",
            "shutting down",
            "sync task stopped",
            "failpoint",
            "WARN",
        ];
        self.log()
            .lines()
            .filter(|l| STEPS.iter().any(|s| l.contains(s)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `sluice <args>` (e.g. `lb list`) against this agent's maps.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let root = self
            .args
            .iter()
            .position(|a| a == "--bpf-root")
            .and_then(|i| self.args.get(i + 1))
            .context("no --bpf-root")?;
        let out = Command::new(&self.bin)
            .args(args)
            .arg("--bpf-root")
            .arg(root)
            .output()?;
        if !out.status.success() {
            bail!(
                "sluice {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- agent log ({}) ---\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        // `SLUICE_KEEP_AGENT_LOGS` keeps them for a look after the run.
        if std::env::var_os("SLUICE_KEEP_AGENT_LOGS").is_none() {
            let _ = fs::remove_file(&self.log);
        }
    }
}

/// Manifests for tests and the demo.
pub mod yaml {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// A ClusterIP Service with one TCP port named `http`.
    pub fn service(name: &str, vip: Ipv4Addr, port: u16, target: u16) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: {vip}\n  clusterIPs: [{vip}]\n  selector:\n    app: {name}\n  ports:\n  - name: http\n    protocol: TCP\n    port: {port}\n    targetPort: {target}\n"
        )
    }

    /// A dual-stack ClusterIP Service (RequireDualStack, IPv4 first) with
    /// one TCP port named `http`.
    pub fn dual_stack_service(
        name: &str,
        vip4: Ipv4Addr,
        vip6: Ipv6Addr,
        port: u16,
        target: u16,
    ) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: {vip4}\n  clusterIPs: [\"{vip4}\", \"{vip6}\"]\n  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n  selector:\n    app: {name}\n  ports:\n  - name: http\n    protocol: TCP\n    port: {port}\n    targetPort: {target}\n"
        )
    }

    /// Conditions of one endpoint.
    #[derive(Clone, Copy, Debug)]
    pub struct Cond {
        pub ready: bool,
        pub serving: bool,
        pub terminating: bool,
    }

    pub const READY: Cond = Cond {
        ready: true,
        serving: true,
        terminating: false,
    };
    pub const TERMINATING: Cond = Cond {
        ready: false,
        serving: false,
        terminating: true,
    };
    pub const TERMINATING_SERVING: Cond = Cond {
        ready: false,
        serving: true,
        terminating: true,
    };

    /// An EndpointSlice for `service` with port `http`.
    pub fn slice(name: &str, service: &str, port: u16, endpoints: &[(Ipv4Addr, Cond)]) -> String {
        let endpoints: Vec<(IpAddr, Cond)> = endpoints
            .iter()
            .map(|(a, c)| (IpAddr::V4(*a), *c))
            .collect();
        slice_of(name, service, port, "IPv4", &endpoints)
    }

    /// An IPv6 EndpointSlice for `service` with port `http`.
    pub fn slice6(name: &str, service: &str, port: u16, endpoints: &[(Ipv6Addr, Cond)]) -> String {
        let endpoints: Vec<(IpAddr, Cond)> = endpoints
            .iter()
            .map(|(a, c)| (IpAddr::V6(*a), *c))
            .collect();
        slice_of(name, service, port, "IPv6", &endpoints)
    }

    fn slice_of(
        name: &str,
        service: &str,
        port: u16,
        address_type: &str,
        endpoints: &[(IpAddr, Cond)],
    ) -> String {
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {service}\naddressType: {address_type}\nports:\n- name: http\n  protocol: TCP\n  port: {port}\nendpoints:\n"
        );
        if endpoints.is_empty() {
            s.push_str("[]\n");
            s = s.replace("endpoints:\n[]\n", "endpoints: []\n");
        }
        for (ip, c) in endpoints {
            s.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  nodeName: node-1\n  conditions:\n    ready: {}\n    serving: {}\n    terminating: {}\n",
                c.ready, c.serving, c.terminating
            ));
        }
        s
    }
}

impl Agent {
    /// `sluice lb list --json` as frontend -> [(backend, state)], sorted.
    pub fn frontends(&self) -> Result<std::collections::BTreeMap<String, Vec<(String, String)>>> {
        let rows: serde_json::Value = serde_json::from_str(&self.cli(&["lb", "list", "--json"])?)?;
        let mut out = std::collections::BTreeMap::new();
        for row in rows.as_array().into_iter().flatten() {
            let mut backends: Vec<(String, String)> = row["backends"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    (
                        b["address"].as_str().unwrap_or_default().to_owned(),
                        b["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            backends.sort();
            out.insert(
                row["frontend"].as_str().unwrap_or_default().to_owned(),
                backends,
            );
        }
        Ok(out)
    }

    /// Syncs completed so far: reconciles, including the one after each
    /// conntrack scan (`sluice_sync_duration_seconds_count`).
    pub fn syncs(&self) -> Result<f64> {
        self.metric("sluice_sync_duration_seconds_count")
    }

    /// Waits until `n` more syncs than now completed: with backends
    /// draining, each follows a conntrack scan (every
    /// `--drain-scan-interval`), so a backend still there after a few has
    /// been judged by scans that started well after it began draining.
    pub fn wait_syncs(&self, n: u32, timeout: Duration) -> Result<()> {
        let since = self.syncs()?;
        self.wait_until(&format!("{n} more syncs"), timeout, |a| {
            Ok(a.syncs()? >= since + f64::from(n))
        })?;
        Ok(())
    }

    /// Waits until metric `name` reads `value`. The agent refreshes its
    /// gauges (refused ports, fill ratios, Maglev fallbacks) at most once
    /// a second while changes stream in, so a gauge lags the maps by up to
    /// that long.
    pub fn wait_metric(&self, name: &str, value: f64, timeout: Duration) -> Result<()> {
        self.wait_until(&format!("{name} == {value}"), timeout, |a| {
            Ok(a.metric(name)? == value)
        })?;
        Ok(())
    }

    /// Waits until `f` holds, polling every 20 ms.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Agent) -> Result<bool>,
    ) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if f(self)? {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "timed out after {timeout:?} waiting for {what}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The agent binary of release `version` (`sluice-<version>`) or of the
/// `abi-probe` build (`sluice-abi-probe`), built by `cargo xtask
/// build-releases` (which `cargo xtask test` runs) into
/// `$SLUICE_RELEASES_BIN`, by default `target/releases/bin`.
pub fn release_binary(name: &str) -> Result<PathBuf> {
    let dir = std::env::var_os("SLUICE_RELEASES_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/releases/bin")
        });
    let bin = dir.join(format!("sluice-{name}"));
    if !bin.exists() {
        bail!(
            "{} is missing: run `cargo xtask build-releases` (cargo xtask test does)",
            bin.display()
        );
    }
    Ok(bin)
}

/// The value of one metric sample in `/metrics` text `text` (the first
/// line starting with `name`, then its labels or a space).
pub fn metric_in(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
