//! kube-proxy's endpoint categorisation, case by case, against ours.
//!
//! Each row is one service with its endpoints, seen from one node (`n1`,
//! zone `zone-a` unless the row says otherwise), one class of source and
//! one kind of destination, with the verdict kube-proxy gives a new
//! connection: which endpoints it spreads over, DROP, REJECT, or no rule
//! at all. The rows were written from kube-proxy's behaviour
//! (pkg/proxy/topology.go and the nftables proxier's chains), as kube-proxy
//! 1.34+ runs by default: nftables mode, `PreferSameTrafficDistribution`
//! on, and `--detect-local-mode=ClusterCIDR` with a `--cluster-cidr` that
//! holds every pod (so a pod on any node is "local" traffic).
//!
//! Every row runs through the real translation; what a connection then
//! gets follows the datapath's one selection (`select.rs`, used by TC
//! ingress for pods and outside clients and by the socket programs for the
//! node's own processes): the frontend's internal scope for sources inside
//! the cluster when it has one, then active backends, else
//! terminating-serving ones, else the frontend's DROP or REJECT.
//! Packets in namespaces are the integration tests' job, not this table's.
//!
//! Every row gives kube-proxy's verdict. (Differences that remain are
//! outside this table's reach, in docs/service-features.md's
//! "Differences from kube-proxy".)

use std::net::IpAddr;

use k8s_openapi::api::{core::v1::Service, discovery::v1::Endpoint as K8sEndpoint};

use super::{builders::*, *};
use crate::model::{BackendState, Frontend, WhenEmpty};

const HERE: &str = "n1";
const N2: &str = "n2";
const N3: &str = "n3";
const N4: &str = "n4";

const CLUSTER_IP: &str = "10.96.0.10";
const NODE_V4: &str = "192.168.1.10";
const NODE_V6: &str = "fd00::10";
const LB_IP: &str = "203.0.113.10";
const EXTERNAL_IP: &str = "198.51.100.10";
const NODE_PORT: i32 = 30080;

/// The pods' network (`--cluster-cidr`): every endpoint and every pod.
const CLUSTER_CIDR: &str = "10.0.0.0/16";

/// An endpoint's conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cond {
    Ready,
    /// Not ready, terminating, still serving (KEP-1669 fallback).
    ServingTerminating,
    /// Terminating and no longer serving.
    Terminating,
    /// Not ready, not terminating.
    NotReady,
}

/// One endpoint: `10.0.0.<last>:8080` on `node`.
#[derive(Clone, Copy, Debug)]
struct Ep {
    last: u8,
    cond: Cond,
    node: &'static str,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
}

const fn ep(last: u8, node: &'static str) -> Ep {
    Ep {
        last,
        cond: Cond::Ready,
        node,
        zones: &[],
        nodes: &[],
    }
}

impl Ep {
    /// `hints.forZones`.
    const fn zones(self, zones: &'static [&'static str]) -> Self {
        Self { zones, ..self }
    }
    /// `hints.forNodes`.
    const fn for_nodes(self, nodes: &'static [&'static str]) -> Self {
        Self { nodes, ..self }
    }
    const fn cond(self, cond: Cond) -> Self {
        Self { cond, ..self }
    }
}

/// The service's type and traffic settings.
#[derive(Clone, Copy, Debug)]
struct Svc {
    /// LoadBalancer (with a node port, an ingress IP and an external IP),
    /// or ClusterIP (with the external IP only).
    load_balancer: bool,
    internal_local: bool,
    external_local: bool,
    traffic_distribution: Option<&'static str>,
}

const CLUSTER: Svc = Svc {
    load_balancer: true,
    internal_local: false,
    external_local: false,
    traffic_distribution: None,
};

impl Svc {
    const fn itp_local(self) -> Self {
        Self {
            internal_local: true,
            ..self
        }
    }
    const fn etp_local(self) -> Self {
        Self {
            external_local: true,
            ..self
        }
    }
    const fn distribution(self, value: &'static str) -> Self {
        Self {
            traffic_distribution: Some(value),
            ..self
        }
    }
    const fn cluster_ip_type(self) -> Self {
        Self {
            load_balancer: false,
            ..self
        }
    }
}

/// Where the connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    PodHere,
    /// A pod on another node, reaching this node's addresses.
    PodElsewhere,
    /// A process of this node (host network).
    Node,
    Outside,
}

/// Where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    ClusterIp,
    NodePort,
    /// The node port on the node's IPv6 address.
    NodePortV6,
    LoadBalancer,
    ExternalIp,
}

impl Dest {
    fn key(self) -> String {
        match self {
            Self::ClusterIp => format!("{CLUSTER_IP}:80/TCP"),
            Self::NodePort => format!("{NODE_V4}:{NODE_PORT}/TCP"),
            Self::NodePortV6 => format!("[{NODE_V6}]:{NODE_PORT}/TCP"),
            Self::LoadBalancer => format!("{LB_IP}:80/TCP"),
            Self::ExternalIp => format!("{EXTERNAL_IP}:80/TCP"),
        }
    }
}

/// What a new connection gets.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Verdict {
    /// Spread over these endpoints (last octets, sorted).
    To(&'static [u8]),
    Drop,
    Reject,
    /// No rule: the packet is not a service's and goes to the routing
    /// table.
    Pass,
}

#[derive(Clone, Debug)]
struct Case {
    name: &'static str,
    /// This node's zone label.
    zone: Option<&'static str>,
    svc: Svc,
    endpoints: &'static [Ep],
    source: Source,
    dest: Dest,
    kube_proxy: Verdict,
}

const fn row(
    name: &'static str,
    svc: Svc,
    endpoints: &'static [Ep],
    source: Source,
    dest: Dest,
    kube_proxy: Verdict,
) -> Case {
    Case {
        name,
        zone: Some("zone-a"),
        svc,
        endpoints,
        source,
        dest,
        kube_proxy,
    }
}

impl Case {
    const fn zone(self, zone: Option<&'static str>) -> Self {
        Self { zone, ..self }
    }
}

use Cond::{NotReady, ServingTerminating, Terminating};
use Dest::{ClusterIp, ExternalIp, LoadBalancer, NodePort, NodePortV6};
use Source::{Node, Outside, PodElsewhere, PodHere};
use Verdict::{Drop, Pass, Reject, To};

/// Four ready endpoints hinted for zones a, b, c, a.
const ZONED: &[Ep] = &[
    ep(1, N2).zones(&["zone-a"]),
    ep(2, N2).zones(&["zone-b"]),
    ep(3, N3).zones(&["zone-c"]),
    ep(4, HERE).zones(&["zone-a"]),
];

/// Three ready endpoints, each hinted for its own node and for a zone.
const NODE_HINTED: &[Ep] = &[
    ep(1, HERE).for_nodes(&[HERE]).zones(&["zone-a"]),
    ep(2, N2).for_nodes(&[N2]).zones(&["zone-a"]),
    ep(3, N3).for_nodes(&[N3]).zones(&["zone-b"]),
];

/// One ready endpoint here, one elsewhere.
const SPLIT: &[Ep] = &[ep(1, HERE), ep(2, N2)];
/// Ready endpoints on other nodes only.
const REMOTE: &[Ep] = &[ep(1, N2), ep(2, N3)];

// One row per line: a table reads better than rustfmt's layout.
#[rustfmt::skip]
const CASES: &[Case] = &[
    // --- Zone hints (topologyModeFromHints, PreferSameZone) ---
    row("zone hints: only endpoints hinted for this node's zone", CLUSTER.distribution("PreferClose"), ZONED, PodHere, ClusterIp, To(&[1, 4])),
    row("zone hints: the hints decide, not trafficDistribution", CLUSTER, ZONED, PodHere, ClusterIp, To(&[1, 4])),
    row("zone hints: PreferClose before the controller wrote hints: everywhere", CLUSTER.distribution("PreferClose"), SPLIT, PodHere, ClusterIp, To(&[1, 2])),
    row("zone hints: node without a zone label: everywhere", CLUSTER, ZONED, PodHere, ClusterIp, To(&[1, 2, 3, 4])).zone(None),
    row("zone hints: node in a zone no endpoint is hinted for: everywhere", CLUSTER, ZONED, PodHere, ClusterIp, To(&[1, 2, 3, 4])).zone(Some("zone-d")),
    row("zone hints: one ready endpoint without hints: everywhere", CLUSTER, &[ep(1, N2).zones(&["zone-a"]), ep(2, N2).zones(&["zone-b"]), ep(3, N3), ep(4, HERE).zones(&["zone-a"])], PodHere, ClusterIp, To(&[1, 2, 3, 4])),
    row("zone hints: an endpoint hinted for several zones", CLUSTER, &[ep(1, N2).zones(&["zone-a", "zone-b", "zone-c"]), ep(2, N2).zones(&["zone-b", "zone-c"]), ep(3, N3).zones(&["zone-b", "zone-d"]), ep(4, HERE).zones(&["zone-c"])], PodHere, ClusterIp, To(&[1, 2, 4])).zone(Some("zone-c")),
    row("zone hints: a not-ready endpoint of this zone is not picked", CLUSTER, &[ep(1, N2).zones(&["zone-a"]), ep(2, N2).zones(&["zone-b"]), ep(3, N3).zones(&["zone-c"]), ep(4, HERE).zones(&["zone-a"]).cond(NotReady)], PodHere, ClusterIp, To(&[1])),
    row("zone hints: only not-ready endpoints are for this zone: everywhere", CLUSTER, &[ep(1, N2).zones(&["zone-a"]).cond(NotReady), ep(2, N2).zones(&["zone-b"]), ep(3, N3).zones(&["zone-c"]), ep(4, HERE).zones(&["zone-a"]).cond(NotReady)], PodHere, ClusterIp, To(&[2, 3])),
    row("zone hints: a not-ready endpoint without hints does not disable them", CLUSTER, &[ep(1, N2).zones(&["zone-a"]), ep(2, N2).zones(&["zone-b"]), ep(3, N3).cond(NotReady)], PodHere, ClusterIp, To(&[1])),
    row("zone hints: external traffic with policy Cluster follows them", CLUSTER, ZONED, Outside, NodePort, To(&[1, 4])),
    // --- Node hints (PreferSameNode) ---
    row("node hints: only endpoints hinted for this node", CLUSTER.distribution("PreferSameNode"), NODE_HINTED, PodHere, ClusterIp, To(&[1])),
    row("node hints: several endpoints for this node", CLUSTER.distribution("PreferSameNode"), &[ep(1, HERE).for_nodes(&[HERE]), ep(2, HERE).for_nodes(&[HERE]), ep(3, N2).for_nodes(&[N2])], PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: one ready endpoint without a node hint: zone hints decide", CLUSTER, &[ep(1, HERE).for_nodes(&[HERE]).zones(&["zone-a"]), ep(2, N2).zones(&["zone-a"]), ep(3, N3).for_nodes(&[N3]).zones(&["zone-b"])], PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: none for this node: zone hints decide", CLUSTER, &[ep(1, N2).for_nodes(&[N2]).zones(&["zone-a"]), ep(2, N3).for_nodes(&[N3]).zones(&["zone-a"]), ep(3, N4).for_nodes(&[N4]).zones(&["zone-b"])], PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: none for this node, no zone hints: everywhere", CLUSTER, &[ep(1, N2).for_nodes(&[N2]), ep(2, N3).for_nodes(&[N3])], PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: one missing, no zone hints: everywhere", CLUSTER, &[ep(1, HERE).for_nodes(&[HERE]), ep(2, N2)], PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: PreferSameNode before the controller wrote hints: everywhere", CLUSTER.distribution("PreferSameNode"), SPLIT, PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: the endpoint for this node is not ready: everywhere", CLUSTER, &[ep(1, HERE).for_nodes(&[HERE]).cond(NotReady), ep(2, N2).for_nodes(&[N2]), ep(3, N3).for_nodes(&[N3])], PodHere, ClusterIp, To(&[2, 3])),
    row("node hints: no ready endpoint: serving-terminating ones, hints ignored", CLUSTER, &[ep(1, HERE).for_nodes(&[HERE]).cond(ServingTerminating), ep(2, N2).for_nodes(&[N2]).cond(ServingTerminating)], PodHere, ClusterIp, To(&[1, 2])),
    row("node hints: external traffic with policy Cluster follows them", CLUSTER, NODE_HINTED, Outside, LoadBalancer, To(&[1])),
    row("node hints: internalTrafficPolicy Local ignores them", CLUSTER.itp_local(), &[ep(1, HERE).for_nodes(&[N2]), ep(2, HERE).for_nodes(&[HERE]), ep(3, N2).for_nodes(&[N2])], PodHere, ClusterIp, To(&[1, 2])),
    // --- Endpoint conditions (KEP-1669) ---
    row("conditions: ready endpoints only while there are some", CLUSTER, &[ep(1, N2), ep(2, N2).cond(NotReady), ep(3, HERE).cond(ServingTerminating)], PodHere, ClusterIp, To(&[1])),
    row("conditions: no ready endpoint: the serving-terminating ones", CLUSTER, &[ep(1, HERE).cond(ServingTerminating), ep(2, N2).cond(ServingTerminating), ep(3, N2).cond(Terminating)], PodHere, ClusterIp, To(&[1, 2])),
    row("conditions: nothing ready or serving: REJECT", CLUSTER, &[ep(1, N2).cond(NotReady), ep(2, N2).cond(Terminating)], PodHere, ClusterIp, Reject),
    row("conditions: no endpoints: REJECT", CLUSTER, &[], PodHere, ClusterIp, Reject),
    row("conditions: no endpoints, from outside to the cluster IP: REJECT", CLUSTER, &[], Outside, ClusterIp, Reject),
    // --- internalTrafficPolicy Local ---
    row("iTP Local: only this node's endpoints", CLUSTER.itp_local(), SPLIT, PodHere, ClusterIp, To(&[1])),
    row("iTP Local: every endpoint on this node", CLUSTER.itp_local(), &[ep(1, HERE), ep(2, HERE)], PodHere, ClusterIp, To(&[1, 2])),
    row("iTP Local: endpoints elsewhere only: DROP", CLUSTER.itp_local(), REMOTE, PodHere, ClusterIp, Drop),
    row("iTP Local: no endpoints: REJECT", CLUSTER.itp_local(), &[], PodHere, ClusterIp, Reject),
    row("iTP Local: serving-terminating endpoints elsewhere only: DROP", CLUSTER.itp_local(), &[ep(1, N2).cond(ServingTerminating), ep(2, N3).cond(ServingTerminating)], PodHere, ClusterIp, Drop),
    row("iTP Local: a local endpoint that is not ready, ready ones elsewhere: DROP", CLUSTER.itp_local(), &[ep(1, HERE).cond(NotReady), ep(2, N2)], PodHere, ClusterIp, Drop),
    row("iTP Local: zone hints ignored", CLUSTER.itp_local(), &[ep(1, HERE).zones(&["zone-b"]), ep(2, HERE).zones(&["zone-a"]), ep(3, N2).zones(&["zone-a"]), ep(4, N2).zones(&["zone-c"])], PodHere, ClusterIp, To(&[1, 2])),
    row("iTP Local: from outside to the cluster IP too", CLUSTER.itp_local(), SPLIT, Outside, ClusterIp, To(&[1])),
    row("iTP Local with eTP Cluster: the node port uses every endpoint", CLUSTER.itp_local(), SPLIT, Outside, NodePort, To(&[1, 2])),
    row("iTP Local: the node itself, a local endpoint", CLUSTER.itp_local(), SPLIT, Node, ClusterIp, To(&[1])),
    row("iTP Local: the node itself, endpoints elsewhere only", CLUSTER.itp_local(), REMOTE, Node, ClusterIp, Drop),
    // --- externalTrafficPolicy Local, traffic from outside ---
    row("eTP Local: outside to the node port: this node's endpoints", CLUSTER.etp_local(), SPLIT, Outside, NodePort, To(&[1])),
    row("eTP Local: outside to the load-balancer IP: this node's endpoints", CLUSTER.etp_local(), SPLIT, Outside, LoadBalancer, To(&[1])),
    row("eTP Local: outside to an external IP: this node's endpoints", CLUSTER.etp_local(), SPLIT, Outside, ExternalIp, To(&[1])),
    row("eTP Local: outside, endpoints elsewhere only: DROP", CLUSTER.etp_local(), REMOTE, Outside, NodePort, Drop),
    row("eTP Local: outside, no endpoints: REJECT", CLUSTER.etp_local(), &[], Outside, LoadBalancer, Reject),
    row("eTP Local: outside, serving-terminating endpoints elsewhere only: DROP", CLUSTER.etp_local(), &[ep(1, N2).cond(ServingTerminating)], Outside, NodePort, Drop),
    row("eTP Local: local ready endpoints before local serving-terminating ones", CLUSTER.etp_local(), &[ep(1, HERE), ep(2, HERE).cond(ServingTerminating), ep(3, N2)], Outside, NodePort, To(&[1])),
    row("eTP Local: no local ready endpoint: the local serving-terminating one", CLUSTER.etp_local(), &[ep(1, N2), ep(2, HERE).cond(NotReady), ep(3, HERE).cond(ServingTerminating), ep(4, N2).cond(ServingTerminating)], Outside, NodePort, To(&[3])),
    row("eTP Local: the cluster IP keeps its ready endpoints", CLUSTER.etp_local(), &[ep(1, N2), ep(2, HERE).cond(NotReady), ep(3, HERE).cond(ServingTerminating), ep(4, N2).cond(ServingTerminating)], PodHere, ClusterIp, To(&[1])),
    row("eTP Local: the cluster IP keeps every endpoint", CLUSTER.etp_local(), SPLIT, PodHere, ClusterIp, To(&[1, 2])),
    row("eTP Local: zone hints ignored for external traffic", CLUSTER.etp_local(), &[ep(1, HERE).zones(&["zone-a"]), ep(2, HERE).zones(&["zone-b"]), ep(3, N2).zones(&["zone-c"]), ep(4, N2).zones(&["zone-a"])], Outside, NodePort, To(&[1, 2])),
    row("eTP Local: zone hints still apply to the cluster IP", CLUSTER.etp_local(), &[ep(1, HERE).zones(&["zone-a"]), ep(2, HERE).zones(&["zone-b"]), ep(3, N2).zones(&["zone-c"]), ep(4, N2).zones(&["zone-a"])], PodHere, ClusterIp, To(&[1, 4])),
    row("eTP Local and iTP Local, endpoints elsewhere only: the cluster IP drops", CLUSTER.etp_local().itp_local(), REMOTE, PodHere, ClusterIp, Drop),
    row("eTP Local and iTP Local, endpoints elsewhere only: the node port drops", CLUSTER.etp_local().itp_local(), REMOTE, Outside, NodePort, Drop),
    row("eTP Local on a ClusterIP service is ignored: its external IP uses every endpoint", CLUSTER.etp_local().cluster_ip_type(), SPLIT, Outside, ExternalIp, To(&[1, 2])),
    // --- eTP Local, traffic from inside the cluster (short-circuit) ---
    row("eTP Local: a pod of this node to the node port gets every endpoint", CLUSTER.etp_local(), SPLIT, PodHere, NodePort, To(&[1, 2])),
    row("eTP Local: a pod of this node to the load-balancer IP, none local", CLUSTER.etp_local(), REMOTE, PodHere, LoadBalancer, To(&[1, 2])),
    row("eTP Local: a pod on another node to this node's node port", CLUSTER.etp_local(), SPLIT, PodElsewhere, NodePort, To(&[1, 2])),
    row("eTP Local: the node itself to its node port", CLUSTER.etp_local(), SPLIT, Node, NodePort, To(&[1, 2])),
    row("eTP Local: the node itself to its node port, none local", CLUSTER.etp_local(), REMOTE, Node, NodePort, To(&[1, 2])),
    // --- The node's own processes ---
    row("the node itself to the cluster IP", CLUSTER, SPLIT, Node, ClusterIp, To(&[1, 2])),
    row("the node itself to its node port, policy Cluster", CLUSTER, SPLIT, Node, NodePort, To(&[1, 2])),
    row("the node itself, no endpoints: REJECT", CLUSTER, &[], Node, ClusterIp, Reject),
    row("the node itself, serving-terminating endpoints only", CLUSTER, &[ep(1, N2).cond(ServingTerminating), ep(2, N2).cond(NotReady)], Node, ClusterIp, To(&[1])),
    row("the node itself follows node hints", CLUSTER, NODE_HINTED, Node, ClusterIp, To(&[1])),
    // --- Outside to internal destinations, address families ---
    row("outside to the cluster IP: every endpoint", CLUSTER, SPLIT, Outside, ClusterIp, To(&[1, 2])),
    row("outside to the node port, policy Cluster: every endpoint", CLUSTER, SPLIT, Outside, NodePort, To(&[1, 2])),
    row("a pod on another node to this node's node port, policy Cluster", CLUSTER, SPLIT, PodElsewhere, NodePort, To(&[1, 2])),
    row("IPv4-only service: nothing on the node's IPv6 address", CLUSTER, SPLIT, Outside, NodePortV6, Pass),
    row("ClusterIP service: no node port", CLUSTER.cluster_ip_type(), SPLIT, Outside, NodePort, Pass),
];

fn k8s_endpoint(e: &Ep) -> K8sEndpoint {
    let mut out = ep_on(&format!("10.0.0.{}", e.last), e.node);
    out = match e.cond {
        Cond::Ready => out,
        Cond::ServingTerminating => with_conditions(out, Some(false), Some(true), Some(true)),
        Cond::Terminating => with_conditions(out, Some(false), Some(false), Some(true)),
        Cond::NotReady => with_conditions(out, Some(false), Some(false), Some(false)),
    };
    if !e.zones.is_empty() {
        set_zone_hints(&mut out, e.zones);
    }
    if !e.nodes.is_empty() {
        set_node_hints(&mut out, e.nodes);
    }
    out
}

fn k8s_service(s: &Svc) -> Service {
    let mut svc = mk_service(
        "default",
        "web",
        CLUSTER_IP,
        &[node_port("http", "TCP", 80, NODE_PORT)],
    );
    set_ip_families(&mut svc, &["IPv4"]);
    let spec = spec_mut(&mut svc);
    spec.external_ips = Some(vec![EXTERNAL_IP.into()]);
    if s.internal_local {
        spec.internal_traffic_policy = Some("Local".into());
    }
    if s.external_local {
        spec.external_traffic_policy = Some("Local".into());
    }
    spec.traffic_distribution = s.traffic_distribution.map(Into::into);
    if s.load_balancer {
        spec.type_ = Some("LoadBalancer".into());
        set_lb_ingress(&mut svc, &[(LB_IP, None)]);
    } else {
        spec.ports
            .iter_mut()
            .flatten()
            .for_each(|p| p.node_port = None);
    }
    svc
}

fn translate_case(c: &Case) -> Translation {
    let endpoints: Vec<K8sEndpoint> = c.endpoints.iter().map(k8s_endpoint).collect();
    let slice = mk_slice(
        "default",
        "web-1",
        "web",
        &[slice_port("http", "TCP", 8080)],
        endpoints,
    );
    let node = mk_node(
        HERE,
        c.zone,
        &[("InternalIP", NODE_V4), ("InternalIP", NODE_V6)],
    );
    let config = TranslateConfig {
        node_name: HERE.into(),
        node_addresses: vec![],
        ipv6: true,
        masquerade_all: false,
        local: LocalDetector::ClusterCidr(vec![IpNet::parse(CLUSTER_CIDR).unwrap()]),
    };
    let stores = Stores::from_objects(&[k8s_service(&c.svc)], &[slice], &[node], HERE);
    let mut t = translate(
        &stores.services,
        &stores.slices,
        stores.node.as_ref(),
        &config,
    );
    t.problems.extend(stores.problems);
    t
}

/// The frontend entry a new connection from `source` to `key` uses: the
/// internal scope (when the frontend has one) for sources inside the
/// cluster, which the TC path recognises by `sl_local4` (`--cluster-cidr`
/// here) and the socket programs by being the node's.
fn frontend<'a>(frontends: &'a [Frontend], key: &str, source: Source) -> Option<&'a Frontend> {
    let find = |k: &str| frontends.iter().find(|f| f.key.to_string() == k);
    let internal = format!("{key} (internal)");
    match source {
        PodHere | PodElsewhere | Node => find(&internal).or_else(|| find(key)),
        Outside => find(key),
    }
}

/// What sluice's datapath gives a new connection to `f` (`select.rs`,
/// shared by the TC path and the socket programs: active backends, else
/// terminating-serving ones, else the frontend's DROP or REJECT; a node
/// process sees DROP as a connect() that fails with ETIMEDOUT at once).
fn pick(f: Option<&Frontend>) -> Result<Vec<u8>, Verdict> {
    let Some(f) = f else { return Err(Pass) };
    let with = |state: BackendState| -> Vec<u8> {
        let mut out: Vec<u8> = f
            .backends
            .iter()
            .filter(|b| b.state == state)
            .filter_map(|b| match b.endpoint.addr {
                IpAddr::V4(a) => Some(a.octets()[3]),
                IpAddr::V6(_) => None,
            })
            .collect();
        out.sort_unstable();
        out
    };
    let active = with(BackendState::Active);
    if !active.is_empty() {
        return Ok(active);
    }
    let fallback = with(BackendState::TerminatingServing);
    if !fallback.is_empty() {
        return Ok(fallback);
    }
    Err(match f.when_empty {
        WhenEmpty::Drop => Drop,
        WhenEmpty::Reject => Reject,
    })
}

/// Compares sluice's pick with a verdict; `Err` says how they differ.
fn check(got: &Result<Vec<u8>, Verdict>, want: &Verdict) -> Result<(), String> {
    let same = match (got, want) {
        (Ok(eps), To(w)) => eps.as_slice() == *w,
        (Err(v), w) => v == w,
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(format!("sluice gives {got:?}, the row says {want:?}"))
    }
}

#[test]
fn every_case_gives_its_verdict() {
    let mut failures = Vec::new();
    for c in CASES {
        let t = translate_case(c);
        if !t.problems.is_empty() {
            failures.push(format!("{}: problems {:?}", c.name, t.problems));
            continue;
        }
        let name = ServicePortName {
            namespace: "default".into(),
            name: "web".into(),
            port: "http".into(),
            proto: crate::model::Proto::Tcp,
        };
        let key = c.dest.key();
        let f = t
            .desired
            .services
            .get(&name)
            .and_then(|s| frontend(&s.frontends, &key, c.source));
        let got = pick(f);
        if let Err(e) = check(&got, &c.kube_proxy) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

#[test]
fn cases_are_well_formed() {
    let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "case names must be unique");
    for c in CASES {
        // Another node's pods reach a cluster IP through their own node.
        assert!(
            !(c.source == PodElsewhere && c.dest == ClusterIp),
            "{}: not this node's decision",
            c.name
        );
        if let To(eps) = c.kube_proxy {
            assert!(eps.windows(2).all(|w| w[0] < w[1]), "{}: sort", c.name);
        }
    }
}
