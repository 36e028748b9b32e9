//! The desired datapath state, as the translation from Kubernetes objects
//! produces it. Plain data, independent of both Kubernetes and BPF types.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
    sync::Mutex,
};

use crate::fast_hash::HashSet;

/// A shared string: the agent's object, namespace and port names. One
/// thin pointer (8 bytes, where an `Arc<str>` is 16) to a count, a length
/// and the bytes; every copy of a key, and every service port name made
/// from it, holds the pointer (docs/performance.md, issue 17).
pub type Name = arcstr::ArcStr;

/// The pool of [`intern`]ed strings.
static POOL: Mutex<Option<HashSet<Name>>> = Mutex::new(None);

/// One shared copy of a string that many objects repeat and that the
/// cluster has few of (namespaces, port names, node and zone names): every
/// holder keeps a pointer, not a copy. Unbounded sets (object names) are
/// never interned; what no object holds any more goes at the next full
/// resync ([`prune_interned`]).
pub fn intern(s: &str) -> Name {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let pool = pool.get_or_insert_with(HashSet::default);
    if let Some(s) = pool.get(s) {
        return s.clone();
    }
    let shared: Name = Name::from(s);
    pool.insert(shared.clone());
    shared
}

/// Drops the interned strings that only the pool still holds (port names
/// of slices long gone, say: a slice may name its ports anything), and
/// says how many went. A later `intern` of one makes a new copy.
pub fn prune_interned() -> usize {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pool) = pool.as_mut() else {
        return 0;
    };
    let before = pool.len();
    // (A static, the empty name, has no count: kept.)
    pool.retain(|s| Name::strong_count(s).is_none_or(|n| n > 1));
    before - pool.len()
}

pub use sluice_common::{BackendState, FrontendKind};

/// Transport protocols the datapath balances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    /// The IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => sluice_common::IPPROTO_TCP,
            Proto::Udp => sluice_common::IPPROTO_UDP,
            Proto::Sctp => sluice_common::IPPROTO_SCTP,
        }
    }

    pub const fn from_number(n: u8) -> Option<Self> {
        match n {
            sluice_common::IPPROTO_TCP => Some(Proto::Tcp),
            sluice_common::IPPROTO_UDP => Some(Proto::Udp),
            sluice_common::IPPROTO_SCTP => Some(Proto::Sctp),
            _ => None,
        }
    }

    /// The Kubernetes spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which sources a frontend's backend list serves. Every frontend has the
/// external scope; an externalTrafficPolicy Local frontend of an external
/// kind also has an internal one: kube-proxy restricts only traffic from
/// outside the cluster to node-local endpoints and sends pods (by
/// local-traffic detection) and the node itself to every endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    #[default]
    External,
    Internal,
}

impl Scope {
    /// The `scope` byte of the service-map keys.
    pub const fn number(self) -> u8 {
        match self {
            Scope::External => sluice_common::service::SCOPE_EXTERNAL,
            Scope::Internal => sluice_common::service::SCOPE_INTERNAL,
        }
    }

    pub const fn from_number(n: u8) -> Option<Self> {
        match n {
            sluice_common::service::SCOPE_EXTERNAL => Some(Scope::External),
            sluice_common::service::SCOPE_INTERNAL => Some(Scope::Internal),
            _ => None,
        }
    }
}

/// A service frontend: the address, port and protocol clients connect to,
/// and the scope of sources its entries serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
    pub scope: Scope,
}

impl FrontendKey {
    /// The external-scope frontend `addr:port/proto`.
    pub const fn new(addr: IpAddr, port: u16, proto: Proto) -> Self {
        Self {
            addr,
            port,
            proto,
            scope: Scope::External,
        }
    }

    /// The same address, port and protocol in `scope`.
    pub const fn in_scope(self, scope: Scope) -> Self {
        Self { scope, ..self }
    }
}

impl fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{}", self.port, self.proto)?,
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{}", self.port, self.proto)?,
        }
        match self.scope {
            Scope::External => Ok(()),
            Scope::Internal => f.write_str(" (internal)"),
        }
    }
}

/// What a frontend does with a new flow when it has no selectable backend
/// (kube-proxy: REJECT when the service has no usable endpoint at all,
/// DROP when endpoints exist but none may serve this traffic, e.g. traffic
/// policy Local on a node without local endpoints).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WhenEmpty {
    #[default]
    Reject,
    Drop,
}

/// A frontend, the endpoints it may send new flows to, and what it does
/// when none is selectable. Frontends of one service port share backend
/// ids (by endpoint) but each has its own selection: traffic policies and
/// topology hints give different frontends different subsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    pub key: FrontendKey,
    pub kind: FrontendKind,
    pub backends: Vec<DesiredBackend>,
    pub when_empty: WhenEmpty,
    /// SNAT new flows to the node's address (external traffic with
    /// externalTrafficPolicy Cluster, as kube-proxy masquerades it).
    pub snat: bool,
    /// sessionAffinity ClientIP: its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// loadBalancerSourceRanges as (network, prefix length); empty means
    /// every client may connect.
    pub source_ranges: Vec<(IpAddr, u8)>,
    /// New flows by Maglev consistent hashing (annotation
    /// `service.sluice.dev/lb-algorithm: maglev`).
    pub maglev: bool,
    /// SNAT new flows from sources outside the cluster (cluster IPs with
    /// local-traffic detection configured, as kube-proxy masquerades
    /// off-cluster traffic to them).
    pub masquerade_outside: bool,
    /// The source ranges admit none of the node's own addresses of this
    /// family: the node's own connections are dropped (kube-proxy filters
    /// them by their source, a node address, like any client's).
    pub node_denied: bool,
}

impl Frontend {
    /// A frontend with the default behaviour (no SNAT, no affinity, open).
    pub fn new(
        key: FrontendKey,
        kind: FrontendKind,
        backends: Vec<DesiredBackend>,
        when_empty: WhenEmpty,
    ) -> Self {
        Self {
            key,
            kind,
            backends,
            when_empty,
            snat: false,
            affinity_timeout: None,
            source_ranges: Vec::new(),
            maglev: false,
            masquerade_outside: false,
            node_denied: false,
        }
    }
}

/// A backend address: pod IP and target port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// One endpoint of a service port with the state its conditions give it.
/// `Draining` never appears here: it is what the reconciler makes of a
/// programmed backend that is no longer desired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DesiredBackend {
    pub endpoint: Endpoint,
    pub state: BackendState,
}

/// The identity of one Kubernetes service port, behind one shared
/// pointer: the desired state and the reconciler's indexes keep several
/// copies of every name (six at 100,000 services: 29 MB as four fields
/// each, a word each now). Compared, ordered and hashed by its fields.
/// A `triomphe::Arc`: no weak count, so the record is 40 bytes, not 48.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName(triomphe::Arc<PortName>);

/// What a [`ServicePortName`] holds. Its strings are shared too (the
/// namespace and port interned, the name with the service's key).
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortName {
    pub namespace: Name,
    pub name: Name,
    /// The port's name, or its number when unnamed.
    pub port: Name,
    pub proto: Proto,
}

impl ServicePortName {
    pub fn new(
        namespace: impl Into<Name>,
        name: impl Into<Name>,
        port: impl Into<Name>,
        proto: Proto,
    ) -> Self {
        Self(triomphe::Arc::new(PortName {
            namespace: namespace.into(),
            name: name.into(),
            port: port.into(),
            proto,
        }))
    }
}

impl std::ops::Deref for ServicePortName {
    type Target = PortName;

    fn deref(&self) -> &PortName {
        &self.0
    }
}

impl fmt::Debug for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}:{}/{}",
            self.namespace, self.name, self.port, self.proto
        )
    }
}

/// One service port: its frontends share backend ids and drain together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredService {
    pub frontends: Vec<Frontend>,
}

/// Everything the datapath should balance. Equality compares the content
/// (`nets_version` is bookkeeping, not state).
#[derive(Clone, Debug, Default, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<ServicePortName, DesiredService>,
    /// The cluster's own sources as (network, prefix length): what
    /// local-traffic detection (`--detect-local-mode`) recognises as pods.
    pub local_sources: BTreeSet<(IpAddr, u8)>,
    /// The devices whose packets come from pods (ifindexes): what
    /// interface-based local-traffic detection (`BridgeInterface`,
    /// `InterfaceNamePrefix`) recognises.
    pub local_ifaces: BTreeSet<u32>,
    /// The service CIDRs as (network, prefix length): a new flow to an
    /// address in them that is no cluster IP is dropped.
    pub service_cidrs: BTreeSet<(IpAddr, u8)>,
    /// Every service's cluster IPs: a new flow to one on a port or
    /// protocol no frontend serves is rejected.
    pub cluster_ips: ClusterIps,
    /// A version of `service_cidrs` and `cluster_ips` that the owner bumps
    /// whenever either changes, so that the reconciler compares them with
    /// the maps (a walk of every cluster IP) only then; 0 means unversioned
    /// (always compared).
    pub nets_version: u64,
}

/// A set of cluster IPs, sorted: IPv4 addresses as `u32`s, IPv6 ones as
/// `u128`s. The sync task collects every service's cluster IPs for a
/// comparison of the service address space; at 100,000 services a
/// B-tree of `IpAddr`s held 1.9 MB of the agent's peak, these 0.4 MB
/// (issue 17).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClusterIps {
    v4: Vec<u32>,
    v6: Vec<u128>,
}

impl ClusterIps {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.binary_search(&u32::from(*a)).is_ok(),
            IpAddr::V6(a) => self.v6.binary_search(&u128::from(*a)).is_ok(),
        }
    }

    /// Adds `ip`; false if it was there.
    pub fn insert(&mut self, ip: IpAddr) -> bool {
        fn put<T: Ord>(v: &mut Vec<T>, x: T) -> bool {
            match v.binary_search(&x) {
                Ok(_) => false,
                Err(at) => {
                    v.insert(at, x);
                    true
                }
            }
        }
        match ip {
            IpAddr::V4(a) => put(&mut self.v4, u32::from(a)),
            IpAddr::V6(a) => put(&mut self.v6, u128::from(a)),
        }
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// In `IpAddr` order: the IPv4 addresses, then the IPv6 ones.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let v4 = self
            .v4
            .iter()
            .map(|a| IpAddr::from(std::net::Ipv4Addr::from(*a)));
        let v6 = self
            .v6
            .iter()
            .map(|a| IpAddr::from(std::net::Ipv6Addr::from(*a)));
        v4.chain(v6)
    }
}

impl fmt::Debug for ClusterIps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<IpAddr> for ClusterIps {
    fn from_iter<I: IntoIterator<Item = IpAddr>>(iter: I) -> Self {
        let mut set = Self::default();
        for ip in iter {
            match ip {
                IpAddr::V4(a) => set.v4.push(u32::from(a)),
                IpAddr::V6(a) => set.v6.push(u128::from(a)),
            }
        }
        set.v4.sort_unstable();
        set.v4.dedup();
        set.v6.sort_unstable();
        set.v6.dedup();
        set
    }
}

impl<const N: usize> From<[IpAddr; N]> for ClusterIps {
    fn from(ips: [IpAddr; N]) -> Self {
        ips.into_iter().collect()
    }
}

impl PartialEq for DesiredState {
    fn eq(&self, other: &Self) -> bool {
        self.services == other.services
            && self.local_sources == other.local_sources
            && self.local_ifaces == other.local_ifaces
            && self.service_cidrs == other.service_cidrs
            && self.cluster_ips == other.cluster_ips
    }
}

#[cfg(test)]
mod intern_tests {
    use super::*;

    #[test]
    fn a_pruned_pool_keeps_what_objects_hold_and_drops_the_rest() {
        let held = intern("intern-test-held");
        assert!(Name::ptr_eq(&held, &intern("intern-test-held")), "one copy");
        drop(intern("intern-test-gone"));
        // (A sync test's full reconcile may prune at the same time: the
        // pool's content is what is checked, not the count.)
        prune_interned();
        let pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let pool = pool.as_ref().expect("the pool exists");
        assert!(pool.contains("intern-test-held"), "held by an object");
        assert!(!pool.contains("intern-test-gone"), "only the pool held it");
    }
}

#[cfg(test)]
mod cluster_ips_tests {
    use super::*;

    #[test]
    fn a_set_of_cluster_ips_is_a_sorted_set_of_addresses() {
        let ips: Vec<IpAddr> = [
            "fd00::2",
            "10.96.0.1",
            "10.200.0.1",
            "fd00::2",
            "9.0.0.1",
            "10.96.0.1",
            "::1",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let set: ClusterIps = ips.iter().copied().collect();
        let std: BTreeSet<IpAddr> = ips.iter().copied().collect();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            std.iter().copied().collect::<Vec<_>>()
        );
        assert_eq!(set.len(), std.len());
        for ip in &ips {
            assert!(set.contains(ip));
        }
        assert!(!set.contains(&"10.96.0.2".parse().unwrap()));

        let mut grown = ClusterIps::default();
        for ip in ips.iter().rev() {
            grown.insert(*ip);
        }
        assert_eq!(grown, set, "inserted one by one, the same set");
        assert!(!grown.insert("9.0.0.1".parse().unwrap()), "once");
        grown.clear();
        assert!(grown.is_empty());
    }
}
