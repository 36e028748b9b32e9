//! Keeps the programs attached to every device that matches `--devices`:
//! attaches new ones, re-attaches a device recreated under the same name,
//! and detaches (removes the pins of) devices that vanished or no longer
//! match. This task touches links only, never the maps: with
//! interface-based local-traffic detection it tells the sync task which
//! devices are the pods' (`sl_localif`), before it attaches new ones.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    datapath::{attached_devices, detach_device, Datapath},
    metrics::Metrics,
    netdev,
    translate::LocalDetector,
};

pub struct Devices {
    datapath: Datapath,
    patterns: Vec<String>,
    /// Attached device name -> ifindex at attach time.
    attached: BTreeMap<String, u32>,
    failing: BTreeMap<String, String>,
    /// Interface-based local-traffic detection and where its devices go.
    local: Option<(LocalDetector, watch::Sender<BTreeSet<u32>>)>,
    links_failing: bool,
}

impl Devices {
    pub fn new(datapath: Datapath, patterns: Vec<String>) -> Self {
        Self {
            datapath,
            patterns,
            attached: BTreeMap::new(),
            failing: BTreeMap::new(),
            local: None,
            links_failing: false,
        }
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
        for (name, index) in &present {
            if !self.wanted(name) || self.attached.get(name) == Some(index) {
                continue;
            }
            match self.datapath.attach(name) {
                Ok(how) => {
                    info!(device = %name, ?how, "attached");
                    self.attached.insert(name.clone(), *index);
                    self.failing.remove(name);
                }
                Err(e) => {
                    let msg = e.to_string();
                    if self.failing.get(name) != Some(&msg) {
                        warn!(device = %name, error = %msg, "cannot attach");
                        self.failing.insert(name.clone(), msg);
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
