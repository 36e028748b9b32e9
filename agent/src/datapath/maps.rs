//! Typed handles on the pinned maps, and reading their content back.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use aya::{
    maps::{lpm_trie::LpmTrie, Array, HashMap, Map, MapData, PerCpuArray},
    Ebpf,
};
use sluice_common::{
    maps as names, Affinity4Key, AffinityValue, Backend, Config, Ct4Key, CtEntry, SockEntry,
    SockRevKey, SockRevValue, SrcRange4, Stat, Svc4Key, SvcValue,
};

use super::DatapathError;
use crate::{
    model::{FrontendKey, Proto},
    state::{FrontendState, MapState},
};

/// The datapath maps. Held by exactly one `MapWriter` in the agent; the
/// inspection commands open their own read-only copy from the pins.
pub struct Maps {
    pub services_v4: HashMap<MapData, Svc4Key, SvcValue>,
    pub backends: HashMap<MapData, u32, Backend>,
    pub conntrack_v4: HashMap<MapData, Ct4Key, CtEntry>,
    pub stats: PerCpuArray<MapData, u64>,
    pub config: Array<MapData, Config>,
    pub affinity_v4: HashMap<MapData, Affinity4Key, AffinityValue>,
    pub source_ranges_v4: LpmTrie<MapData, SrcRange4, u8>,
    pub sockets_v4: HashMap<MapData, u64, SockEntry>,
    pub sock_rev_v4: HashMap<MapData, SockRevKey, SockRevValue>,
}

fn convert<T>(name: &'static str, map: Map) -> Result<T, DatapathError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(map).map_err(|source| DatapathError::Map { name, source })
}

impl Maps {
    /// Takes the maps out of a freshly loaded object.
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, DatapathError> {
        let mut take =
            |name: &'static str| ebpf.take_map(name).ok_or(DatapathError::MissingMap(name));
        Ok(Self {
            services_v4: convert(names::SERVICES_V4, take(names::SERVICES_V4)?)?,
            backends: convert(names::BACKENDS, take(names::BACKENDS)?)?,
            conntrack_v4: convert(names::CONNTRACK_V4, take(names::CONNTRACK_V4)?)?,
            stats: convert(names::STATS, take(names::STATS)?)?,
            config: convert(names::CONFIG, take(names::CONFIG)?)?,
            affinity_v4: convert(names::AFFINITY_V4, take(names::AFFINITY_V4)?)?,
            source_ranges_v4: convert(names::SOURCE_RANGES_V4, take(names::SOURCE_RANGES_V4)?)?,
            sockets_v4: convert(names::SOCKETS_V4, take(names::SOCKETS_V4)?)?,
            sock_rev_v4: convert(names::SOCK_REV_V4, take(names::SOCK_REV_V4)?)?,
        })
    }

    /// Opens the maps pinned under `root` (no program is loaded).
    pub fn open_pinned(root: &Path) -> Result<Self, DatapathError> {
        let open = |name: &'static str| -> Result<Map, DatapathError> {
            let data = MapData::from_pin(root.join(name))
                .map_err(|source| DatapathError::Map { name, source })?;
            Map::from_map_data(data).map_err(|source| DatapathError::Map { name, source })
        };
        Ok(Self {
            services_v4: convert(names::SERVICES_V4, open(names::SERVICES_V4)?)?,
            backends: convert(names::BACKENDS, open(names::BACKENDS)?)?,
            conntrack_v4: convert(names::CONNTRACK_V4, open(names::CONNTRACK_V4)?)?,
            stats: convert(names::STATS, open(names::STATS)?)?,
            config: convert(names::CONFIG, open(names::CONFIG)?)?,
            affinity_v4: convert(names::AFFINITY_V4, open(names::AFFINITY_V4)?)?,
            source_ranges_v4: convert(names::SOURCE_RANGES_V4, open(names::SOURCE_RANGES_V4)?)?,
            sockets_v4: convert(names::SOCKETS_V4, open(names::SOCKETS_V4)?)?,
            sock_rev_v4: convert(names::SOCK_REV_V4, open(names::SOCK_REV_V4)?)?,
        })
    }

    /// The sum over CPUs of one counter.
    pub fn stat(&self, stat: Stat) -> Result<u64, DatapathError> {
        let values = self
            .stats
            .get(&(stat as u32), 0)
            .map_err(|source| DatapathError::Map {
                name: names::STATS,
                source,
            })?;
        Ok(values.iter().sum())
    }

    /// The config entry (all zero before the agent first wrote it).
    pub fn config(&self) -> Result<Config, DatapathError> {
        self.config.get(&0, 0).map_err(|source| DatapathError::Map {
            name: names::CONFIG,
            source,
        })
    }
}

/// The frontend a `sl_svc4` key belongs to.
pub(crate) fn frontend_of(key: &Svc4Key) -> Option<FrontendKey> {
    Some(FrontendKey {
        addr: IpAddr::V4(Ipv4Addr::from(key.addr)),
        port: key.port,
        proto: Proto::from_number(key.proto)?,
    })
}

/// Reads the service and backend maps back into a `MapState`. Entries the
/// agent cannot interpret (unknown protocol) are returned separately so the
/// reconciler can delete them.
pub fn read_map_state(maps: &Maps) -> Result<(MapState, Vec<Svc4Key>), DatapathError> {
    let mut state = MapState::default();
    let mut foreign = Vec::new();
    for item in maps.services_v4.iter() {
        let (key, value) = item.map_err(|source| DatapathError::Map {
            name: names::SERVICES_V4,
            source,
        })?;
        let Some(frontend) = frontend_of(&key) else {
            foreign.push(key);
            continue;
        };
        let fe = state
            .frontends
            .entry(frontend)
            .or_insert_with(FrontendState::default);
        if key.slot == 0 {
            fe.svc_id = value.svc_id;
            fe.flags = value.flags;
            fe.active = value.active;
            fe.fallback = value.fallback;
            fe.affinity_s = value.affinity_s;
        } else {
            let i = usize::from(key.slot) - 1;
            if fe.slots.len() <= i {
                fe.slots.resize(i + 1, 0);
            }
            fe.slots[i] = value.backend_id;
        }
    }
    for item in maps.backends.iter() {
        let (id, backend) = item.map_err(|source| DatapathError::Map {
            name: names::BACKENDS,
            source,
        })?;
        state.backends.insert(id, backend);
    }
    for item in maps.source_ranges_v4.iter() {
        let (key, _) = item.map_err(|source| DatapathError::Map {
            name: names::SOURCE_RANGES_V4,
            source,
        })?;
        let data = key.data();
        let prefix = key.prefix_len().saturating_sub(32).min(32) as u8;
        state
            .source_ranges
            .entry(u32::from_be_bytes(data.svc_id))
            .or_default()
            .insert((data.addr, prefix));
    }
    Ok((state, foreign))
}
