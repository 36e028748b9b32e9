// kube-proxy's endpoint categorisation cases: the data, shared by the
// translation's unit test (`kube_proxy_cases.rs`) and the test that plays
// every row as real packets in namespaces
// (`tests/tests/kube_proxy_cases.rs`), both of which `include!` it. Plain
// Rust with no dependencies.
//
// Each row is one service with its endpoints, seen from one node (`n1`,
// zone `zone-a` unless the row says otherwise), one class of source and
// one kind of destination, with the verdict kube-proxy gives a new
// connection. An endpoint `ep(k, node)` is `10.0.0.<k>:8080` in the
// translation's test and the k-th backend pod on the wire.

pub const HERE: &str = "n1";
pub const N2: &str = "n2";
pub const N3: &str = "n3";
pub const N4: &str = "n4";

pub const CLUSTER_IP: &str = "10.96.0.10";
pub const NODE_V4: &str = "192.168.1.10";
pub const NODE_V6: &str = "fd00::10";
pub const LB_IP: &str = "203.0.113.10";
pub const EXTERNAL_IP: &str = "198.51.100.10";
pub const NODE_PORT: i32 = 30080;

/// The pods' network (`--cluster-cidr`): every endpoint and every pod.
pub const CLUSTER_CIDR: &str = "10.0.0.0/16";

/// An endpoint's conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
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
pub struct Ep {
    pub last: u8,
    pub cond: Cond,
    pub node: &'static str,
    pub zones: &'static [&'static str],
    pub nodes: &'static [&'static str],
}

pub const fn ep(last: u8, node: &'static str) -> Ep {
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
    pub const fn zones(self, zones: &'static [&'static str]) -> Self {
        Self { zones, ..self }
    }
    /// `hints.forNodes`.
    pub const fn for_nodes(self, nodes: &'static [&'static str]) -> Self {
        Self { nodes, ..self }
    }
    pub const fn cond(self, cond: Cond) -> Self {
        Self { cond, ..self }
    }
}

/// The service's type and traffic settings.
#[derive(Clone, Copy, Debug)]
pub struct Svc {
    /// LoadBalancer (with a node port, an ingress IP and an external IP),
    /// or ClusterIP (with the external IP only).
    pub load_balancer: bool,
    pub internal_local: bool,
    pub external_local: bool,
    pub traffic_distribution: Option<&'static str>,
}

pub const CLUSTER: Svc = Svc {
    load_balancer: true,
    internal_local: false,
    external_local: false,
    traffic_distribution: None,
};

impl Svc {
    pub const fn itp_local(self) -> Self {
        Self {
            internal_local: true,
            ..self
        }
    }
    pub const fn etp_local(self) -> Self {
        Self {
            external_local: true,
            ..self
        }
    }
    pub const fn distribution(self, value: &'static str) -> Self {
        Self {
            traffic_distribution: Some(value),
            ..self
        }
    }
    pub const fn cluster_ip_type(self) -> Self {
        Self {
            load_balancer: false,
            ..self
        }
    }
}

/// Where the connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    PodHere,
    /// A pod on another node, reaching this node's addresses.
    PodElsewhere,
    /// A process of this node (host network).
    Node,
    Outside,
}

/// Where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    ClusterIp,
    NodePort,
    /// The node port on the node's IPv6 address.
    NodePortV6,
    LoadBalancer,
    ExternalIp,
}

impl Dest {
    pub fn key(self) -> String {
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
pub enum Verdict {
    /// Spread over these endpoints (last octets, sorted).
    To(&'static [u8]),
    Drop,
    Reject,
    /// No rule: the packet is not a service's and goes to the routing
    /// table.
    Pass,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    /// This node's zone label.
    pub zone: Option<&'static str>,
    pub svc: Svc,
    pub endpoints: &'static [Ep],
    pub source: Source,
    pub dest: Dest,
    pub kube_proxy: Verdict,
}

pub const fn row(
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
    pub const fn zone(self, zone: Option<&'static str>) -> Self {
        Self { zone, ..self }
    }
}

pub use Cond::{NotReady, ServingTerminating, Terminating};
pub use Dest::{ClusterIp, ExternalIp, LoadBalancer, NodePort, NodePortV6};
pub use Source::{Node, Outside, PodElsewhere, PodHere};
pub use Verdict::{Drop, Pass, Reject, To};

/// Four ready endpoints hinted for zones a, b, c, a.
pub const ZONED: &[Ep] = &[
    ep(1, N2).zones(&["zone-a"]),
    ep(2, N2).zones(&["zone-b"]),
    ep(3, N3).zones(&["zone-c"]),
    ep(4, HERE).zones(&["zone-a"]),
];

/// Three ready endpoints, each hinted for its own node and for a zone.
pub const NODE_HINTED: &[Ep] = &[
    ep(1, HERE).for_nodes(&[HERE]).zones(&["zone-a"]),
    ep(2, N2).for_nodes(&[N2]).zones(&["zone-a"]),
    ep(3, N3).for_nodes(&[N3]).zones(&["zone-b"]),
];

/// One ready endpoint here, one elsewhere.
pub const SPLIT: &[Ep] = &[ep(1, HERE), ep(2, N2)];
/// Ready endpoints on other nodes only.
pub const REMOTE: &[Ep] = &[ep(1, N2), ep(2, N3)];

// One row per line: a table reads better than rustfmt's layout.
#[rustfmt::skip]
pub const CASES: &[Case] = &[
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
