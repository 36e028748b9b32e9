//! Every kind of frontend on real traffic, for both address families:
//! NodePort from outside the node (SNAT with policy Cluster, client
//! address kept with policy Local, DROP without local endpoints),
//! LoadBalancer source ranges, session affinity, a backend on another node,
//! a pod reaching itself (hairpin), ICMP errors translated back (about
//! DNATed flows: IPv4 here, IPv6 in `datapath_ipv6`; about SNATed NodePort
//! flows: path MTU discovery and port unreachable, both families).
//!
//! Each scenario is one function over a `Family` and two `#[test]`s: the
//! IPv6 run uses the same topology, its `fd00:b:k::h` twin addresses
//! (`v6_of`), and TX checksum offload off in every pod and external host,
//! so that a wrong checksum update shows as loss.

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use sluice::model::{BackendState, FrontendKind, Proto, WhenEmpty};
use sluice_common::{conntrack::CT_F_SNAT, CtEntry, CtKind, Stat};
use sluice_tests::{
    clients::{self, Stream},
    lb::{frontend, service, Lb},
    servers::{self, Server},
    topology::{v6_of, Pod},
    Netns, Topology,
};
use socket2::{Domain, Protocol, Socket, Type};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 70);
const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const NODE_PORT: u16 = 30080;

/// Which family a scenario runs in. Addresses are written as IPv4 and
/// mapped to their IPv6 twins (`a.b.k.h` -> `fd00:b:k::h`; a /24 is the
/// twin /64, a /32 the /128).
#[derive(Clone, Copy, Debug)]
struct Family {
    v6: bool,
}

const V4: Family = Family { v6: false };
const V6: Family = Family { v6: true };

impl Family {
    fn ip(self, v4: Ipv4Addr) -> IpAddr {
        if self.v6 {
            IpAddr::V6(v6_of(v4))
        } else {
            IpAddr::V4(v4)
        }
    }

    fn at(self, v4: Ipv4Addr, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip(v4), port)
    }

    fn range(self, v4: Ipv4Addr, len: u8) -> (IpAddr, u8) {
        let len = match (self.v6, len) {
            (false, l) => l,
            (true, 24) => 64,
            (true, 32) => 128,
            (true, l) => panic!("no IPv6 twin of a /{l}"),
        };
        (self.ip(v4), len)
    }

    fn whoami_server(self, pod: &Pod) -> Result<Server> {
        if self.v6 {
            servers::tcp_whoami6(&pod.ns, 8080, &pod.name)
        } else {
            servers::tcp_whoami(&pod.ns, 8080, &pod.name)
        }
    }

    fn greeter(self, pod: &Pod) -> Result<Server> {
        if self.v6 {
            servers::tcp_greeter6(&pod.ns, 8080, &pod.name)
        } else {
            servers::tcp_greeter(&pod.ns, 8080, &pod.name)
        }
    }

    /// IPv6 runs verify every checksum (see the module comment), on
    /// devices whose IPv6 is up.
    fn prepare(self, topo: &Topology) -> Result<()> {
        if self.v6 {
            topo.strict_checksums()?;
            topo.wait_ipv6_ready()?;
        }
        Ok(())
    }
}

/// Connects and returns the `<name> <peer>` greeting of a whoami server.
fn whoami(ns: &Netns, addr: SocketAddr) -> Result<(String, IpAddr)> {
    let line = ns.run(move || -> std::io::Result<String> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line)
    })??;
    let (name, peer) = line.trim().split_once(' ').context("greeting has a peer")?;
    Ok((name.to_owned(), peer.parse()?))
}

fn times_out(ns: &Netns, addr: SocketAddr) -> Result<()> {
    let outcome = ns.run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(700)))?;
    match outcome {
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(()),
        other => bail!("expected a silent drop, got {other:?}"),
    }
}

fn active(ips: &[IpAddr]) -> Vec<(IpAddr, u16, BackendState)> {
    ips.iter()
        .map(|ip| (*ip, 8080, BackendState::Active))
        .collect()
}

/// Two `#[test]`s, IPv4 and IPv6, running one scenario.
macro_rules! both_families {
    ($scenario:ident: $v4:ident, $v6:ident) => {
        #[test]
        fn $v4() -> Result<()> {
            $scenario(V4)
        }

        #[test]
        fn $v6() -> Result<()> {
            $scenario(V6)
        }
    };
}

both_families!(node_port: node_port_from_outside_is_snated_with_policy_cluster_and_kept_with_local,
    v6_node_port_from_outside_is_snated_with_policy_cluster_and_kept_with_local);

fn node_port(fam: Family) -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    fam.prepare(&topo)?;
    let b = &topo.backends[0];
    let _server = fam.whoami_server(b)?;
    let mut lb = Lb::load(&topo)?;
    let node = fam.ip(topo.node_address(0));
    let node_port = SocketAddr::new(node, NODE_PORT);
    let ext = &topo.externals[0];

    let mut np = frontend(
        FrontendKind::NodePort,
        node,
        NODE_PORT,
        Proto::Tcp,
        &active(&[b.addr(fam.v6)]),
    );
    np.snat = true;
    lb.set(service("web", 80, Proto::Tcp, vec![np.clone()]));
    let (name, peer) = whoami(&ext.ns, node_port)?;
    assert_eq!(name, "backend-0");
    assert_eq!(
        peer,
        fam.ip(Ipv4Addr::new(10, 20, 0, 1)),
        "policy Cluster: the backend sees the node (SNAT)"
    );
    // An established SNATed flow keeps working both ways.
    let mut stream = Stream::connect(&ext.ns, node_port)?;
    for _ in 0..5 {
        stream.ping()?;
    }
    assert!(lb.stat(Stat::SnatReply)? >= 6);
    drop(stream);

    np.snat = false;
    lb.set(service("web", 80, Proto::Tcp, vec![np.clone()]));
    let (_, peer) = whoami(&ext.ns, node_port)?;
    assert_eq!(
        peer,
        ext.addr(fam.v6),
        "policy Local: the backend sees the client"
    );

    // Policy Local with endpoints only elsewhere: DROP, not REJECT.
    np.backends.clear();
    np.when_empty = WhenEmpty::Drop;
    lb.set(service("web", 80, Proto::Tcp, vec![np]));
    times_out(&ext.ns, node_port)?;
    assert!(lb.stat(Stat::NoBackendDrop)? >= 1);
    Ok(())
}

both_families!(source_ranges: load_balancer_source_ranges_admit_only_listed_clients,
    v6_load_balancer_source_ranges_admit_only_listed_clients);

fn source_ranges(fam: Family) -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    topo.add_external()?;
    fam.prepare(&topo)?;
    let b = &topo.backends[0];
    let _server = fam.greeter(b)?;
    let mut lb = Lb::load(&topo)?;
    let (e0, e1) = (&topo.externals[0], &topo.externals[1]);
    let lb_addr = fam.at(LB_IP, 80);
    let with_ranges = |ranges: &[(IpAddr, u8)]| {
        let mut fe = frontend(
            FrontendKind::LoadBalancer,
            fam.ip(LB_IP),
            80,
            Proto::Tcp,
            &active(&[b.addr(fam.v6)]),
        );
        fe.source_ranges = ranges.to_vec();
        service("public", 80, Proto::Tcp, vec![fe])
    };

    lb.set(with_ranges(&[fam.range(Ipv4Addr::new(192, 168, 1, 0), 24)]));
    assert_eq!(clients::tcp_hello(&e0.ns, lb_addr)?, "backend-0");
    times_out(&e1.ns, lb_addr)?;
    assert!(lb.stat(Stat::SourceDenied)? >= 1);

    lb.set(with_ranges(&[
        fam.range(Ipv4Addr::new(192, 168, 2, 100), 32)
    ]));
    assert_eq!(clients::tcp_hello(&e1.ns, lb_addr)?, "backend-0");
    times_out(&e0.ns, lb_addr)?;

    let report = lb.set(with_ranges(&[]));
    assert!(report.errors.is_empty());
    assert_eq!(clients::tcp_hello(&e0.ns, lb_addr)?, "backend-0");
    assert_eq!(clients::tcp_hello(&e1.ns, lb_addr)?, "backend-0");
    let maps = lb.maps()?;
    assert!(
        maps.source_ranges_v4.keys().next().is_none()
            && maps.source_ranges_v6.keys().next().is_none(),
        "no range left behind"
    );
    Ok(())
}

both_families!(affinity: session_affinity_sticks_until_timeout_and_leaves_terminating_backends,
    v6_session_affinity_sticks_until_timeout_and_leaves_terminating_backends);

fn affinity(fam: Family) -> Result<()> {
    let topo = Topology::new(1, 3)?;
    fam.prepare(&topo)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| fam.greeter(b))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let ips: Vec<IpAddr> = topo.backends.iter().map(|b| b.addr(fam.v6)).collect();
    let vip = fam.at(VIP, 80);
    let sticky = |states: Vec<(IpAddr, u16, BackendState)>, timeout: u32| {
        let mut fe = frontend(
            FrontendKind::ClusterIp,
            fam.ip(VIP),
            80,
            Proto::Tcp,
            &states,
        );
        fe.affinity_timeout = Some(timeout);
        service("sticky", 80, Proto::Tcp, vec![fe])
    };
    lb.set(sticky(active(&ips), 2));
    let client = &topo.clients[0].ns;
    let hits: Vec<String> = clients::tcp_hellos(client, vip, 30)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert!(
        hits.iter().all(|h| *h == hits[0]),
        "all 30 on one backend: {hits:?}"
    );
    // Every new flow but the first was an affinity hit. (A SYN that
    // reuses the source port of a flow whose entry is not closing yet
    // follows that entry instead of being a new flow.)
    let new_flows = lb.stat(Stat::NewFlow)? + lb.stat(Stat::Reselected)?;
    assert!(new_flows >= 25, "{new_flows} new flows of 30 connections");
    assert_eq!(lb.stat(Stat::AffinityHit)?, new_flows - 1);

    // The chosen backend turns terminating: affinity must not keep sending
    // new flows there; the client sticks to its new backend instead.
    let first = topo
        .backend(&hits[0])
        .context("known backend")?
        .addr(fam.v6);
    let states: Vec<_> = ips
        .iter()
        .map(|ip| {
            let state = if *ip == first {
                BackendState::Terminating
            } else {
                BackendState::Active
            };
            (*ip, 8080, state)
        })
        .collect();
    lb.set(sticky(states, 2));
    let moved: Vec<String> = clients::tcp_hellos(client, vip, 20)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert!(
        moved.iter().all(|h| *h == moved[0] && *h != hits[0]),
        "{moved:?}"
    );

    // After the timeout, the next new flow is not an affinity hit.
    let before = lb.stat(Stat::AffinityHit)?;
    std::thread::sleep(Duration::from_millis(2300));
    clients::tcp_hello(client, vip)?;
    assert_eq!(
        lb.stat(Stat::AffinityHit)?,
        before,
        "expired affinity is not followed"
    );
    clients::tcp_hello(client, vip)?;
    assert_eq!(
        lb.stat(Stat::AffinityHit)?,
        before + 1,
        "a fresh affinity is recorded again"
    );
    Ok(())
}

both_families!(remote_backend: backend_on_another_node_is_reached_and_replies_carry_the_frontend,
    v6_backend_on_another_node_is_reached_and_replies_carry_the_frontend);

fn remote_backend(fam: Family) -> Result<()> {
    let mut node1 = Topology::with_index(1, 1, 0)?;
    node1.add_external()?;
    let node2 = Topology::with_index(2, 0, 1)?;
    Topology::join(&node1, &node2)?;
    fam.prepare(&node1)?;
    fam.prepare(&node2)?;
    let remote = &node2.backends[0];
    let _server = fam.whoami_server(remote)?;
    // Only node 1 runs sluice; node 2 just routes.
    let mut lb = Lb::load(&node1)?;
    let node_ip = fam.ip(node1.node_address(0));
    let mut np = frontend(
        FrontendKind::NodePort,
        node_ip,
        NODE_PORT,
        Proto::Tcp,
        &active(&[remote.addr(fam.v6)]),
    );
    np.snat = true;
    let cluster = frontend(
        FrontendKind::ClusterIp,
        fam.ip(VIP),
        80,
        Proto::Tcp,
        &active(&[remote.addr(fam.v6)]),
    );
    lb.set(service("web", 80, Proto::Tcp, vec![cluster, np]));

    // Pod to service: routed to node 2 and back, reverse NAT on the way out.
    let client = &node1.clients[0];
    let (name, peer) = whoami(&client.ns, fam.at(VIP, 80))?;
    assert_eq!(name, "node2-backend-0");
    assert_eq!(peer, client.addr(fam.v6), "pod traffic keeps its source");
    let mut stream = Stream::connect(&client.ns, fam.at(VIP, 80))?;
    stream.ping()?;

    // External NodePort to a remote backend: SNAT to node 1's underlay
    // address brings the replies back through node 1.
    let (name, peer) = whoami(&node1.externals[0].ns, SocketAddr::new(node_ip, NODE_PORT))?;
    assert_eq!(name, "node2-backend-0");
    assert_eq!(peer, fam.ip(Ipv4Addr::new(192, 168, 200, 1)));
    Ok(())
}

both_families!(hairpin: a_pod_reaches_itself_through_its_service,
    v6_a_pod_reaches_itself_through_its_service);

fn hairpin(fam: Family) -> Result<()> {
    let topo = Topology::new(0, 1)?;
    fam.prepare(&topo)?;
    let b = &topo.backends[0];
    let _server = fam.whoami_server(b)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(service(
        "self",
        80,
        Proto::Tcp,
        vec![frontend(
            FrontendKind::ClusterIp,
            fam.ip(VIP),
            80,
            Proto::Tcp,
            &active(&[b.addr(fam.v6)]),
        )],
    ));
    let (name, peer) = whoami(&b.ns, fam.at(VIP, 80))?;
    assert_eq!(name, "backend-0");
    assert_eq!(
        peer,
        fam.ip(Ipv4Addr::new(10, 20, 0, 1)),
        "hairpin flows are SNATed to the node"
    );
    let mut stream = Stream::connect(&b.ns, fam.at(VIP, 80))?;
    stream.ping()?;
    Ok(())
}

both_families!(snat_pmtu: icmp_fragmentation_needed_about_a_snated_node_port_flow_reaches_the_client,
    v6_packet_too_big_about_a_snated_node_port_flow_reaches_the_client);

/// Path MTU discovery through a NodePort with policy Cluster: node 1 SNATs
/// the outside client's flow to its underlay address towards a backend on
/// node 2, and node 2 forwards to that backend over a link of a smaller
/// MTU. Node 2 answers the client's full-size segments with
/// "fragmentation needed" / Packet Too Big addressed to node 1 and quoting
/// node 1:SNAT port -> backend. Unless node 1 turns the error into one
/// about client -> node port and sends it on, the client never learns the
/// path MTU and the transfer stalls.
fn snat_pmtu(fam: Family) -> Result<()> {
    let mut node1 = Topology::with_index(1, 0, 0)?;
    node1.add_external()?;
    let node2 = Topology::with_index(2, 0, 1)?;
    Topology::join(&node1, &node2)?;
    fam.prepare(&node1)?;
    fam.prepare(&node2)?;
    let remote = &node2.backends[0];
    // The small hop: node 2 -> its backend. The backend itself sends no
    // more than that (route MTU) yet advertises a full-size MSS, so the
    // client's segments are the ones too big (the hop's own MTU would
    // lower the MSS instead and hide the problem).
    let (mtu, mss, gw) = if fam.v6 {
        ("1280", "1440", "fd00:60:0::1")
    } else {
        ("1200", "1460", "10.60.0.1")
    };
    node2
        .node
        .ip(&["link", "set", &remote.host_if, "mtu", mtu])?;
    let family = if fam.v6 { "-6" } else { "-4" };
    remote.ns.ip(&[
        family, "route", "replace", "default", "via", gw, "mtu", mtu, "advmss", mss,
    ])?;
    let _server = fam.greeter(remote)?;
    let mut lb = Lb::load(&node1)?;
    let node_ip = fam.ip(node1.node_address(0));
    let mut np = frontend(
        FrontendKind::NodePort,
        node_ip,
        NODE_PORT,
        Proto::Tcp,
        &active(&[remote.addr(fam.v6)]),
    );
    np.snat = true;
    lb.set(service("big", 80, Proto::Tcp, vec![np]));

    let mut stream = Stream::connect(&node1.externals[0].ns, SocketAddr::new(node_ip, NODE_PORT))?;
    assert_eq!(stream.backend, "node2-backend-0");
    // 64 KiB in one line: many segments of the client's 1500-byte MTU.
    let big = "x".repeat(64 * 1024);
    for _ in 0..3 {
        stream
            .exchange(&big)
            .context("a transfer larger than the path MTU")?;
    }
    assert!(
        lb.stat(Stat::IcmpSnatTranslated)? >= 1,
        "no ICMP error was translated, so the test did not exercise PMTU"
    );
    assert_eq!(
        lb.stat(Stat::IcmpTranslated)?,
        0,
        "the errors came to the node, not past it"
    );
    Ok(())
}

both_families!(snat_port_unreachable: port_unreachable_about_a_snated_node_port_flow_refuses_the_client,
    v6_port_unreachable_about_a_snated_node_port_flow_refuses_the_client);

/// A UDP NodePort with policy Cluster whose backend has no listener on its
/// targetPort: the backend answers the SNATed datagram with port
/// unreachable to the node's address, quoting node:SNAT port -> backend.
/// Translated and sent on, it reaches the client's connected socket as
/// ECONNREFUSED, as with kube-proxy; untranslated, the node swallows it and
/// the client waits for an answer that never comes.
fn snat_port_unreachable(fam: Family) -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    fam.prepare(&topo)?;
    let b = &topo.backends[0];
    let mut lb = Lb::load(&topo)?;
    let node = fam.ip(topo.node_address(0));
    let mut np = frontend(
        FrontendKind::NodePort,
        node,
        NODE_PORT,
        Proto::Udp,
        &active(&[b.addr(fam.v6)]),
    );
    np.snat = true;
    lb.set(service("dns", 53, Proto::Udp, vec![np]));

    let addr = SocketAddr::new(node, NODE_PORT);
    let local: SocketAddr = if fam.v6 {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let outcome = topo.externals[0]
        .ns
        .run(move || -> std::io::Result<usize> {
            let socket = UdpSocket::bind(local)?;
            socket.connect(addr)?;
            socket.set_read_timeout(Some(Duration::from_secs(2)))?;
            socket.send(b"hello")?;
            let mut buf = [0u8; 64];
            socket.recv(&mut buf)
        })?;
    match outcome {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => bail!("expected ECONNREFUSED from the backend's port unreachable, got {other:?}"),
    }
    assert_eq!(lb.stat(Stat::SnatReply)?, 0, "no reply came back");
    assert!(lb.stat(Stat::IcmpSnatTranslated)? >= 1);
    Ok(())
}

both_families!(crafted_quotes: icmp_errors_about_a_snated_flow_are_translated_whole_or_partial_and_truncated_ones_pass,
    v6_icmp_errors_about_a_snated_flow_are_translated_whole_or_partial_and_truncated_ones_pass);

/// ICMP errors built by hand, to pin down what the datapath does with
/// each length of quote, seen byte for byte by a raw socket on the client:
/// a quote with the whole TCP header (every checksum, the quoted TCP one
/// included, must be right for the translated addresses), one with only
/// the 8 bytes an ICMP error must carry (translated, the TCP checksum
/// not being there), and one cut inside the ports (passed untouched: it
/// reaches the node, not the client).
fn crafted_quotes(fam: Family) -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    fam.prepare(&topo)?;
    let b = &topo.backends[0];
    let _server = fam.greeter(b)?;
    let mut lb = Lb::load(&topo)?;
    let node = fam.ip(topo.node_address(0));
    let mut np = frontend(
        FrontendKind::NodePort,
        node,
        NODE_PORT,
        Proto::Tcp,
        &active(&[b.addr(fam.v6)]),
    );
    np.snat = true;
    lb.set(service("web", 80, Proto::Tcp, vec![np]));
    let ext = &topo.externals[0];
    let mut stream = Stream::connect(&ext.ns, SocketAddr::new(node, NODE_PORT))?;
    stream.ping()?;
    let client = stream.local_addr()?;
    let (snat_ip, snat_port) = snat_source(&lb, fam.v6)?;
    let backend = SocketAddr::new(b.addr(fam.v6), 8080);
    let snat = SocketAddr::new(snat_ip, snat_port);

    let listener = raw_icmp(&ext.ns, fam.v6)?;
    let sender = raw_icmp(&b.ns, fam.v6)?;
    let expected = Quote {
        src: client,
        dst: SocketAddr::new(node, NODE_PORT),
    };
    for (l4_len, what) in [(20, "whole TCP header"), (8, "8 bytes of TCP")] {
        let error = icmp_error(snat, backend, l4_len);
        sender.send_to(&error, SocketAddr::new(snat_ip, 0))?;
        let got = receive_error(&listener, fam.v6)?
            .with_context(|| format!("no error with a quote of {what} reached the client"))?;
        check_translated(&got, node, &expected, l4_len == 20)
            .with_context(|| format!("quote of {what}"))?;
    }
    assert_eq!(lb.stat(Stat::IcmpSnatTranslated)?, 2);

    // Cut inside the ports: not ours to translate.
    let error = icmp_error(snat, backend, 4);
    sender.send_to(&error, SocketAddr::new(snat_ip, 0))?;
    assert!(
        receive_error(&listener, fam.v6)?.is_none(),
        "a truncated quote must pass untouched (to the node)"
    );
    assert_eq!(lb.stat(Stat::IcmpSnatTranslated)?, 2);
    stream.ping().context("the flow is unharmed")?;
    Ok(())
}

/// The node address and port of the test's one SNATed flow, from its
/// reply entry (backend -> node:port).
fn snat_source(lb: &Lb, v6: bool) -> Result<(IpAddr, u16)> {
    let maps = lb.maps()?;
    let snat_reply = |e: &CtEntry| e.kind == CtKind::Reply as u8 && e.flags & CT_F_SNAT != 0;
    let found = if v6 {
        sluice::conntrack::read_all6(&maps)?
            .into_iter()
            .find(|(_, e)| snat_reply(e))
            .map(|(k, _)| (IpAddr::from(k.dst), k.dport))
    } else {
        sluice::conntrack::read_all(&maps)?
            .into_iter()
            .find(|(_, e)| snat_reply(e))
            .map(|(k, _)| (IpAddr::from(k.dst), k.dport))
    };
    found.context("no SNAT reply entry")
}

/// A raw ICMP (ICMPv6) socket in `ns`: it gets a copy of every ICMP
/// message the namespace receives, and sends ICMP messages as built.
fn raw_icmp(ns: &Netns, v6: bool) -> Result<UdpSocket> {
    let socket = ns.run(move || -> std::io::Result<UdpSocket> {
        let (domain, proto) = if v6 {
            (Domain::IPV6, Protocol::ICMPV6)
        } else {
            (Domain::IPV4, Protocol::ICMPV4)
        };
        let socket = Socket::new(domain, Type::RAW, Some(proto))?;
        socket.set_read_timeout(Some(Duration::from_millis(700)))?;
        // Plain recv_from/send_to on the raw socket.
        Ok(socket.into())
    })??;
    Ok(socket)
}

/// The internet checksum of `bytes` on top of the unfolded sum `sum`.
fn csum(bytes: &[u8], mut sum: u32) -> u16 {
    for pair in bytes.chunks(2) {
        sum += u32::from(pair[0]) << 8 | u32::from(*pair.get(1).unwrap_or(&0));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The unfolded sum of a pseudo-header (addresses, length, protocol).
fn pseudo(src: IpAddr, dst: IpAddr, len: usize, proto: u8) -> u32 {
    let octets = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut bytes = octets(src);
    bytes.extend(octets(dst));
    let sum = u32::from(!csum(&bytes, 0));
    sum + len as u32 + u32::from(proto)
}

/// A "port unreachable" from `backend` about a TCP segment
/// `snat` -> `backend` (a bare 20-byte header, quoted up to `l4_len`
/// bytes), with every checksum right. ICMPv6's own checksum is left to
/// the kernel (raw ICMPv6 sockets always compute it).
fn icmp_error(snat: SocketAddr, backend: SocketAddr, l4_len: usize) -> Vec<u8> {
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&snat.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&backend.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x10; // ACK
    tcp[14..16].copy_from_slice(&1000u16.to_be_bytes());
    let check = csum(&tcp, pseudo(snat.ip(), backend.ip(), 20, 6));
    tcp[16..18].copy_from_slice(&check.to_be_bytes());
    let mut msg = match (snat.ip(), backend.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip = vec![0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0];
            ip.extend(s.octets());
            ip.extend(d.octets());
            let check = csum(&ip, 0);
            ip[10..12].copy_from_slice(&check.to_be_bytes());
            let mut msg = vec![3, 3, 0, 0, 0, 0, 0, 0];
            msg.extend(ip);
            msg
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut msg = vec![1, 4, 0, 0, 0, 0, 0, 0];
            msg.extend([0x60, 0, 0, 0, 0, 20, 6, 64]);
            msg.extend(s.octets());
            msg.extend(d.octets());
            msg
        }
        _ => unreachable!("one family"),
    };
    msg.extend(&tcp[..l4_len]);
    if snat.is_ipv4() {
        let check = csum(&msg, 0);
        msg[2..4].copy_from_slice(&check.to_be_bytes());
    }
    msg
}

/// The next ICMP destination unreachable the raw socket receives (outer
/// source, outer destination, ICMP message), or `None` within its timeout.
fn receive_error(socket: &UdpSocket, v6: bool) -> Result<Option<(IpAddr, IpAddr, Vec<u8>)>> {
    let mut buf = [0u8; 2048];
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let packet = &buf[..n];
        if v6 {
            // IPv6 raw sockets get the message alone; the destination is
            // the client's own address, checked by the caller's quote.
            if packet.first() == Some(&1) {
                return Ok(Some((from.ip(), IpAddr::from([0u8; 16]), packet.to_vec())));
            }
        } else {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            if packet[9] == 1 && packet.get(ihl) == Some(&3) {
                let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
                let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
                return Ok(Some((src.into(), dst.into(), packet[ihl..].to_vec())));
            }
        }
    }
}

/// What the client must find quoted: its own packet to the frontend.
struct Quote {
    src: SocketAddr,
    dst: SocketAddr,
}

/// Checks a received error: from the frontend, to the client, quoting
/// client -> frontend, with a valid ICMP checksum (ICMPv6: over its
/// pseudo-header), a valid quoted IPv4 header checksum and, when
/// `whole_tcp`, a valid quoted TCP checksum.
fn check_translated(
    (src, dst, msg): &(IpAddr, IpAddr, Vec<u8>),
    frontend: IpAddr,
    quote: &Quote,
    whole_tcp: bool,
) -> Result<()> {
    anyhow::ensure!(*src == frontend, "outer source {src}, not the frontend");
    let octets = |b: &[u8]| -> IpAddr {
        if b.len() == 4 {
            IpAddr::from(<[u8; 4]>::try_from(b).unwrap_or_default())
        } else {
            IpAddr::from(<[u8; 16]>::try_from(b).unwrap_or_default())
        }
    };
    let (inner_src, inner_dst, l4) = if quote.src.is_ipv4() {
        anyhow::ensure!(*dst == quote.src.ip(), "outer destination {dst}");
        anyhow::ensure!(csum(msg, 0) == 0, "ICMP checksum");
        anyhow::ensure!(csum(&msg[8..28], 0) == 0, "quoted IP header checksum");
        (octets(&msg[20..24]), octets(&msg[24..28]), &msg[28..])
    } else {
        let sum = pseudo(*src, quote.src.ip(), msg.len(), 58);
        anyhow::ensure!(csum(msg, sum) == 0, "ICMPv6 checksum");
        (octets(&msg[16..32]), octets(&msg[32..48]), &msg[48..])
    };
    let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    anyhow::ensure!(
        SocketAddr::new(inner_src, port(&l4[0..2])) == quote.src
            && SocketAddr::new(inner_dst, port(&l4[2..4])) == quote.dst,
        "quoted {inner_src}:{} -> {inner_dst}:{}",
        port(&l4[0..2]),
        port(&l4[2..4])
    );
    if whole_tcp {
        anyhow::ensure!(l4.len() == 20, "the whole quoted TCP header");
        anyhow::ensure!(
            csum(l4, pseudo(inner_src, inner_dst, 20, 6)) == 0,
            "quoted TCP checksum"
        );
    }
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
            V4.ip(VIP),
            80,
            Proto::Tcp,
            &active(&[remote.addr(false)]),
        )],
    ));

    let mut stream = Stream::connect(&node1.clients[0].ns, V4.at(VIP, 80))?;
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
