//! Kubernetes objects in, desired datapath state out: a pure, deterministic
//! function of trimmed Services, EndpointSlices and this node's Node,
//! following kube-proxy's rules (see `endpoints` for where they differ).
//!
//! - `objects`: the trimmed types and their validation.
//! - `endpoints`: merging slices, traffic policies.
//! - `topology`: node and zone hints (topology-aware routing).
//! - `frontends`: the frontends of a service port.
//! - `problems`: what is reported instead of failing.

mod endpoints;
mod forbidden;
mod frontends;
mod local_traffic;
mod objects;
mod places;
mod problems;
mod topology;

#[cfg(test)]
pub(crate) mod builders;
#[cfg(test)]
pub(crate) mod fuzz;
#[cfg(test)]
mod kube_proxy_cases;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::{core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice};

pub use local_traffic::LocalDetector;
pub use objects::{
    AddressFamily, Conditions, IpFamilies, IpNet, ListMark, NodeInfo, ObjectKey, PortInfo,
    ServiceCidrInfo, ServiceExtras, ServiceInfo, ServiceType, SliceEndpoint, SliceInfo, SlicePort,
    ANNOTATION_LB_ALGORITHM, DEFAULT_AFFINITY_TIMEOUT, DEFAULT_NAMESPACE, LABEL_HEADLESS,
    LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_TOPOLOGY_ZONE, MAX_AFFINITY_TIMEOUT,
};
pub use problems::{Problem, ProblemReason};

use crate::model::{DesiredService, DesiredState, ServicePortName};
use frontends::Addresses;

/// What translation needs to know about the node it runs for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TranslateConfig {
    /// This node's name: endpoints with this `nodeName` are local.
    pub node_name: String,
    /// The addresses NodePort frontends listen on, resolved by the caller;
    /// when empty, the Node object's InternalIP and ExternalIP addresses.
    pub node_addresses: Vec<IpAddr>,
    /// Balance IPv6 too. When off, IPv6 frontends and endpoints are
    /// skipped and reported (`ipv6_unsupported`); the IPv4 side of a
    /// dual-stack service still works.
    pub ipv6: bool,
    /// kube-proxy's `--masquerade-all`: every new flow to a cluster IP is
    /// SNATed to the node.
    pub masquerade_all: bool,
    /// Local-traffic detection (`--detect-local-mode` with its input).
    /// When it is on, flows to a cluster IP from sources outside the
    /// cluster are SNATed, as kube-proxy masquerades them.
    pub local: LocalDetector,
    /// `--service-cluster-ip-range`: service CIDRs known without the
    /// ServiceCIDR objects (both are used).
    pub service_cidrs: Vec<IpNet>,
}

/// The result of one translation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Translation {
    pub desired: DesiredState,
    /// Everything left out, sorted: the stored objects' own problems and
    /// those translation found.
    pub problems: Vec<Problem>,
}

/// What translation needs from this node, computed once per translation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    /// The node's zone, for topology hints.
    pub zone: Option<String>,
    /// Addresses NodePort frontends listen on (IPv4 unless IPv6 is on).
    pub node_addrs: Vec<IpAddr>,
    /// Node addresses skipped because IPv6 is off.
    pub node_v6: Vec<IpAddr>,
    /// Problems of the Node object itself.
    pub problems: Vec<Problem>,
    /// The networks local-traffic detection takes for pods.
    pub local_sources: BTreeSet<(IpAddr, u8)>,
}

impl NodeContext {
    /// `node` is this node's Node object, if known: it supplies the zone and,
    /// unless `config.node_addresses` is set, the NodePort addresses.
    pub fn new(node: Option<&NodeInfo>, config: &TranslateConfig) -> Self {
        let mut problems = Vec::new();
        let node = match node {
            Some(n) if !config.node_name.is_empty() && n.name != config.node_name => {
                problems.push(Problem::new(
                    format!("Node {}", n.name),
                    ProblemReason::InvalidValue,
                    format!("is not this node ({}), ignored", config.node_name),
                ));
                None
            }
            other => other,
        };
        if let Some(n) = node {
            problems.extend(n.problems.iter().cloned());
        }
        let raw: &[IpAddr] = if config.node_addresses.is_empty() {
            node.map(|n| n.addresses.as_slice()).unwrap_or_default()
        } else {
            &config.node_addresses
        };
        // --nodeport-addresses may cover loopback or link-local
        // addresses: a node port is never on one.
        let raw: Vec<IpAddr> = raw
            .iter()
            .copied()
            .filter(|a| forbidden::forbidden(*a).is_none())
            .collect();
        let (mut node_addrs, node_v6) = split_family(&raw, config.ipv6);
        node_addrs.sort();
        node_addrs.dedup();
        Self {
            zone: node.and_then(|n| n.zone.clone()),
            node_addrs,
            node_v6,
            problems,
            local_sources: config.local.sources(node),
        }
    }

    /// Problems that arise when some service wants node ports.
    pub fn node_port_problems(&self, config: &TranslateConfig) -> Vec<Problem> {
        let node_object = format!("Node {}", config.node_name);
        let mut problems = Vec::new();
        if self.node_addrs.is_empty() {
            problems.push(Problem::new(
                node_object.clone(),
                ProblemReason::MissingField,
                "no node address known: NodePort services get no node port frontends",
            ));
        }
        if !self.node_v6.is_empty() {
            problems.push(Problem::new(
                node_object,
                ProblemReason::Ipv6Unsupported,
                format!(
                    "IPv6 node address(es) get no node ports: {}",
                    join(&self.node_v6)
                ),
            ));
        }
        problems
    }
}

/// kube-proxy's health check node port of a LoadBalancer service with
/// externalTrafficPolicy Local: load balancers send traffic only to nodes
/// that answer 200 (this node has a ready endpoint of the service).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub port: u16,
    /// Ready endpoints of the service on this node (terminating ones do
    /// not count: a node with only those must drain from the balancer).
    pub local_endpoints: u32,
}

/// One service's share of a translation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceTranslation {
    pub ports: Vec<(ServicePortName, DesiredService)>,
    /// The service's own problems and those translation found in it.
    pub problems: Vec<Problem>,
    /// Whether a port asks for node ports (see `node_port_problems`).
    pub wants_node_ports: bool,
    pub health_check: Option<HealthCheck>,
    /// The service's cluster IPs of the families sluice balances, when it
    /// has a port: kube-proxy's `cluster-ips` set (any port that is not
    /// served on them is rejected).
    pub cluster_ips: Vec<IpAddr>,
}

/// Translates one service with its EndpointSlices (in slice-name order).
/// Slices' own problems are not included: they belong to the slices.
pub fn translate_service(
    key: &ObjectKey,
    svc: &ServiceInfo,
    own_slices: &[(&ObjectKey, &SliceInfo)],
    ctx: &NodeContext,
    config: &TranslateConfig,
) -> ServiceTranslation {
    let object = format!("Service {key}");
    let mut out = ServiceTranslation {
        problems: svc.problems().to_vec(),
        ..ServiceTranslation::default()
    };

    let (cluster, mut skipped) = split_family(&svc.cluster_ips, config.ipv6);
    let (external, v6) = split_family(svc.external_ips(), config.ipv6);
    skipped.extend(v6);
    let (load_balancer, v6) = split_family(svc.load_balancer_ips(), config.ipv6);
    skipped.extend(v6);
    if !skipped.is_empty() {
        out.problems.push(Problem::new(
            object.clone(),
            ProblemReason::Ipv6Unsupported,
            format!("IPv6 address(es) get no frontend: {}", join(&skipped)),
        ));
    }
    if !config.ipv6 {
        for (slice_key, _) in own_slices
            .iter()
            .filter(|(_, s)| s.family == AddressFamily::V6)
        {
            out.problems.push(Problem::new(
                format!("EndpointSlice {slice_key}"),
                ProblemReason::Ipv6Unsupported,
                format!("IPv6 endpoints of service {key} are not balanced"),
            ));
        }
    }
    out.cluster_ips = service_cluster_ips(svc, config).collect();
    let slice_refs: Vec<&SliceInfo> = own_slices.iter().map(|(_, s)| *s).collect();
    let addrs = Addresses {
        cluster: &cluster,
        external: &external,
        load_balancer: &load_balancer,
        node: &ctx.node_addrs,
    };
    let here = topology::Locality {
        node_name: &config.node_name,
        zone: ctx.zone.as_deref(),
    };
    let mut seen: std::collections::BTreeSet<ServicePortName> = std::collections::BTreeSet::new();
    let mut local_ready: std::collections::BTreeSet<IpAddr> = std::collections::BTreeSet::new();
    for port in &svc.ports {
        out.wants_node_ports |= frontends::wants_node_ports(svc, port);
        let candidates = endpoints::collect(
            &slice_refs,
            &port.name,
            port.proto,
            &config.node_name,
            config.ipv6,
        );
        local_ready.extend(
            candidates
                .iter()
                .filter(|c| c.local && c.conditions.state() == crate::model::BackendState::Active)
                .map(|c| c.endpoint.addr),
        );
        let opts = frontends::Options {
            masquerade_all: config.masquerade_all,
            local_detection: config.local.implemented(),
        };
        let list = frontends::frontends(svc, port, &addrs, &candidates, here, opts);
        if list.is_empty() {
            continue;
        }
        let name = ServicePortName::new(
            key.namespace.clone(),
            key.name.clone(),
            port.port_name(),
            port.proto,
        );
        if !seen.insert(name.clone()) {
            out.problems.push(Problem::new(
                object.clone(),
                ProblemReason::Duplicate,
                format!("service port {name} appears more than once, later one skipped"),
            ));
            continue;
        }
        out.ports.push((name, DesiredService { frontends: list }));
    }
    if svc.service_type == ServiceType::LoadBalancer && svc.external_traffic_local {
        out.health_check = svc.health_check_node_port.map(|port| HealthCheck {
            port,
            local_endpoints: local_ready.len() as u32,
        });
    }
    out
}

/// Translates the current objects into the desired datapath state.
///
/// `node` is this node's Node object, if known: it supplies the zone for
/// topology hints and, unless `config.node_addresses` is set, the NodePort
/// addresses. Same input, same output: a replayed event gives an equal
/// `Translation`. The agent translates incrementally with
/// `translate_service`; this is the whole-state form of the same rules.
pub fn translate(
    services: &BTreeMap<ObjectKey, ServiceInfo>,
    slices: &BTreeMap<ObjectKey, SliceInfo>,
    node: Option<&NodeInfo>,
    config: &TranslateConfig,
) -> Translation {
    translate_with_cidrs(services, slices, node, &[], config)
}

/// `translate` with the service CIDRs of the ServiceCIDR objects
/// (`service_cidrs`, added to `config.service_cidrs`).
pub fn translate_with_cidrs(
    services: &BTreeMap<ObjectKey, ServiceInfo>,
    slices: &BTreeMap<ObjectKey, SliceInfo>,
    node: Option<&NodeInfo>,
    service_cidrs: &[IpNet],
    config: &TranslateConfig,
) -> Translation {
    let ctx = NodeContext::new(node, config);
    let mut problems: Vec<Problem> = ctx.problems.clone();

    // Slices by the service they belong to, in slice-name order.
    let mut by_service: BTreeMap<ObjectKey, Vec<(&ObjectKey, &SliceInfo)>> = BTreeMap::new();
    for (key, slice) in slices {
        problems.extend(slice.problems.iter().cloned());
        by_service
            .entry(ObjectKey::new(key.namespace.clone(), slice.service.clone()))
            .or_default()
            .push((key, slice));
    }

    let mut desired = DesiredState {
        local_sources: ctx.local_sources.clone(),
        service_cidrs: wanted_service_cidrs(service_cidrs, config),
        ..DesiredState::default()
    };
    let mut node_ports_wanted = false;
    let mut cluster_ips = Vec::new();
    for (key, svc) in services {
        let own_slices = by_service.get(key).map(Vec::as_slice).unwrap_or_default();
        let t = translate_service(key, svc, own_slices, &ctx, config);
        problems.extend(t.problems);
        node_ports_wanted |= t.wants_node_ports;
        desired.services.extend(t.ports);
        cluster_ips.extend(t.cluster_ips);
    }
    desired.cluster_ips = cluster_ips.into_iter().collect();
    if node_ports_wanted {
        problems.extend(ctx.node_port_problems(config));
    }
    problems.sort();
    problems.dedup();
    Translation { desired, problems }
}

/// The service CIDRs to enforce: the flag's and the objects', of the
/// families sluice balances.
pub fn wanted_service_cidrs(objects: &[IpNet], config: &TranslateConfig) -> BTreeSet<(IpAddr, u8)> {
    config
        .service_cidrs
        .iter()
        .chain(objects)
        .filter(|n| config.ipv6 || n.addr.is_ipv4())
        .map(|n| (n.addr, n.prefix_len))
        .collect()
}

/// Splits addresses into those frontends may use and the IPv6 ones that
/// are skipped (none when IPv6 is on).
/// The cluster IPs a service contributes to the service address space
/// (`ServiceTranslation::cluster_ips`): those of its balanced families,
/// when it has ports. A function of the stored object alone, so that the
/// sync task collects them from the stores when it needs them instead of
/// keeping them per service.
pub fn service_cluster_ips<'a>(
    svc: &'a ServiceInfo,
    config: &'a TranslateConfig,
) -> impl Iterator<Item = IpAddr> + 'a {
    svc.cluster_ips
        .iter()
        .copied()
        .filter(move |a| svc.has_ports && (config.ipv6 || a.is_ipv4()))
}

fn split_family(addrs: &[IpAddr], ipv6: bool) -> (Vec<IpAddr>, Vec<IpAddr>) {
    addrs.iter().partition(|a| ipv6 || a.is_ipv4())
}

fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Objects trimmed into the stores `translate` reads, e.g. from a
/// manifest directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stores {
    pub services: BTreeMap<ObjectKey, ServiceInfo>,
    pub slices: BTreeMap<ObjectKey, SliceInfo>,
    /// The Node named `node_name`, if among the objects.
    pub node: Option<NodeInfo>,
    /// Objects that could not be used at all, and duplicates (the first
    /// object with a key is kept).
    pub problems: Vec<Problem>,
}

impl Stores {
    pub fn from_objects(
        services: &[Service],
        slices: &[EndpointSlice],
        nodes: &[Node],
        node_name: &str,
    ) -> Self {
        let mut out = Self::default();
        for svc in services {
            let Some(key) = ObjectKey::from_meta(&svc.metadata) else {
                out.problems.extend(ServiceInfo::from_service(svc).err());
                continue;
            };
            match ServiceInfo::from_service(svc) {
                Ok(Some(info)) => {
                    insert_first(&mut out.services, key, info, "Service", &mut out.problems)
                }
                Ok(None) => {}
                Err(p) => out.problems.push(p),
            }
        }
        for slice in slices {
            let Some(key) = ObjectKey::from_meta(&slice.metadata) else {
                out.problems.extend(SliceInfo::from_slice(slice).err());
                continue;
            };
            match SliceInfo::from_slice(slice) {
                Ok(Some(info)) => insert_first(
                    &mut out.slices,
                    key,
                    info,
                    "EndpointSlice",
                    &mut out.problems,
                ),
                Ok(None) => {}
                Err(p) => out.problems.push(p),
            }
        }
        for node in nodes
            .iter()
            .filter(|n| n.metadata.name.as_deref() == Some(node_name))
        {
            match NodeInfo::from_node(node) {
                Ok(info) if out.node.is_none() => out.node = Some(info),
                Ok(_) => out.problems.push(Problem::new(
                    format!("Node {node_name}"),
                    ProblemReason::Duplicate,
                    "defined more than once, first one used",
                )),
                Err(p) => out.problems.push(p),
            }
        }
        out
    }
}

fn insert_first<T>(
    map: &mut BTreeMap<ObjectKey, T>,
    key: ObjectKey,
    value: T,
    kind: &str,
    problems: &mut Vec<Problem>,
) {
    match map.entry(key) {
        std::collections::btree_map::Entry::Occupied(e) => problems.push(Problem::new(
            format!("{kind} {}", e.key()),
            ProblemReason::Duplicate,
            "defined more than once, first one used",
        )),
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(value);
        }
    }
}
