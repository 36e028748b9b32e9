//! IPv6 and dual-stack services in the datapath: balancing and reverse NAT
//! over `sl_svc6`/`sl_ct6`, graceful termination, reject, a service with
//! one VIP of each family, extension headers walked to the L4 header,
//! and what the IPv6 path leaves alone.
//!
//! Every topology here runs with TX checksum offload off in the pods
//! (`strict_checksums`), so that each rewritten or generated packet's
//! checksum is verified by the receiving stack.

use std::{
    collections::HashMap,
    io::ErrorKind,
    net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use sluice::model::{BackendState, Proto};
use sluice_common::Stat;
use sluice_tests::{
    clients::{self, ExtHeaders, Stream},
    lb::{cluster_ip6, cluster_ips, dual_stack_backends, vip, vip6, Lb},
    servers::{self, Server},
    Netns, Topology,
};

const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x70);
const VIP4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 70);

fn setup(clients: usize, backends: usize) -> Result<Topology> {
    let topo = Topology::new(clients, backends)?;
    topo.strict_checksums()?;
    topo.wait_ipv6_ready()?;
    Ok(topo)
}

fn greeters6(topo: &Topology) -> Result<Vec<Server>> {
    topo.backends
        .iter()
        .map(|b| servers::tcp_greeter6(&b.ns, 8080, &b.name))
        .collect()
}

fn all6(topo: &Topology, state: BackendState) -> Vec<(Ipv6Addr, u16, BackendState)> {
    topo.backends.iter().map(|b| (b.ip6, 8080, state)).collect()
}

fn tally(outcomes: Vec<std::io::Result<String>>) -> Result<HashMap<String, usize>> {
    let mut hits = HashMap::new();
    for o in outcomes {
        *hits.entry(o.context("connection failed")?).or_default() += 1;
    }
    Ok(hits)
}

/// Opens streams until one is served by `backend`; closes the others.
fn stream_to(ns: &Netns, addr: SocketAddr, backend: &str) -> Result<Stream> {
    for _ in 0..200 {
        let s = Stream::connect(ns, addr)?;
        if s.backend == backend {
            return Ok(s);
        }
    }
    bail!("no connection landed on {backend} in 200 tries")
}

#[test]
fn v6_cluster_ip_tcp_spreads_over_three_backends_through_sl_ct6() -> Result<()> {
    let topo = setup(1, 3)?;
    let _servers = greeters6(&topo)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &all6(&topo, BackendState::Active),
    ));
    let hits = tally(clients::tcp_hellos(
        &topo.clients[0].ns,
        vip6(VIP6, 80),
        300,
    )?)?;
    assert_eq!(hits.len(), 3, "all three backends serve: {hits:?}");
    for (backend, n) in &hits {
        assert!(*n >= 60, "{backend} got {n} of 300: {hits:?}");
    }
    // A connection completes only if the client saw its SYN-ACK come from
    // the VIP: every handshake was reverse-NATed.
    assert_eq!(lb.stat(Stat::NewFlow)?, 300);
    assert!(lb.stat(Stat::ReplyNat)? >= 300);
    assert_eq!(lb.stat(Stat::Dangling)?, 0);
    assert_eq!(lb.stat(Stat::NatFailed)?, 0);
    let maps = lb.maps()?;
    let ct6 = sluice::conntrack::read_all6(&maps)?;
    assert!(ct6.len() >= 600, "forward and reply entries: {}", ct6.len());
    assert!(
        sluice::conntrack::read_all(&maps)?.is_empty(),
        "no IPv4 flow"
    );
    Ok(())
}

#[test]
fn v6_udp_request_response_comes_back_from_the_vip() -> Result<()> {
    let topo = setup(1, 2)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::udp_greeter6(&b.ns, 5353, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip6, 5353, BackendState::Active))
        .collect();
    lb.set(cluster_ip6("dns6", VIP6, 53, Proto::Udp, &backends));
    let mut seen = HashMap::<String, usize>::new();
    for _ in 0..40 {
        let (answer, from) = clients::udp_hello(&topo.clients[0].ns, vip6(VIP6, 53))?;
        assert!(answer.starts_with("backend-"), "{answer}");
        assert_eq!(
            from,
            SocketAddr::from(vip6(VIP6, 53)),
            "reply source is the VIP"
        );
        *seen.entry(answer).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "both backends answer: {seen:?}");
    assert_eq!(lb.stat(Stat::NewFlow)?, 40);
    assert_eq!(lb.stat(Stat::ReplyNat)?, 40);
    Ok(())
}

#[test]
fn v6_terminating_backend_keeps_its_flow_gets_no_new_ones_and_goes_after_close() -> Result<()> {
    let topo = setup(1, 3)?;
    let _servers = greeters6(&topo)?;
    let mut lb = Lb::load(&topo)?;
    let client = &topo.clients[0].ns;
    let (a, b, c) = (&topo.backends[0], &topo.backends[1], &topo.backends[2]);
    let svc = |sa: BackendState| {
        cluster_ip6(
            "web6",
            VIP6,
            80,
            Proto::Tcp,
            &[
                (a.ip6, 8080, sa),
                (b.ip6, 8080, BackendState::Active),
                (c.ip6, 8080, BackendState::Active),
            ],
        )
    };
    let addr = SocketAddr::from(vip6(VIP6, 80));
    lb.set(svc(BackendState::Active));
    let mut stream = stream_to(client, addr, &a.name)?;
    let a_id = lb
        .backend_id_of(IpAddr::V6(a.ip6), 8080)
        .context("backend A programmed")?;

    // A turns terminating: its stream keeps talking while 500 new
    // connections avoid it.
    lb.set(svc(BackendState::Terminating));
    let (pings, hits) = std::thread::scope(|s| {
        let pinger = s.spawn(|| -> Result<u32> {
            let start = Instant::now();
            let mut n = 0;
            while start.elapsed() < Duration::from_secs(5) {
                stream
                    .ping()
                    .with_context(|| format!("ping {n} on the draining stream"))?;
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(n)
        });
        let hits = clients::tcp_hellos(client, addr, 500).and_then(tally);
        (pinger.join().expect("pinger"), hits)
    });
    let (pings, hits) = (pings?, hits?);
    assert!(
        pings >= 45,
        "the draining stream kept working ({pings} pings)"
    );
    assert_eq!(
        hits.get(&a.name),
        None,
        "a terminating backend got new flows: {hits:?}"
    );
    assert_eq!(hits.values().sum::<usize>(), 500);

    // Its live flow keeps it in the maps across drain ticks.
    lb.drain_tick()?;
    assert_eq!(lb.backend_id_of(IpAddr::V6(a.ip6), 8080), Some(a_id));
    stream.ping()?;

    // Its last flow closes: it goes, and so do its conntrack entries.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lb.backend_id_of(IpAddr::V6(a.ip6), 8080).is_some() {
        if Instant::now() > deadline {
            bail!("A was not removed after its last flow closed");
        }
        std::thread::sleep(Duration::from_millis(150));
        lb.drain_tick()?;
    }
    lb.drain_tick()?;
    assert_eq!(
        lb.conntrack_entries_of(a_id)?,
        0,
        "A's conntrack entries went with it"
    );
    Ok(())
}

#[test]
fn v6_established_flow_is_reset_when_its_backend_is_gone() -> Result<()> {
    let topo = setup(1, 2)?;
    let _servers = greeters6(&topo)?;
    // Drain timeout 0: a removed backend leaves at the next reconcile.
    let mut lb = Lb::load_with(&topo, Default::default(), Duration::ZERO)?;
    let client = &topo.clients[0].ns;
    let (a, b) = (&topo.backends[0], &topo.backends[1]);
    let addr = SocketAddr::from(vip6(VIP6, 80));
    lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &all6(&topo, BackendState::Active),
    ));
    let mut stream = stream_to(client, addr, &a.name)?;
    stream.ping()?;
    lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &[(b.ip6, 8080, BackendState::Active)],
    ));
    lb.apply();
    assert_eq!(lb.backend_id_of(IpAddr::V6(a.ip6), 8080), None);
    let err = stream
        .ping()
        .expect_err("a flow whose backend is gone is reset");
    let io = err.downcast_ref::<std::io::Error>().context("io error")?;
    assert_eq!(io.kind(), ErrorKind::ConnectionReset, "{err:#}");
    assert!(lb.stat(Stat::StaleReset)? >= 1);
    assert_eq!(clients::tcp_hello(client, addr)?, b.name, "new flows work");
    Ok(())
}

#[test]
fn v6_service_without_backends_rejects_tcp_and_udp() -> Result<()> {
    let topo = setup(1, 0)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6("empty6", VIP6, 80, Proto::Tcp, &[]));
    lb.set(cluster_ip6("empty6-dns", VIP6, 53, Proto::Udp, &[]));
    let client = &topo.clients[0].ns;

    let started = Instant::now();
    let err = clients::tcp_hello(client, vip6(VIP6, 80)).expect_err("refused");
    let elapsed = started.elapsed();
    let io = err.downcast_ref::<std::io::Error>().context("io error")?;
    assert_eq!(io.kind(), ErrorKind::ConnectionRefused, "{err:#}");
    assert!(
        elapsed < Duration::from_millis(500),
        "refused in {elapsed:?}"
    );
    assert_eq!(lb.stat(Stat::NoBackend)?, 1);

    let outcome = client.run(|| -> std::io::Result<usize> {
        let socket = UdpSocket::bind("[::]:0")?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        // A connected socket reports the ICMPv6 error on its next receive.
        socket.connect(vip6(VIP6, 53))?;
        socket.send(b"q")?;
        socket.recv(&mut [0u8; 64])
    })?;
    let err = outcome.expect_err("ICMPv6 port unreachable");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    assert_eq!(lb.stat(Stat::NoBackend)?, 2);
    assert_eq!(lb.stat(Stat::RejectFailed)?, 0);
    Ok(())
}

#[test]
fn dual_stack_service_is_reached_over_both_families() -> Result<()> {
    let topo = setup(1, 2)?;
    let mut servers = greeters6(&topo)?;
    for b in &topo.backends {
        servers.push(servers::tcp_greeter(&b.ns, 8080, &b.name)?);
    }
    let mut lb = Lb::load(&topo)?;
    let backends = dual_stack_backends(&topo.backends, 8080);
    let report = lb.set(cluster_ips(
        "dual",
        &[IpAddr::V4(VIP4), IpAddr::V6(VIP6)],
        80,
        Proto::Tcp,
        &backends,
    ));
    ensure!(report.refused.is_empty(), "{:?}", report.refused);
    ensure!(report.errors.is_empty(), "{:?}", report.errors);

    let client = &topo.clients[0].ns;
    let over4 = tally(clients::tcp_hellos(client, vip(VIP4, 80), 60)?)?;
    let over6 = tally(clients::tcp_hellos(client, vip6(VIP6, 80), 60)?)?;
    assert_eq!(over4.len(), 2, "both backends over IPv4: {over4:?}");
    assert_eq!(over6.len(), 2, "both backends over IPv6: {over6:?}");

    // One service port: one svc_id, four backends with distinct ids, and
    // each frontend's slots hold only its own family.
    let state = lb.reconciler.programmed();
    assert_eq!(state.backends.len(), 4);
    let ids: std::collections::HashSet<u32> = state.backends.values().map(|b| b.svc_id).collect();
    assert_eq!(ids.len(), 1, "one service port");
    for (key, fe) in &state.frontends {
        for id in &fe.slots {
            let b = state.backends.get(id).context("slot names a backend")?;
            let ep = sluice::reconcile::endpoint_of(&b);
            assert_eq!(ep.addr.is_ipv6(), key.addr.is_ipv6(), "{key}: {ep}");
        }
    }
    Ok(())
}

/// A frontend without backends refuses TCP and UDP behind extension
/// headers as it does without: the RST acknowledges the SYN (its sequence
/// number counted without the extension headers, or the client's stack
/// ignores it) and the ICMPv6 error quotes the datagram so that the
/// client's socket takes it.
#[test]
fn v6_service_without_backends_rejects_tcp_and_udp_behind_extension_headers() -> Result<()> {
    let topo = setup(1, 0)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6("empty6", VIP6, 80, Proto::Tcp, &[]));
    lb.set(cluster_ip6("empty6-dns", VIP6, 53, Proto::Udp, &[]));
    let client = &topo.clients[0].ns;

    let started = Instant::now();
    let err =
        clients::tcp_hello_ext(client, vip6(VIP6, 80), ExtHeaders::BOTH).expect_err("refused");
    let elapsed = started.elapsed();
    let io = err.downcast_ref::<std::io::Error>().context("io error")?;
    assert_eq!(io.kind(), ErrorKind::ConnectionRefused, "{err:#}");
    assert!(
        elapsed < Duration::from_millis(500),
        "refused in {elapsed:?}"
    );

    let outcome = client.run(|| -> std::io::Result<usize> {
        let socket = UdpSocket::bind("[::]:0")?;
        clients::ext_headers(&socket, ExtHeaders::BOTH)?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(vip6(VIP6, 53))?;
        socket.send(b"q")?;
        socket.recv(&mut [0u8; 64])
    })?;
    let err = outcome.expect_err("ICMPv6 port unreachable");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    assert_eq!(lb.stat(Stat::NoBackend)?, 2);
    assert_eq!(lb.stat(Stat::RejectFailed)?, 0);
    assert!(lb.stat(Stat::Ipv6ExtWalked)? >= 2);
    Ok(())
}

/// A datagram that leaves the client in fragments is balanced like any
/// (`datapath_fragments` has the full story, both families): the first
/// fragment picks the backend, the later one follows it.
#[test]
fn v6_fragments_are_balanced_and_counted() -> Result<()> {
    let topo = setup(1, 1)?;
    let b = &topo.backends[0];
    let _server = servers::udp_greeter6(&b.ns, 5353, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6(
        "dns6",
        VIP6,
        53,
        Proto::Udp,
        &[(b.ip6, 5353, BackendState::Active)],
    ));
    // 3000 bytes over a 1500-byte link: the client's stack fragments it.
    let (answer, from) =
        topo.clients[0]
            .ns
            .run(|| -> std::io::Result<(String, SocketAddr)> {
                let socket = UdpSocket::bind("[::]:0")?;
                socket.set_read_timeout(Some(Duration::from_secs(3)))?;
                socket.send_to(&[7u8; 3000], vip6(VIP6, 53))?;
                let mut buf = [0u8; 64];
                let (n, from) = socket.recv_from(&mut buf)?;
                Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
            })??;
    assert_eq!(
        answer, b.name,
        "the fragmented datagram reached the backend"
    );
    assert_eq!(from, SocketAddr::from(vip6(VIP6, 53)));
    assert_eq!(lb.stat(Stat::NewFlow)?, 1, "one datagram, one flow");
    assert!(
        lb.stat(Stat::Fragment)? >= 1,
        "its first fragment was recorded"
    );
    assert!(
        lb.stat(Stat::FragmentTracked)? >= 1,
        "its later one followed"
    );
    assert_eq!(lb.stat(Stat::FragmentUnknown)?, 0);
    Ok(())
}

/// Path MTU discovery through an IPv6 VIP: the underlay between two nodes
/// has the IPv6 minimum MTU, so node 1 answers the client's full-size
/// (DNATed) segments with Packet Too Big quoting client -> backend. Unless
/// the egress program puts the VIP back into the quote, the client's stack
/// finds no socket for it, never lowers its MSS, and the transfer stalls
/// (IPv6 routers never fragment).
#[test]
fn v6_packet_too_big_reaches_the_client_as_about_the_vip() -> Result<()> {
    packet_too_big(None)
}

/// The same when the client's segments carry a hop-by-hop and a
/// destination options header: the datapath walks them in the packet the
/// error quotes to find its TCP header.
#[test]
fn v6_packet_too_big_quoting_extension_headers_reaches_the_client_as_about_the_vip() -> Result<()> {
    packet_too_big(Some(ExtHeaders::BOTH))
}

fn packet_too_big(ext: Option<ExtHeaders>) -> Result<()> {
    let node1 = Topology::with_index(1, 1, 0)?;
    let node2 = Topology::with_index(2, 0, 1)?;
    Topology::join(&node1, &node2)?;
    node1.strict_checksums()?;
    node2.strict_checksums()?;
    for node in [&node1, &node2] {
        node.node.ip(&["link", "set", "u0", "mtu", "1280"])?;
    }
    let remote = &node2.backends[0];
    let _server = servers::tcp_greeter6(&remote.ns, 8080, &remote.name)?;
    let mut lb = Lb::load(&node1)?;
    lb.set(cluster_ip6(
        "big6",
        VIP6,
        80,
        Proto::Tcp,
        &[(remote.ip6, 8080, BackendState::Active)],
    ));

    let mut stream = Stream::connect_ext(&node1.clients[0].ns, vip6(VIP6, 80), ext)?;
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
        "no ICMPv6 error was translated, so the test did not exercise PMTU"
    );
    Ok(())
}

/// Both ends' packets carry a hop-by-hop and a destination options header
/// (the client's SYN and data, the backends' SYN-ACK and data): the
/// datapath walks them to the TCP header, balances the connections over
/// both backends and reverse-NATs the answers, as conntrack does.
#[test]
fn v6_tcp_with_hop_by_hop_and_destination_options_is_balanced_and_answered_from_the_vip(
) -> Result<()> {
    let topo = setup(1, 2)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter6_ext(&b.ns, 8080, &b.name, ExtHeaders::BOTH))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &all6(&topo, BackendState::Active),
    ));
    let mut hits = HashMap::<String, usize>::new();
    for _ in 0..40 {
        let backend =
            clients::tcp_hello_ext(&topo.clients[0].ns, vip6(VIP6, 80), ExtHeaders::BOTH)?;
        *hits.entry(backend).or_default() += 1;
    }
    assert_eq!(hits.len(), 2, "both backends serve: {hits:?}");
    // A handshake completes only if the SYN-ACK came back from the VIP.
    assert_eq!(lb.stat(Stat::NewFlow)?, 40);
    assert!(lb.stat(Stat::ReplyNat)? >= 40);
    // SYN and SYN-ACK of each connection at least.
    assert!(lb.stat(Stat::Ipv6ExtWalked)? >= 80);
    assert_eq!(lb.stat(Stat::Ipv6ExtHeader)?, 0, "nothing left unbalanced");
    assert_eq!(lb.stat(Stat::NatFailed)?, 0);
    Ok(())
}

/// The same for UDP: datagrams and answers with a hop-by-hop and a
/// destination options header, balanced, answered from the VIP.
#[test]
fn v6_udp_with_hop_by_hop_and_destination_options_is_balanced_and_answered_from_the_vip(
) -> Result<()> {
    let topo = setup(1, 2)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::udp_greeter6_ext(&b.ns, 5353, &b.name, ExtHeaders::BOTH))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip6, 5353, BackendState::Active))
        .collect();
    lb.set(cluster_ip6("dns6", VIP6, 53, Proto::Udp, &backends));
    let mut seen = HashMap::<String, usize>::new();
    for _ in 0..40 {
        let (answer, from) =
            clients::udp_hello_ext(&topo.clients[0].ns, vip6(VIP6, 53), 64, ExtHeaders::BOTH)?;
        assert!(answer.starts_with("backend-"), "{answer}");
        assert_eq!(
            from,
            SocketAddr::from(vip6(VIP6, 53)),
            "answered from the VIP"
        );
        *seen.entry(answer).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "both backends answer: {seen:?}");
    assert_eq!(lb.stat(Stat::NewFlow)?, 40);
    assert_eq!(lb.stat(Stat::ReplyNat)?, 40);
    assert!(lb.stat(Stat::Ipv6ExtWalked)? >= 80, "requests and answers");
    assert_eq!(lb.stat(Stat::Ipv6ExtHeader)?, 0);
    Ok(())
}

/// A datagram that leaves the client in fragments with a destination
/// options header before each fragment header (where Linux puts
/// `IPV6_DSTOPTS` without a routing header): the first fragment picks
/// the backend behind the walk, the later ones follow it.
#[test]
fn v6_fragments_behind_destination_options_are_balanced() -> Result<()> {
    let topo = setup(1, 1)?;
    let b = &topo.backends[0];
    let _server = servers::udp_greeter6(&b.ns, 5353, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6(
        "dns6",
        VIP6,
        53,
        Proto::Udp,
        &[(b.ip6, 5353, BackendState::Active)],
    ));
    let dst_only = ExtHeaders {
        hop_by_hop: false,
        dst_opts: true,
    };
    // 3000 bytes over a 1500-byte link: three fragments.
    let (answer, from) =
        clients::udp_hello_ext(&topo.clients[0].ns, vip6(VIP6, 53), 3000, dst_only)?;
    assert_eq!(
        answer, b.name,
        "the fragmented datagram reached the backend"
    );
    assert_eq!(from, SocketAddr::from(vip6(VIP6, 53)));
    assert_eq!(lb.stat(Stat::NewFlow)?, 1, "one datagram, one flow");
    assert!(
        lb.stat(Stat::Fragment)? >= 1,
        "its first fragment was recorded"
    );
    assert!(
        lb.stat(Stat::FragmentTracked)? >= 2,
        "its later ones followed"
    );
    assert_eq!(lb.stat(Stat::FragmentUnknown)?, 0);
    assert!(
        lb.stat(Stat::Ipv6ExtWalked)? >= 3,
        "every fragment had its destination options walked"
    );
    assert_eq!(lb.stat(Stat::Ipv6ExtHeader)?, 0);
    Ok(())
}

/// A routing header with a segment left means the destination in the
/// fixed header is a waypoint, not the final one: such a datagram to the
/// VIP passes untouched (counted), while the same datagram with no
/// segment left (its destination final) is walked, balanced and answered
/// from the VIP.
#[test]
fn v6_routing_header_with_segments_left_passes_untouched() -> Result<()> {
    let topo = setup(1, 1)?;
    let b = &topo.backends[0];
    let server = servers::udp_greeter6(&b.ns, 5353, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip6(
        "dns6",
        VIP6,
        53,
        Proto::Udp,
        &[(b.ip6, 5353, BackendState::Active)],
    ));
    let client = &topo.clients[0];
    let src = client.ip6;
    let elsewhere = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
    let (passed, answer) = client
        .ns
        .run(move || -> Result<(u64, (String, SocketAddr))> {
            // The answer comes to this port; the raw socket sends from it.
            let receiver = UdpSocket::bind("[::]:40053")?;
            receiver.set_read_timeout(Some(Duration::from_secs(1)))?;
            let raw = socket2::Socket::new(
                socket2::Domain::IPV6,
                socket2::Type::RAW,
                Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
            )?;
            let to: socket2::SockAddr = SocketAddr::from(vip6(VIP6, 0)).into();
            let mut buf = [0u8; 512];
            raw.send_to(
                &clients::routed_udp(src, VIP6, elsewhere, 1, 40053, 53),
                &to,
            )?;
            let passed = match receiver.recv_from(&mut buf) {
                Ok(_) => bail!("a datagram with a segment left was answered"),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => 0,
                Err(e) => return Err(e.into()),
            };
            raw.send_to(
                &clients::routed_udp(src, VIP6, elsewhere, 0, 40053, 53),
                &to,
            )?;
            receiver.set_read_timeout(Some(Duration::from_secs(3)))?;
            let (n, from) = receiver
                .recv_from(&mut buf)
                .context("no answer to the datagram with no segment left")?;
            Ok((
                passed,
                (String::from_utf8_lossy(&buf[..n]).into_owned(), from),
            ))
        })??;
    assert_eq!(passed, 0);
    assert_eq!(answer.0, b.name);
    assert_eq!(
        answer.1,
        SocketAddr::from(vip6(VIP6, 53)),
        "answered from the VIP"
    );
    assert_eq!(server.served(), 1, "only the datagram with no segment left");
    assert_eq!(lb.stat(Stat::NewFlow)?, 1);
    assert!(
        lb.stat(Stat::Ipv6ExtHeader)? >= 1,
        "the routed one was counted"
    );
    assert!(lb.stat(Stat::Ipv6ExtWalked)? >= 1);
    Ok(())
}
