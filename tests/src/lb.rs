//! A datapath loaded into a [`Topology`]'s node, driven through the same
//! reconciler the agent uses, plus builders for desired state.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use sluice::{
    datapath::{Datapath, MapSizes, MapWriter, Maps},
    model::{
        BackendState, DesiredBackend, DesiredService, DesiredState, Endpoint, Frontend,
        FrontendKey, FrontendKind, Proto, ServicePortName, WhenEmpty,
    },
    reconcile::{Reconciler, Report, Scope},
};
use sluice_common::Stat;

use crate::topology::{Pod, Topology};

/// The loaded datapath of one topology.
pub struct Lb {
    pub datapath: Datapath,
    pub reconciler: Reconciler,
    pub desired: DesiredState,
}

impl Lb {
    /// Loads the programs with default map sizes, attaches them to every
    /// device of the node and adopts the maps.
    pub fn load(topo: &Topology) -> Result<Self> {
        Self::load_with(topo, MapSizes::default(), Duration::from_secs(60))
    }

    pub fn load_with(topo: &Topology, sizes: MapSizes, drain_timeout: Duration) -> Result<Self> {
        let (mut datapath, maps) = Datapath::load(topo.bpf.path(), &sizes)?;
        let devices = topo.devices();
        let xdp = crate::xdp_under_test();
        topo.node.run(|| -> Result<()> {
            for dev in &devices {
                datapath.attach(dev)?;
                if let Some(mode) = xdp.filter(|_| dev.starts_with('e') || dev == "u0") {
                    datapath.attach_xdp(dev, mode)?;
                }
            }
            Ok(())
        })??;
        datapath.finish_migration()?;
        let mut reconciler = Reconciler::new(MapWriter::new(maps), &sizes, drain_timeout)?;
        // As the agent's sync task does once every link is swapped.
        reconciler.start_picks()?;
        Ok(Self {
            datapath,
            reconciler,
            desired: DesiredState::default(),
        })
    }

    /// Turns host routing (`--host-routing`) on between the topology's
    /// pods' devices (its clients' and backends' veths), or off.
    pub fn host_routing(&mut self, topo: &Topology, on: bool) -> Result<()> {
        let bit = sluice_common::config::CFG_F_HOST_ROUTING;
        if on {
            let pods: Vec<String> = topo
                .clients
                .iter()
                .chain(&topo.backends)
                .map(|p| p.host_if.clone())
                .collect();
            let datapath = &mut self.datapath;
            topo.node.run(|| -> Result<()> {
                for dev in &pods {
                    anyhow::ensure!(datapath.route_into(dev)?, "{dev} is not a veth");
                }
                Ok(())
            })??;
        }
        self.reconciler
            .set_config_flags(bit, if on { bit } else { 0 })?;
        Ok(())
    }

    /// Sets (or replaces) one service port and reconciles.
    pub fn set(&mut self, svc: (ServicePortName, DesiredService)) -> Report {
        self.desired.services.insert(svc.0, svc.1);
        self.apply()
    }

    /// Removes one service port and reconciles.
    pub fn remove(&mut self, name: &ServicePortName) -> Report {
        self.desired.services.remove(name);
        self.apply()
    }

    /// Reconciles the current desired state.
    pub fn apply(&mut self) -> Report {
        self.reconciler
            .reconcile(&self.desired, Scope::All, Instant::now())
    }

    /// Reconciles only `changed` service ports, as the agent does for a
    /// watch event.
    pub fn apply_changed(&mut self, changed: &BTreeSet<ServicePortName>) -> Report {
        self.reconciler
            .reconcile(&self.desired, Scope::Changed(changed), Instant::now())
    }

    /// Scans conntrack (GC + live flows) and reconciles, as the agent's
    /// drain tick does.
    pub fn drain_tick(&mut self) -> Result<Report> {
        self.reconciler.scan_conntrack(Instant::now())?;
        Ok(self.apply())
    }

    /// A fresh read-only view of the pinned maps.
    pub fn maps(&self) -> Result<Maps> {
        Ok(Maps::open_pinned(self.datapath.root())?)
    }

    pub fn stat(&self, stat: Stat) -> Result<u64> {
        self.maps()?.stat(stat).context("reading sl_stats")
    }
}

/// A ClusterIP service port `ns/name:port/proto` with `backends`.
pub fn cluster_ip(
    name: &str,
    vip: Ipv4Addr,
    port: u16,
    proto: Proto,
    backends: &[(Ipv4Addr, u16, BackendState)],
) -> (ServicePortName, DesiredService) {
    let (namespace, name) = name.split_once('/').unwrap_or(("default", name));
    (
        ServicePortName::new(namespace, name, port.to_string(), proto),
        DesiredService {
            frontends: vec![Frontend::new(
                FrontendKey::new(IpAddr::V4(vip), port, proto),
                FrontendKind::ClusterIp,
                backends
                    .iter()
                    .map(|(addr, port, state)| DesiredBackend {
                        endpoint: Endpoint {
                            addr: IpAddr::V4(*addr),
                            port: *port,
                        },
                        state: *state,
                    })
                    .collect(),
                WhenEmpty::Reject,
            )],
        },
    )
}

/// `vip:port` as a socket address.
pub fn vip(addr: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(addr, port)
}

/// `[vip]:port` as a socket address.
pub fn vip6(addr: Ipv6Addr, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(addr, port, 0, 0)
}

/// Every pod of `pods` as an active backend on `port`, once per family
/// (its IPv4 and its IPv6 address), as a dual-stack service's endpoints.
pub fn dual_stack_backends(pods: &[Pod], port: u16) -> Vec<(IpAddr, u16, BackendState)> {
    pods.iter()
        .flat_map(|p| {
            [
                (IpAddr::V4(p.ip), port, BackendState::Active),
                (IpAddr::V6(p.ip6), port, BackendState::Active),
            ]
        })
        .collect()
}

/// A ClusterIP service port with one frontend per address in `vips` (a
/// dual-stack service has one of each family); each frontend gets the
/// backends of its own family, as translation does.
pub fn cluster_ips(
    name: &str,
    vips: &[IpAddr],
    port: u16,
    proto: Proto,
    backends: &[(IpAddr, u16, BackendState)],
) -> (ServicePortName, DesiredService) {
    let frontends = vips
        .iter()
        .map(|vip| {
            let own: Vec<DesiredBackend> = backends
                .iter()
                .filter(|(addr, _, _)| addr.is_ipv6() == vip.is_ipv6())
                .map(|(addr, port, state)| DesiredBackend {
                    endpoint: Endpoint {
                        addr: *addr,
                        port: *port,
                    },
                    state: *state,
                })
                .collect();
            Frontend::new(
                FrontendKey::new(*vip, port, proto),
                FrontendKind::ClusterIp,
                own,
                WhenEmpty::Reject,
            )
        })
        .collect();
    service(name, port, proto, frontends)
}

/// An IPv6 ClusterIP service port (see `cluster_ip`).
pub fn cluster_ip6(
    name: &str,
    vip: Ipv6Addr,
    port: u16,
    proto: Proto,
    backends: &[(Ipv6Addr, u16, BackendState)],
) -> (ServicePortName, DesiredService) {
    let backends: Vec<(IpAddr, u16, BackendState)> = backends
        .iter()
        .map(|(a, p, s)| (IpAddr::V6(*a), *p, *s))
        .collect();
    cluster_ips(name, &[IpAddr::V6(vip)], port, proto, &backends)
}

impl Lb {
    /// The backend id the maps hold for `addr:port`, if any.
    pub fn backend_id(&self, addr: Ipv4Addr, port: u16) -> Option<u32> {
        self.reconciler
            .programmed()
            .backends
            .iter()
            .find(|(_, b)| b.addr_v4() == addr.octets() && b.port == port)
            .map(|(id, _)| id.get())
    }

    /// The backend id the maps hold for `addr:port` (either family).
    pub fn backend_id_of(&self, addr: IpAddr, port: u16) -> Option<u32> {
        self.reconciler
            .programmed()
            .backends
            .iter()
            .find(|(_, b)| {
                let ep = sluice::reconcile::endpoint_of(b);
                ep.addr == addr && ep.port == port
            })
            .map(|(id, _)| id.get())
    }

    /// Conntrack entries (forward and reply, both families) that name
    /// backend `id`.
    pub fn conntrack_entries_of(&self, id: u32) -> Result<usize> {
        let maps = self.maps()?;
        let v4 = sluice::conntrack::read_all(&maps)?
            .iter()
            .filter(|(_, e)| e.backend_id == id)
            .count();
        let v6 = sluice::conntrack::read_all6(&maps)?
            .iter()
            .filter(|(_, e)| e.backend_id == id)
            .count();
        Ok(v4 + v6)
    }
}

/// A frontend for tests: `kind` at `addr:port` (either family), the given
/// backends.
pub fn frontend(
    kind: FrontendKind,
    addr: IpAddr,
    port: u16,
    proto: Proto,
    backends: &[(IpAddr, u16, BackendState)],
) -> Frontend {
    Frontend::new(
        FrontendKey::new(addr, port, proto),
        kind,
        backends
            .iter()
            .map(|(addr, port, state)| DesiredBackend {
                endpoint: Endpoint {
                    addr: *addr,
                    port: *port,
                },
                state: *state,
            })
            .collect(),
        WhenEmpty::Reject,
    )
}

/// A service port `default/<name>:<port>` with the given frontends.
pub fn service(
    name: &str,
    port: u16,
    proto: Proto,
    frontends: Vec<Frontend>,
) -> (ServicePortName, DesiredService) {
    (
        ServicePortName::new("default", name, port.to_string(), proto),
        DesiredService { frontends },
    )
}
