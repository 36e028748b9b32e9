//! Traffic from the node itself (which crosses no TC ingress hook) through
//! the socket-level programs: TCP and UDP to a ClusterIP and a NodePort,
//! the service address seen by the application, refusal of an empty
//! service, and graceful termination of a host connection; the same for
//! IPv6 sockets and for IPv4 services reached through v4-mapped addresses.

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{ensure, Result};
use sluice_tests::{
    agent::{
        yaml::{self, READY, TERMINATING},
        Agent, ManifestDir,
    },
    host::HostClient,
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 90);

fn node_port_yaml(node_ip: Ipv4Addr) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {node_ip}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: np\n  namespace: default\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.91\n  clusterIPs: [10.96.0.91]\n  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8080\n    nodePort: 30090\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: np-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: np\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\nendpoints:\n- addresses: [\"10.20.0.2\"]\n  nodeName: node-1\n  conditions: {{ready: true}}\n"
    )
}

#[test]
fn the_nodes_own_processes_reach_services() -> Result<()> {
    let mut topo = Topology::new(0, 2)?;
    topo.add_external()?;
    let _tcp = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let _udp = topo
        .backends
        .iter()
        .map(|b| servers::udp_greeter(&b.ns, 5353, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let dir = ManifestDir::create()?;
    let (b0, b1) = (&topo.backends[0], &topo.backends[1]);
    dir.write("web.yaml", &yaml::service("web", VIP, 80, 8080))?;
    dir.write(
        "web-slice.yaml",
        &yaml::slice("web-1", "web", 8080, &[(b0.ip, READY), (b1.ip, READY)]),
    )?;
    dir.write(
        "empty.yaml",
        &yaml::service("empty", Ipv4Addr::new(10, 96, 0, 92), 80, 8080),
    )?;
    dir.write(
        "dns.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: dns\n  namespace: default\nspec:\n  clusterIP: 10.96.0.93\n  ports:\n  - name: dns\n    protocol: UDP\n    port: 53\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: dns\naddressType: IPv4\nports:\n- name: dns\n  protocol: UDP\n  port: 5353\nendpoints:\n- addresses: [\"10.20.0.2\"]\n  conditions: {ready: true}\n",
    )?;
    dir.write("np.yaml", &node_port_yaml(topo.node_address(0)))?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    // ClusterIP from the node: a backend answers, and getpeername() says
    // the service address.
    let out = HostClient::once(&topo, "tcp", &VIP.to_string(), 80)?;
    ensure!(
        out[0] == "ok" && out[1].starts_with("backend-") && out[2] == format!("{VIP}:80"),
        "{out:?}"
    );
    // NodePort on the node's own address.
    let out = HostClient::once(&topo, "tcp", &topo.node_address(0).to_string(), 30090)?;
    ensure!(
        out[0] == "ok"
            && out[1] == "backend-0"
            && out[2] == format!("{}:30090", topo.node_address(0)),
        "{out:?}"
    );
    // UDP: the reply reads as coming from the service address.
    let out = HostClient::once(&topo, "udp", "10.96.0.93", 53)?;
    ensure!(out == ["ok", "backend-0", "10.96.0.93:53"], "{out:?}");
    // A service without endpoints refuses at once.
    let out = HostClient::once(&topo, "tcp", "10.96.0.92", 80)?;
    ensure!(out == ["error", "ECONNREFUSED"], "{out:?}");

    // A host connection drains gracefully like any other flow.
    let mut host = (0..40)
        .map(|_| HostClient::start(&topo, "tcp", &VIP.to_string(), 80))
        .find_map(|c| {
            let mut c = c.ok()?;
            let first = c.line().ok()?;
            (first.get(1).map(String::as_str) == Some("backend-1")).then_some(c)
        })
        .ok_or_else(|| anyhow::anyhow!("no host connection landed on backend-1"))?;
    dir.write(
        "web-slice.yaml",
        &yaml::slice(
            "web-1",
            "web",
            8080,
            &[(b0.ip, READY), (b1.ip, TERMINATING)],
        ),
    )?;
    let b1_addr = format!("{}:8080", b1.ip);
    agent.wait_until(
        "backend-1 terminating with one flow",
        Duration::from_secs(5),
        |a| {
            let out = a.cli(&["lb", "list", "--json"])?;
            let rows: serde_json::Value = serde_json::from_str(&out)?;
            Ok(rows
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|r| r["backends"].as_array().cloned().unwrap_or_default())
                .any(|b| {
                    b["address"] == b1_addr.as_str()
                        && b["state"] == "terminating"
                        && b["flows"] == 1
                }))
        },
    )?;
    for _ in 0..5 {
        host.ping()?;
    }
    dir.write(
        "web-slice.yaml",
        &yaml::slice("web-1", "web", 8080, &[(b0.ip, READY)]),
    )?;
    let draining = |a: &Agent| -> Result<bool> {
        Ok(a.frontends()?[&format!("{VIP}:80")]
            .iter()
            .any(|(addr, s)| *addr == b1_addr && s == "draining"))
    };
    agent.wait_until("backend-1 draining", Duration::from_secs(5), draining)?;
    // The host's live flow keeps it through the scans.
    agent.wait_syncs(3, Duration::from_secs(5))?;
    host.ping()?;
    ensure!(draining(&agent)?, "backend-1 left with a live host flow");
    drop(host);
    agent.wait_until(
        "backend-1 removed once the host socket closed",
        Duration::from_secs(5),
        |a| Ok(a.frontends()?[&format!("{VIP}:80")].len() == 1),
    )?;
    Ok(())
}

/// A dual-stack ClusterIP service `web6` (TCP 80), an IPv6 UDP service
/// `dns6` and an IPv6 service `empty6` without endpoints, on the two
/// backends' addresses of both families.
fn dual_stack_yaml(topo: &Topology) -> String {
    let (b0, b1) = (&topo.backends[0], &topo.backends[1]);
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: web6
  namespace: default
spec:
  ipFamilyPolicy: RequireDualStack
  clusterIP: 10.96.0.94
  clusterIPs: [10.96.0.94, "fd00:96::94"]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web6-v4
  namespace: default
  labels:
    kubernetes.io/service-name: web6
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{b0v4}"]
  conditions: {{ready: true}}
- addresses: ["{b1v4}"]
  conditions: {{ready: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web6-v6
  namespace: default
  labels:
    kubernetes.io/service-name: web6
addressType: IPv6
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{b0v6}"]
  conditions: {{ready: true}}
- addresses: ["{b1v6}"]
  conditions: {{ready: true}}
---
apiVersion: v1
kind: Service
metadata:
  name: dns6
  namespace: default
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:96::95"
  clusterIPs: ["fd00:96::95"]
  ports:
  - name: dns
    protocol: UDP
    port: 53
    targetPort: 5353
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns6-1
  namespace: default
  labels:
    kubernetes.io/service-name: dns6
addressType: IPv6
ports:
- name: dns
  protocol: UDP
  port: 5353
endpoints:
- addresses: ["{b0v6}"]
  conditions: {{ready: true}}
---
apiVersion: v1
kind: Service
metadata:
  name: empty6
  namespace: default
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:96::96"
  clusterIPs: ["fd00:96::96"]
  ports:
  - name: http
    protocol: TCP
    port: 80
"#,
        b0v4 = b0.ip,
        b1v4 = b1.ip,
        b0v6 = b0.ip6,
        b1v6 = b1.ip6,
    )
}

/// The node's own IPv6 sockets (`connect6` & co.), and `AF_INET6` sockets
/// reaching an IPv4 service through its v4-mapped address: balanced, the
/// service address reported back, an empty service refused, and a node
/// socket counted as a live flow of its backend.
#[test]
fn the_nodes_own_ipv6_and_v4_mapped_sockets_reach_services() -> Result<()> {
    let topo = Topology::new(0, 2)?;
    topo.wait_ipv6_ready()?;
    let mut servers = servers::tcp_greeters_dual(&topo.backends, 8080)?;
    servers.push(servers::udp_greeter6(
        &topo.backends[0].ns,
        5353,
        &topo.backends[0].name,
    )?);
    let dir = ManifestDir::create()?;
    dir.write("web6.yaml", &dual_stack_yaml(&topo))?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    // IPv6 TCP: both backends answer over a run of connections, and
    // getpeername() says the service address.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let out = HostClient::once(&topo, "tcp", "fd00:96::94", 80)?;
        ensure!(out[0] == "ok" && out[2] == "[fd00:96::94]:80", "{out:?}");
        seen.insert(out[1].clone());
    }
    ensure!(
        seen.len() == 2,
        "20 connections reach both backends: {seen:?}"
    );
    // An AF_INET6 socket to the IPv4 ClusterIP, v4-mapped.
    let out = HostClient::once(&topo, "tcp", "::ffff:10.96.0.94", 80)?;
    ensure!(
        out[0] == "ok" && out[1].starts_with("backend-") && out[2] == "[::ffff:10.96.0.94]:80",
        "{out:?}"
    );
    // IPv6 UDP: the reply reads as coming from the service address.
    let out = HostClient::once(&topo, "udp", "fd00:96::95", 53)?;
    ensure!(out == ["ok", "backend-0", "[fd00:96::95]:53"], "{out:?}");
    // An IPv6 service without endpoints refuses at once.
    let out = HostClient::once(&topo, "tcp", "fd00:96::96", 80)?;
    ensure!(out == ["error", "ECONNREFUSED"], "{out:?}");

    // An open IPv6 node socket is a live flow of its backend.
    let mut host = HostClient::start(&topo, "tcp", "fd00:96::94", 80)?;
    let first = host.line()?;
    ensure!(first[0] == "ok", "{first:?}");
    let backend = topo
        .backend(&first[1])
        .ok_or_else(|| anyhow::anyhow!("unknown backend {first:?}"))?;
    let address = format!("[{}]:8080", backend.ip6);
    agent.wait_until("the node socket counted", Duration::from_secs(5), |a| {
        let rows: serde_json::Value = serde_json::from_str(&a.cli(&["lb", "list", "--json"])?)?;
        Ok(rows
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["backends"].as_array().cloned().unwrap_or_default())
            .any(|b| b["address"] == address.as_str() && b["flows"] == 1))
    })?;
    host.ping()?;
    Ok(())
}

/// A ClusterIP service `name` at `vip`, port 80 -> 8080, with `extra`
/// lines under `spec:` and `annotations` under `metadata:`, and one
/// EndpointSlice of `endpoints` on `node`.
fn service_with(
    name: &str,
    vip: Ipv4Addr,
    annotations: &str,
    extra: &str,
    endpoints: &[Ipv4Addr],
    node: &str,
) -> String {
    let eps: String = endpoints
        .iter()
        .map(|a| {
            format!("- addresses: [\"{a}\"]\n  nodeName: {node}\n  conditions: {{ready: true}}\n")
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n{annotations}spec:\n  clusterIP: {vip}\n  clusterIPs: [{vip}]\n{extra}  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8080\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\nendpoints:\n{eps}"
    )
}

/// The node's own sockets go through the TC path's selection: session
/// affinity keeps them on one backend, a Maglev frontend's table decides
/// (proven by rewriting the table so that it names a single backend), and
/// a frontend that drops when empty (internalTrafficPolicy Local, no local
/// endpoint) fails the connect() at once with ETIMEDOUT, counted as a drop,
/// instead of refusing it.
#[test]
fn the_nodes_own_sockets_select_as_the_tc_path_does() -> Result<()> {
    const STICKY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 95);
    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 96);
    const MAGLEV: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 97);
    let topo = Topology::new(0, 3)?;
    let _tcp = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let ips: Vec<Ipv4Addr> = topo.backends.iter().map(|b| b.ip).collect();
    let dir = ManifestDir::create()?;
    dir.write(
        "sticky.yaml",
        &service_with(
            "sticky",
            STICKY,
            "",
            "  sessionAffinity: ClientIP\n",
            &ips,
            "node-1",
        ),
    )?;
    dir.write(
        "local.yaml",
        &service_with(
            "local",
            LOCAL,
            "",
            "  internalTrafficPolicy: Local\n",
            &ips[..1],
            "node-2",
        ),
    )?;
    dir.write(
        "maglev.yaml",
        &service_with(
            "maglev",
            MAGLEV,
            "  annotations:\n    service.sluice.dev/lb-algorithm: maglev\n",
            "",
            &ips,
            "node-1",
        ),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    // Affinity: the node is one client, and it sticks.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let out = HostClient::once(&topo, "tcp", &STICKY.to_string(), 80)?;
        ensure!(out.first().map(String::as_str) == Some("ok"), "{out:?}");
        seen.insert(out[1].clone());
    }
    ensure!(seen.len() == 1, "affinity not kept: {seen:?}");

    // DROP: at once, as ETIMEDOUT, counted.
    let maps = || sluice::datapath::Maps::open_pinned(topo.bpf.path());
    let drops = maps()?.stat(sluice_common::Stat::NoBackendDrop)?;
    let started = std::time::Instant::now();
    let out = HostClient::once(&topo, "tcp", &LOCAL.to_string(), 80)?;
    ensure!(out == ["error", "ETIMEDOUT"], "{out:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    ensure!(maps()?.stat(sluice_common::Stat::NoBackendDrop)? > drops);

    // Maglev: the table decides. Point every entry at backend-2.
    let b2 = format!("{}:8080", topo.backends[2].ip);
    let rows: serde_json::Value = serde_json::from_str(&agent.cli(&["lb", "list", "--json"])?)?;
    let b2_id = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["frontend"] == format!("{MAGLEV}:80").as_str())
        .flat_map(|r| r["backends"].as_array().cloned().unwrap_or_default())
        .find(|b| b["address"] == b2.as_str())
        .and_then(|b| b["id"].as_u64())
        .ok_or_else(|| anyhow::anyhow!("backend-2 of the maglev frontend not listed: {rows}"))?;
    let key = sluice_common::Svc4Key::new(MAGLEV.octets(), 80, sluice_common::IPPROTO_TCP, 0);
    let mut table = Box::new(sluice_common::MaglevTable::default());
    table.backends.fill(u32::try_from(b2_id)?);
    maps()?.maglev_v4.insert(key, *table, 0)?;
    for _ in 0..8 {
        let out = HostClient::once(&topo, "tcp", &MAGLEV.to_string(), 80)?;
        ensure!(
            out.get(1).map(String::as_str) == Some("backend-2"),
            "{out:?}"
        );
    }
    Ok(())
}

/// A LoadBalancer service `name` at cluster IP `vip` with load-balancer
/// ingress `lb` and `ranges` as loadBalancerSourceRanges, port 80 -> 8080
/// on `endpoints`.
fn load_balancer_with_ranges(
    name: &str,
    vip: Ipv4Addr,
    lb: Ipv4Addr,
    ranges: &str,
    endpoints: &[Ipv4Addr],
) -> String {
    let svc = service_with(
        name,
        vip,
        "",
        &format!("  type: LoadBalancer\n  loadBalancerSourceRanges: [{ranges}]\n"),
        endpoints,
        "node-1",
    );
    svc.replacen(
        "\n---\n",
        &format!("\nstatus:\n  loadBalancer:\n    ingress:\n    - ip: {lb}\n---\n"),
        1,
    )
}

/// kube-proxy filters the node's own connections to a load-balancer IP by
/// their source, a node address, like any client's: a node process reaches
/// a load-balancer IP whose ranges hold one of the node's addresses, and is
/// dropped (at once, ETIMEDOUT, counted `source_denied`) where they hold
/// none.
#[test]
fn the_nodes_own_sockets_obey_load_balancer_source_ranges() -> Result<()> {
    const OPEN_LB: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 61);
    const CLOSED_LB: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 62);
    let topo = Topology::new(0, 2)?;
    let _tcp = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let ips: Vec<Ipv4Addr> = topo.backends.iter().map(|b| b.ip).collect();
    let node_ip = Ipv4Addr::new(192, 168, 1, 1);
    let dir = ManifestDir::create()?;
    dir.write(
        "node.yaml",
        &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {node_ip}\n"
        ),
    )?;
    dir.write(
        "open.yaml",
        &load_balancer_with_ranges(
            "open",
            Ipv4Addr::new(10, 96, 0, 61),
            OPEN_LB,
            "192.168.1.0/24, 198.51.100.0/24",
            &ips,
        ),
    )?;
    dir.write(
        "closed.yaml",
        &load_balancer_with_ranges(
            "closed",
            Ipv4Addr::new(10, 96, 0, 62),
            CLOSED_LB,
            "198.51.100.0/24",
            &ips,
        ),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    let list = agent.cli(&["lb", "list"])?;
    ensure!(
        list.lines()
            .filter(|l| l.contains("[source ranges deny the node]"))
            .count()
            == 1,
        "{list}"
    );

    let out = HostClient::once(&topo, "tcp", &OPEN_LB.to_string(), 80)?;
    ensure!(out.first().map(String::as_str) == Some("ok"), "{out:?}");
    let maps = || sluice::datapath::Maps::open_pinned(topo.bpf.path());
    let denied = maps()?.stat(sluice_common::Stat::SourceDenied)?;
    let started = std::time::Instant::now();
    let out = HostClient::once(&topo, "tcp", &CLOSED_LB.to_string(), 80)?;
    ensure!(out == ["error", "ETIMEDOUT"], "{out:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    ensure!(maps()?.stat(sluice_common::Stat::SourceDenied)? > denied);
    // The cluster IP of the same service is not filtered.
    let out = HostClient::once(&topo, "tcp", "10.96.0.62", 80)?;
    ensure!(out.first().map(String::as_str) == Some("ok"), "{out:?}");
    Ok(())
}
