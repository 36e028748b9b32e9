//! Fragmented UDP datagrams to services, both families (issue 13, class
//! 10): kube-proxy's conntrack reassembles them before NAT; sluice
//! records each first fragment's ports by IP identity (`sl_frag4`,
//! `sl_frag6`) and sends the later fragments after it, on the way in
//! (DNAT, SNAT) and on the way back (reverse NAT, the SNAT reply).
//!
//! Datagrams of 4000 bytes cross 1500-byte links: the client's stack
//! fragments the request (IPv4 with path MTU discovery off, IPv6 at the
//! source), the backend's stack fragments its echo. Every pod and the
//! outside host run with TX checksum offload off (`strict_checksums`),
//! so a wrong checksum update anywhere shows as a lost datagram.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use sluice::model::{BackendState, FrontendKind, Proto, WhenEmpty};
use sluice_common::Stat;
use sluice_tests::{
    clients::{self, Echo},
    lb::{frontend, service, Lb},
    servers::{self, Server},
    topology::v6_of,
    Topology,
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const PORT: u16 = 53;
const BACKEND_PORT: u16 = 5353;
const NODE_PORT: u16 = 30053;
/// Three fragments of a 1500-byte MTU each way.
const SIZE: usize = 4000;
const DATAGRAMS: usize = 40;

fn ip(v6: bool, v4: Ipv4Addr) -> IpAddr {
    if v6 {
        IpAddr::V6(v6_of(v4))
    } else {
        IpAddr::V4(v4)
    }
}

fn setup(v6: bool, clients: usize, backends: usize, external: bool) -> Result<Topology> {
    let mut topo = Topology::new(clients, backends)?;
    if external {
        topo.add_external()?;
    }
    topo.strict_checksums()?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    Ok(topo)
}

fn echo_servers(topo: &Topology, v6: bool) -> Result<Vec<Server>> {
    topo.backends
        .iter()
        .map(|b| servers::udp_echo(&b.ns, BACKEND_PORT, &b.name, v6))
        .collect()
}

fn all_active(topo: &Topology, v6: bool) -> Vec<(IpAddr, u16, BackendState)> {
    topo.backends
        .iter()
        .map(|b| (b.addr(v6), BACKEND_PORT, BackendState::Active))
        .collect()
}

/// Every echo came back whole (the client checked it byte for byte) from
/// `frontend`: the backends that answered, with their counts.
fn tally(
    outcomes: Vec<std::io::Result<Echo>>,
    frontend: SocketAddr,
) -> Result<HashMap<String, usize>> {
    let mut hits = HashMap::new();
    for (i, o) in outcomes.into_iter().enumerate() {
        let echo = o.with_context(|| format!("datagram {i}"))?;
        ensure!(
            echo.from == frontend,
            "datagram {i}: answer from {}, not the frontend {frontend}",
            echo.from
        );
        *hits.entry(echo.backend).or_default() += 1;
    }
    Ok(hits)
}

/// Waits (up to 2 s) until counter `stat` reaches `n`: packets the test
/// sent may still be in the node's queues.
fn wait_for(lb: &Lb, stat: Stat, n: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while lb.stat(stat)? < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Two `#[test]`s, IPv4 and IPv6, running one scenario.
macro_rules! both_families {
    ($scenario:ident: $v4:ident, $v6:ident) => {
        #[test]
        fn $v4() -> Result<()> {
            $scenario(false)
        }

        #[test]
        fn $v6() -> Result<()> {
            $scenario(true)
        }
    };
}

both_families!(cluster_ip: fragmented_udp_to_a_cluster_ip_reaches_both_backends_and_comes_back_whole,
    v6_fragmented_udp_to_a_cluster_ip_reaches_both_backends_and_comes_back_whole);

fn cluster_ip(v6: bool) -> Result<()> {
    let topo = setup(v6, 1, 2, false)?;
    let _servers = echo_servers(&topo, v6)?;
    let mut lb = Lb::load(&topo)?;
    let vip = ip(v6, VIP);
    let fe = frontend(
        FrontendKind::ClusterIp,
        vip,
        PORT,
        Proto::Udp,
        &all_active(&topo, v6),
    );
    lb.set(service("dns", PORT, Proto::Udp, vec![fe]));
    let client = &topo.clients[0];
    let outcomes = clients::udp_echoes(&client.ns, SocketAddr::new(vip, PORT), SIZE, DATAGRAMS)?;
    let hits = tally(outcomes, SocketAddr::new(vip, PORT))?;
    assert_eq!(hits.len(), 2, "both backends answer: {hits:?}");
    for (backend, n) in &hits {
        assert!(*n >= 8, "{backend} got {n} of {DATAGRAMS}: {hits:?}");
    }
    // Each request: a first fragment (a new flow) and two later ones that
    // followed it in; each echo: two later fragments reverse-NATed after
    // their first one.
    assert_eq!(lb.stat(Stat::NewFlow)?, DATAGRAMS as u64);
    let tracked = lb.stat(Stat::FragmentTracked)?;
    assert!(
        tracked >= 4 * DATAGRAMS as u64,
        "later fragments followed their flow: {tracked}"
    );
    // Every first fragment is recorded at each hook it passes (client in,
    // backend out; backend in, client out).
    assert!(lb.stat(Stat::Fragment)? >= 4 * DATAGRAMS as u64);
    assert_eq!(lb.stat(Stat::FragmentUnknown)?, 0);
    assert_eq!(lb.stat(Stat::FragmentDropped)?, 0);
    assert_eq!(lb.stat(Stat::NatFailed)?, 0);
    // An unfragmented datagram still works, of course.
    let small = clients::udp_echoes(&client.ns, SocketAddr::new(vip, PORT), 100, 1)?;
    tally(small, SocketAddr::new(vip, PORT))?;
    Ok(())
}

both_families!(node_port_snat: fragmented_udp_to_a_node_port_with_policy_cluster_is_snated_both_ways,
    v6_fragmented_udp_to_a_node_port_with_policy_cluster_is_snated_both_ways);

fn node_port_snat(v6: bool) -> Result<()> {
    let topo = setup(v6, 0, 2, true)?;
    let _servers = echo_servers(&topo, v6)?;
    let mut lb = Lb::load(&topo)?;
    let node = ip(v6, topo.node_address(0));
    let mut np = frontend(
        FrontendKind::NodePort,
        node,
        NODE_PORT,
        Proto::Udp,
        &all_active(&topo, v6),
    );
    np.snat = true;
    lb.set(service("dns", PORT, Proto::Udp, vec![np]));
    let ext = &topo.externals[0];
    let target = SocketAddr::new(node, NODE_PORT);
    let outcomes = clients::udp_echoes(&ext.ns, target, SIZE, DATAGRAMS)?;
    let mut hits = HashMap::<String, usize>::new();
    for (i, o) in outcomes.into_iter().enumerate() {
        let echo = o.with_context(|| format!("datagram {i}"))?;
        ensure!(
            echo.from == target,
            "datagram {i}: answer from {}",
            echo.from
        );
        // Policy Cluster: the backend saw the node (its address on the
        // backend's link, `.1`), not the client.
        let b = topo.backend(&echo.backend).context("a known backend")?;
        let [a, n, k, _] = b.ip.octets();
        ensure!(
            echo.peer == ip(v6, Ipv4Addr::new(a, n, k, 1)),
            "datagram {i}: {} saw {}",
            echo.backend,
            echo.peer
        );
        *hits.entry(echo.backend).or_default() += 1;
    }
    assert_eq!(hits.len(), 2, "both backends answer: {hits:?}");
    // Requests: two later fragments each SNATed after their first; echoes:
    // two later fragments each turned back on the way in.
    let tracked = lb.stat(Stat::FragmentTracked)?;
    assert!(
        tracked >= 4 * DATAGRAMS as u64,
        "later fragments followed their SNATed flow: {tracked}"
    );
    assert!(lb.stat(Stat::SnatReply)? >= 3 * DATAGRAMS as u64);
    assert_eq!(lb.stat(Stat::FragmentUnknown)?, 0);
    assert_eq!(lb.stat(Stat::FragmentDropped)?, 0);
    assert_eq!(lb.stat(Stat::SnatFailed)?, 0);
    assert_eq!(lb.stat(Stat::NatFailed)?, 0);
    Ok(())
}

/// One IPv4 fragment of a UDP datagram, for a raw socket (`IP_HDRINCL`:
/// the kernel fills in the header checksum and sends it as it is).
fn fragment4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    offset: usize,
    more: bool,
    data: &[u8],
) -> Vec<u8> {
    let total = 20 + data.len();
    let frag_off = (offset / 8) as u16 | if more { 0x2000 } else { 0 };
    let mut pkt = vec![0x45, 0];
    pkt.extend_from_slice(&(total as u16).to_be_bytes());
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&frag_off.to_be_bytes());
    pkt.extend_from_slice(&[64, 17, 0, 0]);
    pkt.extend_from_slice(&src.octets());
    pkt.extend_from_slice(&dst.octets());
    pkt.extend_from_slice(data);
    pkt
}

/// A UDP datagram (no checksum, allowed in IPv4) from `sport` to `dport`
/// cut into two fragments at byte 1480: (first, later).
fn two_fragments(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    sport: u16,
    dport: u16,
    payload: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let mut datagram = Vec::new();
    datagram.extend_from_slice(&sport.to_be_bytes());
    datagram.extend_from_slice(&dport.to_be_bytes());
    datagram.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(payload);
    (
        fragment4(src, dst, id, 0, true, &datagram[..1480]),
        fragment4(src, dst, id, 1480, false, &datagram[1480..]),
    )
}

fn send_raw(packets: &[&[u8]], dst: Ipv4Addr) -> std::io::Result<()> {
    let raw = Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_RAW)),
    )?;
    let to = SockAddr::from(SocketAddr::new(IpAddr::V4(dst), 0));
    for p in packets {
        raw.send_to(p, &to)?;
    }
    Ok(())
}

/// What sluice does with a later fragment it cannot place. Its first
/// fragment not seen (here: sent after it, as a reordering network
/// would): it passes untouched, so traffic that is no service's keeps
/// kube-proxy's behaviour (the receiver reassembles it; Cilium would drop
/// it). Its first fragment dropped (a drop-when-empty frontend without
/// backends): it is dropped too, as a fragment cannot start a flow.
#[test]
fn later_fragments_without_their_first_pass_and_those_of_a_dropped_flow_are_dropped() -> Result<()>
{
    let topo = setup(false, 1, 1, false)?;
    let b = &topo.backends[0];
    let _server = servers::udp_echo(&b.ns, BACKEND_PORT, &b.name, false)?;
    let mut lb = Lb::load(&topo)?;
    let mut fe = frontend(
        FrontendKind::ClusterIp,
        IpAddr::V4(VIP),
        PORT,
        Proto::Udp,
        &[],
    );
    fe.when_empty = WhenEmpty::Drop;
    lb.set(service("dns", PORT, Proto::Udp, vec![fe]));
    let client = &topo.clients[0];
    let (src, backend) = (client.ip, b.ip);
    let payload: Vec<u8> = (0..2000).map(|k| (k * 3) as u8).collect();

    // Out of order to a pod, no service involved: the later fragment
    // first, then the first one; the backend reassembles and echoes.
    let expected = payload.clone();
    let echoed = client.ns.run(move || -> std::io::Result<bool> {
        let udp = UdpSocket::bind("0.0.0.0:0")?;
        udp.set_read_timeout(Some(Duration::from_secs(3)))?;
        let sport = udp.local_addr()?.port();
        let (first, later) = two_fragments(src, backend, 0x5eed, sport, BACKEND_PORT, &expected);
        send_raw(&[&later, &first], backend)?;
        let mut buf = vec![0u8; 65_536];
        let (n, _) = udp.recv_from(&mut buf)?;
        Ok(buf[..n].ends_with(&expected))
    })??;
    assert!(echoed, "the reassembled datagram was echoed whole");
    assert!(
        lb.stat(Stat::FragmentUnknown)? >= 1,
        "the reordered fragment is counted"
    );
    assert_eq!(lb.stat(Stat::FragmentDropped)?, 0);

    // To a frontend that drops new flows: both fragments are dropped.
    client.ns.run(move || -> std::io::Result<()> {
        let (first, later) = two_fragments(src, VIP, 0xf00d, 40_000, PORT, &payload);
        send_raw(&[&first, &later], VIP)
    })??;
    wait_for(&lb, Stat::FragmentDropped, 1)?;
    assert_eq!(lb.stat(Stat::NoBackendDrop)?, 1, "the first fragment");
    assert_eq!(lb.stat(Stat::FragmentDropped)?, 1, "the later fragment");
    assert_eq!(lb.stat(Stat::FragmentTracked)?, 0);
    Ok(())
}

both_families!(rejected: fragmented_udp_to_a_frontend_without_backends_is_refused,
    v6_fragmented_udp_to_a_frontend_without_backends_is_refused);

/// kube-proxy rejects the reassembled datagram with ICMP port
/// unreachable; sluice answers its first fragment the same way (the quote
/// names the client's socket) and drops the later ones.
fn rejected(v6: bool) -> Result<()> {
    let topo = setup(v6, 1, 0, false)?;
    let mut lb = Lb::load(&topo)?;
    let vip = ip(v6, VIP);
    let fe = frontend(FrontendKind::ClusterIp, vip, PORT, Proto::Udp, &[]);
    lb.set(service("dns", PORT, Proto::Udp, vec![fe]));
    let to = SocketAddr::new(vip, PORT);
    let outcome = topo.clients[0].ns.run(move || -> std::io::Result<usize> {
        let socket = UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" })?;
        clients::allow_fragments(&socket, v6)?;
        socket.set_read_timeout(Some(Duration::from_secs(3)))?;
        socket.connect(to)?;
        socket.send(&vec![1u8; SIZE])?;
        socket.recv(&mut [0u8; 64])
    })?;
    match outcome {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => anyhow::bail!("expected ECONNREFUSED, got {other:?}"),
    }
    assert_eq!(lb.stat(Stat::NoBackend)?, 1, "the first fragment");
    wait_for(&lb, Stat::FragmentDropped, 2)?;
    assert_eq!(lb.stat(Stat::FragmentDropped)?, 2, "the two later ones");
    Ok(())
}
