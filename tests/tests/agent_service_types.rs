//! Service types end to end through the real agent and manifests: a
//! LoadBalancer service with externalTrafficPolicy Local gets ClusterIP,
//! NodePort (on the Node object's address) and LoadBalancer frontends, keeps
//! the client address, and serves kube-proxy's health check node port; the
//! IPv6 side of a dual-stack LoadBalancer with policy Cluster, session
//! affinity and source ranges is served the same way.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use sluice_tests::{
    agent::{Agent, ManifestDir},
    servers, Netns, Topology,
};

const HEALTH_PORT: u16 = 32001;

fn manifests(node_ip: Ipv4Addr, backend: Ipv4Addr, ready: bool) -> String {
    let (r, t) = if ready { (true, false) } else { (false, true) };
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
  name: public
  namespace: default
spec:
  type: LoadBalancer
  clusterIP: 10.96.5.1
  clusterIPs: [10.96.5.1]
  externalTrafficPolicy: Local
  healthCheckNodePort: {HEALTH_PORT}
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: 30080
status:
  loadBalancer:
    ingress:
    - ip: 10.200.0.5
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: public-1
  namespace: default
  labels:
    kubernetes.io/service-name: public
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{backend}"]
  nodeName: node-1
  conditions: {{ready: {r}, serving: {r}, terminating: {t}}}
"#
    )
}

fn whoami(ns: &Netns, addr: SocketAddrV4) -> Result<String> {
    ns.run(move || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 128];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
    })?
    .context("whoami")
}

fn health_check(ns: &Netns, addr: SocketAddrV4) -> Result<(u16, serde_json::Value)> {
    let resp = ns.run(move || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&SocketAddr::V4(addr), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })??;
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("status")?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok((code, serde_json::from_str(body)?))
}

#[test]
fn load_balancer_with_local_policy_end_to_end() -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    let b = &topo.backends[0];
    let _server = servers::tcp_whoami(&b.ns, 8080, &b.name)?;
    let node_ip = topo.node_address(0);
    let dir = ManifestDir::create()?;
    dir.write("public.yaml", &manifests(node_ip, b.ip, true))?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let kinds = agent.cli(&["lb", "list"])?;
    for kind in ["ClusterIP", "NodePort", "LoadBalancer"] {
        ensure!(kinds.contains(kind), "lb list shows {kind}:\n{kinds}");
    }
    let ext = &topo.externals[0];
    // Policy Local: the backend sees the external client's own address.
    let via_node_port = whoami(&ext.ns, SocketAddrV4::new(node_ip, 30080))?;
    ensure!(
        via_node_port == format!("backend-0 {}", ext.ip),
        "{via_node_port}"
    );
    let via_lb = whoami(&ext.ns, SocketAddrV4::new(Ipv4Addr::new(10, 200, 0, 5), 80))?;
    ensure!(via_lb == format!("backend-0 {}", ext.ip), "{via_lb}");

    let hc = SocketAddrV4::new(node_ip, HEALTH_PORT);
    let (code, body) = health_check(&ext.ns, hc)?;
    ensure!(code == 200 && body["localEndpoints"] == 1, "{code} {body}");
    ensure!(body["service"]["name"] == "public");

    // Only a terminating local endpoint left: the balancer must drain us.
    dir.write("public.yaml", &manifests(node_ip, b.ip, false))?;
    agent.wait_until("health check 503", Duration::from_secs(5), |_| {
        Ok(health_check(&ext.ns, hc)?.0 == 503)
    })?;
    let (_, body) = health_check(&ext.ns, hc)?;
    ensure!(body["localEndpoints"] == 0, "{body}");
    Ok(())
}

fn dual_stack_manifests(node4: Ipv4Addr, node6: Ipv6Addr, b4: Ipv4Addr, b6: Ipv6Addr) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: node-1
status:
  addresses:
  - type: InternalIP
    address: {node4}
  - type: InternalIP
    address: {node6}
---
apiVersion: v1
kind: Service
metadata:
  name: edge
  namespace: default
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.5.2
  clusterIPs: [10.96.5.2, "fd00:96:5::2"]
  externalTrafficPolicy: Cluster
  sessionAffinity: ClientIP
  loadBalancerSourceRanges: ["192.168.1.0/24", "fd00:168:1::/64"]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: 30081
status:
  loadBalancer:
    ingress:
    - ip: 10.200.0.6
    - ip: "fd00:200::6"
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: edge-v4
  namespace: default
  labels:
    kubernetes.io/service-name: edge
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{b4}"]
  nodeName: node-1
  conditions: {{ready: true, serving: true, terminating: false}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: edge-v6
  namespace: default
  labels:
    kubernetes.io/service-name: edge
addressType: IPv6
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{b6}"]
  nodeName: node-1
  conditions: {{ready: true, serving: true, terminating: false}}
"#
    )
}

fn whoami6(ns: &Netns, addr: SocketAddrV6) -> Result<String> {
    ns.run(move || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 128];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
    })?
    .context("whoami")
}

/// The IPv6 side of a dual-stack LoadBalancer through the agent: the
/// Node object's IPv6 address gets the node port, externalTrafficPolicy
/// Cluster SNATs to the node, the IPv6 source range admits only its own
/// family's listed network, and `sluice ct list` shows the SNAT rewrite.
#[test]
fn dual_stack_load_balancer_with_cluster_policy_serves_ipv6_end_to_end() -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    topo.add_external()?;
    topo.strict_checksums()?;
    topo.wait_ipv6_ready()?;
    let b = &topo.backends[0];
    let _server = servers::tcp_whoami6(&b.ns, 8080, &b.name)?;
    let node6 = topo.node_address6(0);
    let dir = ManifestDir::create()?;
    dir.write(
        "edge.yaml",
        &dual_stack_manifests(topo.node_address(0), node6, b.ip, b.ip6),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let list = agent.cli(&["lb", "list"])?;
    for frontend in [
        "[fd00:96:5::2]:80",
        &format!("[{node6}]:30081"),
        "[fd00:200::6]:80",
        "10.200.0.6:80",
    ] {
        ensure!(list.contains(frontend), "lb list shows {frontend}:\n{list}");
    }
    let problems = agent.metrics()?;
    ensure!(
        !problems
            .lines()
            .any(|l| l.contains("ipv6_unsupported") && !l.ends_with(" 0")),
        "nothing IPv6 is left out:\n{problems}"
    );

    let (e0, e1) = (&topo.externals[0], &topo.externals[1]);
    // NodePort with policy Cluster: the backend sees the node's address on
    // its own link (SNAT), and the flow's conntrack entry says so.
    let node_on_backend_link = sluice_tests::topology::v6_of(Ipv4Addr::new(10, 20, 0, 1));
    let via_node_port = whoami6(&e0.ns, SocketAddrV6::new(node6, 30081, 0, 0))?;
    ensure!(
        via_node_port == format!("backend-0 {node_on_backend_link}"),
        "{via_node_port}"
    );
    let flows = agent.cli(&["ct", "list"])?;
    ensure!(
        flows.contains(&format!("[{node_on_backend_link}]:")),
        "ct list shows the SNAT source:\n{flows}"
    );

    // The load-balancer IP admits the listed IPv6 network only.
    let lb6 = SocketAddrV6::new("fd00:200::6".parse()?, 80, 0, 0);
    ensure!(whoami6(&e0.ns, lb6)?.starts_with("backend-0 "));
    let denied = e1
        .ns
        .run(move || TcpStream::connect_timeout(&lb6.into(), Duration::from_millis(700)))?;
    ensure!(
        matches!(&denied, Err(e) if e.kind() == std::io::ErrorKind::TimedOut),
        "external-1 is outside the IPv6 source range: {denied:?}"
    );
    Ok(())
}

/// Issue 13, class 7, on the wire: an IPv4-only NodePort service on a
/// dual-stack node leaves the node's IPv6 port alone, so an IPv6 client of
/// that port reaches whatever listens there on the node (here a process of
/// the node's own), not a RST from a frontend without backends; the IPv4
/// node port is served.
#[test]
fn an_ipv4_only_node_port_leaves_the_nodes_ipv6_port_alone() -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    topo.wait_ipv6_ready()?;
    let b = &topo.backends[0];
    let _server = servers::tcp_whoami(&b.ns, 8080, &b.name)?;
    let _node_listener = servers::tcp_whoami6(&topo.node, 30082, "node-process")?;
    let (node4, node6) = (topo.node_address(0), topo.node_address6(0));
    let dir = ManifestDir::create()?;
    dir.write(
        "np.yaml",
        &format!(
            r#"apiVersion: v1
kind: Node
metadata:
  name: node-1
status:
  addresses:
  - type: InternalIP
    address: {node4}
  - type: InternalIP
    address: {node6}
---
apiVersion: v1
kind: Service
metadata:
  name: v4only
  namespace: default
spec:
  type: NodePort
  clusterIP: 10.96.5.9
  clusterIPs: [10.96.5.9]
  ipFamilies: [IPv4]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: 30082
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: v4only-1
  namespace: default
  labels:
    kubernetes.io/service-name: v4only
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{ip}"]
  nodeName: node-1
  conditions: {{ready: true}}
"#,
            ip = b.ip
        ),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    let list = agent.cli(&["lb", "list"])?;
    ensure!(
        !list.contains(&format!("[{node6}]:30082")),
        "no IPv6 frontend for an IPv4-only service:\n{list}"
    );
    let e0 = &topo.externals[0];
    let v4 = whoami(&e0.ns, SocketAddrV4::new(node4, 30082))?;
    ensure!(v4.starts_with("backend-0"), "IPv4 node port served: {v4}");
    let v6 = whoami6(&e0.ns, SocketAddrV6::new(node6, 30082, 0, 0))?;
    ensure!(
        v6.starts_with("node-process"),
        "the node's own IPv6 listener answers, not sluice: {v6}"
    );
    Ok(())
}
