//! Service types end to end through the real agent and manifests: a
//! LoadBalancer service with externalTrafficPolicy Local gets ClusterIP,
//! NodePort (on the Node object's address) and LoadBalancer frontends, keeps
//! the client address, and serves kube-proxy's health check node port.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
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
