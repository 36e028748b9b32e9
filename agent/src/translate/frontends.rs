//! The frontends of one service port, each with its backend list.

use std::net::IpAddr;

use super::{
    endpoints::{Candidate, Selection},
    objects::{AddressFamily, PortInfo, ServiceInfo},
    topology::Locality,
};
use crate::model::{Frontend, FrontendKey, FrontendKind, Scope};

/// The proxy-wide options that change a frontend (kube-proxy's
/// `--masquerade-all` and local-traffic detection).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Options {
    pub masquerade_all: bool,
    pub local_detection: bool,
}

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
    opts: Options,
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
    let mut out: Vec<Frontend> = Vec::new();
    for (addr, p, kind) in wanted {
        let family = AddressFamily::of(addr);
        let slot = match family {
            AddressFamily::V4 => &mut v4,
            AddressFamily::V6 => &mut v6,
        };
        let selection = slot.get_or_insert_with(|| Selection::new(candidates, family, here));
        let cluster_ip = kind == FrontendKind::ClusterIp;
        let local = if cluster_ip {
            svc.internal_traffic_local
        } else {
            svc.external_traffic_local
        };
        let (backends, when_empty) = selection.for_policy(local);
        // Source ranges guard load-balancer addresses only, each family
        // with its own ranges: as in kube-proxy, a family without ranges
        // is not filtered.
        let source_ranges: Vec<(IpAddr, u8)> = if kind == FrontendKind::LoadBalancer {
            svc.load_balancer_source_ranges()
                .iter()
                .filter(|n| AddressFamily::of(n.addr) == family)
                .map(|n| (n.addr, n.prefix_len))
                .collect()
        } else {
            Vec::new()
        };
        // The node's own connections come from one of its addresses of
        // this family: admitted when a range holds one.
        let node_denied = kind == FrontendKind::LoadBalancer
            && !source_ranges.is_empty()
            && !addrs.node.iter().any(|a| {
                AddressFamily::of(*a) == family
                    && svc
                        .load_balancer_source_ranges()
                        .iter()
                        .any(|n| n.contains(*a))
            });
        let frontend = Frontend {
            key: FrontendKey::new(addr, p, port.proto),
            kind,
            backends,
            when_empty,
            // kube-proxy masquerades external traffic unless the policy is
            // Local (which keeps the client address), and traffic to a
            // cluster IP only with --masquerade-all.
            snat: if cluster_ip {
                opts.masquerade_all
            } else {
                !local
            },
            // ... or, with local-traffic detection, the cluster-IP traffic
            // of sources outside the cluster.
            masquerade_outside: cluster_ip && !opts.masquerade_all && opts.local_detection,
            affinity_timeout: svc.session_affinity_timeout,
            maglev: svc.maglev,
            source_ranges,
            node_denied,
        };
        if !cluster_ip && local {
            // externalTrafficPolicy Local restricts only traffic from
            // outside the cluster: pods and the node get every endpoint,
            // unmasqueraded, from the internal scope ("short-circuit").
            let (backends, when_empty) = selection.for_policy(false);
            out.push(Frontend {
                key: frontend.key.in_scope(Scope::Internal),
                backends,
                when_empty,
                snat: false,
                masquerade_outside: false,
                ..frontend.clone()
            });
        }
        out.push(frontend);
    }
    out.sort_by_key(|f| (f.key, f.kind));
    out.dedup_by_key(|f| f.key);
    // Kept in the desired state for as long as the service lives: no
    // spare capacity (a Vec grown by pushes holds up to twice its length).
    for f in &mut out {
        f.backends.shrink_to_fit();
    }
    out.shrink_to_fit();
    out
}
