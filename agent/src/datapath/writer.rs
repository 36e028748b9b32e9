//! The only code that writes the datapath maps.
//!
//! Every write keeps the datapath consistent at every instant, after
//! Cilium's `lb.h` discipline: a backend exists before any slot names it, a
//! slot exists before a master count covers it, surplus slots go only after
//! the master stopped covering them, and a backend goes only after no slot
//! names it (the reconciler orders whole frontends and backends that way).
//! IPv6 frontends go to `sl_svc6` under the same rules; both families name
//! backends in the one `sl_backends`.
//! Each call updates the caller's record of what is programmed write by
//! write, so the record stays exact even when a write fails half way.

use std::net::IpAddr;

use aya::maps::{lpm_trie::Key, MapError};
use sluice_common::{
    maps as names, Affinity4Key, Affinity6Key, Backend, Config, Ct4Key, Ct6Key, MaglevTable,
    SockRevKey, SrcRange4, SrcRange6, SvcValue,
};

use super::{maps::ServiceKey, Maps, WriteError};
use crate::{
    model::{Endpoint, FrontendKey},
    reconcile::maglev,
    state::{FrontendState, SourceRange},
};

pub struct MapWriter {
    maps: Maps,
    writes: u64,
}

fn is_missing(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound | MapError::ElementNotFound => true,
        MapError::SyscallError(sys) => sys.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

impl MapWriter {
    pub fn new(maps: Maps) -> Self {
        Self { maps, writes: 0 }
    }

    /// Successful updates and deletions so far.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Read access for the reconciler's conntrack scans.
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    pub fn write_config(&mut self, config: &Config) -> Result<(), WriteError> {
        self.maps
            .config
            .set(0, config, 0)
            .map_err(|e| WriteError::from_map(names::CONFIG, e))?;
        self.writes += 1;
        Ok(())
    }

    pub fn put_backend(&mut self, id: u32, backend: &Backend) -> Result<(), WriteError> {
        self.maps
            .backends
            .insert(id, backend, 0)
            .map_err(|e| WriteError::from_map(names::BACKENDS, e))?;
        self.writes += 1;
        Ok(())
    }

    /// Removes a backend; a missing one counts as removed.
    pub fn delete_backend(&mut self, id: u32) -> Result<(), WriteError> {
        let result = self.maps.backends.remove(&id);
        self.settle(names::BACKENDS, result)
    }

    /// Brings one frontend from `current` to `target`: changed slots first,
    /// then the master entry, then trims the slots it no longer covers.
    /// On failure `current` is marked unknown (`svc_id` 0) so the next call
    /// rewrites everything.
    pub fn sync_frontend(
        &mut self,
        frontend: &FrontendKey,
        current: &mut FrontendState,
        target: &FrontendState,
    ) -> Result<(), WriteError> {
        let result = self.sync_frontend_inner(frontend, current, target);
        if result.is_err() {
            current.svc_id = 0;
        }
        result
    }

    fn sync_frontend_inner(
        &mut self,
        frontend: &FrontendKey,
        current: &mut FrontendState,
        target: &FrontendState,
    ) -> Result<(), WriteError> {
        let owner_changed = current.svc_id != target.svc_id;
        for (i, &backend_id) in target.slots.iter().enumerate() {
            if !owner_changed && current.slots.get(i) == Some(&backend_id) {
                continue;
            }
            let value = SvcValue {
                svc_id: target.svc_id,
                backend_id,
                ..SvcValue::default()
            };
            self.put_service_entry(ServiceKey::of(frontend, slot_number(i)), &value)?;
            if current.slots.len() <= i {
                current.slots.resize(i + 1, 0);
            }
            current.slots[i] = backend_id;
        }
        // A table exists before a master entry that flags it.
        let table_changed = owner_changed || current.maglev != target.maglev;
        if table_changed && !target.maglev.is_empty() {
            self.put_maglev(frontend, &target.maglev)?;
            current.maglev = target.maglev.clone();
        }
        let master_changed = owner_changed
            || current.flags != target.flags
            || current.active != target.active
            || current.fallback != target.fallback
            || current.affinity_s != target.affinity_s
            || current.slots.len() != target.slots.len();
        if master_changed {
            let value = SvcValue {
                svc_id: target.svc_id,
                backend_id: 0,
                active: target.active,
                fallback: target.fallback,
                total: target.slots.len() as u16,
                flags: target.flags,
                affinity_s: target.affinity_s,
                _pad: 0,
            };
            self.put_service_entry(ServiceKey::of(frontend, 0), &value)?;
            current.svc_id = target.svc_id;
            current.flags = target.flags;
            current.active = target.active;
            current.fallback = target.fallback;
            current.affinity_s = target.affinity_s;
        }
        while current.slots.len() > target.slots.len() {
            let i = current.slots.len() - 1;
            if current.slots[i] != 0 {
                self.delete_service_entry(ServiceKey::of(frontend, slot_number(i)))?;
            }
            current.slots.pop();
        }
        // A table goes after the master entry stopped flagging it.
        if target.maglev.is_empty() && !current.maglev.is_empty() {
            self.delete_maglev(frontend)?;
            current.maglev.clear();
        }
        Ok(())
    }

    /// Removes a frontend: the master first (new flows stop matching), then
    /// its slots. `current` shrinks as entries go.
    pub fn delete_frontend(
        &mut self,
        frontend: &FrontendKey,
        current: &mut FrontendState,
    ) -> Result<(), WriteError> {
        self.delete_service_entry(ServiceKey::of(frontend, 0))?;
        current.svc_id = 0;
        if !current.maglev.is_empty() {
            self.delete_maglev(frontend)?;
            current.maglev.clear();
        }
        while let Some(&id) = current.slots.last() {
            if id != 0 {
                let slot = slot_number(current.slots.len() - 1);
                self.delete_service_entry(ServiceKey::of(frontend, slot))?;
            }
            current.slots.pop();
        }
        Ok(())
    }

    /// Writes the Maglev table of `frontend` over `members`.
    fn put_maglev(
        &mut self,
        frontend: &FrontendKey,
        members: &[(u32, Endpoint)],
    ) -> Result<(), WriteError> {
        let mut table = Box::<MaglevTable>::default();
        for (slot, id) in table.backends.iter_mut().zip(maglev::populate(members)) {
            *slot = id;
        }
        let (map, result) = match ServiceKey::of(frontend, 0) {
            ServiceKey::V4(k) => (
                names::MAGLEV_V4,
                self.maps.maglev_v4.insert(k, table.as_ref(), 0),
            ),
            ServiceKey::V6(k) => (
                names::MAGLEV_V6,
                self.maps.maglev_v6.insert(k, table.as_ref(), 0),
            ),
        };
        result.map_err(|e| WriteError::from_map(map, e))?;
        self.writes += 1;
        Ok(())
    }

    /// Removes the Maglev table of `frontend`; a missing one counts as
    /// removed.
    fn delete_maglev(&mut self, frontend: &FrontendKey) -> Result<(), WriteError> {
        match ServiceKey::of(frontend, 0) {
            ServiceKey::V4(k) => {
                let result = self.maps.maglev_v4.remove(&k);
                self.settle(names::MAGLEV_V4, result)
            }
            ServiceKey::V6(k) => {
                let result = self.maps.maglev_v6.remove(&k);
                self.settle(names::MAGLEV_V6, result)
            }
        }
    }

    /// Writes one service-map entry into its family's map.
    fn put_service_entry(&mut self, key: ServiceKey, value: &SvcValue) -> Result<(), WriteError> {
        let (map, result) = match key {
            ServiceKey::V4(k) => (
                names::SERVICES_V4,
                self.maps.services_v4.insert(k, value, 0),
            ),
            ServiceKey::V6(k) => (
                names::SERVICES_V6,
                self.maps.services_v6.insert(k, value, 0),
            ),
        };
        result.map_err(|e| WriteError::from_map(map, e))?;
        self.writes += 1;
        Ok(())
    }

    /// Removes a raw service-map entry (also used for entries the agent
    /// cannot interpret).
    pub fn delete_service_entry(&mut self, key: ServiceKey) -> Result<(), WriteError> {
        match key {
            ServiceKey::V4(k) => {
                let result = self.maps.services_v4.remove(&k);
                self.settle(names::SERVICES_V4, result)
            }
            ServiceKey::V6(k) => {
                let result = self.maps.services_v6.remove(&k);
                self.settle(names::SERVICES_V6, result)
            }
        }
    }

    /// Adds a loadBalancerSourceRanges entry of service port `svc_id`.
    pub fn put_source_range(&mut self, svc_id: u32, range: SourceRange) -> Result<(), WriteError> {
        match range.0 {
            IpAddr::V4(a) => {
                let key = Key::new(
                    SrcRange4::prefix_len(range.1),
                    SrcRange4::new(svc_id, a.octets()),
                );
                self.maps
                    .source_ranges_v4
                    .insert(&key, 1, 0)
                    .map_err(|e| WriteError::from_map(names::SOURCE_RANGES_V4, e))?;
            }
            IpAddr::V6(a) => {
                let key = Key::new(
                    SrcRange6::prefix_len(range.1),
                    SrcRange6::new(svc_id, a.octets()),
                );
                self.maps
                    .source_ranges_v6
                    .insert(&key, 1, 0)
                    .map_err(|e| WriteError::from_map(names::SOURCE_RANGES_V6, e))?;
            }
        }
        self.writes += 1;
        Ok(())
    }

    pub fn delete_source_range(
        &mut self,
        svc_id: u32,
        range: SourceRange,
    ) -> Result<(), WriteError> {
        match range.0 {
            IpAddr::V4(a) => {
                let key = Key::new(
                    SrcRange4::prefix_len(range.1),
                    SrcRange4::new(svc_id, a.octets()),
                );
                let result = self.maps.source_ranges_v4.remove(&key);
                self.settle(names::SOURCE_RANGES_V4, result)
            }
            IpAddr::V6(a) => {
                let key = Key::new(
                    SrcRange6::prefix_len(range.1),
                    SrcRange6::new(svc_id, a.octets()),
                );
                let result = self.maps.source_ranges_v6.remove(&key);
                self.settle(names::SOURCE_RANGES_V6, result)
            }
        }
    }

    /// Adds a network of the cluster's own sources (local-traffic
    /// detection).
    pub fn put_local_source(&mut self, net: SourceRange) -> Result<(), WriteError> {
        match net.0 {
            IpAddr::V4(a) => self
                .maps
                .local_v4
                .insert(&Key::new(u32::from(net.1), a.octets()), 1, 0)
                .map_err(|e| WriteError::from_map(names::LOCAL_V4, e))?,
            IpAddr::V6(a) => self
                .maps
                .local_v6
                .insert(&Key::new(u32::from(net.1), a.octets()), 1, 0)
                .map_err(|e| WriteError::from_map(names::LOCAL_V6, e))?,
        }
        self.writes += 1;
        Ok(())
    }

    /// Removes a network of the cluster's own sources; a missing one counts
    /// as removed.
    pub fn delete_local_source(&mut self, net: SourceRange) -> Result<(), WriteError> {
        match net.0 {
            IpAddr::V4(a) => {
                let result = self
                    .maps
                    .local_v4
                    .remove(&Key::new(u32::from(net.1), a.octets()));
                self.settle(names::LOCAL_V4, result)
            }
            IpAddr::V6(a) => {
                let result = self
                    .maps
                    .local_v6
                    .remove(&Key::new(u32::from(net.1), a.octets()));
                self.settle(names::LOCAL_V6, result)
            }
        }
    }

    /// Marks device `ifindex` as a pod's (interface-based local-traffic
    /// detection).
    pub fn put_local_iface(&mut self, ifindex: u32) -> Result<(), WriteError> {
        self.maps
            .local_ifs
            .insert(ifindex, 1, 0)
            .map_err(|e| WriteError::from_map(names::LOCAL_IFS, e))?;
        self.writes += 1;
        Ok(())
    }

    /// Writes what the service address space says of `net` (`SVCNET_*`:
    /// a service CIDR, or a cluster IP as a host route).
    pub fn put_service_net(&mut self, net: SourceRange, kind: u8) -> Result<(), WriteError> {
        match net.0 {
            IpAddr::V4(a) => self
                .maps
                .svcnet_v4
                .insert(&Key::new(u32::from(net.1), a.octets()), kind, 0)
                .map_err(|e| WriteError::from_map(names::SVCNET_V4, e))?,
            IpAddr::V6(a) => self
                .maps
                .svcnet_v6
                .insert(&Key::new(u32::from(net.1), a.octets()), kind, 0)
                .map_err(|e| WriteError::from_map(names::SVCNET_V6, e))?,
        }
        self.writes += 1;
        Ok(())
    }

    /// Unmarks device `ifindex`; a missing one counts as removed.
    pub fn delete_local_iface(&mut self, ifindex: u32) -> Result<(), WriteError> {
        let result = self.maps.local_ifs.remove(&ifindex);
        self.settle(names::LOCAL_IFS, result)
    }

    /// Removes an entry of the service address space; a missing one counts
    /// as removed.
    pub fn delete_service_net(&mut self, net: SourceRange) -> Result<(), WriteError> {
        match net.0 {
            IpAddr::V4(a) => {
                let result = self
                    .maps
                    .svcnet_v4
                    .remove(&Key::new(u32::from(net.1), a.octets()));
                self.settle(names::SVCNET_V4, result)
            }
            IpAddr::V6(a) => {
                let result = self
                    .maps
                    .svcnet_v6
                    .remove(&Key::new(u32::from(net.1), a.octets()));
                self.settle(names::SVCNET_V6, result)
            }
        }
    }

    /// Removes a session affinity entry; a missing one counts as removed.
    pub fn delete_affinity(&mut self, key: &Affinity4Key) -> Result<(), WriteError> {
        let result = self.maps.affinity_v4.remove(key);
        self.settle(names::AFFINITY_V4, result)
    }

    /// Removes an IPv6 session affinity entry; a missing one counts as
    /// removed.
    pub fn delete_affinity6(&mut self, key: &Affinity6Key) -> Result<(), WriteError> {
        let result = self.maps.affinity_v6.remove(key);
        self.settle(names::AFFINITY_V6, result)
    }

    /// Removes a socket-level entry of the node's own sockets.
    pub fn delete_socket(&mut self, cookie: u64) -> Result<(), WriteError> {
        let result = self.maps.sockets.remove(&cookie);
        self.settle(names::SOCKETS, result)
    }

    pub fn delete_sock_rev(&mut self, key: &SockRevKey) -> Result<(), WriteError> {
        let result = self.maps.sock_rev.remove(key);
        self.settle(names::SOCK_REV, result)
    }

    /// Removes an IPv4 conntrack entry; a missing one counts as removed.
    pub fn delete_conntrack(&mut self, key: &Ct4Key) -> Result<(), WriteError> {
        let result = self.maps.conntrack_v4.remove(key);
        self.settle(names::CONNTRACK_V4, result)
    }

    /// Removes an IPv6 conntrack entry; a missing one counts as removed.
    pub fn delete_conntrack6(&mut self, key: &Ct6Key) -> Result<(), WriteError> {
        let result = self.maps.conntrack_v6.remove(key);
        self.settle(names::CONNTRACK_V6, result)
    }
}

impl MapWriter {
    /// A deletion that found nothing to delete is fine (and not a write).
    fn settle(
        &mut self,
        map: &'static str,
        result: Result<(), MapError>,
    ) -> Result<(), WriteError> {
        match result {
            Ok(()) => {
                self.writes += 1;
                Ok(())
            }
            Err(e) if is_missing(&e) => Ok(()),
            Err(e) => Err(WriteError::from_map(map, e)),
        }
    }
}

/// Slot number of slot index `i` (slot 0 is the master).
fn slot_number(i: usize) -> u16 {
    (i + 1) as u16
}
