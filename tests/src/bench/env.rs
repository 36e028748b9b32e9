//! One environment per variant: its own node namespace with a client pod
//! and ten backend pods running the benchmark server, and whatever the
//! variant balances with (nothing, sluice's TC programs, or kube-proxy's
//! rules in the node's netfilter tables).
//!
//! Every variant lives in its own node namespace, so the variants never
//! share a hook: netfilter hooks and tables are per network namespace and
//! the TC programs are attached to the sluice environment's veths only.
//! Only one environment carries traffic at a time. A loaded but idle
//! ruleset costs other namespaces nothing, and keeping it loaded lets the
//! rounds interleave without re-loading 10,000+ services each round
//! (which would take minutes) and without the legacy `nat` table's hooks,
//! which stay registered in a namespace once created, taxing a later
//! variant in the same namespace.

use std::{
    fs,
    net::SocketAddrV4,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use sluice::datapath::MapSizes;

use super::{
    kubeproxy::Layout,
    services::{ServiceSet, SERVICE_PORT, TARGET_PORT},
    traffic::{self, Server},
};
use crate::{lb::Lb, netns::unique_name, topology::Topology, Netns};

pub const BACKENDS: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    Direct,
    /// `direct` again, in a topology of its own: the A/A control. What
    /// it reads against `direct` is the measurement's own bias between
    /// two identical setups, the least difference the bench can tell.
    DirectAgain,
    Sluice,
    /// sluice with socket-level balancing for pods (`--socket-lb=all`):
    /// the client's sockets are in the cgroup the socket programs are
    /// attached to, so its connections are sent to a backend at
    /// connect() and the TC programs see plain pod-to-pod packets.
    SluiceSock,
    /// `sluice` with host routing (`--host-routing`): a service packet
    /// DNATed to a local pod goes into the pod's namespace at once
    /// (`bpf_redirect_peer`), past the node's IP stack.
    SluiceHostRouting,
    /// sluice attached and programmed like `sluice`, but the client
    /// connects to the pods directly: what the programs cost traffic that
    /// is not a service's (the goal: within 1% of `direct`).
    SluicePassthrough,
    /// `sluice-sock`'s datapath (the default `--socket-lb=all`), the
    /// client in the covered cgroup connecting to the pods directly: what
    /// the default configuration costs traffic that is not a service's.
    SluiceSockPassthrough,
    /// A TC program that does nothing (`return TCX_NEXT`) on every hook
    /// sluice's TC programs use, the client connecting to the pods
    /// directly: what the hooks cost with nothing in them, the floor under
    /// `sluice-passthrough`.
    TcFloor,
    /// `tc-floor`'s empty TC programs, and an empty program on every
    /// cgroup hook sluice's socket programs use, the client in that
    /// cgroup connecting to the pods directly: the floor under
    /// `sluice-sock-passthrough` (and the least `sluice-sock` can cost).
    SockFloor,
    IptablesLegacy,
    IptablesNft,
    Nftables,
}

impl Variant {
    pub const ALL: [Variant; 12] = [
        Variant::Direct,
        Variant::DirectAgain,
        Variant::Sluice,
        Variant::SluiceSock,
        Variant::SluiceHostRouting,
        Variant::SluicePassthrough,
        Variant::SluiceSockPassthrough,
        Variant::TcFloor,
        Variant::SockFloor,
        Variant::IptablesLegacy,
        Variant::IptablesNft,
        Variant::Nftables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Direct => "direct",
            Variant::DirectAgain => "direct-again",
            Variant::Sluice => "sluice",
            Variant::SluiceSock => "sluice-sock",
            Variant::SluiceHostRouting => "sluice-host-routing",
            Variant::SluicePassthrough => "sluice-passthrough",
            Variant::SluiceSockPassthrough => "sluice-sock-passthrough",
            Variant::TcFloor => "tc-floor",
            Variant::SockFloor => "sock-floor",
            Variant::IptablesLegacy => "iptables-legacy",
            Variant::IptablesNft => "iptables-nft",
            Variant::Nftables => "nftables",
        }
    }

    /// Whether the client's sockets are balanced by the socket programs
    /// (`--socket-lb=all`).
    pub fn on_sockets(self) -> bool {
        matches!(
            self,
            Variant::SluiceSock | Variant::SluiceSockPassthrough | Variant::SockFloor
        )
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == s)
    }

    /// The `iptables-restore` flavour, for the two iptables variants.
    pub fn restore_binary(self) -> Option<&'static str> {
        match self {
            Variant::IptablesLegacy => Some("iptables-legacy-restore"),
            Variant::IptablesNft => Some("iptables-nft-restore"),
            _ => None,
        }
    }

    fn iptables_binary(self) -> Option<&'static str> {
        match self {
            Variant::IptablesLegacy => Some("iptables-legacy"),
            Variant::IptablesNft => Some("iptables-nft"),
            _ => None,
        }
    }
}

/// How a timed command ended.
#[derive(Debug)]
pub enum Timed {
    Done(Duration),
    OverBudget(Duration),
}

/// Runs `cmd` with `input` as stdin; kills it when it exceeds `budget`.
pub fn run_timed(mut cmd: Command, input: Option<&Path>, budget: Duration) -> Result<Timed> {
    let stdin = match input {
        Some(path) => Stdio::from(fs::File::open(path)?),
        None => Stdio::null(),
    };
    let shown = format!("{cmd:?}");
    let err_path = std::env::temp_dir().join(format!("{}.stderr", unique_name("cmd")));
    let err_file = fs::File::create(&err_path)?;
    let start = Instant::now();
    let mut child = cmd
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    let outcome = loop {
        if let Some(status) = child.try_wait()? {
            let took = start.elapsed();
            if !status.success() {
                let err = fs::read_to_string(&err_path).unwrap_or_default();
                let _ = fs::remove_file(&err_path);
                let err: String = err.chars().take(2000).collect();
                bail!("{shown} failed ({status}): {}", err.trim());
            }
            break Timed::Done(took);
        }
        if start.elapsed() > budget {
            let _ = child.kill();
            let _ = child.wait();
            break Timed::OverBudget(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = fs::remove_file(&err_path);
    Ok(outcome)
}

/// A temporary file, removed on drop.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn write(role: &str, content: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(unique_name(role));
        fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

pub struct Env {
    pub variant: Variant,
    // Field order is drop order: the datapath and servers go before the
    // namespaces.
    pub lb: Option<Lb>,
    /// `tc-floor`'s (and `sock-floor`'s) empty TC programs.
    pub floor: Option<crate::bpf::NopTcEverywhere>,
    /// `sock-floor`'s empty cgroup programs.
    pub sock_floor: Option<crate::bpf::NopSockEverywhere>,
    _servers: Vec<Server>,
    pub topo: Topology,
    /// Which kube-proxy layout is loaded, if any.
    pub layout: Option<Layout>,
}

impl Env {
    pub fn new(variant: Variant) -> Result<Self> {
        let topo = Topology::new(1, BACKENDS)?;
        // Sequential connects reuse the client's ports quickly; a wide
        // range keeps reuse rare. It ends below sluice's SNAT ports
        // (`SNAT_PORT_MIN`), as the kernel's default range (32768-60999)
        // does: a reply to a client port in the SNAT range is looked up
        // as a possible SNAT reply on every hook, which a pod with the
        // default range never pays.
        topo.clients[0].ns.sysctl(
            "net.ipv4.ip_local_port_range",
            &format!("1024 {}", sluice_common::config::SNAT_PORT_MIN - 1),
        )?;
        let servers = topo
            .backends
            .iter()
            .map(|b| traffic::serve(&b.ns, TARGET_PORT))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            variant,
            lb: None,
            floor: None,
            sock_floor: None,
            _servers: servers,
            topo,
            layout: None,
        })
    }

    pub fn client(&self) -> &Netns {
        &self.topo.clients[0].ns
    }

    pub fn node(&self) -> &Netns {
        &self.topo.node
    }

    /// Where connections go for the service with index `i`: the VIP, or
    /// (direct) the backend pods themselves, in turn.
    pub fn targets(&self, set: &ServiceSet, i: usize) -> Vec<SocketAddrV4> {
        match self.variant {
            Variant::Direct
            | Variant::DirectAgain
            | Variant::SluicePassthrough
            | Variant::SluiceSockPassthrough
            | Variant::TcFloor
            | Variant::SockFloor => self
                .topo
                .backends
                .iter()
                .map(|b| traffic::addr(b.ip, TARGET_PORT))
                .collect(),
            _ => vec![traffic::addr(set.vip(i), SERVICE_PORT)],
        }
    }

    /// Attaches `tc-floor`'s empty program where sluice's TC programs go,
    /// and for `sock-floor` also where its socket programs go.
    pub fn attach_floor(&mut self) -> Result<()> {
        let floor = crate::bpf::NopTcEverywhere::attach(
            &self.topo.node,
            &self.topo.devices(),
            super::progcost::FLOOR,
        )?;
        self.floor = Some(floor);
        if self.variant == Variant::SockFloor {
            let sock = crate::bpf::NopSockEverywhere::attach(self.topo.cgroup.path())?;
            self.sock_floor = Some(sock);
        }
        Ok(())
    }

    /// Loads sluice's programs (fresh maps) and attaches them; for
    /// `sluice-sock` also the socket programs, to the topology's cgroup,
    /// for every network namespace (`--socket-lb=all`), with every device
    /// a pod's (`--pod-devices`: `sl_egress_pod` at their egress, the
    /// pods' bit set as the agent's first conntrack scan sets it).
    pub fn load_sluice(&mut self, sizes: MapSizes) -> Result<&mut Lb> {
        let mut lb = Lb::load_with(&self.topo, sizes, Duration::from_secs(60))?;
        if self.variant == Variant::SluiceHostRouting {
            lb.host_routing(&self.topo, true)?;
        }
        if self.variant.on_sockets() {
            let cookie = self.topo.node.run(sluice::datapath::netns_cookie)??;
            lb.reconciler
                .set_socket_lb(cookie, sluice_common::config::CFG_F_SOCK_PODS)?;
            lb.datapath.attach_cgroup(self.topo.cgroup.path())?;
            let devices = self.topo.devices();
            let datapath = &mut lb.datapath;
            self.topo.node.run(|| -> Result<()> {
                for dev in &devices {
                    datapath.attach_facing(dev, sluice::datapath::Facing::Pods)?;
                }
                Ok(())
            })??;
            lb.reconciler.allow_pods_on_sockets(true, false)?;
            lb.reconciler.scan_conntrack(std::time::Instant::now())?;
            ensure!(lb.reconciler.pods_on_sockets(), "the pods' bit is not set");
        }
        Ok(self.lb.insert(lb))
    }

    /// The process in this variant's cgroup while it measures, for
    /// `sluice-sock` (whose socket programs cover that cgroup only).
    pub fn enter(&self) -> Result<Option<super::progcost::InCgroup>> {
        if !self.variant.on_sockets() {
            return Ok(None);
        }
        super::progcost::InCgroup::enter(self.topo.cgroup.path()).map(Some)
    }

    /// Removes every rule of this variant from the node (synchronously, so
    /// that no kernel clean-up runs later, during another measurement).
    pub fn flush(&mut self) -> Result<()> {
        flush_rules(self.variant, self.node())?;
        self.layout = None;
        Ok(())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.layout.is_some() {
            let _ = flush_rules(self.variant, &self.topo.node);
        }
    }
}

/// Empties the tables `variant` writes in `ns`.
pub fn flush_rules(variant: Variant, ns: &Netns) -> Result<()> {
    let quiet = |mut cmd: Command| -> Result<()> {
        let out = cmd.stdin(Stdio::null()).output()?;
        if !out.status.success() {
            bail!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    if let Some(bin) = variant.iptables_binary() {
        for table in ["nat", "filter"] {
            let mut flush = ns.command(bin);
            flush.args(["-w", "-t", table, "-F"]);
            quiet(flush)?;
            let mut delete = ns.command(bin);
            delete.args(["-w", "-t", table, "-X"]);
            quiet(delete)?;
        }
    } else if variant == Variant::Nftables {
        let mut cmd = ns.command("nft");
        cmd.args(["flush", "ruleset"]);
        quiet(cmd)?;
    }
    Ok(())
}
