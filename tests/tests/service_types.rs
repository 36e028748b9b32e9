//! Every kind of frontend on real traffic: NodePort from outside the node
//! (SNAT with policy Cluster, client address kept with policy Local, DROP
//! without local endpoints), LoadBalancer source ranges, session affinity,
//! a backend on another node, and a pod reaching itself (hairpin).

use std::{
    io::{BufRead, BufReader},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use sluice::model::{BackendState, FrontendKind, Proto, WhenEmpty};
use sluice_common::Stat;
use sluice_tests::{
    clients::{self, Stream},
    lb::{frontend, service, vip, Lb},
    servers, Netns, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 70);
const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const NODE_PORT: u16 = 30080;

/// Connects and returns the `<name> <peer>` greeting of a whoami server.
fn whoami(ns: &Netns, addr: SocketAddrV4) -> Result<(String, Ipv4Addr)> {
    let line = ns.run(move || -> std::io::Result<String> {
        let s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line)
    })??;
    let (name, peer) = line.trim().split_once(' ').context("greeting has a peer")?;
    Ok((name.to_owned(), peer.parse()?))
}

fn times_out(ns: &Netns, addr: SocketAddrV4) -> Result<()> {
    let outcome =
        ns.run(move || TcpStream::connect_timeout(&addr.into(), Duration::from_millis(700)))?;
    match outcome {
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(()),
        other => bail!("expected a silent drop, got {other:?}"),
    }
}

fn active(ips: &[Ipv4Addr]) -> Vec<(Ipv4Addr, u16, BackendState)> {
    ips.iter()
        .map(|ip| (*ip, 8080, BackendState::Active))
        .collect()
}

#[test]
fn node_port_from_outside_is_snated_with_policy_cluster_and_kept_with_local() -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    let b = &topo.backends[0];
    let _server = servers::tcp_whoami(&b.ns, 8080, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    let node = topo.node_address(0);
    let ext = &topo.externals[0];

    let mut np = frontend(
        FrontendKind::NodePort,
        node,
        NODE_PORT,
        Proto::Tcp,
        &active(&[b.ip]),
    );
    np.snat = true;
    lb.set(service("web", 80, Proto::Tcp, vec![np.clone()]));
    let (name, peer) = whoami(&ext.ns, SocketAddrV4::new(node, NODE_PORT))?;
    assert_eq!(name, "backend-0");
    assert_eq!(
        peer,
        Ipv4Addr::new(10, 20, 0, 1),
        "policy Cluster: the backend sees the node (SNAT)"
    );
    // An established SNATed flow keeps working both ways.
    let mut stream = Stream::connect(&ext.ns, SocketAddrV4::new(node, NODE_PORT))?;
    for _ in 0..5 {
        stream.ping()?;
    }
    assert!(lb.stat(Stat::SnatReply)? >= 6);
    drop(stream);

    np.snat = false;
    lb.set(service("web", 80, Proto::Tcp, vec![np.clone()]));
    let (_, peer) = whoami(&ext.ns, SocketAddrV4::new(node, NODE_PORT))?;
    assert_eq!(peer, ext.ip, "policy Local: the backend sees the client");

    // Policy Local with endpoints only elsewhere: DROP, not REJECT.
    np.backends.clear();
    np.when_empty = WhenEmpty::Drop;
    lb.set(service("web", 80, Proto::Tcp, vec![np]));
    times_out(&ext.ns, SocketAddrV4::new(node, NODE_PORT))?;
    assert!(lb.stat(Stat::NoBackendDrop)? >= 1);
    Ok(())
}

#[test]
fn load_balancer_source_ranges_admit_only_listed_clients() -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    topo.add_external()?;
    let b = &topo.backends[0];
    let _server = servers::tcp_greeter(&b.ns, 8080, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    let (e0, e1) = (&topo.externals[0], &topo.externals[1]);
    let lb_addr = SocketAddrV4::new(LB_IP, 80);
    let with_ranges = |ranges: &[(Ipv4Addr, u8)]| {
        let mut fe = frontend(
            FrontendKind::LoadBalancer,
            LB_IP,
            80,
            Proto::Tcp,
            &active(&[b.ip]),
        );
        fe.source_ranges = ranges.iter().map(|(a, l)| ((*a).into(), *l)).collect();
        service("public", 80, Proto::Tcp, vec![fe])
    };

    lb.set(with_ranges(&[(Ipv4Addr::new(192, 168, 1, 0), 24)]));
    assert_eq!(clients::tcp_hello(&e0.ns, lb_addr)?, "backend-0");
    times_out(&e1.ns, lb_addr)?;
    assert!(lb.stat(Stat::SourceDenied)? >= 1);

    lb.set(with_ranges(&[(Ipv4Addr::new(192, 168, 2, 100), 32)]));
    assert_eq!(clients::tcp_hello(&e1.ns, lb_addr)?, "backend-0");
    times_out(&e0.ns, lb_addr)?;

    let report = lb.set(with_ranges(&[]));
    assert!(report.errors.is_empty());
    assert_eq!(clients::tcp_hello(&e0.ns, lb_addr)?, "backend-0");
    assert_eq!(clients::tcp_hello(&e1.ns, lb_addr)?, "backend-0");
    assert!(
        lb.maps()?.source_ranges_v4.keys().next().is_none(),
        "no range left behind"
    );
    Ok(())
}

#[test]
fn session_affinity_sticks_until_timeout_and_leaves_terminating_backends() -> Result<()> {
    let topo = Topology::new(1, 3)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let ips: Vec<Ipv4Addr> = topo.backends.iter().map(|b| b.ip).collect();
    let sticky = |states: Vec<(Ipv4Addr, u16, BackendState)>, timeout: u32| {
        let mut fe = frontend(FrontendKind::ClusterIp, VIP, 80, Proto::Tcp, &states);
        fe.affinity_timeout = Some(timeout);
        service("sticky", 80, Proto::Tcp, vec![fe])
    };
    lb.set(sticky(active(&ips), 2));
    let client = &topo.clients[0].ns;
    let hits: Vec<String> = clients::tcp_hellos(client, vip(VIP, 80), 30)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert!(
        hits.iter().all(|h| *h == hits[0]),
        "all 30 on one backend: {hits:?}"
    );
    assert_eq!(lb.stat(Stat::AffinityHit)?, 29);

    // The chosen backend turns terminating: affinity must not keep sending
    // new flows there; the client sticks to its new backend instead.
    let first = topo.backend(&hits[0]).context("known backend")?.ip;
    let states: Vec<_> = ips
        .iter()
        .map(|ip| {
            (
                *ip,
                8080,
                if *ip == first {
                    BackendState::Terminating
                } else {
                    BackendState::Active
                },
            )
        })
        .collect();
    lb.set(sticky(states.clone(), 2));
    let moved: Vec<String> = clients::tcp_hellos(client, vip(VIP, 80), 20)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert!(
        moved.iter().all(|h| *h == moved[0] && *h != hits[0]),
        "{moved:?}"
    );

    // After the timeout, the next new flow is not an affinity hit.
    let before = lb.stat(Stat::AffinityHit)?;
    std::thread::sleep(Duration::from_millis(2300));
    clients::tcp_hello(client, vip(VIP, 80))?;
    assert_eq!(
        lb.stat(Stat::AffinityHit)?,
        before,
        "expired affinity is not followed"
    );
    clients::tcp_hello(client, vip(VIP, 80))?;
    assert_eq!(
        lb.stat(Stat::AffinityHit)?,
        before + 1,
        "a fresh affinity is recorded again"
    );
    Ok(())
}

#[test]
fn backend_on_another_node_is_reached_and_replies_carry_the_frontend() -> Result<()> {
    let mut node1 = Topology::with_index(1, 1, 0)?;
    node1.add_external()?;
    let node2 = Topology::with_index(2, 0, 1)?;
    Topology::join(&node1, &node2)?;
    let remote = &node2.backends[0];
    let _server = servers::tcp_whoami(&remote.ns, 8080, &remote.name)?;
    // Only node 1 runs sluice; node 2 just routes.
    let mut lb = Lb::load(&node1)?;
    let node_ip = node1.node_address(0);
    let mut np = frontend(
        FrontendKind::NodePort,
        node_ip,
        NODE_PORT,
        Proto::Tcp,
        &active(&[remote.ip]),
    );
    np.snat = true;
    let cluster = frontend(
        FrontendKind::ClusterIp,
        VIP,
        80,
        Proto::Tcp,
        &active(&[remote.ip]),
    );
    lb.set(service("web", 80, Proto::Tcp, vec![cluster, np]));

    // Pod to service: routed to node 2 and back, reverse NAT on the way out.
    let (name, peer) = whoami(&node1.clients[0].ns, vip(VIP, 80))?;
    assert_eq!(name, "node2-backend-0");
    assert_eq!(peer, node1.clients[0].ip, "pod traffic keeps its source");
    let mut stream = Stream::connect(&node1.clients[0].ns, vip(VIP, 80))?;
    stream.ping()?;

    // External NodePort to a remote backend: SNAT to node 1's underlay
    // address brings the replies back through node 1.
    let (name, peer) = whoami(
        &node1.externals[0].ns,
        SocketAddrV4::new(node_ip, NODE_PORT),
    )?;
    assert_eq!(name, "node2-backend-0");
    assert_eq!(peer, Ipv4Addr::new(192, 168, 200, 1));
    Ok(())
}

/// Path MTU discovery through a VIP: the underlay between the nodes has a
/// smaller MTU than the pods, so node 1 answers the client's full-size
/// (DNATed) segments with "fragmentation needed" quoting client -> backend.
/// Unless the egress program puts the VIP back into the quoted header, the
/// client's stack finds no socket for it, never lowers its MSS, and the
/// transfer stalls.
#[test]
fn icmp_fragmentation_needed_reaches_the_client_as_about_the_vip() -> Result<()> {
    let node1 = Topology::with_index(1, 1, 0)?;
    let node2 = Topology::with_index(2, 0, 1)?;
    Topology::join(&node1, &node2)?;
    for node in [&node1, &node2] {
        node.node.ip(&["link", "set", "u0", "mtu", "1200"])?;
    }
    let remote = &node2.backends[0];
    let _server = servers::tcp_greeter(&remote.ns, 8080, &remote.name)?;
    let mut lb = Lb::load(&node1)?;
    lb.set(service(
        "big",
        80,
        Proto::Tcp,
        vec![frontend(
            FrontendKind::ClusterIp,
            VIP,
            80,
            Proto::Tcp,
            &active(&[remote.ip]),
        )],
    ));

    let mut stream = Stream::connect(&node1.clients[0].ns, vip(VIP, 80))?;
    assert_eq!(stream.backend, "node2-backend-0");
    // 64 KiB in one line: many segments of the client's 1500-byte MTU.
    let big = "x".repeat(64 * 1024);
    for _ in 0..3 {
        stream
            .exchange(&big)
            .context("a transfer larger than the underlay MTU")?;
    }
    assert!(
        lb.stat(Stat::IcmpTranslated)? >= 1,
        "no ICMP error was translated, so the test did not exercise PMTU"
    );
    Ok(())
}

#[test]
fn a_pod_reaches_itself_through_its_service() -> Result<()> {
    let topo = Topology::new(0, 1)?;
    let b = &topo.backends[0];
    let _server = servers::tcp_whoami(&b.ns, 8080, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(service(
        "self",
        80,
        Proto::Tcp,
        vec![frontend(
            FrontendKind::ClusterIp,
            VIP,
            80,
            Proto::Tcp,
            &active(&[b.ip]),
        )],
    ));
    let (name, peer) = whoami(&b.ns, vip(VIP, 80))?;
    assert_eq!(name, "backend-0");
    assert_eq!(
        peer,
        Ipv4Addr::new(10, 20, 0, 1),
        "hairpin flows are SNATed to the node"
    );
    let mut stream = Stream::connect(&b.ns, vip(VIP, 80))?;
    stream.ping()?;
    Ok(())
}
