//! Keeps the programs attached to every device that matches `--devices`:
//! attaches new ones, re-attaches a device recreated under the same name,
//! and detaches (removes the pins of) devices that vanished or no longer
//! match. This task touches links only, never the maps.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    datapath::{attached_devices, detach_device, Datapath},
    metrics::Metrics,
    netdev,
};

pub struct Devices {
    datapath: Datapath,
    patterns: Vec<String>,
    /// Attached device name -> ifindex at attach time.
    attached: BTreeMap<String, u32>,
    failing: BTreeMap<String, String>,
}

impl Devices {
    pub fn new(datapath: Datapath, patterns: Vec<String>) -> Self {
        Self {
            datapath,
            patterns,
            attached: BTreeMap::new(),
            failing: BTreeMap::new(),
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
