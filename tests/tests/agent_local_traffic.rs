//! kube-proxy's local-traffic detection, `--masquerade-all` and the
//! externalTrafficPolicy Local short-circuit, through the real agent on
//! manifests and real connections, as kube-proxy's nftables proxier
//! decides them:
//! - a pod (by `--cluster-cidr`) or the node itself reaching an
//!   externalTrafficPolicy Local node port gets every endpoint of the
//!   cluster, unmasqueraded; a client outside the cluster gets this node's
//!   endpoints only, and is dropped when there are none;
//! - with local-traffic detection, a client outside the cluster reaching a
//!   cluster IP is masqueraded (the backend sees the node), a pod is not;
//! - with `--masquerade-all`, pods are masqueraded too;
//! - without detection, pods are taken for outside clients (no
//!   short-circuit) and nobody is masqueraded to a cluster IP.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{ensure, Result};
use sluice_common::Stat;
use sluice_tests::{
    agent::{Agent, ManifestDir},
    clients,
    host::HostClient,
    servers, Topology,
};

const LOCAL_NP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 8, 1);
const NODE_PORT: u16 = 30081;
const WEB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 8, 2);

/// This node (`node-1`), the NodePort service `local-np` with
/// externalTrafficPolicy Local whose endpoints are all on `node-2`, and the
/// ClusterIP service `web`, both on the two backends.
fn manifests(node_ip: Ipv4Addr, b0: Ipv4Addr, b1: Ipv4Addr) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: node-1
status:
  addresses:
  - type: InternalIP
    address: {node_ip}
---
apiVersion: v1
kind: Service
metadata:
  name: local-np
  namespace: default
spec:
  type: NodePort
  clusterIP: {LOCAL_NP_VIP}
  clusterIPs: [{LOCAL_NP_VIP}]
  externalTrafficPolicy: Local
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: {NODE_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: local-np-1
  namespace: default
  labels:
    kubernetes.io/service-name: local-np
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{b0}"]
  nodeName: node-2
  conditions: {{ready: true}}
- addresses: ["{b1}"]
  nodeName: node-2
  conditions: {{ready: true}}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: ClusterIP
  clusterIP: {WEB_VIP}
  clusterIPs: [{WEB_VIP}]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{b0}"]
  nodeName: node-1
  conditions: {{ready: true}}
- addresses: ["{b1}"]
  nodeName: node-1
  conditions: {{ready: true}}
"#
    )
}

/// This node with one client pod, two whoami backends (and an outside
/// host if `external`), and `manifests` in a directory the agent reads.
/// Fields drop in order: the servers before their namespaces.
struct Node {
    _servers: Vec<servers::Server>,
    _dir: ManifestDir,
    source: String,
    topo: Topology,
}

impl Node {
    fn new(external: bool) -> Result<Self> {
        let mut topo = Topology::new(1, 2)?;
        if external {
            topo.add_external()?;
        }
        let servers = topo
            .backends
            .iter()
            .map(|b| servers::tcp_whoami(&b.ns, 8080, &b.name))
            .collect::<Result<Vec<_>>>()?;
        let (b0, b1) = (topo.backends[0].ip, topo.backends[1].ip);
        let dir = ManifestDir::create()?;
        dir.write("all.yaml", &manifests(topo.node_address(0), b0, b1))?;
        let source = format!("dir:{}", dir.path().display());
        Ok(Self {
            _servers: servers,
            _dir: dir,
            source,
            topo,
        })
    }
}

/// The agent with `--detect-local-mode InterfaceNamePrefix` and `prefix`,
/// scanning devices every 200 ms, ready.
fn start_with_prefix(topo: &Topology, source: &str, prefix: &str) -> Result<Agent> {
    let mut agent = Agent::start(
        topo,
        source,
        &[
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            prefix,
            "--device-scan-interval",
            "200ms",
        ],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    Ok(agent)
}

/// The backend's greeting: its name and the source address it saw.
fn whoami(ns: &sluice_tests::netns::Netns, to: SocketAddrV4) -> Result<(String, String)> {
    let greeting = clients::tcp_hello(ns, to)?;
    let (name, seen) = greeting
        .split_once(' ')
        .ok_or_else(|| anyhow::anyhow!("unexpected greeting {greeting:?}"))?;
    Ok((name.to_owned(), seen.to_owned()))
}

/// Whether a new connection from `ns` to `to` is dropped (times out).
fn dropped(ns: &sluice_tests::netns::Netns, to: SocketAddrV4) -> bool {
    match clients::tcp_hello(ns, to) {
        Err(e) => e
            .chain()
            .filter_map(|c| c.downcast_ref::<std::io::Error>())
            .any(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                )
            }),
        Ok(_) => false,
    }
}

fn agent_stat(topo: &Topology, stat: Stat) -> Result<u64> {
    Ok(sluice::datapath::Maps::open_pinned(topo.bpf.path())?.stat(stat)?)
}

#[test]
fn pods_and_the_node_short_circuit_and_outsiders_are_masqueraded_as_kube_proxy_does() -> Result<()>
{
    let node = Node::new(true)?;
    let (topo, source) = (&node.topo, &node.source);
    let node_ip = topo.node_address(0);
    let client = &topo.clients[0];
    let outside = &topo.externals[0];
    let node_port = SocketAddrV4::new(node_ip, NODE_PORT);
    let web = SocketAddrV4::new(WEB_VIP, 80);
    let backend_names = ["backend-0", "backend-1"];

    // Pods are 10.0.0.0/8 (clients 10.10.x, backends 10.20.x); the
    // outside host is 192.168.1.100.
    let mut agent = Agent::start(topo, source, &["--cluster-cidr", "10.0.0.0/8"])?;
    agent.wait_ready(Duration::from_secs(20))?;

    // A pod of this node to the Local node port, no endpoint on this node:
    // every endpoint of the cluster, client address kept.
    for _ in 0..4 {
        let (name, seen) = whoami(&client.ns, node_port)?;
        ensure!(backend_names.contains(&name.as_str()), "{name}");
        ensure!(seen == client.ip.to_string(), "pod masqueraded: {seen}");
    }
    // The node itself, through the socket programs: every endpoint too.
    let out = HostClient::once(topo, "tcp", &node_ip.to_string(), NODE_PORT)?;
    ensure!(
        out.first().map(String::as_str) == Some("ok") && backend_names.contains(&out[1].as_str()),
        "node to its Local node port: {out:?}"
    );
    // Outside the cluster: this node's endpoints only, and there are none.
    let drops = agent_stat(topo, Stat::NoBackendDrop)?;
    ensure!(
        dropped(&outside.ns, node_port),
        "outside client not dropped"
    );
    ensure!(
        agent_stat(topo, Stat::NoBackendDrop)? > drops,
        "drop not counted"
    );

    // A cluster IP: the outside client is masqueraded to the node's
    // address, the pod is not.
    let (_, seen) = whoami(&outside.ns, web)?;
    ensure!(
        seen != outside.ip.to_string() && seen.starts_with("10.20."),
        "outside client reached the cluster IP as {seen}, expected the node's address"
    );
    let (_, seen) = whoami(&client.ns, web)?;
    ensure!(seen == client.ip.to_string(), "pod masqueraded: {seen}");
    agent.stop()?;

    // --masquerade-all without detection: everyone is masqueraded to the
    // cluster IP; pods are no longer told from outside clients, so the
    // Local node port drops them too (kube-proxy without a local detector).
    let mut agent = Agent::start(topo, source, &["--masquerade-all"])?;
    agent.wait_ready(Duration::from_secs(20))?;
    let (_, seen) = whoami(&client.ns, web)?;
    ensure!(seen.starts_with("10.20."), "pod not masqueraded: {seen}");
    let (_, seen) = whoami(&outside.ns, web)?;
    ensure!(
        seen.starts_with("10.20."),
        "outside client not masqueraded: {seen}"
    );
    ensure!(
        dropped(&client.ns, node_port),
        "pod short-circuited without detection: {:?}, maps: {}",
        clients::tcp_hello(&client.ns, node_port),
        agent.cli(&["lb", "list"]).unwrap_or_default()
    );
    // The node is always inside the cluster.
    let out = HostClient::once(topo, "tcp", &node_ip.to_string(), NODE_PORT)?;
    ensure!(out.first().map(String::as_str) == Some("ok"), "{out:?}");
    agent.stop()?;

    // Neither: nobody is masqueraded to a cluster IP.
    let mut agent = Agent::start(topo, source, &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    let (_, seen) = whoami(&outside.ns, web)?;
    ensure!(
        seen == outside.ip.to_string(),
        "outside client masqueraded: {seen}"
    );
    let (_, seen) = whoami(&client.ns, web)?;
    ensure!(seen == client.ip.to_string(), "pod masqueraded: {seen}");
    agent.stop()?;
    Ok(())
}

/// kube-proxy's interface-based detection: `InterfaceNamePrefix` tells
/// pods by the device their packets enter through, whatever their
/// address; a device that appears later (a new pod) is a pod's as soon as
/// the agent's device scan sees it.
#[test]
fn interface_name_prefix_tells_pods_by_their_device() -> Result<()> {
    let mut node = Node::new(true)?;
    let node_port = SocketAddrV4::new(node.topo.node_address(0), NODE_PORT);
    let web = SocketAddrV4::new(WEB_VIP, 80);
    let backend_names = ["backend-0", "backend-1"];

    // Pods' devices are c*: client-0 is a pod, the outside host (e0) is not.
    let mut agent = start_with_prefix(&node.topo, &node.source, "c")?;
    {
        let topo = &node.topo;
        let client = &topo.clients[0];
        let outside = &topo.externals[0];
        let (_, seen) = whoami(&client.ns, web)?;
        ensure!(seen == client.ip.to_string(), "pod masqueraded: {seen}");
        let (_, seen) = whoami(&outside.ns, web)?;
        ensure!(
            seen.starts_with("10.20."),
            "outside client not masqueraded: {seen}"
        );
        for _ in 0..4 {
            let (name, seen) = whoami(&client.ns, node_port)?;
            ensure!(backend_names.contains(&name.as_str()), "{name}");
            ensure!(seen == client.ip.to_string(), "pod masqueraded: {seen}");
        }
        ensure!(
            dropped(&outside.ns, node_port),
            "outside client not dropped"
        );
    }
    // A pod created while the agent runs.
    let k = node.topo.clients.len();
    node.topo.add_client()?;
    let (topo, source) = (&node.topo, &node.source);
    let late = &topo.clients[k];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = whoami(&late.ns, web);
        if matches!(&got, Ok((_, seen)) if seen == &late.ip.to_string()) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "a pod created later is not taken for a pod: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.stop()?;

    // The same topology with the outside host's device as the "pods'":
    // the decision follows the device, not the address.
    let mut agent = start_with_prefix(topo, source, "e")?;
    let client = &topo.clients[0];
    let outside = &topo.externals[0];
    let (_, seen) = whoami(&outside.ns, web)?;
    ensure!(seen == outside.ip.to_string(), "e0 masqueraded: {seen}");
    let (name, _) = whoami(&outside.ns, node_port)?;
    ensure!(backend_names.contains(&name.as_str()), "{name}");
    let (_, seen) = whoami(&client.ns, web)?;
    ensure!(seen.starts_with("10.20."), "c0 not masqueraded: {seen}");
    agent.stop()?;
    Ok(())
}

/// kube-proxy's `BridgeInterface` detection with pods behind a bridge, as
/// bridge CNI plugins wire them: sluice runs on the bridge, a pod behind
/// it is a pod, a pod on a routed veth is not.
/// Local-traffic detection by the pods' bridge, `cbr0`.
const BRIDGE_DETECTION: &[&str] = &[
    "--detect-local-mode",
    "BridgeInterface",
    "--pod-bridge-interface",
    "cbr0",
];

#[test]
fn bridge_interface_tells_pods_behind_the_bridge() -> Result<()> {
    let mut node = Node::new(false)?;
    let bridged = node.topo.add_bridged_pod("cbr0", 0)?;
    let (topo, source) = (&node.topo, &node.source);
    let web = SocketAddrV4::new(WEB_VIP, 80);

    // The default --devices of the tests (c*, ...) take cbr0, not pv0.
    let mut agent = Agent::start(topo, source, BRIDGE_DETECTION)?;
    agent.wait_ready(Duration::from_secs(20))?;
    for _ in 0..4 {
        let (_, seen) = whoami(&bridged.ns, web)?;
        ensure!(
            seen == bridged.ip.to_string(),
            "bridged pod masqueraded: {seen}"
        );
    }
    let client = &topo.clients[0];
    let (_, seen) = whoami(&client.ns, web)?;
    ensure!(
        seen.starts_with("10.20."),
        "a pod outside the bridge was not masqueraded: {seen}"
    );
    agent.stop()?;
    // With the bridge's ports attached too, they are pods' devices that an
    // upgrade swaps first (detected, not named): before b0, which is not a
    // pod's device here and whose name sorts before theirs. A scan attaches
    // in the order it swaps.
    let mut agent = Agent::start_on(topo, source, "c*,b*,pv*", BRIDGE_DETECTION)?;
    agent.wait_ready(Duration::from_secs(20))?;
    let log = agent.log();
    let at = |dev: &str| log.find(&format!("attached device={dev} "));
    ensure!(
        matches!((at("pv0"), at("b0")), (Some(port), Some(other)) if port < other),
        "the bridge's port pv0 was not attached before b0:\n{}",
        agent.log_tail()
    );
    agent.stop()?;
    // Without a bridge flag the agent refuses to start rather than detect
    // nothing.
    let mut agent = Agent::start(topo, source, &["--detect-local-mode", "BridgeInterface"])?;
    ensure!(
        agent.wait_ready(Duration::from_secs(5)).is_err(),
        "BridgeInterface without --pod-bridge-interface started"
    );
    Ok(())
}
