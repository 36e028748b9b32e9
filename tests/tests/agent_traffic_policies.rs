//! Traffic policies and topology hints end to end, through the real agent
//! on manifests and real connections: internalTrafficPolicy Local keeps
//! pod traffic on this node's endpoints and drops it when there are none
//! (kube-proxy: "no local endpoints"); zone hints keep traffic in the
//! node's zone only while every ready endpoint carries hints.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{ensure, Result};
use sluice_common::Stat;
use sluice_tests::{
    agent::{Agent, ManifestDir},
    clients, servers, Topology,
};

const LOCAL_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 1);
const NO_LOCAL_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 2);
const ZONED_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 3);

fn service(name: &str, vip: Ipv4Addr, internal_local: bool) -> String {
    let policy = if internal_local { "Local" } else { "Cluster" };
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  type: ClusterIP
  clusterIP: {vip}
  clusterIPs: [{vip}]
  internalTrafficPolicy: {policy}
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
---
"#
    )
}

/// One endpoint: address, node, zone hint (if any).
type Ep<'a> = (Ipv4Addr, &'a str, Option<&'a str>);

fn slice(service: &str, endpoints: &[Ep]) -> String {
    let mut eps = String::new();
    for (addr, node, hint) in endpoints {
        eps.push_str(&format!(
            "- addresses: [\"{addr}\"]\n  nodeName: {node}\n  conditions: {{ready: true, serving: true, terminating: false}}\n"
        ));
        if let Some(zone) = hint {
            eps.push_str(&format!(
                "  zone: {zone}\n  hints: {{forZones: [{{name: {zone}}}]}}\n"
            ));
        }
    }
    format!(
        r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-1
  namespace: default
  labels:
    kubernetes.io/service-name: {service}
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
{eps}---
"#
    )
}

const NODE: &str = r#"apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels:
    topology.kubernetes.io/zone: zone-a
---
"#;

/// Which backends 30 connections to `vip` reach (errors under "error").
fn spread(topo: &Topology, vip: Ipv4Addr) -> Result<BTreeMap<String, usize>> {
    let mut hits = BTreeMap::new();
    for outcome in clients::tcp_hellos(&topo.clients[0].ns, SocketAddrV4::new(vip, 80), 30)? {
        let key = outcome.unwrap_or_else(|_| "error".into());
        *hits.entry(key).or_default() += 1;
    }
    Ok(hits)
}

#[test]
fn internal_policy_local_and_zone_hints_pick_the_endpoints_kube_proxy_would() -> Result<()> {
    let topo = Topology::new(1, 3)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let [b0, b1, b2] = [
        topo.backends[0].ip,
        topo.backends[1].ip,
        topo.backends[2].ip,
    ];
    let zoned = |hint_on_b2: bool| {
        slice(
            "zoned",
            &[
                (b0, "node-1", Some("zone-a")),
                (b1, "node-1", Some("zone-b")),
                (b2, "node-1", hint_on_b2.then_some("zone-b")),
            ],
        )
    };
    let dir = ManifestDir::create()?;
    // Backend 1 stands for a pod on another node: routable, not local.
    dir.write(
        "policies.yaml",
        &[
            NODE.to_owned(),
            service("local", LOCAL_VIP, true),
            slice("local", &[(b0, "node-1", None), (b1, "node-2", None)]),
            service("no-local", NO_LOCAL_VIP, true),
            slice("no-local", &[(b1, "node-2", None)]),
            service("zoned", ZONED_VIP, false),
        ]
        .concat(),
    )?;
    dir.write("zoned-slice.yaml", &zoned(true))?;
    let source = format!("dir:{}", dir.path().display());
    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let local = spread(&topo, LOCAL_VIP)?;
    ensure!(
        local == BTreeMap::from([("backend-0".to_owned(), 30)]),
        "internalTrafficPolicy Local reaches only the node's endpoint: {local:?}"
    );

    let dropped_before = agent_stat(&topo, Stat::NoBackendDrop)?;
    let outcome = clients::tcp_hello(&topo.clients[0].ns, SocketAddrV4::new(NO_LOCAL_VIP, 80));
    ensure!(
        outcome.is_err(),
        "no local endpoint: the connection must not be served: {outcome:?}"
    );
    ensure!(
        agent_stat(&topo, Stat::NoBackendDrop)? > dropped_before,
        "no local endpoint: dropped (kube-proxy's DROP), not rejected"
    );

    // Every endpoint hinted, one for this node's zone: only that one.
    let hinted = spread(&topo, ZONED_VIP)?;
    ensure!(
        hinted == BTreeMap::from([("backend-0".to_owned(), 30)]),
        "zone hints keep traffic in zone-a: {hinted:?}"
    );
    // One endpoint without hints: kube-proxy ignores hints altogether.
    dir.write("zoned-slice.yaml", &zoned(false))?;
    agent.wait_until(
        "hints ignored once one endpoint has none",
        Duration::from_secs(5),
        |_| Ok(spread(&topo, ZONED_VIP)?.len() == 3),
    )?;
    Ok(())
}

fn agent_stat(topo: &Topology, stat: Stat) -> Result<u64> {
    Ok(sluice::datapath::Maps::open_pinned(topo.bpf.path())?.stat(stat)?)
}
