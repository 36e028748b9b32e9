//! Every row of kube-proxy's endpoint categorisation table
//! (`agent/src/translate/kube_proxy_table.rs`, which the translation's unit
//! test also runs) played as real connections through the real agent:
//! each row becomes its own Service (own cluster IP, node port,
//! load-balancer IP and external IP) with its own EndpointSlice, and a
//! client of the row's class connects to the row's destination:
//! - a pod of this node: a client pod (TC ingress on its veth);
//! - a pod on another node: a second client pod; like a pod elsewhere it
//!   is inside `--cluster-cidr`, and it reaches this node's addresses
//!   through a device of this node;
//! - the node itself: a process in the node namespace (socket programs);
//! - outside the cluster: a host behind the node's uplink.
//!
//! Endpoint `k` of a row is backend pod `k - 1`; its `nodeName` is the
//! row's (this node is `node-1` here, `n1` in the table). The verdict is
//! checked as kube-proxy gives it: the set of backends 40 connections
//! reach, a refusal (sluice's RST, counted `no_backend`), a drop (the
//! connection times out, counted `no_backend_drop`), or no rule at all
//! (the node's own stack answers, sluice counts nothing). Rows are grouped
//! by the node's zone, one agent for all.

use std::{
    collections::BTreeSet,
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use sluice_common::Stat;
use sluice_tests::{
    agent::{Agent, ManifestDir, NODE_NAME},
    clients,
    host::HostClient,
    netns::Netns,
    servers, Topology,
};

#[allow(dead_code)] // what only the translation's test reads
mod table {
    include!("../../agent/src/translate/kube_proxy_table.rs");
}
use table::*;

/// Connections per `To` row: every endpoint of up to four is reached with
/// a probability above 1 - 4 * (3/4)^40.
const TRIES: usize = 40;
/// How long a dropped connection is given.
const DROP_WAIT: Duration = Duration::from_millis(1000);

/// The table's node names as this test's agent knows them.
fn node_name(n: &str) -> &str {
    if n == HERE {
        NODE_NAME
    } else {
        n
    }
}

/// Row `i`'s addresses.
struct RowAddrs {
    cluster_ip: Ipv4Addr,
    node_port: u16,
    lb_ip: Ipv4Addr,
    external_ip: Ipv4Addr,
}

fn addrs(i: usize) -> RowAddrs {
    // Row numbers fit: the table has far fewer than 254 rows.
    let i = (i % 254) as u8 + 1;
    RowAddrs {
        cluster_ip: Ipv4Addr::new(10, 96, 9, i),
        node_port: 30100 + u16::from(i),
        lb_ip: Ipv4Addr::new(203, 0, 113, i),
        external_ip: Ipv4Addr::new(198, 51, 100, i),
    }
}

fn endpoint_yaml(e: &Ep, backends: &[Ipv4Addr]) -> String {
    let addr = backends[usize::from(e.last) - 1];
    let (ready, serving, terminating) = match e.cond {
        Cond::Ready => (true, true, false),
        Cond::ServingTerminating => (false, true, true),
        Cond::Terminating => (false, false, true),
        Cond::NotReady => (false, false, false),
    };
    let mut out = format!(
        "- addresses: [\"{addr}\"]\n  nodeName: {}\n  conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}\n",
        node_name(e.node)
    );
    if !e.zones.is_empty() || !e.nodes.is_empty() {
        out.push_str("  hints:\n");
        if !e.zones.is_empty() {
            let zones: Vec<String> = e.zones.iter().map(|z| format!("{{name: {z}}}")).collect();
            out.push_str(&format!("    forZones: [{}]\n", zones.join(", ")));
        }
        if !e.nodes.is_empty() {
            let nodes: Vec<String> = e
                .nodes
                .iter()
                .map(|n| format!("{{name: {}}}", node_name(n)))
                .collect();
            out.push_str(&format!("    forNodes: [{}]\n", nodes.join(", ")));
        }
    }
    out
}

/// Row `i`'s Service and EndpointSlice, as the table's translation test
/// builds them (`k8s_service` there), on this row's addresses.
fn row_yaml(i: usize, c: &Case, backends: &[Ipv4Addr]) -> String {
    let a = addrs(i);
    let s = &c.svc;
    let name = format!("row-{i}");
    let mut spec = format!(
        "  clusterIP: {}\n  clusterIPs: [{}]\n  ipFamilies: [IPv4]\n  externalIPs: [{}]\n",
        a.cluster_ip, a.cluster_ip, a.external_ip
    );
    if s.internal_local {
        spec.push_str("  internalTrafficPolicy: Local\n");
    }
    if s.external_local {
        spec.push_str("  externalTrafficPolicy: Local\n");
    }
    if let Some(d) = s.traffic_distribution {
        spec.push_str(&format!("  trafficDistribution: {d}\n"));
    }
    let (kind, node_port, status) = if s.load_balancer {
        (
            "LoadBalancer",
            format!("    nodePort: {}\n", a.node_port),
            format!(
                "status:\n  loadBalancer:\n    ingress:\n    - ip: {}\n",
                a.lb_ip
            ),
        )
    } else {
        ("ClusterIP", String::new(), String::new())
    };
    let endpoints: String = c
        .endpoints
        .iter()
        .map(|e| endpoint_yaml(e, backends))
        .collect();
    let endpoints = if endpoints.is_empty() {
        "endpoints: []\n".to_owned()
    } else {
        format!("endpoints:\n{endpoints}")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: {kind}\n{spec}  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8080\n{node_port}{status}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\n{endpoints}"
    )
}

fn node_yaml(zone: Option<&str>, v4: Ipv4Addr, v6: std::net::Ipv6Addr) -> String {
    let labels = zone.map_or(String::new(), |z| {
        format!("  labels:\n    topology.kubernetes.io/zone: {z}\n")
    });
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE_NAME}\n{labels}status:\n  addresses:\n  - type: InternalIP\n    address: {v4}\n  - type: InternalIP\n    address: \"{v6}\"\n"
    )
}

/// What one connection got.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The greeting: the backend's name.
    Reached(String),
    Refused,
    TimedOut,
    Other(String),
}

fn outcome(r: io::Result<String>) -> Outcome {
    match r {
        Ok(name) => Outcome::Reached(name),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Outcome::Refused,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) =>
        {
            Outcome::TimedOut
        }
        Err(e) => Outcome::Other(e.to_string()),
    }
}

/// `n` connections from a pod or host namespace.
fn from_ns(ns: &Netns, to: SocketAddr, n: usize, timeout: Duration) -> Result<Vec<Outcome>> {
    ns.run(move || {
        (0..n)
            .map(|_| outcome(TcpStream::connect_timeout(&to, timeout).and_then(clients::hello)))
            .collect()
    })
}

/// `n` connections from a process of the node (the socket programs).
fn from_node(topo: &Topology, to: SocketAddr, n: usize) -> Result<Vec<Outcome>> {
    Ok(
        HostClient::tcp_many(topo, &to.ip().to_string(), to.port(), n)?
            .into_iter()
            .map(|out| {
                match out.first().map(String::as_str) {
                    Some("ok") => Outcome::Reached(out.get(1).cloned().unwrap_or_default()),
                    Some("error") => match out.get(1).map(String::as_str) {
                        Some("ECONNREFUSED") => Outcome::Refused,
                        // ETIMEDOUT at once (a drop), or the client's own timeout.
                        Some("ETIMEDOUT") | Some("timed") => Outcome::TimedOut,
                        other => Outcome::Other(format!("{other:?}")),
                    },
                    _ => Outcome::Other(format!("{out:?}")),
                }
            })
            .collect(),
    )
}

fn stat(topo: &Topology, s: Stat) -> Result<u64> {
    Ok(sluice::datapath::Maps::open_pinned(topo.bpf.path())?.stat(s)?)
}

/// Plays row `i` and says how it differs from kube-proxy's verdict.
fn play(topo: &Topology, i: usize, c: &Case) -> Result<Option<String>> {
    let a = addrs(i);
    let to: SocketAddr = match c.dest {
        Dest::ClusterIp => (a.cluster_ip, 80).into(),
        Dest::NodePort => (topo.node_address(0), a.node_port).into(),
        Dest::NodePortV6 => (IpAddr::V6(topo.node_address6(0)), a.node_port).into(),
        Dest::LoadBalancer => (a.lb_ip, 80).into(),
        Dest::ExternalIp => (a.external_ip, 80).into(),
    };
    let n = match c.kube_proxy {
        Verdict::To(_) => TRIES,
        _ => 1,
    };
    let (rejects, drops) = (
        stat(topo, Stat::NoBackend)?,
        stat(topo, Stat::NoBackendDrop)?,
    );
    let got = match c.source {
        Source::PodHere => from_ns(&topo.clients[0].ns, to, n, DROP_WAIT)?,
        Source::PodElsewhere => from_ns(&topo.clients[1].ns, to, n, DROP_WAIT)?,
        Source::Outside => from_ns(&topo.externals[0].ns, to, n, DROP_WAIT)?,
        Source::Node => from_node(topo, to, n)?,
    };
    let (rejected, dropped) = (
        stat(topo, Stat::NoBackend)? > rejects,
        stat(topo, Stat::NoBackendDrop)? > drops,
    );
    let differs = match &c.kube_proxy {
        Verdict::To(eps) => {
            let want: BTreeSet<String> = eps.iter().map(|k| format!("backend-{}", k - 1)).collect();
            let reached: BTreeSet<String> = got
                .iter()
                .filter_map(|o| match o {
                    Outcome::Reached(name) => Some(name.clone()),
                    _ => None,
                })
                .collect();
            // How the failed ones failed (refused, timed out, reset...):
            // what tells a datapath fault from a slow machine.
            let failed: Vec<&Outcome> = got
                .iter()
                .filter(|o| !matches!(o, Outcome::Reached(_)))
                .collect();
            (reached != want || !failed.is_empty()).then(|| {
                format!(
                    "reached {reached:?} ({} of {n} failed: {failed:?}), want {want:?}",
                    failed.len()
                )
            })
        }
        // The socket programs refuse without a packet, so only the TC
        // path's refusals are counted.
        Verdict::Reject => (got != [Outcome::Refused] || (c.source != Source::Node && !rejected))
            .then(|| format!("{got:?} (counted: {rejected}), want a refusal by sluice")),
        Verdict::Drop => (got != [Outcome::TimedOut] || !dropped)
            .then(|| format!("{got:?} (counted: {dropped}), want a drop by sluice")),
        // Not a service's packet: the node's own stack answers (nothing
        // listens there: a refusal) and sluice counts nothing.
        Verdict::Pass => (got != [Outcome::Refused] || rejected || dropped).then(|| {
            format!("{got:?} (sluice refused: {rejected}, dropped: {dropped}), want no rule")
        }),
    };
    Ok(differs)
}

#[test]
fn every_case_gives_kube_proxys_verdict_on_the_wire() -> Result<()> {
    let mut topo = Topology::new(2, 4)?;
    topo.add_external()?;
    topo.wait_ipv6_ready()?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let backends: Vec<Ipv4Addr> = topo.backends.iter().map(|b| b.ip).collect();
    let dir = ManifestDir::create()?;
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &["--cluster-cidr", "10.0.0.0/8"],
    )?;
    let mut zones: Vec<Option<&str>> = CASES.iter().map(|c| c.zone).collect();
    zones.sort();
    zones.dedup();
    anyhow::ensure!(CASES.len() < 254, "row addresses are one byte");
    let mut failures = Vec::new();
    let mut played = 0;
    for zone in zones {
        // This zone's rows, each its own service; the others' files go.
        for i in 0..CASES.len() {
            let _ = dir.remove(&format!("row-{i}.yaml"));
        }
        dir.write(
            "node.yaml",
            &node_yaml(zone, topo.node_address(0), topo.node_address6(0)),
        )?;
        let rows: Vec<(usize, &Case)> = CASES
            .iter()
            .enumerate()
            .filter(|(_, c)| c.zone == zone)
            .collect();
        for (i, c) in &rows {
            dir.write(&format!("row-{i}.yaml"), &row_yaml(*i, c, &backends))?;
        }
        agent.wait_ready(Duration::from_secs(20))?;
        agent.wait_until(
            "every row's service is programmed",
            Duration::from_secs(20),
            |a| {
                let fronts = a.frontends()?;
                Ok(rows
                    .iter()
                    .all(|(i, _)| fronts.contains_key(&format!("{}:80", addrs(*i).cluster_ip))))
            },
        )?;
        // Zone changes reach the node context, hence every service: the
        // Node goes out after the services in the same read of the
        // directory, so wait until nothing sent is pending.
        agent.wait_until(
            "the directory's read applied",
            Duration::from_secs(10),
            |a| Ok(a.healthz()?.1["pending_seconds"].is_null()),
        )?;
        for (i, c) in &rows {
            played += 1;
            if let Some(d) = play(&topo, *i, c).with_context(|| c.name)? {
                failures.push(format!("{} ({:?} -> {:?}): {d}", c.name, c.source, c.dest));
            }
        }
    }
    if played != CASES.len() {
        bail!("played {played} of {} rows", CASES.len());
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} rows differ from kube-proxy on the wire:\n{}\n{}",
            failures.len(),
            CASES.len(),
            failures.join("\n"),
            agent.log_tail()
        );
    }
    agent.stop()?;
    Ok(())
}
