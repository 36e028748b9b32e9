//! Keeps the programs attached to every device that matches `--devices`:
//! attaches new ones, re-attaches a device recreated under the same name,
//! and detaches (removes the pins of) devices that vanished or no longer
//! match. This task touches links only, never the maps: with
//! interface-based local-traffic detection it tells the sync task which
//! devices are the pods' (`sl_localif`), before it attaches new ones.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    datapath::{
        attached_devices, detach_device, detach_xdp, xdp_devices, Datapath, Facing, XdpMode,
    },
    metrics::{Metrics, ModeLabel},
    netdev,
    translate::LocalDetector,
};

pub struct Devices {
    datapath: Datapath,
    patterns: Vec<String>,
    /// The pods' devices (`--pod-devices`, or those of interface-based
    /// local-traffic detection): swapped first in an upgrade.
    pod_patterns: Vec<String>,
    /// Whether the pods' devices' egress runs `sl_egress_pod` (only when
    /// the socket programs serve every pod); otherwise `sl_egress`.
    pod_egress: bool,
    /// The pods' devices host routing takes packets from and hands them
    /// to (`--host-routing`; empty without it).
    peer_patterns: Vec<String>,
    /// Devices host routing cannot use (not veth or netkit), reported once.
    not_peers: BTreeSet<String>,
    /// Attached device name -> ifindex at attach time.
    attached: BTreeMap<String, u32>,
    failing: BTreeMap<String, String>,
    /// Interface-based local-traffic detection and where its devices go.
    local: Option<(LocalDetector, watch::Sender<BTreeSet<u32>>)>,
    links_failing: bool,
    xdp: Option<Xdp>,
}

/// Where `sl_xdp` runs (`--xdp-mode`, `--xdp-devices`).
pub struct Xdp {
    pub mode: XdpMode,
    /// Device globs; empty: the devices holding one of `node_addrs`.
    pub patterns: Vec<String>,
    /// This node's addresses, from the sync task (empty until the first
    /// translation: before it, only links a previous agent pinned are
    /// swapped to this agent's program, see `Devices::scan_xdp`).
    pub node_addrs: watch::Receiver<Vec<IpAddr>>,
    pub metrics: Arc<Metrics>,
    /// Device name -> ifindex, XDP attached by this agent.
    attached: BTreeMap<String, u32>,
    /// Device name -> ifindex whose XDP attach failed (not retried until
    /// the device is recreated).
    failed: BTreeMap<String, u32>,
    /// veths left out of the default device choice (logged once each).
    skipped: BTreeSet<String>,
}

impl Xdp {
    pub fn new(
        mode: XdpMode,
        patterns: Vec<String>,
        node_addrs: watch::Receiver<Vec<IpAddr>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            mode,
            patterns,
            node_addrs,
            metrics,
            attached: BTreeMap::new(),
            failed: BTreeMap::new(),
            skipped: BTreeSet::new(),
        }
    }

    /// Sets `sluice_xdp_devices{mode}` to the devices running `sl_xdp`.
    fn publish_count(&self) {
        self.metrics
            .xdp_devices
            .get_or_create(&ModeLabel {
                mode: self.mode.as_str().to_owned(),
            })
            .set(self.attached.len() as i64);
    }

    /// The devices (among `tc`, the TC-attached ones) that should run XDP,
    /// or `None` when that is not known yet.
    ///
    /// The default choice leaves veths out: a veth drops the frames XDP
    /// sends into it unless its peer runs XDP or has GRO on, and XDP sees
    /// no checksum state, so a peer sending with TX checksum offload gets
    /// its TCP/UDP checksums broken. A veth named in `--xdp-devices` gets
    /// XDP (its peers set up for it).
    fn wanted(&mut self, tc: &BTreeMap<String, u32>) -> Option<BTreeSet<String>> {
        if self.mode == XdpMode::Off {
            return Some(BTreeSet::new());
        }
        if !self.patterns.is_empty() {
            return Some(
                tc.keys()
                    .filter(|n| self.patterns.iter().any(|p| netdev::glob(p, n)))
                    .cloned()
                    .collect(),
            );
        }
        let addrs = self.node_addrs.borrow().clone();
        if addrs.is_empty() {
            return None;
        }
        let mut out = BTreeSet::new();
        for (name, addr) in netdev::device_addresses() {
            if !tc.contains_key(&name) || !addrs.contains(&addr) || out.contains(&name) {
                continue;
            }
            if netdev::driver(&name).as_deref() == Some("veth") {
                if self.skipped.insert(name.clone()) {
                    info!(device = %name, "XDP: a veth holding a node address is left to TC unless named in --xdp-devices (its peer must run XDP or GRO and send without TX checksum offload)");
                }
                continue;
            }
            out.insert(name);
        }
        Some(out)
    }
}

impl Devices {
    pub fn new(datapath: Datapath, patterns: Vec<String>) -> Self {
        Self {
            datapath,
            patterns,
            pod_patterns: Vec::new(),
            pod_egress: false,
            peer_patterns: Vec::new(),
            not_peers: BTreeSet::new(),
            attached: BTreeMap::new(),
            failing: BTreeMap::new(),
            local: None,
            links_failing: false,
            xdp: None,
        }
    }

    /// The devices `patterns` match are the pods' (`--pod-devices`): a
    /// scan attaches (an upgrade swaps) them before the others, and with
    /// `egress` their egress runs `sl_egress_pod`.
    pub fn with_pod_devices(mut self, patterns: Vec<String>, egress: bool) -> Self {
        self.pod_patterns = patterns;
        self.pod_egress = egress;
        self
    }

    /// Enters the devices `patterns` match, as they are attached, in the
    /// programs' `sl_peer_devs` (`--host-routing`).
    pub fn with_host_routing(mut self, patterns: Vec<String>) -> Self {
        self.peer_patterns = patterns;
        self
    }

    /// Lets host routing use `name` if it is one of the pods' devices. A
    /// failure is reported, not fatal: packets then take the node's stack.
    fn route_into(&mut self, name: &str) {
        if !self.peer_patterns.iter().any(|p| netdev::glob(p, name)) {
            return;
        }
        match self.datapath.route_into(name) {
            Ok(true) => {
                self.not_peers.remove(name);
            }
            Ok(false) => {
                if self.not_peers.insert(name.to_owned()) {
                    warn!(device = %name, "not a veth or netkit device: host routing leaves its packets to the node's stack");
                }
            }
            Err(e) => warn!(device = %name, error = %e, "cannot enter the device for host routing"),
        }
    }

    /// Whether `name` is one of the pods' devices by `--pod-devices` (or
    /// the detection's pattern): the devices `sl_egress_pod` may run on.
    fn is_pods(&self, name: &str) -> bool {
        self.pod_patterns.iter().any(|p| netdev::glob(p, name))
    }

    /// Whether device `index` faces pods, for the swap order: `is_pods`,
    /// or one of the devices interface-based local-traffic detection
    /// found (a pod bridge's ports too, where a backend's replies first
    /// meet `sl_ingress` when `--devices` takes them).
    fn swaps_as_pods(&self, name: &str, index: u32) -> bool {
        self.is_pods(name)
            || self
                .local
                .as_ref()
                .is_some_and(|(_, found)| found.borrow().contains(&index))
    }

    /// What `name` faces, for the program at its egress.
    fn facing(&self, pods: bool) -> Facing {
        if pods && self.pod_egress {
            Facing::Pods
        } else {
            Facing::Any
        }
    }

    /// Runs `sl_xdp` where `xdp` says.
    pub fn with_xdp(mut self, xdp: Xdp) -> Self {
        self.xdp = Some(xdp);
        self
    }

    /// Attaches `sl_xdp` to the wanted devices that lack it, detaches it
    /// from the others (their pins, also those a previous agent left).
    fn scan_xdp(&mut self) {
        let Some(xdp) = &mut self.xdp else {
            return;
        };
        let root = self.datapath.root().to_owned();
        let Some(wanted) = xdp.wanted(&self.attached) else {
            // Not known yet (the node's addresses come with the first
            // translation, after the first scan). An upgrade's migration
            // ends after the first scan, so no previous agent's `sl_xdp`
            // may stay on the old maps: the links it pinned get this
            // generation's program, or go (TC, which runs this
            // generation, takes the device's packets) where that fails or
            // where this agent does not run TC. The next scan that knows
            // keeps or detaches them as usual.
            for name in xdp_devices(&root) {
                if xdp.attached.contains_key(&name) || xdp.failed.contains_key(&name) {
                    continue;
                }
                let Some(&index) = self.attached.get(&name) else {
                    info!(device = %name, "XDP detached: not a device this agent runs TC on");
                    detach_xdp_logged(&root, &name);
                    continue;
                };
                match self.datapath.attach_xdp(&name, xdp.mode) {
                    Ok(how) => {
                        info!(device = %name, ?how, "XDP runs this agent's program (its link was pinned before), ahead of knowing the node's addresses");
                        xdp.attached.insert(name, index);
                    }
                    Err(e) => {
                        warn!(device = %name, error = %e, "cannot swap this agent's program into the pinned XDP link: detached, the device stays on TC only");
                        xdp.metrics.xdp_attach_failures.inc();
                        xdp.failed.insert(name.clone(), index);
                        detach_xdp_logged(&root, &name);
                    }
                }
            }
            xdp.publish_count();
            return;
        };
        xdp.attached.retain(|n, i| self.attached.get(n) == Some(i));
        xdp.failed.retain(|n, i| self.attached.get(n) == Some(i));
        for name in &wanted {
            let index = self.attached[name];
            if xdp.attached.contains_key(name) || xdp.failed.contains_key(name) {
                continue;
            }
            match self.datapath.attach_xdp(name, xdp.mode) {
                Ok(how) => {
                    info!(device = %name, mode = xdp.mode.as_str(), ?how, "XDP attached: north-south traffic balanced at the driver");
                    xdp.attached.insert(name.clone(), index);
                }
                Err(e) => {
                    warn!(device = %name, mode = xdp.mode.as_str(), error = %e, "cannot attach XDP: the device stays on TC only");
                    xdp.metrics.xdp_attach_failures.inc();
                    xdp.failed.insert(name.clone(), index);
                }
            }
        }
        for name in xdp_devices(&root) {
            if !wanted.contains(&name) || !xdp.attached.contains_key(&name) {
                info!(device = %name, "XDP detached");
                xdp.attached.remove(&name);
                detach_xdp_logged(&root, &name);
            }
        }
        xdp.publish_count();
    }

    /// Publishes the pods' devices by `detector` to `tx` on every scan.
    pub fn with_local_interfaces(
        mut self,
        detector: LocalDetector,
        tx: watch::Sender<BTreeSet<u32>>,
    ) -> Self {
        self.local = Some((detector, tx));
        self
    }

    /// Sends the pods' devices to the sync task (when they changed).
    fn publish_local_interfaces(&mut self) {
        let Some((detector, tx)) = &self.local else {
            return;
        };
        match netdev::links() {
            Ok(links) => {
                self.links_failing = false;
                let found = detector.interfaces(&links);
                tx.send_if_modified(|current| {
                    let modified = *current != found;
                    if modified {
                        info!(devices = ?found, "pods' devices for local-traffic detection");
                        *current = found;
                    }
                    modified
                });
            }
            Err(e) => {
                // Keep what was published: a failed listing is no reason
                // to take pods for outside clients.
                if !self.links_failing {
                    warn!(error = %e, "cannot list devices for local-traffic detection");
                    self.links_failing = true;
                }
            }
        }
    }

    /// The loaded datapath.
    pub fn datapath_mut(&mut self) -> &mut Datapath {
        &mut self.datapath
    }

    fn wanted(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| netdev::glob(p, name))
    }

    /// One pass; returns the number of attached devices.
    pub fn scan(&mut self) -> usize {
        // Before attaching: a new pod's device is known as a pod's by the
        // time its packets meet the programs (the sync task writes it).
        self.publish_local_interfaces();
        let present: BTreeMap<String, u32> = netdev::devices().into_iter().collect();
        let order = swap_order(
            present
                .iter()
                .map(|(n, &index)| (n.as_str(), self.swaps_as_pods(n, index))),
        );
        for name in order {
            let facing = self.facing(self.is_pods(name));
            let Some(index) = present.get(name) else {
                continue;
            };
            if !self.wanted(name) || self.attached.get(name) == Some(index) {
                continue;
            }
            match self.datapath.attach_facing(name, facing) {
                Ok(how) => {
                    info!(device = %name, ?how, ?facing, "attached");
                    self.attached.insert(name.to_owned(), *index);
                    self.failing.remove(name);
                    self.route_into(name);
                }
                Err(e) => {
                    let msg = e.to_string();
                    if self.failing.get(name) != Some(&msg) {
                        warn!(device = %name, error = %msg, "cannot attach");
                        self.failing.insert(name.to_owned(), msg);
                    }
                }
            }
        }
        let root = self.datapath.root().to_owned();
        let gone: Vec<String> = self
            .attached
            .keys()
            .filter(|n| !present.contains_key(*n) || !self.wanted(n))
            .cloned()
            .collect();
        for name in gone {
            self.attached.remove(&name);
            info!(device = %name, "device gone, detaching");
            if let Err(e) = detach_device(&root, &name) {
                warn!(device = %name, error = %e, "cannot remove link pins");
            }
        }
        for name in attached_devices(&root) {
            let keep = self.attached.contains_key(&name)
                || (present.contains_key(&name) && self.wanted(&name));
            if !keep {
                info!(device = %name, "removing stale link pins");
                if let Err(e) = detach_device(&root, &name) {
                    warn!(device = %name, error = %e, "cannot remove link pins");
                }
            }
        }
        self.failing.retain(|n, _| present.contains_key(n));
        self.scan_xdp();
        self.attached.len()
    }

    pub async fn run(
        mut self,
        interval: Duration,
        metrics: Arc<Metrics>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let n = self.scan();
            metrics.devices.set(n as i64);
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Removes `device`'s XDP link pin; a failure is logged, not fatal.
fn detach_xdp_logged(root: &std::path::Path, device: &str) {
    if let Err(e) = detach_xdp(root, device) {
        warn!(device = %device, error = %e, "cannot detach XDP");
    }
}

/// The order a scan attaches (or, after an upgrade, swaps) devices in:
/// the pods' devices first, then the others, each by name. During an
/// upgrade's swap the uplinks' ingress programs then keep creating the
/// flows of outside clients with the old generation until every pod's
/// device runs the new one, so that an SNATed flow's first reply, turned
/// back on the backend pod's device, always meets a program whose
/// conntrack has the flow or whose handover has (docs/install.md).
/// Each device comes with whether it is a pod's (whatever program its
/// egress runs).
pub fn swap_order<'a>(devices: impl Iterator<Item = (&'a str, bool)>) -> Vec<&'a str> {
    let mut order: Vec<(&str, bool)> = devices.collect();
    order.sort_by_key(|&(name, pods)| (!pods, name));
    order.into_iter().map(|(name, _)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_devices_are_swapped_before_the_uplinks() {
        let devices = [
            ("eth0", false),
            ("lxc2", true),
            ("cni0", false),
            ("lxc1", true),
        ];
        assert_eq!(
            swap_order(devices.into_iter()),
            ["lxc1", "lxc2", "cni0", "eth0"]
        );
    }
}
