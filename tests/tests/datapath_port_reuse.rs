//! Source-port reuse after a service connection: a client that reached a
//! backend through a cluster IP from port P, and closed that connection,
//! may open a direct connection to the same backend address and port from
//! the same port P (the kernel only keeps 4-tuples unique). The backend's
//! SYN-ACK then has the reply tuple of the old, closed service flow: it
//! must reach the client as it is, not be reverse-NATed to the cluster IP
//! (the client would never see its connection established). netfilter
//! handles it (a new connection replaces a closed entry); so must sluice,
//! in both families, whether the old connection ended with a RST or FINs.
//!
//! A connection through the service on a finished flow's tuple to the same
//! backend takes over that flow's conntrack entries in place.
//!
//! Source-port sharing between live connections: Linux lets connect()
//! give one local port to several connections with different peers, so a
//! client may hold two live connections from one port to two services
//! whose backend is the same. After DNAT both would have one 4-tuple; the
//! backend could not tell them apart, and the second's reply entry would
//! take the first's replies. netfilter remaps the second connection's
//! source port; sluice leaves the first flow alone and masquerades the
//! second (the node's address and an SNAT port make its tuple unique).

use std::{
    io::{BufRead, BufReader, Read},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use anyhow::{Context, Result};
use sluice::model::{BackendState, Proto};
use sluice_common::{
    conntrack::{CT_F_SEEN_REPLY, CT_F_SNAT, CT_REUSE_IDLE_NS},
    CtEntry, CtKind, Stat,
};
use sluice_tests::{
    lb::{cluster_ips, Lb},
    servers::{self, Server},
    Netns, Topology,
};
use socket2::{Domain, Socket, Type};

const VIP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 61);
const VIP6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x61);
const OTHER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 62);
const OTHER6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x62);

/// Connects from local port `port` to `to`, reads the greeting, and
/// closes with a RST (`reset`) or a FIN.
fn greet_from(ns: &Netns, port: u16, to: SocketAddr, reset: bool) -> Result<String> {
    let (stream, greeting) = connect_from(ns, port, to)?;
    if reset {
        socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))?;
    } else {
        // Both FINs before the socket goes: the old flow is closed.
        stream.shutdown(std::net::Shutdown::Write)?;
        let mut rest = Vec::new();
        (&stream).read_to_end(&mut rest)?;
    }
    Ok(greeting)
}

/// One client, `backends` backend pods serving TCP on 8080 in the family
/// `v6` (`whoami`: the greeting also names the source address the backend
/// saw), and sluice loaded on them.
struct Rig {
    topo: Topology,
    _servers: Vec<Server>,
    lb: Lb,
}

fn rig(v6: bool, backends: usize, whoami: bool) -> Result<Rig> {
    let topo = Topology::new(1, backends)?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    let mut servers = Vec::new();
    for b in &topo.backends {
        servers.push(match (v6, whoami) {
            (false, false) => servers::tcp_greeter(&b.ns, 8080, &b.name)?,
            (true, false) => servers::tcp_greeter6(&b.ns, 8080, &b.name)?,
            (false, true) => servers::tcp_whoami(&b.ns, 8080, &b.name)?,
            (true, true) => servers::tcp_whoami6(&b.ns, 8080, &b.name)?,
        });
    }
    let lb = Lb::load(&topo)?;
    Ok(Rig {
        topo,
        _servers: servers,
        lb,
    })
}

/// The two service addresses of the family: `VIP`'s and `OTHER`'s.
fn vips(v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        (IpAddr::V6(VIP6), IpAddr::V6(OTHER6))
    } else {
        (IpAddr::V4(VIP), IpAddr::V4(OTHER))
    }
}

fn reuse(v6: bool, reset: bool) -> Result<()> {
    let Rig {
        topo,
        _servers,
        mut lb,
    } = rig(v6, 1, false)?;
    let b = &topo.backends[0];
    let (vip, _) = vips(v6);
    let backend = b.addr(v6);
    lb.set(cluster_ips(
        "web",
        &[vip],
        80,
        Proto::Tcp,
        &[(backend, 8080, BackendState::Active)],
    ));
    let (service, direct) = (SocketAddr::new(vip, 80), SocketAddr::new(backend, 8080));
    let client = &topo.clients[0];
    let clashes = lb.stat(Stat::TupleClash)?;
    for port in [41_000u16, 41_001, 41_002] {
        assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
        let again = greet_from(&client.ns, port, direct, reset)
            .with_context(|| format!("direct connection from port {port} after a service one"))?;
        assert_eq!(again, b.name);
        // And back through the service from the same port.
        assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
    }
    assert_eq!(
        lb.stat(Stat::TupleClash)?,
        clashes,
        "a port reused after its flow closed is no clash"
    );
    Ok(())
}

#[test]
fn a_port_reused_after_a_reset_service_connection_reaches_the_backend_directly() -> Result<()> {
    reuse(false, true)
}

#[test]
fn a_port_reused_after_a_closed_service_connection_reaches_the_backend_directly() -> Result<()> {
    reuse(false, false)
}

#[test]
fn v6_a_port_reused_after_a_reset_service_connection_reaches_the_backend_directly() -> Result<()> {
    reuse(true, true)
}

#[test]
fn v6_a_port_reused_after_a_closed_service_connection_reaches_the_backend_directly() -> Result<()> {
    reuse(true, false)
}

/// Every conntrack entry of the family, keys left out.
fn entries(lb: &Lb, v6: bool) -> Result<Vec<CtEntry>> {
    let maps = lb.maps()?;
    Ok(if v6 {
        sluice::conntrack::read_all6(&maps)?
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    } else {
        sluice::conntrack::read_all(&maps)?
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    })
}

/// A client reconnecting through the service from the port of its
/// finished connection reaches the same backend (one here): the new flow
/// takes over the old flow's two conntrack entries in place (`ct_reused`,
/// no insert), and they read as a new flow's: no closing bit left of the
/// old one, fresh stamps, the frontend and client of this connection.
/// Not taken over: a reply entry another frontend's flow left on the
/// same backend tuple, and entries idle past `CT_REUSE_IDLE_NS` (which the
/// agent may be collecting); those reselected flows take the inserts.
fn taken_over(v6: bool, reset: bool) -> Result<()> {
    let Rig {
        topo,
        _servers,
        mut lb,
    } = rig(v6, 1, false)?;
    let b = &topo.backends[0];
    let (vip, other) = vips(v6);
    let backend = [(b.addr(v6), 8080, BackendState::Active)];
    lb.set(cluster_ips("web", &[vip], 80, Proto::Tcp, &backend));
    lb.set(cluster_ips("api", &[other], 80, Proto::Tcp, &backend));
    let service = SocketAddr::new(vip, 80);
    let client = &topo.clients[0];
    let port = 43_000u16;
    assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
    // The RST or last ACK passes sl_ingress in the softirq after close().
    let over = |lb: &Lb| -> Result<Vec<CtEntry>> {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let now = entries(lb, v6)?;
            let closing = now
                .iter()
                .any(|e| e.kind == CtKind::Forward as u8 && e.is_closing());
            if closing || std::time::Instant::now() > deadline {
                assert!(closing, "the first flow is over: {now:?}");
                return Ok(now);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let old = over(&lb)?;
    assert_eq!(old.len(), 2, "the first flow's forward and reply entries");
    let old_stamp = old.iter().map(|e| e.last_seen_ns).max().unwrap_or(0);
    let (reused, reselected) = (lb.stat(Stat::CtReused)?, lb.stat(Stat::Reselected)?);
    // The datapath's stamps are the coarse clock's (a tick apart).
    std::thread::sleep(Duration::from_millis(30));

    let (stream, hello) = connect_from(&client.ns, port, service)?;
    assert_eq!(hello, b.name);
    echo(&stream, "again").context("the connection on the reused tuple")?;
    assert_eq!(
        lb.stat(Stat::Reselected)?,
        reselected + 1,
        "the SYN reselected"
    );
    assert_eq!(
        lb.stat(Stat::CtReused)?,
        reused + 1,
        "the entries were taken over, not inserted"
    );
    let now = entries(&lb, v6)?;
    assert_eq!(now.len(), 2, "still one flow's two entries: {now:?}");
    let forward = now
        .iter()
        .find(|e| e.kind == CtKind::Forward as u8)
        .context("a forward entry")?;
    let reply = now
        .iter()
        .find(|e| e.kind == CtKind::Reply as u8)
        .context("a reply entry")?;
    for e in [forward, reply] {
        assert!(!e.is_closing(), "a closing bit of the old flow left: {e:?}");
        assert!(e.last_seen_ns > old_stamp, "stamped by the new flow: {e:?}");
        assert_eq!(e.flags & CT_F_SNAT, 0, "not SNATed: {e:?}");
    }
    assert_ne!(
        forward.flags & CT_F_SEEN_REPLY,
        0,
        "the new flow's replies are seen: {forward:?}"
    );
    let v4_in_16 = |a: IpAddr| match a {
        IpAddr::V4(a) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&a.octets());
            out
        }
        IpAddr::V6(a) => a.octets(),
    };
    assert_eq!(reply.nat_addr, v4_in_16(vip), "replies come from the VIP");
    assert_eq!(reply.nat_port, 80);
    assert_eq!(reply.peer_addr, v4_in_16(client.addr(v6)));
    assert_eq!(reply.peer_port, port);
    // Both FINs before the socket goes.
    stream.shutdown(std::net::Shutdown::Write)?;
    (&stream).read_to_end(&mut Vec::new())?;
    drop(stream);

    // The port to the other service on the same backend: the reply key is
    // the same, its entry `web`'s. Then back to `web`, whose reply entry is
    // now `api`'s: neither is taken over (another frontend's), both
    // reselected flows take the inserts, and work.
    let reused = lb.stat(Stat::CtReused)?;
    assert_eq!(
        greet_from(&client.ns, port, SocketAddr::new(other, 80), reset)?,
        b.name
    );
    assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
    assert_eq!(
        lb.stat(Stat::CtReused)?,
        reused,
        "another frontend's reply entry is not taken over"
    );
    let reply = entries(&lb, v6)?
        .into_iter()
        .find(|e| e.kind == CtKind::Reply as u8 && e.nat_port == 80 && e.peer_port == port)
        .context("the reply entry")?;
    assert_eq!(reply.nat_addr, v4_in_16(vip), "the last flow's: {reply:?}");

    // Entries idle for longer than the collector's shortest timeout allows
    // may be being deleted: those take the inserts.
    if reset {
        over(&lb)?;
        std::thread::sleep(Duration::from_nanos(CT_REUSE_IDLE_NS) + Duration::from_millis(500));
        let (reused, reselected) = (lb.stat(Stat::CtReused)?, lb.stat(Stat::Reselected)?);
        assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
        assert_eq!(lb.stat(Stat::Reselected)?, reselected + 1);
        assert_eq!(
            lb.stat(Stat::CtReused)?,
            reused,
            "idle entries are not taken over"
        );
    }
    Ok(())
}

#[test]
fn a_service_connection_on_a_finished_flows_tuple_takes_over_its_entries() -> Result<()> {
    taken_over(false, true)?;
    taken_over(false, false)
}

#[test]
fn v6_a_service_connection_on_a_finished_flows_tuple_takes_over_its_entries() -> Result<()> {
    taken_over(true, true)?;
    taken_over(true, false)
}

/// A live connection from local port `port` to `to` (the port may be
/// shared with other connections to other peers); the greeting read.
fn connect_from(ns: &Netns, port: u16, to: SocketAddr) -> Result<(std::net::TcpStream, String)> {
    Ok(ns.run(move || -> std::io::Result<_> {
        let domain = if to.is_ipv6() {
            Domain::IPV6
        } else {
            Domain::IPV4
        };
        let socket = Socket::new(domain, Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        let local: SocketAddr = if to.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, port).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, port).into()
        };
        socket.bind(&local.into())?;
        socket.connect_timeout(&to.into(), Duration::from_secs(3))?;
        socket.set_read_timeout(Some(Duration::from_secs(3)))?;
        let stream: std::net::TcpStream = socket.into();
        let mut greeting = String::new();
        BufReader::new(&stream).read_line(&mut greeting)?;
        Ok((stream, greeting.trim().to_owned()))
    })??)
}

/// One line out and the same line back.
fn echo(stream: &std::net::TcpStream, line: &str) -> Result<()> {
    use std::io::Write;
    (&mut &*stream).write_all(format!("{line}\n").as_bytes())?;
    let mut back = String::new();
    BufReader::new(stream).read_line(&mut back)?;
    anyhow::ensure!(back.trim() == line, "sent {line:?}, got {back:?}");
    Ok(())
}

fn shared(v6: bool) -> Result<()> {
    // The greeting names the backend and the source address it saw.
    let Rig {
        topo,
        _servers,
        mut lb,
    } = rig(v6, 1, true)?;
    let b = &topo.backends[0];
    let (first, second) = vips(v6);
    let backend = [(b.addr(v6), 8080, BackendState::Active)];
    lb.set(cluster_ips("web", &[first], 80, Proto::Tcp, &backend));
    lb.set(cluster_ips("api", &[second], 80, Proto::Tcp, &backend));
    let client = &topo.clients[0];
    let as_is = format!("{} {}", b.name, client.addr(v6));
    let clashes = lb.stat(Stat::TupleClash)?;
    // Each order of the two services, from a port of its own.
    let ports = [(42_000u16, first, second), (42_001, second, first)];
    for (port, first, second) in ports {
        let (a, hello) = connect_from(&client.ns, port, SocketAddr::new(first, 80))?;
        assert_eq!(
            hello, as_is,
            "the first connection keeps the client's address"
        );
        echo(&a, "one").context("the first connection, alone")?;
        let (c, hello) = connect_from(&client.ns, port, SocketAddr::new(second, 80))
            .with_context(|| format!("a second live connection from port {port}"))?;
        assert!(
            hello.starts_with(&b.name) && hello != as_is,
            "the second connection reaches the backend masqueraded: {hello:?}"
        );
        for round in 0..3 {
            echo(&a, &format!("first {round}")).with_context(|| {
                format!("the first connection from port {port}, after the second")
            })?;
            echo(&c, &format!("second {round}"))
                .with_context(|| format!("the second connection from port {port}"))?;
        }
    }
    assert_eq!(
        lb.stat(Stat::TupleClash)? - clashes,
        ports.len() as u64,
        "one clash counted per shared port"
    );
    Ok(())
}

#[test]
fn two_live_connections_from_one_port_to_two_services_on_one_backend_both_work() -> Result<()> {
    shared(false)
}

#[test]
fn v6_two_live_connections_from_one_port_to_two_services_on_one_backend_both_work() -> Result<()> {
    shared(true)
}

/// A reply entry left behind by a reselection: the client's flow from a
/// port was reset, the same tuple came back after its backend left the
/// service and went to the other backend. The first backend's reply entry
/// now names a forward entry that is another flow's; a direct connection
/// from that port to the first backend must not be taken for it.
fn stale_after_reselection(v6: bool) -> Result<()> {
    let Rig {
        topo,
        _servers,
        mut lb,
    } = rig(v6, 2, false)?;
    let (b1, b2) = (&topo.backends[0], &topo.backends[1]);
    let (vip, _) = vips(v6);
    let service = SocketAddr::new(vip, 80);
    let client = &topo.clients[0];
    let port = 43_000;
    lb.set(cluster_ips(
        "web",
        &[vip],
        80,
        Proto::Tcp,
        &[(b1.addr(v6), 8080, BackendState::Active)],
    ));
    assert_eq!(greet_from(&client.ns, port, service, true)?, b1.name);
    lb.set(cluster_ips(
        "web",
        &[vip],
        80,
        Proto::Tcp,
        &[(b2.addr(v6), 8080, BackendState::Active)],
    ));
    // The same tuple again, reselected to the other backend, kept open.
    let (live, hello) = connect_from(&client.ns, port, service)?;
    assert_eq!(hello, b2.name);
    let direct = greet_from(&client.ns, port, SocketAddr::new(b1.addr(v6), 8080), true)
        .context("a direct connection to the first backend from the reselected flow's port")?;
    assert_eq!(direct, b1.name);
    echo(&live, "still").context("the reselected flow, after the direct one")?;
    Ok(())
}

#[test]
fn a_reply_entry_left_by_a_reselection_does_not_take_a_direct_connection() -> Result<()> {
    stale_after_reselection(false)
}

#[test]
fn v6_a_reply_entry_left_by_a_reselection_does_not_take_a_direct_connection() -> Result<()> {
    stale_after_reselection(true)
}
