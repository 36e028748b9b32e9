//! A node namespace with client and backend "pods" behind veth pairs.
//!
//! ```text
//!  client-k (10.10.k.2/24) eth0 ==veth== c<k> (10.10.k.1)  \
//!                                                            node (forwarding on,
//!  backend-k (10.20.k.2/24) eth0 ==veth== b<k> (10.20.k.1)  /   sluice on c*, b*)
//! ```
//! Every pod routes everything via the node, so traffic to a service VIP
//! (10.96.0.0/12) reaches the node's programs on the pod's host-side veth.
//!
//! Every link is dual-stack: beside `a.b.k.h/24` each end has the ULA
//! `fd00:b:k::h/64` (client-0 is `fd00:10:0::2`, its gateway
//! `fd00:10:0::1`), added with `nodad` so that it is usable at once, and
//! pods route IPv6 via the node too (IPv6 VIPs: `fd00:96::/64`).

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{
    netns::{run, unique_name, Netns},
    sweep::BPFFS,
};

/// A pod: its namespace, address and the node-side end of its veth.
pub struct Pod {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address (`fd00:b:k::h` beside `a.b.k.h`).
    pub ip6: Ipv6Addr,
    /// The veth end in the node namespace (a device sluice attaches to).
    pub host_if: String,
}

/// A bpffs directory for one datapath instance, removed on drop (which
/// also detaches its pinned links and frees its maps).
pub struct BpfRoot {
    path: PathBuf,
}

impl BpfRoot {
    pub fn create() -> Result<Self> {
        ensure_bpffs()?;
        let path = Path::new(BPFFS).join(unique_name("bpf"));
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpfRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Mounts bpffs at /sys/fs/bpf when nothing is mounted there.
pub fn ensure_bpffs() -> Result<()> {
    let mounts = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(BPFFS) && l.contains(" bpf "))
    {
        return Ok(());
    }
    run(Command::new("mount").args(["-t", "bpf", "bpf", BPFFS]))?;
    Ok(())
}

/// A cgroup (v2) for one test's "host" processes, removed on drop: the
/// socket-level programs are attached here, never to the machine's root.
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    pub fn create() -> Result<Self> {
        let mounts = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
        let root = mounts
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (_, path, fstype) = (f.next()?, f.next()?, f.next()?);
                (fstype == "cgroup2").then(|| PathBuf::from(path))
            })
            .context("no cgroup2 mount")?;
        let path = root.join(unique_name("cg"));
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Processes left inside keep the cgroup busy.
        if let Ok(pids) = fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: sending a signal has no memory-safety effect.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for _ in 0..50 {
            if fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

pub struct Topology {
    // Field order is drop order: pins go before the namespaces.
    pub bpf: BpfRoot,
    pub cgroup: TestCgroup,
    pub clients: Vec<Pod>,
    pub backends: Vec<Pod>,
    /// Hosts outside the cluster, each behind its own node device
    /// (`e<k>`, node address 192.168.<k+1>.1, host .100).
    pub externals: Vec<Pod>,
    pub node: Netns,
    /// 1 or 2: picks the pod address ranges (node 2: 10.50.x clients,
    /// 10.60.x backends), so that two nodes can be joined.
    index: u8,
}

/// The base of the address ranges of node `index`'s clients and backends.
fn nets(index: u8) -> (u8, u8) {
    let shift = 40 * (index - 1);
    (10 + shift, 20 + shift)
}

impl Topology {
    /// A node with `clients` client pods and `backends` backend pods.
    pub fn new(clients: usize, backends: usize) -> Result<Self> {
        Self::with_index(1, clients, backends)
    }

    /// Node number `index` (1 or 2) of a two-node cluster (see `join`).
    pub fn with_index(index: u8, clients: usize, backends: usize) -> Result<Self> {
        crate::require_root()?;
        anyhow::ensure!(index == 1 || index == 2, "node index is 1 or 2");
        let node = Netns::create(&format!("node{index}"))?;
        node.sysctl("net.ipv4.ip_forward", "1")?;
        node.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        let mut topo = Self {
            bpf: BpfRoot::create()?,
            cgroup: TestCgroup::create()?,
            clients: Vec::new(),
            backends: Vec::new(),
            externals: Vec::new(),
            node,
            index,
        };
        for _ in 0..clients {
            topo.add_client()?;
        }
        for _ in 0..backends {
            topo.add_backend()?;
        }
        Ok(topo)
    }

    pub fn add_client(&mut self) -> Result<&Pod> {
        let k = self.clients.len();
        let name = self.pod_name("client", k);
        let pod = self.add_pod(&name, &format!("c{k}"), (10, nets(self.index).0, 2), k)?;
        self.clients.push(pod);
        Ok(&self.clients[k])
    }

    pub fn add_backend(&mut self) -> Result<&Pod> {
        let k = self.backends.len();
        let name = self.pod_name("backend", k);
        let pod = self.add_pod(&name, &format!("b{k}"), (10, nets(self.index).1, 2), k)?;
        self.backends.push(pod);
        Ok(&self.backends[k])
    }

    /// A host outside the cluster on its own node device `e<k>`: it reaches
    /// the node at 192.168.<k+1>.1 (a NodePort address) and routes
    /// everything there, as a client on the node's LAN would.
    pub fn add_external(&mut self) -> Result<&Pod> {
        let host_if = format!("e{}", self.externals.len());
        self.add_external_on(&host_if)
    }

    /// `add_external` with the node's device named `host_if` (a name that
    /// sorts before the pods' devices, say, where the order matters).
    pub fn add_external_on(&mut self, host_if: &str) -> Result<&Pod> {
        let k = self.externals.len();
        let net = u8::try_from(k + 1).context("at most 255 external hosts")?;
        let name = format!("external-{k}");
        let pod = self.add_pod(&name, host_if, (192, 168, 100), net as usize)?;
        if crate::xdp_under_test().is_some() {
            pod.strict_checksums()?;
            pod.receive_xdp_frames()?;
        }
        self.externals.push(pod);
        Ok(&self.externals[k])
    }

    /// A pod behind bridge `bridge` of the node (created on first use, with
    /// the pods' gateway 10.30.0.1/24 on it), as bridge CNI plugins wire
    /// pods: its veth's node side `pv<k>` is a port of the bridge, and the
    /// pod is 10.30.0.<k+2>. Sluice attaches to the bridge when
    /// `--devices` matches its name. IPv4 only.
    pub fn add_bridged_pod(&mut self, bridge: &str, k: u8) -> Result<Pod> {
        if self.node.ip(&["link", "show", bridge]).is_err() {
            self.node.ip(&["link", "add", bridge, "type", "bridge"])?;
            self.node
                .ip(&["addr", "add", "10.30.0.1/24", "dev", bridge])?;
            self.node.ip(&["link", "set", bridge, "up"])?;
        }
        let name = format!("bridged-{k}");
        let host_if = format!("pv{k}");
        let ns = Netns::create(&name)?;
        let ip = Ipv4Addr::new(10, 30, 0, k + 2);
        self.node.ip(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ])?;
        self.node.ip(&["link", "set", &host_if, "master", bridge])?;
        self.node.ip(&["link", "set", &host_if, "up"])?;
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", "10.30.0.1"])?;
        Ok(Pod {
            name,
            ns,
            ip,
            ip6: v6_of(ip),
            host_if,
        })
    }

    /// The node's address on the device of external host `k`.
    pub fn node_address(&self, k: usize) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, (k + 1) as u8, 1)
    }

    /// The node's IPv6 address on the device of external host `k`.
    pub fn node_address6(&self, k: usize) -> Ipv6Addr {
        v6_of(Ipv4Addr::new(192, 168, (k + 1) as u8, 1))
    }

    fn pod_name(&self, kind: &str, k: usize) -> String {
        if self.index == 1 {
            format!("{kind}-{k}")
        } else {
            format!("node{}-{kind}-{k}", self.index)
        }
    }

    /// A pod (or external host) on network `a.b.k.0/24`: host `a.b.k.host`,
    /// node side `a.b.k.1`.
    fn add_pod(
        &self,
        name: &str,
        host_if: &str,
        (a, b, host): (u8, u8, u8),
        k: usize,
    ) -> Result<Pod> {
        let k = u8::try_from(k).context("at most 256 pods of a kind")?;
        let ns = Netns::create(name)?;
        let ip = Ipv4Addr::new(a, b, k, host);
        let gw = Ipv4Addr::new(a, b, k, 1);
        let (ip6, gw6) = (v6_of(ip), v6_of(gw));
        self.node.ip(&[
            "link",
            "add",
            host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ])?;
        self.node
            .ip(&["addr", "add", &format!("{gw}/24"), "dev", host_if])?;
        self.node.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{gw6}/64"),
            "dev",
            host_if,
            "nodad",
        ])?;
        self.node.ip(&["link", "set", host_if, "up"])?;
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{ip6}/64"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &gw.to_string()])?;
        ns.ip(&["-6", "route", "add", "default", "via", &gw6.to_string()])?;
        Ok(Pod {
            name: name.to_owned(),
            ns,
            ip,
            ip6,
            host_if: host_if.to_owned(),
        })
    }

    /// Every node-side device: the ones sluice attaches to.
    pub fn devices(&self) -> Vec<String> {
        let mut devices: Vec<String> = self
            .clients
            .iter()
            .chain(&self.backends)
            .chain(&self.externals)
            .map(|p| p.host_if.clone())
            .collect();
        if self.node.ip(&["link", "show", "u0"]).is_ok() {
            devices.push("u0".into());
        }
        devices
    }

    /// Joins two nodes with an underlay link `u0` (192.168.200.<index>/24)
    /// and routes each node's pod networks to the other.
    pub fn join(a: &Topology, b: &Topology) -> Result<()> {
        a.node.ip(&[
            "link",
            "add",
            "u0",
            "type",
            "veth",
            "peer",
            "name",
            "u0",
            "netns",
            b.node.name(),
        ])?;
        for (me, other) in [(a, b), (b, a)] {
            let mine = Ipv4Addr::new(192, 168, 200, me.index);
            me.node
                .ip(&["addr", "add", &format!("{mine}/24"), "dev", "u0"])?;
            me.node.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{}/64", v6_of(mine)),
                "dev",
                "u0",
                "nodad",
            ])?;
            me.node.ip(&["link", "set", "u0", "up"])?;
            let via = Ipv4Addr::new(192, 168, 200, other.index);
            let (clients, backends) = nets(other.index);
            for net in [clients, backends] {
                me.node.ip(&[
                    "route",
                    "add",
                    &format!("10.{net}.0.0/16"),
                    "via",
                    &via.to_string(),
                ])?;
                me.node.ip(&[
                    "-6",
                    "route",
                    "add",
                    &format!("fd00:{net}::/32"),
                    "via",
                    &v6_of(via).to_string(),
                ])?;
            }
        }
        for node in [a, b] {
            node.wait_ipv6_ready()?;
            if crate::xdp_under_test().is_some() {
                node.strict_checksums()?;
                receive_xdp_frames(&node.node, "u0")?;
            }
        }
        Ok(())
    }

    /// Waits until IPv6 is configured on every device of the topology,
    /// both ends of each veth. A veth's carrier comes up through the
    /// kernel's link watch, which may lag by a second; until then the
    /// device has no multicast route and drops its peer's neighbour
    /// solicitations. Its link-local address then runs duplicate address
    /// detection (~1-2 s), during which neighbour discovery from it stalls.
    /// Either way a fresh pod's first IPv6 connection took 1-2 s (measured
    /// without sluice loaded); IPv4's ARP waits for neither.
    pub fn wait_ipv6_ready(&self) -> Result<()> {
        for dev in self.devices() {
            wait_ipv6_ready(&self.node, &dev)?;
        }
        for pod in self
            .clients
            .iter()
            .chain(&self.backends)
            .chain(&self.externals)
        {
            wait_ipv6_ready(&pod.ns, "eth0")?;
        }
        Ok(())
    }

    /// A command for a process of the node itself: in the node's network
    /// namespace and in this topology's cgroup.
    pub fn host_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.cgroup_command(&self.node, program)
    }

    /// A command for a process in network namespace `ns` (a pod's) and in
    /// this topology's cgroup, which the agent's socket programs cover.
    pub fn cgroup_command(&self, ns: &Netns, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = ns.command(program);
        let procs = std::ffi::CString::new(
            self.cgroup
                .path()
                .join("cgroup.procs")
                .as_os_str()
                .as_encoded_bytes(),
        )
        .unwrap_or_default();
        // SAFETY: open/write/close are async-signal-safe; "0" moves the
        // calling (child) process.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        cmd
    }

    pub fn backend(&self, name: &str) -> Option<&Pod> {
        self.backends.iter().find(|p| p.name == name)
    }

    /// `Pod::strict_checksums` on every client, backend and external host.
    pub fn strict_checksums(&self) -> Result<()> {
        for pod in self
            .clients
            .iter()
            .chain(&self.backends)
            .chain(&self.externals)
        {
            pod.strict_checksums()?;
        }
        Ok(())
    }
}

impl Pod {
    /// Lets the pod's `eth0` receive frames that an XDP program on the
    /// node side sends with `XDP_TX` or redirects to that device: a veth
    /// drops them silently unless the receiving peer runs XDP or has GRO
    /// on (its NAPI then takes them). Turns GRO on.
    pub fn receive_xdp_frames(&self) -> Result<()> {
        receive_xdp_frames(&self.ns, "eth0")
    }

    /// Turns TX checksum offload off on the pod's `eth0`: its packets then
    /// carry full checksums (not `CHECKSUM_PARTIAL`, which a veth peer
    /// trusts unchecked) and whoever receives them verifies every one, so
    /// a wrong incremental update in the datapath shows as loss.
    pub fn strict_checksums(&self) -> Result<()> {
        run(self.ns.command("ethtool").args(["-K", "eth0", "tx", "off"]))?;
        Ok(())
    }

    /// The pod's address of one family.
    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.ip6)
        } else {
            IpAddr::V4(self.ip)
        }
    }
}

/// Lets veth `dev` in `ns` receive frames its peer's XDP program sends
/// with `XDP_TX` or redirects into the peer: GRO on (see
/// `Pod::receive_xdp_frames`).
pub fn receive_xdp_frames(ns: &Netns, dev: &str) -> Result<()> {
    run(ns.command("ethtool").args(["-K", dev, "gro", "on"]))?;
    Ok(())
}

/// Waits until IPv6 is configured on `dev`: its multicast route exists
/// and no address is tentative (see `Topology::wait_ipv6_ready`).
fn wait_ipv6_ready(ns: &Netns, dev: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let routes = ns.ip(&["-6", "route", "show", "table", "local", "dev", dev])?;
        let tentative = ns.ip(&["-6", "addr", "show", "dev", dev, "tentative"])?;
        if routes.contains("multicast ff00::/8") && tentative.trim().is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "IPv6 on {dev} in {} not configured after 10 s",
            ns.name()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The IPv6 twin of a topology address: `a.b.k.h` -> `fd00:b:k::h`, the
/// decimal digits written as hex digits so that they read the same.
pub fn v6_of(ip: Ipv4Addr) -> Ipv6Addr {
    let [_, b, k, h] = ip.octets();
    let hexlike = |d: u8| -> u16 {
        let d = u16::from(d);
        (d / 100) * 0x100 + ((d / 10) % 10) * 0x10 + d % 10
    };
    Ipv6Addr::new(0xfd00, hexlike(b), hexlike(k), 0, 0, 0, 0, hexlike(h))
}
