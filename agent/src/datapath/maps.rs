//! Typed handles on the pinned maps, and reading their content back.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::{
    maps::{lpm_trie::LpmTrie, Array, HashMap, Map, MapData, PerCpuArray},
    Ebpf,
};
use sluice_common::{
    maps as names, maps::SOCK_MARK_SLOTS, Affinity4Key, Affinity6Key, AffinityValue, Backend,
    Config, Ct4Key, Ct6Key, CtEntry, MaglevTable, SockEntry, SockPicks4, SockPicks6, SockRevKey,
    SockRevValue, SrcRange4, SrcRange6, Stat, Svc4Key, Svc6Key, SvcValue, SvcnetSummary4,
};

use super::{socktab::SockTable, writer::PicksEntry, DatapathError};
use crate::{
    model::{Endpoint, FrontendKey, Proto, Scope},
    reconcile::{BackendId, MapState, SvcId},
};

/// The datapath maps. Held by exactly one `MapWriter` in the agent; the
/// inspection commands open their own read-only copy from the pins.
pub struct Maps {
    pub services_v4: HashMap<MapData, Svc4Key, SvcValue>,
    pub backends: HashMap<MapData, u32, Backend>,
    pub conntrack_v4: HashMap<MapData, Ct4Key, CtEntry>,
    pub services_v6: HashMap<MapData, Svc6Key, SvcValue>,
    pub conntrack_v6: HashMap<MapData, Ct6Key, CtEntry>,
    pub stats: PerCpuArray<MapData, u64>,
    pub stats2: PerCpuArray<MapData, u64>,
    pub config: Array<MapData, Config>,
    pub affinity_v4: HashMap<MapData, Affinity4Key, AffinityValue>,
    pub source_ranges_v4: LpmTrie<MapData, SrcRange4, u8>,
    pub sockets: HashMap<MapData, u64, SockEntry>,
    pub sock_rev: HashMap<MapData, SockRevKey, SockRevValue>,
    pub affinity_v6: HashMap<MapData, Affinity6Key, AffinityValue>,
    pub source_ranges_v6: LpmTrie<MapData, SrcRange6, u8>,
    pub maglev_v4: HashMap<MapData, Svc4Key, MaglevTable>,
    pub maglev_v6: HashMap<MapData, Svc6Key, MaglevTable>,
    pub sock_picks_v4: HashMap<MapData, Svc4Key, SockPicks4>,
    pub sock_picks_v6: HashMap<MapData, Svc6Key, SockPicks6>,
    pub local_v4: LpmTrie<MapData, [u8; 4], u8>,
    pub local_v6: LpmTrie<MapData, [u8; 16], u8>,
    pub local_ifs: HashMap<MapData, u32, u8>,
    pub svcnet_v4: LpmTrie<MapData, [u8; 4], u8>,
    pub svcnet_v6: LpmTrie<MapData, [u8; 16], u8>,
    pub svcnet_summary_v4: Array<MapData, SvcnetSummary4>,
    pub sock_marks: Array<MapData, u64>,
    /// `sl_socktab`, mapped (for writing in a writer's maps only).
    pub sock_table: SockTable,
    /// The loaded programs' filters (`sluice_common::filter`): not pinned,
    /// so only a writer over freshly loaded programs has them.
    pub filters: Option<FilterMaps>,
}

/// One program generation's `sl_fe_filter` and `sl_port_filter`.
pub struct FilterMaps {
    pub frontends: Array<MapData, u64>,
    pub ports: Array<MapData, u64>,
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
            services_v6: convert(names::SERVICES_V6, take(names::SERVICES_V6)?)?,
            conntrack_v6: convert(names::CONNTRACK_V6, take(names::CONNTRACK_V6)?)?,
            stats: convert(names::STATS, take(names::STATS)?)?,
            stats2: convert(names::STATS2, take(names::STATS2)?)?,
            config: convert(names::CONFIG, take(names::CONFIG)?)?,
            affinity_v4: convert(names::AFFINITY_V4, take(names::AFFINITY_V4)?)?,
            source_ranges_v4: convert(names::SOURCE_RANGES_V4, take(names::SOURCE_RANGES_V4)?)?,
            sockets: convert(names::SOCKETS, take(names::SOCKETS)?)?,
            sock_rev: convert(names::SOCK_REV, take(names::SOCK_REV)?)?,
            affinity_v6: convert(names::AFFINITY_V6, take(names::AFFINITY_V6)?)?,
            source_ranges_v6: convert(names::SOURCE_RANGES_V6, take(names::SOURCE_RANGES_V6)?)?,
            maglev_v4: convert(names::MAGLEV_V4, take(names::MAGLEV_V4)?)?,
            maglev_v6: convert(names::MAGLEV_V6, take(names::MAGLEV_V6)?)?,
            sock_picks_v4: convert(names::SOCK_PICKS_V4, take(names::SOCK_PICKS_V4)?)?,
            sock_picks_v6: convert(names::SOCK_PICKS_V6, take(names::SOCK_PICKS_V6)?)?,
            local_v4: convert(names::LOCAL_V4, take(names::LOCAL_V4)?)?,
            local_v6: convert(names::LOCAL_V6, take(names::LOCAL_V6)?)?,
            local_ifs: convert(names::LOCAL_IFS, take(names::LOCAL_IFS)?)?,
            svcnet_v4: convert(names::SVCNET_V4, take(names::SVCNET_V4)?)?,
            svcnet_v6: convert(names::SVCNET_V6, take(names::SVCNET_V6)?)?,
            svcnet_summary_v4: convert(names::SVCNET_SUMMARY_V4, take(names::SVCNET_SUMMARY_V4)?)?,
            sock_marks: convert(names::SOCK_MARKS, take(names::SOCK_MARKS)?)?,
            sock_table: SockTable::new(take(names::SOCK_TABLE)?, true)?,
            filters: Some(FilterMaps {
                frontends: convert(names::FE_FILTER, take(names::FE_FILTER)?)?,
                ports: convert(names::PORT_FILTER, take(names::PORT_FILTER)?)?,
            }),
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
            services_v6: convert(names::SERVICES_V6, open(names::SERVICES_V6)?)?,
            conntrack_v6: convert(names::CONNTRACK_V6, open(names::CONNTRACK_V6)?)?,
            stats: convert(names::STATS, open(names::STATS)?)?,
            stats2: convert(names::STATS2, open(names::STATS2)?)?,
            config: convert(names::CONFIG, open(names::CONFIG)?)?,
            affinity_v4: convert(names::AFFINITY_V4, open(names::AFFINITY_V4)?)?,
            source_ranges_v4: convert(names::SOURCE_RANGES_V4, open(names::SOURCE_RANGES_V4)?)?,
            sockets: convert(names::SOCKETS, open(names::SOCKETS)?)?,
            sock_rev: convert(names::SOCK_REV, open(names::SOCK_REV)?)?,
            affinity_v6: convert(names::AFFINITY_V6, open(names::AFFINITY_V6)?)?,
            source_ranges_v6: convert(names::SOURCE_RANGES_V6, open(names::SOURCE_RANGES_V6)?)?,
            maglev_v4: convert(names::MAGLEV_V4, open(names::MAGLEV_V4)?)?,
            maglev_v6: convert(names::MAGLEV_V6, open(names::MAGLEV_V6)?)?,
            sock_picks_v4: convert(names::SOCK_PICKS_V4, open(names::SOCK_PICKS_V4)?)?,
            sock_picks_v6: convert(names::SOCK_PICKS_V6, open(names::SOCK_PICKS_V6)?)?,
            local_v4: convert(names::LOCAL_V4, open(names::LOCAL_V4)?)?,
            local_v6: convert(names::LOCAL_V6, open(names::LOCAL_V6)?)?,
            local_ifs: convert(names::LOCAL_IFS, open(names::LOCAL_IFS)?)?,
            svcnet_v4: convert(names::SVCNET_V4, open(names::SVCNET_V4)?)?,
            svcnet_v6: convert(names::SVCNET_V6, open(names::SVCNET_V6)?)?,
            svcnet_summary_v4: convert(names::SVCNET_SUMMARY_V4, open(names::SVCNET_SUMMARY_V4)?)?,
            sock_marks: convert(names::SOCK_MARKS, open(names::SOCK_MARKS)?)?,
            sock_table: SockTable::new(open(names::SOCK_TABLE)?, false)?,
            filters: None,
        })
    }

    /// The sum over CPUs of one counter.
    pub fn stat(&self, stat: Stat) -> Result<u64, DatapathError> {
        let (map, name, index) = match stat.slot() {
            (false, i) => (&self.stats, names::STATS, i),
            (true, i) => (&self.stats2, names::STATS2, i),
        };
        let values = map
            .get(&index, 0)
            .map_err(|source| DatapathError::Map { name, source })?;
        Ok(values.iter().sum())
    }

    /// `sl_sockmark`'s counts by slot (`sluice_common::socket`), without
    /// the validity word.
    pub fn sock_marks(&self) -> Result<Vec<u64>, DatapathError> {
        (0..SOCK_MARK_SLOTS)
            .map(|slot| self.sock_mark(slot))
            .collect()
    }

    /// One word of `sl_sockmark`: a slot's count, or at
    /// `socket::MARKS_VALID` the validity word.
    pub fn sock_mark(&self, index: u32) -> Result<u64, DatapathError> {
        self.sock_marks
            .get(&index, 0)
            .map_err(|source| DatapathError::Map {
                name: names::SOCK_MARKS,
                source,
            })
    }

    /// Moves `sl_socktab` into `sl_sock` (`SockTable::move_into`): once
    /// `sl_sockmark`'s counts are not valid, as an agent starts or stops.
    pub fn move_sock_table(&mut self) -> usize {
        let moved = self.sock_table.move_into(&mut self.sockets);
        if moved > 0 {
            tracing::info!(moved, "sockets of sl_socktab moved into sl_sock");
        }
        moved
    }

    /// Every entry of `sl_sockfe4` and `sl_sockfe6`.
    pub fn sock_picks(&self) -> Result<Vec<PicksEntry>, DatapathError> {
        let mut out = Vec::new();
        for item in self.sock_picks_v4.iter() {
            let (key, value) = item.map_err(|source| DatapathError::Map {
                name: names::SOCK_PICKS_V4,
                source,
            })?;
            out.push(PicksEntry::V4(key, value));
        }
        for item in self.sock_picks_v6.iter() {
            let (key, value) = item.map_err(|source| DatapathError::Map {
                name: names::SOCK_PICKS_V6,
                source,
            })?;
            out.push(PicksEntry::V6(key, value));
        }
        Ok(out)
    }

    /// The config entry (all zero before the agent first wrote it).
    pub fn config(&self) -> Result<Config, DatapathError> {
        self.config.get(&0, 0).map_err(|source| DatapathError::Map {
            name: names::CONFIG,
            source,
        })
    }
}

/// A service-map key of either family (`sl_svc4` or `sl_svc6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceKey {
    V4(Svc4Key),
    V6(Svc6Key),
}

impl ServiceKey {
    /// The key of `slot` of `frontend`, in its family's map.
    pub fn of(frontend: &FrontendKey, slot: u16) -> Self {
        let (port, proto, scope) = (
            frontend.port,
            frontend.proto.number(),
            frontend.scope.number(),
        );
        match frontend.addr {
            IpAddr::V4(a) => Self::V4(Svc4Key::scoped(a.octets(), port, proto, slot, scope)),
            IpAddr::V6(a) => Self::V6(Svc6Key::scoped(a.octets(), port, proto, slot, scope)),
        }
    }

    /// The frontend this key belongs to and its slot; `None` for a
    /// protocol or scope the agent does not know.
    pub fn frontend(&self) -> Option<(FrontendKey, u16)> {
        let (addr, port, proto, slot, scope) = match self {
            Self::V4(k) => (
                IpAddr::V4(Ipv4Addr::from(k.addr)),
                k.port,
                k.proto,
                k.slot,
                k.scope,
            ),
            Self::V6(k) => (
                IpAddr::V6(Ipv6Addr::from(k.addr)),
                k.port,
                k.proto,
                k.slot,
                k.scope,
            ),
        };
        let key = FrontendKey::new(addr, port, Proto::from_number(proto)?);
        Some((key.in_scope(Scope::from_number(scope)?), slot))
    }
}

/// Every entry of both service maps.
fn read_services(maps: &Maps) -> Result<Vec<(ServiceKey, SvcValue)>, DatapathError> {
    let mut out = Vec::new();
    for item in maps.services_v4.iter() {
        let (key, value) = item.map_err(|source| DatapathError::Map {
            name: names::SERVICES_V4,
            source,
        })?;
        out.push((ServiceKey::V4(key), value));
    }
    for item in maps.services_v6.iter() {
        let (key, value) = item.map_err(|source| DatapathError::Map {
            name: names::SERVICES_V6,
            source,
        })?;
        out.push((ServiceKey::V6(key), value));
    }
    Ok(out)
}

/// Reads the service and backend maps back into a `MapState`. Entries the
/// agent cannot interpret (unknown protocol) are returned separately so the
/// reconciler can delete them.
pub fn read_map_state(maps: &Maps) -> Result<(MapState, Vec<ServiceKey>), DatapathError> {
    let mut state = MapState::default();
    let mut foreign = Vec::new();
    for (key, value) in read_services(maps)? {
        let Some((frontend, slot)) = key.frontend() else {
            foreign.push(key);
            continue;
        };
        let fe = state.frontends.get_or_default(frontend);
        if slot == 0 {
            fe.svc_id = SvcId(value.svc_id);
            fe.flags = value.flags;
            fe.active = value.active;
            fe.fallback = value.fallback;
            fe.affinity_s = value.affinity_s;
        } else {
            fe.set_slot(usize::from(slot) - 1, BackendId(value.backend_id));
        }
    }
    for item in maps.backends.iter() {
        let (id, backend) = item.map_err(|source| DatapathError::Map {
            name: names::BACKENDS,
            source,
        })?;
        state.backends.insert(BackendId(id), backend);
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
            .entry(SvcId(u32::from_be_bytes(data.svc_id)))
            .or_default()
            .insert((IpAddr::V4(Ipv4Addr::from(data.addr)), prefix));
    }
    for item in maps.source_ranges_v6.iter() {
        let (key, _) = item.map_err(|source| DatapathError::Map {
            name: names::SOURCE_RANGES_V6,
            source,
        })?;
        let data = key.data();
        let prefix = key.prefix_len().saturating_sub(32).min(128) as u8;
        state
            .source_ranges
            .entry(SvcId(u32::from_be_bytes(data.svc_id)))
            .or_default()
            .insert((IpAddr::V6(Ipv6Addr::from(data.addr)), prefix));
    }
    for item in maps.local_v4.iter() {
        let (key, _) = item.map_err(|source| DatapathError::Map {
            name: names::LOCAL_V4,
            source,
        })?;
        let prefix = key.prefix_len().min(32) as u8;
        state
            .local_sources
            .insert((IpAddr::V4(Ipv4Addr::from(key.data())), prefix));
    }
    for item in maps.local_v6.iter() {
        let (key, _) = item.map_err(|source| DatapathError::Map {
            name: names::LOCAL_V6,
            source,
        })?;
        let prefix = key.prefix_len().min(128) as u8;
        state
            .local_sources
            .insert((IpAddr::V6(Ipv6Addr::from(key.data())), prefix));
    }
    for item in maps.local_ifs.keys() {
        let index = item.map_err(|source| DatapathError::Map {
            name: names::LOCAL_IFS,
            source,
        })?;
        state.local_ifaces.insert(index);
    }
    for item in maps.svcnet_v4.iter() {
        let (key, kind) = item.map_err(|source| DatapathError::Map {
            name: names::SVCNET_V4,
            source,
        })?;
        let prefix = key.prefix_len().min(32) as u8;
        state
            .service_nets
            .insert((IpAddr::V4(Ipv4Addr::from(key.data())), prefix), kind);
    }
    for item in maps.svcnet_v6.iter() {
        let (key, kind) = item.map_err(|source| DatapathError::Map {
            name: names::SVCNET_V6,
            source,
        })?;
        let prefix = key.prefix_len().min(128) as u8;
        state
            .service_nets
            .insert((IpAddr::V6(Ipv6Addr::from(key.data())), prefix), kind);
    }
    state.svcnet_summary_v4 =
        maps.svcnet_summary_v4
            .get(&0, 0)
            .map_err(|source| DatapathError::Map {
                name: names::SVCNET_SUMMARY_V4,
                source,
            })?;
    for (key, table) in read_maglev(maps)? {
        let Some((frontend, _)) = key.frontend() else {
            continue;
        };
        let mut ids: Vec<BackendId> = table.backends.iter().copied().map(BackendId).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut members: Vec<(BackendId, Endpoint)> = ids
            .into_iter()
            .map(|id| {
                let endpoint = state.backends.get(&id).map_or(
                    // Unknown backend: an endpoint no desired state has,
                    // so the table is rewritten.
                    Endpoint {
                        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                        port: 0,
                    },
                    |b| Endpoint {
                        addr: backend_ip(&b),
                        port: b.port,
                    },
                );
                (id, endpoint)
            })
            .collect();
        members.sort_by_key(|(_, ep)| *ep);
        state.frontends.get_or_default(frontend).maglev = members.into();
    }
    Ok((state, foreign))
}

/// An IPv4 or IPv6 backend's address.
fn backend_ip(b: &Backend) -> IpAddr {
    if b.family == sluice_common::FAMILY_V6 {
        IpAddr::V6(Ipv6Addr::from(b.addr))
    } else {
        IpAddr::V4(Ipv4Addr::from(b.addr_v4()))
    }
}

/// Every Maglev table of both families, by its frontend's master key.
fn read_maglev(maps: &Maps) -> Result<Vec<(ServiceKey, Box<MaglevTable>)>, DatapathError> {
    let mut out = Vec::new();
    for item in maps.maglev_v4.iter() {
        let (key, table) = item.map_err(|source| DatapathError::Map {
            name: names::MAGLEV_V4,
            source,
        })?;
        out.push((ServiceKey::V4(key), Box::new(table)));
    }
    for item in maps.maglev_v6.iter() {
        let (key, table) = item.map_err(|source| DatapathError::Map {
            name: names::MAGLEV_V6,
            source,
        })?;
        out.push((ServiceKey::V6(key), Box::new(table)));
    }
    Ok(out)
}
