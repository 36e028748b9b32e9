//! Trimmed, validated copies of the Kubernetes objects translation reads.
//!
//! The agent's stores hold these instead of the full objects: only the
//! fields translation (and, later, health checks and source ranges) needs,
//! already parsed, with no resourceVersion, managed fields or annotations.
//! Equal trimmed objects translate equally, so a watcher can skip an update
//! whose trimmed form did not change.
//!
//! Each constructor returns `Ok(None)` for an object that is intentionally
//! ignored (an ExternalName or headless service, a service handled by
//! another proxy, an FQDN slice), `Err` for one that cannot be used at all
//! (the caller should treat it as absent), and otherwise the usable part,
//! with what was left out recorded in its `problems`.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{Node, Service, ServicePort, ServiceSpec},
        discovery::v1::{Endpoint as K8sEndpoint, EndpointConditions, EndpointSlice},
        networking::v1::ServiceCIDR,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{
    forbidden::forbidden,
    places::{self, PlaceId},
    problems::{Problem, ProblemReason},
};
use crate::{
    few::{Inline, Rare},
    model::{BackendState, Name, Proto},
};

/// Label naming the service an EndpointSlice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label handing a service to another proxy; kube-proxy ignores such services.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";

/// Annotation choosing how a service's new flows pick a backend: `maglev`
/// (consistent hashing) or `random` (the default: a flow hash over the
/// selectable slots).
pub const ANNOTATION_LB_ALGORITHM: &str = "service.sluice.dev/lb-algorithm";
/// Label the EndpointSlice controller puts on headless services' slices.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The node label holding its zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// The namespace of a (manifest) object that names none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Session affinity timeout when `ClientIP` affinity names none (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
/// The largest session affinity timeout the API allows (1 day).
pub const MAX_AFFINITY_TIMEOUT: u32 = 86_400;

/// Most examples a single aggregated problem lists.
const MAX_EXAMPLES: usize = 5;

/// A namespaced object's identity: the namespace interned, the name
/// shared by every copy of the key (and the service port names made from
/// it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: Name,
    pub name: Name,
}

impl ObjectKey {
    pub fn new(namespace: impl AsRef<str>, name: impl Into<Name>) -> Self {
        Self {
            namespace: crate::model::intern(namespace.as_ref()),
            name: name.into(),
        }
    }

    /// The key of an object; `None` when it has no name. A missing
    /// namespace (common in manifest files) means `default`.
    pub fn from_meta(meta: &ObjectMeta) -> Option<Self> {
        let name = named(meta)?;
        let namespace = meta
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(DEFAULT_NAMESPACE);
        Some(Self::new(namespace, name))
    }
}

/// The object's name, if it has one (what `ObjectKey::from_meta` needs,
/// checked without building the key).
fn named(meta: &ObjectMeta) -> Option<&str> {
    meta.name.as_deref().filter(|n| !n.is_empty())
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How problems name an object: `Service default/web`.
pub(crate) fn object_label(kind: &str, meta: &ObjectMeta) -> String {
    match ObjectKey::from_meta(meta) {
        Some(key) => format!("{kind} {key}"),
        None => format!("{kind} <unnamed>"),
    }
}

/// Problems of one object, all named alike.
struct Problems<'a> {
    object: Label<'a>,
    list: Vec<Problem>,
}

/// How problems name their object: built only when there is a problem
/// (most objects have none; a list converts 200,000).
enum Label<'a> {
    Object(&'static str, &'a ObjectMeta),
    Text(String),
}

impl<'a> Problems<'a> {
    fn new(object: String) -> Self {
        Self {
            object: Label::Text(object),
            list: Vec::new(),
        }
    }

    /// Problems of the object of `kind` that `meta` names.
    fn of(kind: &'static str, meta: &'a ObjectMeta) -> Self {
        Self {
            object: Label::Object(kind, meta),
            list: Vec::new(),
        }
    }

    fn error(&self, reason: ProblemReason, detail: impl Into<String>) -> Problem {
        let object = match &self.object {
            Label::Object(kind, meta) => object_label(kind, meta),
            Label::Text(text) => text.clone(),
        };
        Problem::new(object, reason, detail)
    }

    fn push(&mut self, reason: ProblemReason, detail: impl Into<String>) {
        let p = self.error(reason, detail);
        self.list.push(p);
    }

    /// One problem for many bad values of one kind; `what` is worded
    /// only when there is one (most objects have none).
    fn push_many(&mut self, reason: ProblemReason, what: impl fmt::Display, values: &[String]) {
        if values.is_empty() {
            return;
        }
        let mut shown: Vec<String> = values
            .iter()
            .take(MAX_EXAMPLES)
            .map(|v| format!("{v:?}"))
            .collect();
        if values.len() > MAX_EXAMPLES {
            shown.push(format!("and {} more", values.len() - MAX_EXAMPLES));
        }
        self.push(
            reason,
            format!("{} {what} skipped: {}", values.len(), shown.join(", ")),
        );
    }

    fn into_vec(mut self) -> Vec<Problem> {
        self.list.shrink_to_fit();
        self.list
    }
}

fn has_label(meta: &ObjectMeta, label: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(label))
}

/// Whether kube-proxy's label selector excludes the object: services (and
/// their slices) labelled for another proxy, or headless.
fn excluded_by_labels(meta: &ObjectMeta) -> bool {
    has_label(meta, LABEL_SERVICE_PROXY_NAME) || has_label(meta, LABEL_HEADLESS)
}

fn parse_ip(s: &str) -> Option<IpAddr> {
    s.trim().parse().ok()
}

/// A port number from the API's `int32`, if it is a valid port.
fn valid_port(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// The API's protocol spelling; `None` (the API default) is TCP.
fn parse_proto(p: Option<&str>) -> Result<Proto, &str> {
    match p {
        None | Some("TCP") => Ok(Proto::Tcp),
        Some("UDP") => Ok(Proto::Udp),
        Some("SCTP") => Ok(Proto::Sctp),
        Some(other) => Err(other),
    }
}

/// An IP network, e.g. a `loadBalancerSourceRanges` entry. Host bits are
/// cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl IpNet {
    /// Parses `addr/len` (surrounding whitespace allowed, as the API
    /// mistakenly allows it).
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, len) = s.trim().split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let prefix_len: u8 = len.parse().ok()?;
        let addr = match addr {
            IpAddr::V4(a) if prefix_len <= 32 => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(prefix_len))
                    .unwrap_or(0);
                IpAddr::from((u32::from(a) & mask).to_be_bytes())
            }
            IpAddr::V6(a) if prefix_len <= 128 => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(prefix_len))
                    .unwrap_or(0);
                IpAddr::from((u128::from(a) & mask).to_be_bytes())
            }
            _ => return None,
        };
        Some(Self { addr, prefix_len })
    }
}

impl IpNet {
    /// Whether `addr` lies in this network.
    pub fn contains(&self, addr: IpAddr) -> bool {
        match Self::parse(&format!("{addr}/{}", self.prefix_len)) {
            Some(net) => net.addr == self.addr && addr.is_ipv4() == self.addr.is_ipv4(),
            None => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// The service types that get a proxy (ExternalName services are ignored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ServiceType {
    #[default]
    ClusterIp,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    /// Whether the type opens node ports.
    pub fn has_node_ports(self) -> bool {
        matches!(self, Self::NodePort | Self::LoadBalancer)
    }
}

/// One TCP or UDP port of a service.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortInfo {
    /// The port's name; empty when unnamed. Interned: most services name
    /// their ports alike (`http`), and a `String` each was an allocation
    /// of every service and slice (docs/performance.md, issue 17).
    pub name: Name,
    pub proto: Proto,
    pub port: u16,
    /// The node port, if one is allocated.
    pub node_port: Option<u16>,
}

impl PortInfo {
    /// The name `ServicePortName` uses: the port's name, or its number
    /// when unnamed.
    pub fn port_name(&self) -> Name {
        if self.name.is_empty() {
            crate::model::intern(&self.port.to_string())
        } else {
            self.name.clone()
        }
    }
}

/// Which list last held a stored object (the sync task's stores flip
/// their mark at each list's start and drop, at its end, whatever still
/// has the old one). Not part of the object: equal and hashed alike
/// whatever it holds, so an unchanged object listed again compares
/// equal. It fits in the objects' padding.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListMark(pub bool);

impl PartialEq for ListMark {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ListMark {}

impl std::hash::Hash for ListMark {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// What sluice needs of a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    pub service_type: ServiceType,
    /// `spec.clusterIPs` (or `spec.clusterIP`) of the service's families.
    pub cluster_ips: Inline<IpAddr>,
    /// The families the service is served in: no frontend of another
    /// family exists (see `IpFamilies`).
    pub ip_families: IpFamilies,
    pub ports: Inline<PortInfo>,
    /// `spec.ports` is not empty, usable or not (kube-proxy's cluster-ips
    /// set holds the cluster IP of a service with an SCTP port too).
    pub has_ports: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_traffic_local: bool,
    /// `externalTrafficPolicy: Local` on a NodePort or LoadBalancer
    /// service. Like kube-proxy (ExternalPolicyLocal), other types ignore
    /// the field: their external IPs use policy Cluster.
    pub external_traffic_local: bool,
    /// `sessionAffinity: ClientIP` with its timeout in seconds.
    pub session_affinity_timeout: Option<u32>,
    pub health_check_node_port: Option<u16>,
    pub allocate_load_balancer_node_ports: bool,
    /// `service.sluice.dev/lb-algorithm: maglev`.
    pub maglev: bool,
    /// What most services leave empty; `None` when all of it is.
    pub extras: Option<Box<ServiceExtras>>,
    /// The stores' list mark (not part of the object).
    pub listed: ListMark,
}

/// The parts of a Service most leave empty, behind one pointer: four
/// empty boxed slices in place took 64 bytes of every service in the
/// stores (6 MB at 100,000 services).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceExtras {
    /// `spec.externalIPs` of the service's families.
    pub external_ips: Box<[IpAddr]>,
    /// `status.loadBalancer.ingress[].ip` of VIP-mode ingresses, of the
    /// service's families.
    pub load_balancer_ips: Box<[IpAddr]>,
    pub load_balancer_source_ranges: Box<[IpNet]>,
    /// What of the object was left out, and why.
    pub problems: Box<[Problem]>,
}

impl ServiceExtras {
    /// `None` when every part is empty.
    fn boxed(self) -> Option<Box<Self>> {
        (self != Self::default()).then(|| Box::new(self))
    }
}

impl ServiceInfo {
    pub fn external_ips(&self) -> &[IpAddr] {
        self.extras.as_ref().map_or(&[], |e| &e.external_ips)
    }

    pub fn load_balancer_ips(&self) -> &[IpAddr] {
        self.extras.as_ref().map_or(&[], |e| &e.load_balancer_ips)
    }

    pub fn load_balancer_source_ranges(&self) -> &[IpNet] {
        self.extras
            .as_ref()
            .map_or(&[], |e| &e.load_balancer_source_ranges)
    }

    pub fn problems(&self) -> &[Problem] {
        self.extras.as_ref().map_or(&[], |e| &e.problems)
    }

    /// Validates and trims a Service. `Ok(None)`: ignored like kube-proxy
    /// ignores it (ExternalName, headless, labelled for another proxy).
    pub fn from_service(svc: &Service) -> Result<Option<Self>, Problem> {
        let meta = &svc.metadata;
        let mut problems = Problems::of("Service", meta);
        if named(meta).is_none() {
            return Err(problems.error(ProblemReason::MissingField, "metadata.name is missing"));
        }
        if excluded_by_labels(meta) {
            return Ok(None);
        }
        let Some(spec) = svc.spec.as_ref() else {
            return Err(problems.error(ProblemReason::MissingField, "spec is missing"));
        };
        let service_type = match spec.type_.as_deref() {
            None | Some("ClusterIP") => ServiceType::ClusterIp,
            Some("NodePort") => ServiceType::NodePort,
            Some("LoadBalancer") => ServiceType::LoadBalancer,
            Some("ExternalName") => return Ok(None),
            Some(other) => {
                return Err(problems.error(
                    ProblemReason::InvalidValue,
                    format!("unknown service type {other:?}"),
                ))
            }
        };

        let mut raw_cluster_ips: Vec<&str> = spec
            .cluster_ips
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        if raw_cluster_ips.is_empty() {
            raw_cluster_ips.extend(spec.cluster_ip.as_deref().filter(|s| !s.is_empty()));
        }
        match raw_cluster_ips.first() {
            Some(&"None") => return Ok(None),
            None => {
                return Err(problems.error(ProblemReason::MissingField, "spec.clusterIP is missing"))
            }
            Some(_) => {}
        }
        let cluster_ips = parse_ips(&raw_cluster_ips, "cluster IP(s)", &mut problems);
        let (ip_families, cluster_ips) = service_families(spec, cluster_ips, &mut problems);
        let raw_external: Vec<&str> = spec
            .external_ips
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        let external_ips = ip_families.keep(
            parse_ips(&raw_external, "external IP(s)", &mut problems),
            "external IP(s)",
            &mut problems,
        );
        let load_balancer_ips = ip_families.keep(
            load_balancer_ips(svc, &mut problems),
            "load balancer ingress IP(s)",
            &mut problems,
        );
        let ports = parse_ports(spec, &mut problems);

        let internal_traffic_local = traffic_policy(
            spec.internal_traffic_policy.as_deref(),
            "internalTrafficPolicy",
            &mut problems,
        );
        let external_traffic_local = traffic_policy(
            spec.external_traffic_policy.as_deref(),
            "externalTrafficPolicy",
            &mut problems,
        ) && service_type.has_node_ports();
        let session_affinity_timeout = session_affinity(spec, &mut problems);
        let maglev = lb_algorithm(meta, &mut problems);

        let mut bad_ranges = Vec::new();
        let mut load_balancer_source_ranges = Vec::new();
        for r in spec.load_balancer_source_ranges.iter().flatten() {
            match IpNet::parse(r) {
                Some(net) => load_balancer_source_ranges.push(net),
                None => bad_ranges.push(r.clone()),
            }
        }
        problems.push_many(
            ProblemReason::InvalidAddress,
            "loadBalancerSourceRanges entr(y/ies)",
            &bad_ranges,
        );

        let health_check_node_port = match spec.health_check_node_port {
            None | Some(0) => None,
            Some(p) => {
                let port = valid_port(p);
                if port.is_none() {
                    problems.push(
                        ProblemReason::InvalidPort,
                        format!("healthCheckNodePort {p} is outside 1..=65535"),
                    );
                }
                port
            }
        };

        Ok(Some(Self {
            listed: ListMark::default(),
            service_type,
            cluster_ips: cluster_ips.into(),
            ip_families,
            ports: ports.into(),
            has_ports: spec.ports.as_ref().is_some_and(|p| !p.is_empty()),
            internal_traffic_local,
            external_traffic_local,
            session_affinity_timeout,
            health_check_node_port,
            allocate_load_balancer_node_ports: spec
                .allocate_load_balancer_node_ports
                .unwrap_or(true),
            maglev,
            extras: ServiceExtras {
                external_ips: external_ips.into(),
                load_balancer_ips: load_balancer_ips.into(),
                load_balancer_source_ranges: load_balancer_source_ranges.into(),
                problems: problems.into_vec().into(),
            }
            .boxed(),
        }))
    }
}

/// The service's families and its cluster IPs of those families.
/// `spec.ipFamilies` names them; a family listed without a cluster IP of
/// it is not served (kube-proxy's GetClusterIPByFamily finds no cluster
/// IP), a cluster IP of an unlisted family is reported and left out.
/// Without `ipFamilies` (or with no value sluice knows), the families of
/// the cluster IPs, as the API server would default the field. With no
/// usable cluster IP at all (reported already), the declared families,
/// or both: the rest of the service is kept.
fn service_families(
    spec: &ServiceSpec,
    cluster_ips: Vec<IpAddr>,
    problems: &mut Problems,
) -> (IpFamilies, Vec<IpAddr>) {
    let mut declared = IpFamilies::default();
    let mut unknown = Vec::new();
    for f in spec.ip_families.iter().flatten() {
        match f.as_str() {
            "IPv4" => declared.v4 = true,
            "IPv6" => declared.v6 = true,
            other => unknown.push(other.to_owned()),
        }
    }
    problems.push_many(
        ProblemReason::InvalidValue,
        "ipFamilies entr(y/ies)",
        &unknown,
    );
    let (kept, fallback) = if declared.is_empty() {
        (cluster_ips, IpFamilies::BOTH)
    } else {
        (
            declared.keep(cluster_ips, "cluster IP(s)", problems),
            declared,
        )
    };
    let families = Some(IpFamilies::of(&kept))
        .filter(|f| !f.is_empty())
        .unwrap_or(fallback);
    (families, kept)
}

/// Parses addresses, reporting the bad ones together; order kept,
/// duplicates dropped.
fn parse_ips(raw: &[&str], what: &str, problems: &mut Problems) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(raw.len());
    let mut bad = Vec::new();
    let mut refused = Vec::new();
    for s in raw {
        match parse_ip(s) {
            Some(ip) => match forbidden(ip) {
                Some(why) => refused.push(format!("{ip} ({why})")),
                None if !out.contains(&ip) => out.push(ip),
                None => {}
            },
            None => bad.push((*s).to_owned()),
        }
    }
    problems.push_many(ProblemReason::InvalidAddress, what, &bad);
    problems.push_many(
        ProblemReason::ForbiddenAddress,
        format_args!("{what} on an address that is never a service's"),
        &refused,
    );
    out
}

fn load_balancer_ips(svc: &Service, problems: &mut Problems) -> Vec<IpAddr> {
    let ingress = svc
        .status
        .iter()
        .filter_map(|s| s.load_balancer.as_ref())
        .flat_map(|lb| lb.ingress.iter().flatten());
    let mut raw = Vec::new();
    for ing in ingress {
        // Hostname-only ingresses have nothing to capture.
        let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        match ing.ip_mode.as_deref() {
            None | Some("VIP") => raw.push(ip),
            // The load balancer proxies: traffic reaches nodes with the
            // node's address as destination, nothing to capture.
            Some("Proxy") => {}
            Some(other) => problems.push(
                ProblemReason::InvalidValue,
                format!("load balancer ingress {ip}: unknown ipMode {other:?}, ingress skipped"),
            ),
        }
    }
    parse_ips(&raw, "load balancer ingress IP(s)", problems)
}

fn parse_ports(spec: &ServiceSpec, problems: &mut Problems) -> Vec<PortInfo> {
    let list = spec.ports.as_deref().unwrap_or_default();
    if list.is_empty() {
        problems.push(ProblemReason::MissingField, "spec.ports is empty");
    }
    let mut out: Vec<PortInfo> = Vec::with_capacity(list.len());
    for (i, p) in list.iter().enumerate() {
        if let Some(port) = parse_port(i, p, problems) {
            if out
                .iter()
                .any(|o| o.name == port.name && o.proto == port.proto)
            {
                problems.push(
                    ProblemReason::Duplicate,
                    format!(
                        "port {:?}/{} appears more than once, later one skipped",
                        port.name, port.proto
                    ),
                );
                continue;
            }
            out.push(port);
        }
    }
    out
}

fn parse_port(index: usize, p: &ServicePort, problems: &mut Problems) -> Option<PortInfo> {
    let name = p.name.as_deref().unwrap_or_default();
    // Named only for a problem.
    let what = || {
        if name.is_empty() {
            format!("port #{index} ({})", p.port)
        } else {
            format!("port {name:?} ({})", p.port)
        }
    };
    let proto = match parse_proto(p.protocol.as_deref()) {
        Ok(proto) => proto,
        Err(other) => {
            problems.push(
                ProblemReason::UnsupportedProtocol,
                format!(
                    "{}: protocol {other} is not supported, port skipped",
                    what()
                ),
            );
            return None;
        }
    };
    let Some(port) = valid_port(p.port) else {
        problems.push(
            ProblemReason::InvalidPort,
            format!("{}: port is outside 1..=65535, port skipped", what()),
        );
        return None;
    };
    let node_port = match p.node_port {
        None | Some(0) => None,
        Some(np) => {
            let valid = valid_port(np);
            if valid.is_none() {
                problems.push(
                    ProblemReason::InvalidPort,
                    format!(
                        "{}: nodePort {np} is outside 1..=65535, no node port",
                        what()
                    ),
                );
            }
            valid
        }
    };
    Some(PortInfo {
        // Interned once valid: a refused port's name stays out of the pool.
        name: crate::model::intern(name),
        proto,
        port,
        node_port,
    })
}

/// Whether the service asks for Maglev; an unknown algorithm is reported
/// and the default used.
fn lb_algorithm(meta: &ObjectMeta, problems: &mut Problems) -> bool {
    let value = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LB_ALGORITHM));
    match value.map(String::as_str) {
        None | Some("") | Some("random") => false,
        Some("maglev") => true,
        Some(other) => {
            problems.push(
                ProblemReason::InvalidValue,
                format!(
                    "annotation {ANNOTATION_LB_ALGORITHM} {other:?} is neither maglev nor random, random used"
                ),
            );
            false
        }
    }
}

/// `true` for `Local`; `Cluster` and unset are the default.
fn traffic_policy(value: Option<&str>, field: &str, problems: &mut Problems) -> bool {
    match value {
        None | Some("") | Some("Cluster") => false,
        Some("Local") => true,
        Some(other) => {
            problems.push(
                ProblemReason::InvalidValue,
                format!("{field} {other:?} is neither Cluster nor Local, Cluster used"),
            );
            false
        }
    }
}

fn session_affinity(spec: &ServiceSpec, problems: &mut Problems) -> Option<u32> {
    match spec.session_affinity.as_deref() {
        None | Some("") | Some("None") => None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match timeout {
                None => Some(DEFAULT_AFFINITY_TIMEOUT),
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=MAX_AFFINITY_TIMEOUT).contains(&t) => Some(t),
                    _ => {
                        problems.push(
                            ProblemReason::InvalidValue,
                            format!(
                                "sessionAffinityConfig.clientIP.timeoutSeconds {t} is outside \
                                 1..={MAX_AFFINITY_TIMEOUT}, {DEFAULT_AFFINITY_TIMEOUT} used"
                            ),
                        );
                        Some(DEFAULT_AFFINITY_TIMEOUT)
                    }
                },
            }
        }
        Some(other) => {
            problems.push(
                ProblemReason::InvalidValue,
                format!("sessionAffinity {other:?} is neither None nor ClientIP, None used"),
            );
            None
        }
    }
}

/// The address family of an EndpointSlice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressFamily {
    V4,
    V6,
}

impl AddressFamily {
    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }
}

/// The address families a service is served in. kube-proxy runs one
/// proxier per family and proxies a service in a family only when the
/// service has a cluster IP of it: an IPv4-only service gets no IPv6 node
/// port, external IP or load-balancer rule, and IPv6 packets to its node
/// port are left alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IpFamilies {
    pub v4: bool,
    pub v6: bool,
}

impl IpFamilies {
    pub const BOTH: Self = Self { v4: true, v6: true };

    /// The families of `addrs`.
    pub fn of(addrs: &[IpAddr]) -> Self {
        Self {
            v4: addrs.iter().any(IpAddr::is_ipv4),
            v6: addrs.iter().any(IpAddr::is_ipv6),
        }
    }

    pub fn contains(self, family: AddressFamily) -> bool {
        match family {
            AddressFamily::V4 => self.v4,
            AddressFamily::V6 => self.v6,
        }
    }

    pub fn is_empty(self) -> bool {
        !self.v4 && !self.v6
    }

    /// The addresses of these families, in order; the others reported
    /// together as `what`.
    fn keep(self, addrs: Vec<IpAddr>, what: &str, problems: &mut Problems) -> Vec<IpAddr> {
        let (kept, stray): (Vec<IpAddr>, Vec<IpAddr>) = addrs
            .into_iter()
            .partition(|a| self.contains(AddressFamily::of(*a)));
        let stray: Vec<String> = stray.iter().map(ToString::to_string).collect();
        problems.push_many(
            ProblemReason::InvalidAddress,
            format_args!("{what} of a family the service does not have (ipFamilies)"),
            &stray,
        );
        kept
    }
}

/// An endpoint's conditions as kube-proxy reads them (nil `ready` and
/// `serving` mean true, nil `terminating` means false, as the API
/// documents).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    pub fn from_k8s(c: Option<&EndpointConditions>) -> Self {
        let c = c.cloned().unwrap_or_default();
        Self {
            ready: c.ready.unwrap_or(true),
            serving: c.serving.unwrap_or(true),
            terminating: c.terminating.unwrap_or(false),
        }
    }

    /// The backend state: ready, else terminating-and-serving, else
    /// terminating, else not ready.
    pub fn state(self) -> BackendState {
        if self.ready {
            BackendState::Active
        } else if self.terminating && self.serving {
            BackendState::TerminatingServing
        } else if self.terminating {
            BackendState::Terminating
        } else {
            BackendState::NotReady
        }
    }

    /// Whether kube-proxy would ever send new traffic to it (ready, or
    /// serving while terminating).
    pub fn usable(self) -> bool {
        self.ready || (self.serving && self.terminating)
    }
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlicePort {
    /// Matches `PortInfo::name`; empty when unnamed. Interned.
    pub name: Name,
    pub proto: Proto,
    pub port: u16,
}

/// One endpoint of an EndpointSlice (its first address: kube-proxy looks
/// at no other).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SliceEndpoint {
    pub addr: IpAddr,
    pub conditions: Conditions,
    /// Where it runs: its node and topology hints, interned (a cluster
    /// has few combinations; see `places`); `None` for an endpoint
    /// without node or hints.
    pub place: Option<PlaceId>,
}

/// An endpoint's node and topology hints, interned (`places::intern`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Place {
    pub node_name: Option<Name>,
    /// `hints.forZones[].name`, sorted.
    pub zones: Box<[Name]>,
    /// `hints.forNodes[].name`, sorted (written for services with
    /// `trafficDistribution: PreferSameNode`).
    pub nodes: Box<[Name]>,
}

impl SliceEndpoint {
    /// A view of it, as a stored endpoint gives one.
    pub fn as_ref(&self) -> EndpointRef<'static> {
        EndpointRef {
            addr: self.addr,
            conditions: self.conditions,
            place: self.place.and_then(PlaceId::place),
        }
    }
}

/// One stored endpoint, read: its address, conditions and place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointRef<'a> {
    pub addr: IpAddr,
    pub conditions: Conditions,
    pub place: Option<&'a Place>,
}

impl<'a> EndpointRef<'a> {
    /// `nodeName`, if set.
    pub fn node_name(&self) -> Option<&'a str> {
        self.place.and_then(|p| p.node_name.as_deref())
    }

    /// `hints.forZones[].name`, sorted.
    pub fn zone_hints(&self) -> &'a [Name] {
        self.place.map_or(&[], |p| &p.zones)
    }

    /// `hints.forNodes[].name`, sorted.
    pub fn node_hints(&self) -> &'a [Name] {
        self.place.map_or(&[], |p| &p.nodes)
    }
}

/// A slice's endpoints, sorted by address, stored by family (a slice has
/// one address type): 8 bytes an IPv4 endpoint, its address and one word
/// for its conditions and place, instead of the 32 of an `IpAddr` beside
/// a pointer. At 100,000 services of 10 endpoints the stores held 35 MB
/// of endpoints; 16 bytes each (an `Arc` to the place) still 16 MB.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SliceEndpoints {
    V4(Box<[Stored<std::net::Ipv4Addr>]>),
    V6(Box<[Stored<std::net::Ipv6Addr>]>),
}

/// One endpoint as a slice stores it (see [`SliceEndpoints`]): the
/// conditions in the word's low 3 bits, the place's id (0: none) above.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stored<A> {
    addr: A,
    word: u32,
}

const READY: u32 = 1;
const SERVING: u32 = 2;
const TERMINATING: u32 = 4;
const CONDITION_BITS: u32 = 3;
const _: () = assert!(CONDITION_BITS + places::ID_BITS == 32);

impl<A: Copy + Into<IpAddr>> Stored<A> {
    fn new(addr: A, conditions: Conditions, place: Option<PlaceId>) -> Self {
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        Stored {
            addr,
            word: place.map_or(0, |p| p.get() << CONDITION_BITS)
                | bit(conditions.ready, READY)
                | bit(conditions.serving, SERVING)
                | bit(conditions.terminating, TERMINATING),
        }
    }

    fn view(&self) -> EndpointRef<'static> {
        EndpointRef {
            addr: self.addr.into(),
            conditions: Conditions {
                ready: self.word & READY != 0,
                serving: self.word & SERVING != 0,
                terminating: self.word & TERMINATING != 0,
            },
            place: PlaceId::from_number(self.word >> CONDITION_BITS).and_then(PlaceId::place),
        }
    }
}

impl Default for SliceEndpoints {
    fn default() -> Self {
        SliceEndpoints::V4(Box::default())
    }
}

impl SliceEndpoints {
    /// Stores `endpoints` (sorted by address), all of `family`; an
    /// endpoint of the other family is left out (`SliceInfo::from_slice`
    /// reports those before).
    pub fn new(family: AddressFamily, endpoints: Vec<SliceEndpoint>) -> Self {
        /// The endpoints whose address `addr` takes, stored with it.
        fn stored<A: Copy + Into<IpAddr>>(
            endpoints: Vec<SliceEndpoint>,
            addr: fn(IpAddr) -> Option<A>,
        ) -> Box<[Stored<A>]> {
            endpoints
                .into_iter()
                .filter_map(|e| Some(Stored::new(addr(e.addr)?, e.conditions, e.place)))
                .collect()
        }
        match family {
            AddressFamily::V4 => SliceEndpoints::V4(stored(endpoints, |a| match a {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            })),
            AddressFamily::V6 => SliceEndpoints::V6(stored(endpoints, |a| match a {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            })),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            SliceEndpoints::V4(e) => e.len(),
            SliceEndpoints::V6(e) => e.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Endpoint `i`, in address order.
    pub fn get(&self, i: usize) -> Option<EndpointRef<'static>> {
        match self {
            SliceEndpoints::V4(e) => e.get(i).map(Stored::view),
            SliceEndpoints::V6(e) => e.get(i).map(Stored::view),
        }
    }

    /// Every endpoint, in address order.
    pub fn iter(&self) -> impl Iterator<Item = EndpointRef<'static>> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Bytes the endpoints take (places not counted: they are shared).
    pub fn heap_bytes(&self) -> usize {
        match self {
            SliceEndpoints::V4(e) => std::mem::size_of_val::<[_]>(e),
            SliceEndpoints::V6(e) => std::mem::size_of_val::<[_]>(e),
        }
    }
}

/// What sluice needs of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    /// The service (same namespace) the slice belongs to; the stores
    /// make it share the Service key's string (`stores.rs`, `share`).
    pub service: Name,
    pub family: AddressFamily,
    pub ports: Inline<SlicePort>,
    /// Sorted by address.
    pub endpoints: SliceEndpoints,
    /// What of the object was left out, and why.
    pub problems: Rare<Problem>,
    /// The stores' list mark (not part of the object).
    pub listed: ListMark,
}

impl SliceInfo {
    /// Validates and trims an EndpointSlice. `Ok(None)`: ignored (FQDN
    /// slices, slices of services kube-proxy's label selector excludes).
    pub fn from_slice(slice: &EndpointSlice) -> Result<Option<Self>, Problem> {
        let meta = &slice.metadata;
        let mut problems = Problems::of("EndpointSlice", meta);
        if named(meta).is_none() {
            return Err(problems.error(ProblemReason::MissingField, "metadata.name is missing"));
        }
        if excluded_by_labels(meta) {
            return Ok(None);
        }
        let service = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .filter(|s| !s.is_empty());
        let Some(service) = service else {
            return Err(problems.error(
                ProblemReason::MissingField,
                format!("label {LABEL_SERVICE_NAME} is missing"),
            ));
        };
        let family = match slice.address_type.as_str() {
            "IPv4" => AddressFamily::V4,
            "IPv6" => AddressFamily::V6,
            "FQDN" => return Ok(None),
            "" => return Err(problems.error(ProblemReason::MissingField, "addressType is missing")),
            other => {
                return Err(problems.error(
                    ProblemReason::InvalidValue,
                    format!("unknown addressType {other:?}"),
                ))
            }
        };

        let mut ports: Vec<SlicePort> =
            Vec::with_capacity(slice.ports.as_ref().map_or(0, Vec::len));
        for p in slice.ports.iter().flatten() {
            // The API documents an unset name as the empty string.
            let name = p.name.as_deref().unwrap_or_default();
            let proto = match parse_proto(p.protocol.as_deref()) {
                Ok(proto) => proto,
                Err(other) => {
                    problems.push(
                        ProblemReason::UnsupportedProtocol,
                        format!("port {name:?}: protocol {other} is not supported, port skipped"),
                    );
                    continue;
                }
            };
            // An unset port means "all ports", which kube-proxy does not
            // implement either.
            let Some(raw) = p.port else { continue };
            let Some(port) = valid_port(raw) else {
                problems.push(
                    ProblemReason::InvalidPort,
                    format!("port {name:?}: {raw} is outside 1..=65535, port skipped"),
                );
                continue;
            };
            if ports.iter().any(|o| *o.name == *name && o.proto == proto) {
                problems.push(
                    ProblemReason::Duplicate,
                    format!("port {name:?}/{proto} appears more than once, later one skipped"),
                );
                continue;
            }
            // Interned once valid: a refused port's name stays out of the
            // pool.
            let name = crate::model::intern(name);
            ports.push(SlicePort { name, proto, port });
        }

        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        let mut bad = Vec::new();
        let mut wrong_family = Vec::new();
        let mut refused = Vec::new();
        let mut no_address = 0usize;
        for ep in &slice.endpoints {
            match endpoint(ep, family) {
                Ok(e) => endpoints.push(e),
                Err(EndpointError::NoAddress) => no_address += 1,
                Err(EndpointError::Unparseable(a)) => bad.push(a),
                Err(EndpointError::WrongFamily(a)) => wrong_family.push(a),
                Err(EndpointError::Forbidden(a)) => refused.push(a),
            }
        }
        problems.push_many(
            ProblemReason::ForbiddenAddress,
            "endpoint address(es) that are never a backend's",
            &refused,
        );
        if no_address > 0 {
            problems.push(
                ProblemReason::MissingField,
                format!("{no_address} endpoint(s) without addresses skipped"),
            );
        }
        problems.push_many(ProblemReason::InvalidAddress, "endpoint address(es)", &bad);
        problems.push_many(
            ProblemReason::InvalidAddress,
            format_args!(
                "endpoint address(es) not of addressType {}",
                slice.address_type
            ),
            &wrong_family,
        );
        endpoints.sort_by_key(|e| e.addr);

        Ok(Some(Self {
            listed: ListMark::default(),
            service: service.as_str().into(),
            family,
            ports: ports.into(),
            endpoints: SliceEndpoints::new(family, endpoints),
            problems: problems.into_vec().into(),
        }))
    }
}

enum EndpointError {
    NoAddress,
    Unparseable(String),
    WrongFamily(String),
    Forbidden(String),
}

fn endpoint(ep: &K8sEndpoint, family: AddressFamily) -> Result<SliceEndpoint, EndpointError> {
    let raw = ep.addresses.first().ok_or(EndpointError::NoAddress)?;
    let addr = parse_ip(raw).ok_or_else(|| EndpointError::Unparseable(raw.clone()))?;
    if let Some(why) = forbidden(addr) {
        return Err(EndpointError::Forbidden(format!("{addr} ({why})")));
    }
    if AddressFamily::of(addr) != family {
        return Err(EndpointError::WrongFamily(raw.clone()));
    }
    let hints = ep.hints.as_ref();
    let zone_hints = sorted_names(
        hints
            .into_iter()
            .flat_map(|h| h.for_zones.iter().flatten())
            .map(|z| &z.name),
    );
    let node_hints = sorted_names(
        hints
            .into_iter()
            .flat_map(|h| h.for_nodes.iter().flatten())
            .map(|n| &n.name),
    );
    Ok(SliceEndpoint {
        addr,
        conditions: Conditions::from_k8s(ep.conditions.as_ref()),
        place: places::intern(Place {
            node_name: ep
                .node_name
                .as_deref()
                .filter(|n| !n.is_empty())
                .map(crate::model::intern),
            zones: zone_hints.into(),
            nodes: node_hints.into(),
        }),
    })
}

/// Hint names, sorted, without duplicates and empty names.
fn sorted_names<'a>(names: impl Iterator<Item = &'a String>) -> Vec<Name> {
    let mut out: Vec<&str> = names
        .filter(|n| !n.is_empty())
        .map(String::as_str)
        .collect();
    out.sort_unstable();
    out.dedup();
    out.into_iter().map(crate::model::intern).collect()
}

/// What sluice needs of its own Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
    /// InternalIP and ExternalIP addresses, sorted, every family.
    pub addresses: Vec<IpAddr>,
    /// `spec.podCIDRs` (or the older `spec.podCIDR`): the pods of this
    /// node, for local-traffic detection in NodeCIDR mode.
    pub pod_cidrs: Vec<IpNet>,
    /// What of the object was left out, and why.
    pub problems: Vec<Problem>,
    /// The stores' list mark (not part of the object).
    pub listed: ListMark,
}

impl NodeInfo {
    pub fn from_node(node: &Node) -> Result<Self, Problem> {
        let meta = &node.metadata;
        let name = meta.name.clone().filter(|n| !n.is_empty());
        let mut problems =
            Problems::new(format!("Node {}", name.as_deref().unwrap_or("<unnamed>")));
        let Some(name) = name else {
            return Err(problems.error(ProblemReason::MissingField, "metadata.name is missing"));
        };
        let zone = meta
            .labels
            .as_ref()
            .and_then(|l: &BTreeMap<String, String>| l.get(LABEL_TOPOLOGY_ZONE))
            .filter(|z| !z.is_empty())
            .cloned();
        let raw: Vec<&str> = node
            .status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
            .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            .map(|a| a.address.as_str())
            .collect();
        let mut addresses = parse_ips(&raw, "node address(es)", &mut problems);
        addresses.sort();
        let spec = node.spec.as_ref();
        let raw_cidrs: Vec<&str> = match spec.and_then(|s| s.pod_cidrs.as_ref()) {
            Some(list) if !list.is_empty() => list.iter().map(String::as_str).collect(),
            _ => spec
                .and_then(|s| s.pod_cidr.as_deref())
                .into_iter()
                .collect(),
        };
        let mut pod_cidrs = Vec::new();
        for raw in raw_cidrs {
            match IpNet::parse(raw) {
                Some(net) => pod_cidrs.push(net),
                None => problems.push(
                    ProblemReason::InvalidAddress,
                    format!("spec.podCIDRs entry `{raw}` is not a CIDR; ignored"),
                ),
            }
        }
        pod_cidrs.sort();
        pod_cidrs.dedup();
        Ok(Self {
            listed: ListMark::default(),
            name,
            zone,
            addresses,
            pod_cidrs,
            problems: problems.into_vec(),
        })
    }
}

/// What sluice needs of a `networking.k8s.io/v1` ServiceCIDR: the service
/// address ranges it adds (kube-proxy takes `spec.cidrs` of every object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceCidrInfo {
    /// `spec.cidrs`, host bits cleared.
    pub cidrs: Vec<IpNet>,
    /// What of the object was left out, and why.
    pub problems: Vec<Problem>,
    /// The stores' list mark (not part of the object).
    pub listed: ListMark,
}

impl ServiceCidrInfo {
    pub fn from_service_cidr(obj: &ServiceCIDR) -> Result<Self, Problem> {
        let name = obj.metadata.name.clone().filter(|n| !n.is_empty());
        let mut problems = Problems::new(format!(
            "ServiceCIDR {}",
            name.as_deref().unwrap_or("<unnamed>")
        ));
        if name.is_none() {
            return Err(problems.error(ProblemReason::MissingField, "metadata.name is missing"));
        }
        let mut cidrs = Vec::new();
        let raw = obj.spec.iter().flat_map(|s| s.cidrs.iter().flatten());
        for raw in raw {
            match IpNet::parse(raw) {
                Some(net) => cidrs.push(net),
                None => problems.push(
                    ProblemReason::InvalidAddress,
                    format!("spec.cidrs entry `{raw}` is not a CIDR; ignored"),
                ),
            }
        }
        cidrs.sort();
        cidrs.dedup();
        Ok(Self {
            listed: ListMark::default(),
            cidrs,
            problems: problems.into_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::builders::*;

    #[test]
    fn conditions_nil_and_explicit() {
        use BackendState::*;
        // (ready, serving, terminating) -> state; None = nil.
        type Case = (Option<bool>, Option<bool>, Option<bool>, BackendState);
        let cases: &[Case] = &[
            (None, None, None, Active),
            (None, None, Some(false), Active),
            (None, None, Some(true), Active),
            (None, Some(false), None, Active),
            (None, Some(false), Some(true), Active),
            (None, Some(true), Some(true), Active),
            (Some(true), None, None, Active),
            (Some(true), Some(false), Some(false), Active),
            (Some(true), Some(true), Some(true), Active),
            (Some(true), Some(false), Some(true), Active),
            // Not ready, not terminating: NotReady whatever serving says.
            (Some(false), None, None, NotReady),
            (Some(false), Some(true), None, NotReady),
            (Some(false), Some(false), None, NotReady),
            (Some(false), Some(true), Some(false), NotReady),
            (Some(false), Some(false), Some(false), NotReady),
            (Some(false), None, Some(false), NotReady),
            // Terminating: serving (nil means true) decides.
            (Some(false), Some(true), Some(true), TerminatingServing),
            (Some(false), None, Some(true), TerminatingServing),
            (Some(false), Some(false), Some(true), Terminating),
        ];
        for (ready, serving, terminating, want) in cases {
            let c = Conditions::from_k8s(Some(&EndpointConditions {
                ready: *ready,
                serving: *serving,
                terminating: *terminating,
            }));
            assert_eq!(
                c.state(),
                *want,
                "ready={ready:?} serving={serving:?} terminating={terminating:?}"
            );
            assert_eq!(
                c.usable(),
                matches!(want, Active | TerminatingServing),
                "usable: ready={ready:?} serving={serving:?} terminating={terminating:?}"
            );
        }
        assert_eq!(Conditions::from_k8s(None).state(), Active);
    }

    #[test]
    fn every_condition_combination_is_covered() {
        let opts = [None, Some(false), Some(true)];
        for ready in opts {
            for serving in opts {
                for terminating in opts {
                    let c = Conditions::from_k8s(Some(&EndpointConditions {
                        ready,
                        serving,
                        terminating,
                    }));
                    let r = ready.unwrap_or(true);
                    let s = serving.unwrap_or(true);
                    let t = terminating.unwrap_or(false);
                    let want = match (r, s, t) {
                        (true, _, _) => BackendState::Active,
                        (false, true, true) => BackendState::TerminatingServing,
                        (false, false, true) => BackendState::Terminating,
                        (false, _, false) => BackendState::NotReady,
                    };
                    assert_eq!(c.state(), want);
                }
            }
        }
    }

    #[test]
    fn service_basic_fields() {
        let svc = mk_service("default", "web", "10.96.0.10", &[port("http", "TCP", 80)]);
        let info = ServiceInfo::from_service(&svc).unwrap().unwrap();
        assert_eq!(info.service_type, ServiceType::ClusterIp);
        assert_eq!(*info.cluster_ips, [ip("10.96.0.10")]);
        assert_eq!(
            *info.ports,
            [PortInfo {
                name: "http".into(),
                proto: Proto::Tcp,
                port: 80,
                node_port: None
            }]
        );
        assert!(info.problems().is_empty());
        assert!(info.allocate_load_balancer_node_ports);
        assert_eq!(info.session_affinity_timeout, None);
    }

    #[test]
    fn service_ip_families() {
        let trim = |families: Option<&[&str]>, cluster_ips: &[&str]| {
            let mut svc = mk_service("default", "web", cluster_ips[0], &[port("", "TCP", 80)]);
            spec_mut(&mut svc).cluster_ips =
                Some(cluster_ips.iter().map(|s| (*s).into()).collect());
            if let Some(f) = families {
                set_ip_families(&mut svc, f);
            }
            ServiceInfo::from_service(&svc).unwrap().unwrap()
        };
        let v4 = IpFamilies {
            v4: true,
            v6: false,
        };
        let v6 = IpFamilies {
            v4: false,
            v6: true,
        };
        assert_eq!(trim(Some(&["IPv4"]), &["10.96.0.1"]).ip_families, v4);
        assert_eq!(trim(Some(&["IPv6"]), &["fd00::1"]).ip_families, v6);
        assert_eq!(
            trim(Some(&["IPv6", "IPv4"]), &["fd00::1", "10.96.0.1"]).ip_families,
            IpFamilies::BOTH
        );
        // No ipFamilies: what the cluster IPs say.
        assert_eq!(trim(None, &["10.96.0.1"]).ip_families, v4);
        assert_eq!(trim(None, &["fd00::1"]).ip_families, v6);
        assert_eq!(
            trim(None, &["10.96.0.1", "fd00::1"]).ip_families,
            IpFamilies::BOTH
        );
        // A family listed without its cluster IP is not served.
        let info = trim(Some(&["IPv4", "IPv6"]), &["10.96.0.1"]);
        assert_eq!(info.ip_families, v4);
        assert!(info.problems().is_empty());
        // A cluster IP of an unlisted family is reported and left out.
        let info = trim(Some(&["IPv4"]), &["10.96.0.1", "fd00::1"]);
        assert_eq!(info.ip_families, v4);
        assert_eq!(*info.cluster_ips, [ip("10.96.0.1")]);
        assert_eq!(info.problems().len(), 1);
        assert_eq!(info.problems()[0].reason, ProblemReason::InvalidAddress);
        // An unknown family is reported; the cluster IPs decide.
        let info = trim(Some(&["IPv5"]), &["10.96.0.1"]);
        assert_eq!(info.ip_families, v4);
        assert_eq!(info.problems()[0].reason, ProblemReason::InvalidValue);
    }

    #[test]
    fn lb_algorithm_annotation() {
        let with = |value: Option<&str>| {
            let mut svc = mk_service("default", "web", "10.96.0.10", &[port("http", "TCP", 80)]);
            if let Some(v) = value {
                svc.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION_LB_ALGORITHM.into(), v.into());
            }
            ServiceInfo::from_service(&svc).unwrap().unwrap()
        };
        assert!(!with(None).maglev);
        assert!(!with(Some("random")).maglev);
        let maglev = with(Some("maglev"));
        assert!(maglev.maglev && maglev.problems().is_empty());
        // An unknown algorithm: reported, the default used, the service kept.
        let bad = with(Some("round-robin"));
        assert!(!bad.maglev);
        assert_eq!(bad.problems().len(), 1);
        assert_eq!(bad.problems()[0].reason, ProblemReason::InvalidValue);
        assert!(bad.problems()[0].to_string().contains("round-robin"));
    }

    #[test]
    fn service_ignored_kinds() {
        let mut ext = mk_service("default", "ext", "", &[]);
        spec_mut(&mut ext).type_ = Some("ExternalName".into());
        spec_mut(&mut ext).external_name = Some("example.com".into());
        assert_eq!(ServiceInfo::from_service(&ext).unwrap(), None);

        let headless = mk_service("default", "db", "None", &[port("", "TCP", 5432)]);
        assert_eq!(ServiceInfo::from_service(&headless).unwrap(), None);

        let mut other = mk_service("default", "x", "10.96.0.1", &[port("", "TCP", 80)]);
        add_label(&mut other.metadata, LABEL_SERVICE_PROXY_NAME, "other-proxy");
        assert_eq!(ServiceInfo::from_service(&other).unwrap(), None);

        let mut hl = mk_service("default", "y", "10.96.0.2", &[port("", "TCP", 80)]);
        add_label(&mut hl.metadata, LABEL_HEADLESS, "");
        assert_eq!(ServiceInfo::from_service(&hl).unwrap(), None);
    }

    #[test]
    fn service_protocols() {
        let svc = mk_service(
            "default",
            "mixed",
            "10.96.0.3",
            &[
                port("dns", "UDP", 53),
                port("dns-tcp", "TCP", 53),
                port("sig", "SCTP", 3868),
                port("odd", "QUIC", 443),
            ],
        );
        let info = ServiceInfo::from_service(&svc).unwrap().unwrap();
        let kept: Vec<_> = info.ports.iter().map(|p| (&*p.name, p.proto)).collect();
        assert_eq!(
            kept,
            vec![
                ("dns", Proto::Udp),
                ("dns-tcp", Proto::Tcp),
                ("sig", Proto::Sctp)
            ]
        );
        assert_eq!(info.problems().len(), 1);
        assert!(info
            .problems()
            .iter()
            .all(|p| p.reason == ProblemReason::UnsupportedProtocol
                && p.object == "Service default/mixed"));
    }

    #[test]
    fn service_malformed() {
        let svc = Service {
            metadata: meta("default", "nospec"),
            ..Default::default()
        };
        let err = ServiceInfo::from_service(&svc).unwrap_err();
        assert_eq!(err.reason, ProblemReason::MissingField);
        assert_eq!(err.object, "Service default/nospec");

        let unnamed = Service::default();
        let err = ServiceInfo::from_service(&unnamed).unwrap_err();
        assert_eq!(err.reason, ProblemReason::MissingField);

        let noip = mk_service("default", "noip", "", &[port("", "TCP", 80)]);
        assert_eq!(
            ServiceInfo::from_service(&noip).unwrap_err().reason,
            ProblemReason::MissingField
        );

        let mut weird = mk_service("default", "weird", "10.96.0.1", &[]);
        spec_mut(&mut weird).type_ = Some("Magic".into());
        assert_eq!(
            ServiceInfo::from_service(&weird).unwrap_err().reason,
            ProblemReason::InvalidValue
        );
    }

    #[test]
    fn service_bad_parts_reported_good_parts_kept() {
        let mut svc = mk_service(
            "default",
            "web",
            "10.96.0.999",
            &[
                port("a", "TCP", 0),
                port("b", "TCP", 70000),
                port("c", "TCP", 80),
            ],
        );
        spec_mut(&mut svc).external_ips = Some(vec!["1.2.3.4".into(), "bogus".into()]);
        let info = ServiceInfo::from_service(&svc).unwrap().unwrap();
        assert!(info.cluster_ips.is_empty());
        assert_eq!(*info.external_ips(), [ip("1.2.3.4")]);
        assert_eq!(info.ports.len(), 1);
        assert_eq!(&*info.ports[0].name, "c");
        let reasons: Vec<_> = info.problems().iter().map(|p| p.reason).collect();
        assert_eq!(
            reasons,
            vec![
                ProblemReason::InvalidAddress,
                ProblemReason::InvalidAddress,
                ProblemReason::InvalidPort,
                ProblemReason::InvalidPort
            ]
        );
    }

    #[test]
    fn service_duplicate_port_reported() {
        let svc = mk_service(
            "default",
            "dup",
            "10.96.0.1",
            &[
                port("http", "TCP", 80),
                port("http", "TCP", 8080),
                port("http", "UDP", 80),
            ],
        );
        let info = ServiceInfo::from_service(&svc).unwrap().unwrap();
        assert_eq!(info.ports.len(), 2);
        assert_eq!(info.problems().len(), 1);
        assert_eq!(info.problems()[0].reason, ProblemReason::Duplicate);
    }

    #[test]
    fn service_optional_fields() {
        let mut svc = mk_service(
            "default",
            "lb",
            "10.96.0.5",
            &[node_port("http", "TCP", 80, 30080)],
        );
        {
            let spec = spec_mut(&mut svc);
            spec.type_ = Some("LoadBalancer".into());
            spec.session_affinity = Some("ClientIP".into());
            spec.load_balancer_source_ranges = Some(vec![
                " 10.1.2.3/8 ".into(),
                "192.168.0.0/16".into(),
                "nope/99".into(),
            ]);
            spec.health_check_node_port = Some(32000);
            spec.allocate_load_balancer_node_ports = Some(false);
            spec.external_traffic_policy = Some("Local".into());
            spec.internal_traffic_policy = Some("Local".into());
        }
        set_lb_ingress(
            &mut svc,
            &[("203.0.113.7", None), ("203.0.113.8", Some("Proxy"))],
        );
        let info = ServiceInfo::from_service(&svc).unwrap().unwrap();
        assert_eq!(info.service_type, ServiceType::LoadBalancer);
        assert_eq!(
            info.session_affinity_timeout,
            Some(DEFAULT_AFFINITY_TIMEOUT)
        );
        assert_eq!(
            *info.load_balancer_source_ranges(),
            [
                IpNet::parse("10.0.0.0/8").unwrap(),
                IpNet::parse("192.168.0.0/16").unwrap()
            ]
        );
        assert_eq!(
            info.load_balancer_source_ranges()[0].to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(info.health_check_node_port, Some(32000));
        assert!(!info.allocate_load_balancer_node_ports);
        assert!(info.external_traffic_local && info.internal_traffic_local);
        assert_eq!(*info.load_balancer_ips(), [ip("203.0.113.7")]);
        assert_eq!(info.ports[0].node_port, Some(30080));
        assert_eq!(info.problems().len(), 1);
        assert_eq!(info.problems()[0].reason, ProblemReason::InvalidAddress);

        let mut aff = mk_service("default", "aff", "10.96.0.6", &[port("", "TCP", 80)]);
        spec_mut(&mut aff).session_affinity = Some("ClientIP".into());
        spec_mut(&mut aff).session_affinity_config =
            Some(k8s_openapi::api::core::v1::SessionAffinityConfig {
                client_ip: Some(k8s_openapi::api::core::v1::ClientIPConfig {
                    timeout_seconds: Some(60),
                }),
            });
        let info = ServiceInfo::from_service(&aff).unwrap().unwrap();
        assert_eq!(info.session_affinity_timeout, Some(60));

        // externalTrafficPolicy means nothing on a ClusterIP service.
        let mut cip = mk_service("default", "cip", "10.96.0.7", &[port("", "TCP", 80)]);
        spec_mut(&mut cip).external_traffic_policy = Some("Local".into());
        let info = ServiceInfo::from_service(&cip).unwrap().unwrap();
        assert!(!info.external_traffic_local);
    }

    #[test]
    fn ipnet_parse() {
        assert_eq!(
            IpNet::parse("10.1.2.3/32").unwrap().to_string(),
            "10.1.2.3/32"
        );
        assert_eq!(IpNet::parse("10.1.2.3/0").unwrap().to_string(), "0.0.0.0/0");
        assert_eq!(
            IpNet::parse("2001:db8::1/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        assert_eq!(IpNet::parse("::/0").unwrap().to_string(), "::/0");
        assert!(IpNet::parse("10.0.0.0/33").is_none());
        assert!(IpNet::parse("10.0.0.0").is_none());
        assert!(IpNet::parse("x/8").is_none());
    }

    #[test]
    fn slice_basic_and_ignored() {
        let s = mk_slice(
            "default",
            "web-1",
            "web",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.2"), ep("10.0.0.1")],
        );
        let info = SliceInfo::from_slice(&s).unwrap().unwrap();
        assert_eq!(&*info.service, "web");
        assert_eq!(info.family, AddressFamily::V4);
        // Sorted by address.
        assert_eq!(info.endpoints.get(0).unwrap().addr, ip("10.0.0.1"));
        assert!(info.problems.is_empty());

        let mut fqdn = s.clone();
        fqdn.address_type = "FQDN".into();
        assert_eq!(SliceInfo::from_slice(&fqdn).unwrap(), None);

        let mut other = s.clone();
        add_label(&mut other.metadata, LABEL_SERVICE_PROXY_NAME, "x");
        assert_eq!(SliceInfo::from_slice(&other).unwrap(), None);

        let mut orphan = s.clone();
        orphan.metadata.labels = None;
        assert_eq!(
            SliceInfo::from_slice(&orphan).unwrap_err().reason,
            ProblemReason::MissingField
        );
    }

    #[test]
    fn slice_bad_parts() {
        let s = mk_slice(
            "default",
            "web-1",
            "web",
            &[
                slice_port("http", "TCP", 8080),
                slice_port("zero", "TCP", 0),
                slice_port("big", "TCP", 70000),
                slice_port_none("all"),
                slice_port("", "QUIC", 9),
            ],
            vec![
                ep("10.0.0.1"),
                ep("10.0.0.300"),
                ep("fd00::1"),
                K8sEndpoint::default(),
            ],
        );
        let info = SliceInfo::from_slice(&s).unwrap().unwrap();
        assert_eq!(info.ports.len(), 1);
        assert_eq!(info.endpoints.len(), 1);
        let reasons: Vec<_> = info.problems.iter().map(|p| p.reason).collect();
        assert_eq!(
            reasons,
            vec![
                ProblemReason::InvalidPort,
                ProblemReason::InvalidPort,
                ProblemReason::UnsupportedProtocol,
                ProblemReason::MissingField,
                ProblemReason::InvalidAddress,
                ProblemReason::InvalidAddress,
            ]
        );
    }

    #[test]
    fn slice_unnamed_port_and_hints() {
        let mut e = ep("10.0.0.1");
        set_zone_hints(&mut e, &["b", "a", "a"]);
        e.node_name = Some("n1".into());
        let s = mk_slice(
            "default",
            "s",
            "svc",
            &[slice_port_unnamed("TCP", 80)],
            vec![e],
        );
        let info = SliceInfo::from_slice(&s).unwrap().unwrap();
        assert_eq!(&*info.ports[0].name, "");
        let strs = |h: &[Name]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            strs(info.endpoints.get(0).unwrap().zone_hints()),
            ["a", "b"]
        );
        assert_eq!(info.endpoints.get(0).unwrap().node_name(), Some("n1"));
        assert!(info.endpoints.get(0).unwrap().node_hints().is_empty());

        let mut e = ep("10.0.0.2");
        set_node_hints(&mut e, &["n2", "", "n1", "n2"]);
        set_zone_hints(&mut e, &["a"]);
        let s = mk_slice("default", "s", "svc", &[slice_port("", "TCP", 80)], vec![e]);
        let info = SliceInfo::from_slice(&s).unwrap().unwrap();
        assert_eq!(
            strs(info.endpoints.get(0).unwrap().node_hints()),
            ["n1", "n2"]
        );
        assert_eq!(strs(info.endpoints.get(0).unwrap().zone_hints()), ["a"]);
    }

    #[test]
    fn node_info() {
        let n = mk_node(
            "n1",
            Some("zone-a"),
            &[
                ("InternalIP", "192.168.1.10"),
                ("ExternalIP", "203.0.113.1"),
                ("Hostname", "n1"),
                ("InternalIP", "fd00::10"),
                ("InternalIP", "garbage"),
            ],
        );
        let info = NodeInfo::from_node(&n).unwrap();
        assert_eq!(info.name, "n1");
        assert_eq!(info.zone.as_deref(), Some("zone-a"));
        assert_eq!(
            info.addresses,
            vec![ip("192.168.1.10"), ip("203.0.113.1"), ip("fd00::10")]
        );
        assert_eq!(info.problems.len(), 1);
        assert!(NodeInfo::from_node(&Node::default()).is_err());
    }

    #[test]
    fn object_key_defaults_namespace() {
        let mut m = meta("", "x");
        m.namespace = None;
        assert_eq!(
            ObjectKey::from_meta(&m),
            Some(ObjectKey::new("default", "x"))
        );
        assert_eq!(ObjectKey::from_meta(&ObjectMeta::default()), None);
        assert_eq!(ObjectKey::new("a", "b").to_string(), "a/b");
    }
}
