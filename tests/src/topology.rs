//! A node namespace with client and backend "pods" behind veth pairs.
//!
//! ```text
//!  client-k (10.10.k.2/24) eth0 ==veth== c<k> (10.10.k.1)  \
//!                                                            node (forwarding on,
//!  backend-k (10.20.k.2/24) eth0 ==veth== b<k> (10.20.k.1)  /   sluice on c*, b*)
//! ```
//! Every pod routes everything via the node, so traffic to a service VIP
//! (10.96.0.0/12) reaches the node's programs on the pod's host-side veth.

use std::{
    fs,
    net::Ipv4Addr,
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

pub struct Topology {
    // Field order is drop order: pins go before the namespaces.
    pub bpf: BpfRoot,
    pub clients: Vec<Pod>,
    pub backends: Vec<Pod>,
    pub node: Netns,
}

impl Topology {
    /// A node with `clients` client pods and `backends` backend pods.
    pub fn new(clients: usize, backends: usize) -> Result<Self> {
        crate::require_root()?;
        let node = Netns::create("node")?;
        node.sysctl("net.ipv4.ip_forward", "1")?;
        let mut topo = Self {
            bpf: BpfRoot::create()?,
            clients: Vec::new(),
            backends: Vec::new(),
            node,
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
        let pod = self.add_pod(&format!("client-{k}"), &format!("c{k}"), 10, k)?;
        self.clients.push(pod);
        Ok(&self.clients[k])
    }

    pub fn add_backend(&mut self) -> Result<&Pod> {
        let k = self.backends.len();
        let pod = self.add_pod(&format!("backend-{k}"), &format!("b{k}"), 20, k)?;
        self.backends.push(pod);
        Ok(&self.backends[k])
    }

    fn add_pod(&self, name: &str, host_if: &str, net: u8, k: usize) -> Result<Pod> {
        let k = u8::try_from(k).context("at most 256 pods of a kind")?;
        let ns = Netns::create(name)?;
        let ip = Ipv4Addr::new(10, net, k, 2);
        let gw = Ipv4Addr::new(10, net, k, 1);
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
        self.node.ip(&["link", "set", host_if, "up"])?;
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.ip(&["route", "add", "default", "via", &gw.to_string()])?;
        Ok(Pod {
            name: name.to_owned(),
            ns,
            ip,
            host_if: host_if.to_owned(),
        })
    }

    /// Every node-side device: the ones sluice attaches to.
    pub fn devices(&self) -> Vec<String> {
        self.clients
            .iter()
            .chain(&self.backends)
            .map(|p| p.host_if.clone())
            .collect()
    }

    pub fn backend(&self, name: &str) -> Option<&Pod> {
        self.backends.iter().find(|p| p.name == name)
    }
}
