//! Hostile input through the real agent (issue 18): a Service on an
//! address that is never a service's (loopback, unspecified, broadcast,
//! link-local) must not capture the node's own traffic to that address.

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{ensure, Result};
use sluice_tests::{
    agent::{Agent, ManifestDir},
    host::HostClient,
    servers, Topology,
};

fn service(name: &str, cluster_ip: &str, external: &str, backend: Ipv4Addr) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterIP: {cluster_ip}\n  clusterIPs: [{cluster_ip}]\n  externalIPs: [{external}]\n  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8080\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\nendpoints:\n- addresses: [\"{backend}\"]\n  conditions: {{ready: true}}\n"
    )
}

/// A Service whose cluster IP is 127.0.0.1 and one whose external IPs are
/// 0.0.0.0, 255.255.255.255 and 169.254.169.254: none of them is
/// programmed, each is reported `forbidden_address`, the node's own
/// connection to 127.0.0.1:80 reaches the node's own listener (not a pod),
/// and a good service beside them works.
#[test]
fn services_on_forbidden_addresses_cannot_capture_the_nodes_traffic() -> Result<()> {
    let topo = Topology::new(0, 1)?;
    let _backend = servers::tcp_greeter(&topo.backends[0].ns, 8080, "backend-0")?;
    // The node's own service on its loopback, port 80.
    let _local = servers::tcp_greeter(&topo.node, 80, "node-local")?;
    let b0 = topo.backends[0].ip;
    let dir = ManifestDir::create()?;
    dir.write("lo.yaml", &service("lo", "127.0.0.1", "10.96.0.81", b0))?;
    dir.write(
        "ext.yaml",
        &service(
            "ext",
            "10.96.0.82",
            "0.0.0.0, 255.255.255.255, 169.254.169.254, \"::ffff:127.0.0.1\"",
            b0,
        ),
    )?;
    dir.write(
        "good.yaml",
        &service("good", "10.96.0.80", "10.96.0.83", b0),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let list = agent.cli(&["lb", "list"])?;
    for addr in ["127.0.0.1", "0.0.0.0", "255.255.255.255", "169.254.169.254"] {
        ensure!(
            !list.contains(&format!("{addr}:80")),
            "{addr} programmed:\n{list}"
        );
    }
    ensure!(
        list.contains("10.96.0.80:80"),
        "good service missing:\n{list}"
    );
    for _ in 0..3 {
        let out = HostClient::once(&topo, "tcp", "127.0.0.1", 80)?;
        ensure!(
            out.get(1).map(String::as_str) == Some("node-local"),
            "the node's loopback was captured: {out:?}"
        );
    }
    let out = HostClient::once(&topo, "tcp", "10.96.0.80", 80)?;
    ensure!(
        out.get(1).map(String::as_str) == Some("backend-0"),
        "{out:?}"
    );
    let text = agent.metrics()?;
    let refused: f64 = text
        .lines()
        .filter(|l| l.starts_with("sluice_rejected_objects") && l.contains("forbidden_address"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    ensure!(refused >= 2.0, "forbidden addresses not counted:\n{text}");
    Ok(())
}
