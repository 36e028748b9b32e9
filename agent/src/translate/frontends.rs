//! The frontends of one service port, each with its backend list.

use std::net::IpAddr;

use super::{
    endpoints::{Candidate, Selection},
    objects::{AddressFamily, PortInfo, ServiceInfo},
    topology::Locality,
};
use crate::model::{Frontend, FrontendKey, FrontendKind};

/// The addresses a service's frontends may use, IPv6 ones already removed
/// when IPv6 is off.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Addresses<'a> {
    pub cluster: &'a [IpAddr],
    pub external: &'a [IpAddr],
    pub load_balancer: &'a [IpAddr],
    /// This node's addresses, for node ports (every family: each service
    /// uses those of its own families).
    pub node: &'a [IpAddr],
}

/// Whether a service port gets NodePort frontends.
pub(super) fn wants_node_ports(svc: &ServiceInfo, port: &PortInfo) -> bool {
    svc.service_type.has_node_ports() && port.node_port.is_some()
}

/// Every frontend of `port`, sorted by key; where two kinds claim one key
/// (e.g. an external IP that is also a load balancer ingress IP) the first
/// kind in `FrontendKind` order keeps it.
pub(super) fn frontends(
    svc: &ServiceInfo,
    port: &PortInfo,
    addrs: &Addresses<'_>,
    candidates: &[Candidate<'_>],
    here: Locality<'_>,
) -> Vec<Frontend> {
    let mut wanted: Vec<(IpAddr, u16, FrontendKind)> = Vec::new();
    let mut add = |list: &[IpAddr], port: u16, kind: FrontendKind| {
        wanted.extend(list.iter().map(|a| (*a, port, kind)));
    };
    add(addrs.cluster, port.port, FrontendKind::ClusterIp);
    add(addrs.external, port.port, FrontendKind::ExternalIp);
    add(addrs.load_balancer, port.port, FrontendKind::LoadBalancer);
    if let (true, Some(np)) = (wants_node_ports(svc, port), port.node_port) {
        // Only the service's own families: kube-proxy leaves a node port
        // of another family alone (no rule, the packet is not a service's).
        let own: Vec<IpAddr> = addrs
            .node
            .iter()
            .copied()
            .filter(|a| svc.ip_families.contains(AddressFamily::of(*a)))
            .collect();
        add(&own, np, FrontendKind::NodePort);
    }

    let mut v4: Option<Selection> = None;
    let mut v6: Option<Selection> = None;
    let mut out: Vec<Frontend> = wanted
        .into_iter()
        .map(|(addr, p, kind)| {
            let family = AddressFamily::of(addr);
            let slot = match family {
                AddressFamily::V4 => &mut v4,
                AddressFamily::V6 => &mut v6,
            };
            let selection = slot.get_or_insert_with(|| Selection::new(candidates, family, here));
            let local = match kind {
                FrontendKind::ClusterIp => svc.internal_traffic_local,
                FrontendKind::NodePort | FrontendKind::LoadBalancer | FrontendKind::ExternalIp => {
                    svc.external_traffic_local
                }
            };
            let (backends, when_empty) = selection.for_policy(local);
            let external = kind != FrontendKind::ClusterIp;
            Frontend {
                key: FrontendKey {
                    addr,
                    port: p,
                    proto: port.proto,
                },
                kind,
                backends,
                when_empty,
                // kube-proxy masquerades external traffic unless the policy
                // is Local (which keeps the client address).
                snat: external && !local,
                affinity_timeout: svc.session_affinity_timeout,
                // Source ranges guard load-balancer addresses only, each
                // family with its own ranges: as in kube-proxy, a family
                // without ranges is not filtered.
                maglev: svc.maglev,
                source_ranges: if kind == FrontendKind::LoadBalancer {
                    svc.load_balancer_source_ranges
                        .iter()
                        .filter(|n| AddressFamily::of(n.addr) == family)
                        .map(|n| (n.addr, n.prefix_len))
                        .collect()
                } else {
                    Vec::new()
                },
            }
        })
        .collect();
    out.sort_by_key(|f| (f.key, f.kind));
    out.dedup_by_key(|f| f.key);
    out
}
