//! Graceful termination in the datapath: a terminating backend gets no new
//! flow but keeps the ones it has; fallback to terminating-but-serving
//! backends; flows whose backend vanished; source-port reuse.

use std::{
    collections::HashMap,
    io::ErrorKind,
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use sluice::model::{BackendState, Proto};
use sluice_common::Stat;
use sluice_tests::{
    clients::{self, Stream},
    lb::{cluster_ip, vip, Lb},
    servers::{self, Server},
    Netns, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);

fn greeters(topo: &Topology) -> Result<Vec<Server>> {
    topo.backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect()
}

fn all(topo: &Topology, state: BackendState) -> Vec<(Ipv4Addr, u16, BackendState)> {
    topo.backends.iter().map(|b| (b.ip, 8080, state)).collect()
}

/// Opens streams until one is served by `backend`; closes the others.
fn stream_to(ns: &Netns, addr: SocketAddrV4, backend: &str) -> Result<Stream> {
    for _ in 0..200 {
        let s = Stream::connect(ns, addr)?;
        if s.backend == backend {
            return Ok(s);
        }
    }
    bail!("no connection landed on {backend} in 200 tries")
}

fn tally(outcomes: Vec<std::io::Result<String>>) -> Result<HashMap<String, usize>> {
    let mut hits = HashMap::new();
    for o in outcomes {
        *hits.entry(o.context("connection failed")?).or_default() += 1;
    }
    Ok(hits)
}

#[test]
fn terminating_backend_keeps_its_flow_gets_no_new_ones_and_goes_after_close() -> Result<()> {
    let topo = Topology::new(1, 3)?;
    let _servers = greeters(&topo)?;
    let mut lb = Lb::load(&topo)?;
    let client = &topo.clients[0].ns;
    let (a, b, c) = (&topo.backends[0], &topo.backends[1], &topo.backends[2]);
    let svc = |sa: BackendState| {
        cluster_ip(
            "web",
            VIP,
            80,
            Proto::Tcp,
            &[
                (a.ip, 8080, sa),
                (b.ip, 8080, BackendState::Active),
                (c.ip, 8080, BackendState::Active),
            ],
        )
    };
    lb.set(svc(BackendState::Active));
    let mut stream = stream_to(client, vip(VIP, 80), &a.name)?;
    let a_id = lb.backend_id(a.ip, 8080).context("backend A programmed")?;

    // A turns terminating: its stream keeps talking every 100 ms for 10 s
    // while 1000 new connections avoid it.
    lb.set(svc(BackendState::Terminating));
    let (pings, hits) = std::thread::scope(|s| {
        let pinger = s.spawn(|| -> Result<u32> {
            let start = Instant::now();
            let mut n = 0;
            while start.elapsed() < Duration::from_secs(10) {
                stream
                    .ping()
                    .with_context(|| format!("ping {n} on the draining stream"))?;
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(n)
        });
        let hits = clients::tcp_hellos(client, vip(VIP, 80), 1000).and_then(tally);
        (pinger.join().expect("pinger"), hits)
    });
    let pings = pings?;
    let hits = hits?;
    assert!(
        pings >= 90,
        "the draining stream kept working ({pings} pings in 10 s)"
    );
    assert_eq!(
        hits.get(&a.name),
        None,
        "a terminating backend got new flows: {hits:?}"
    );
    assert_eq!(hits.values().sum::<usize>(), 1000);

    // Its live flow keeps it in the maps across drain ticks.
    lb.drain_tick()?;
    assert_eq!(
        lb.backend_id(a.ip, 8080),
        Some(a_id),
        "A stays while its flow lives"
    );

    // Revived: new connections reach it again.
    lb.set(svc(BackendState::Active));
    let hits = tally(clients::tcp_hellos(client, vip(VIP, 80), 300)?)?;
    assert!(
        hits.get(&a.name).copied().unwrap_or(0) > 30,
        "revived A gets new flows: {hits:?}"
    );

    // Terminating again, then its last flow closes: it goes, and so do its
    // conntrack entries.
    lb.set(svc(BackendState::Terminating));
    stream.ping()?;
    lb.drain_tick()?;
    assert_eq!(lb.backend_id(a.ip, 8080), Some(a_id));
    drop(stream);
    // The revived-phase flows on A are closed already; the stream's close
    // takes a moment to cross the datapath.
    let deadline = Instant::now() + Duration::from_secs(5);
    while lb.backend_id(a.ip, 8080).is_some() {
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
fn all_terminating_but_serving_still_serve_and_not_serving_is_refused() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _servers = greeters(&topo)?;
    let mut lb = Lb::load(&topo)?;
    let client = &topo.clients[0].ns;
    lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &all(&topo, BackendState::TerminatingServing),
    ));
    let hits = tally(clients::tcp_hellos(client, vip(VIP, 80), 100)?)?;
    assert_eq!(
        hits.values().sum::<usize>(),
        100,
        "fallback to serving backends: {hits:?}"
    );

    lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &all(&topo, BackendState::Terminating),
    ));
    let err =
        clients::tcp_hello(client, vip(VIP, 80)).expect_err("terminating, not serving: refused");
    let io = err
        .downcast_ref::<std::io::Error>()
        .context("an io error")?;
    assert_eq!(io.kind(), ErrorKind::ConnectionRefused, "{err:#}");
    Ok(())
}

#[test]
fn established_flow_is_reset_when_its_backend_is_gone_and_udp_moves_on() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _servers = greeters(&topo)?;
    let _udp = topo
        .backends
        .iter()
        .map(|b| servers::udp_greeter(&b.ns, 5353, &b.name))
        .collect::<Result<Vec<_>>>()?;
    // Drain timeout 0: a removed backend leaves at the next reconcile,
    // flows or not.
    let mut lb = Lb::load_with(&topo, Default::default(), Duration::ZERO)?;
    let client = &topo.clients[0].ns;
    let (a, b) = (&topo.backends[0], &topo.backends[1]);
    lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &all(&topo, BackendState::Active),
    ));
    let dns: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, 5353, BackendState::Active))
        .collect();
    lb.set(cluster_ip("dns", VIP, 53, Proto::Udp, &dns));
    let mut stream = stream_to(client, vip(VIP, 80), &a.name)?;
    stream.ping()?;

    // A UDP flow, pinned to its backend by conntrack.
    let udp = client.run(|| std::net::UdpSocket::bind("0.0.0.0:0"))??;
    udp.set_read_timeout(Some(Duration::from_secs(3)))?;
    udp.send_to(b"q", vip(VIP, 53))?;
    let mut buf = [0u8; 64];
    let (n, _) = udp.recv_from(&mut buf)?;
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();

    let keep_only = |name: &str| -> Vec<(Ipv4Addr, u16, BackendState)> {
        topo.backends
            .iter()
            .filter(|p| p.name == name)
            .map(|p| (p.ip, 8080, BackendState::Active))
            .collect()
    };
    let survivor = if first == a.name { b } else { a };
    let gone = if first == a.name { a } else { b };
    // Remove A from the TCP service and the UDP flow's backend from DNS.
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &keep_only(&b.name)));
    lb.set(cluster_ip(
        "dns",
        VIP,
        53,
        Proto::Udp,
        &keep_only(&survivor.name)
            .iter()
            .map(|(ip, _, s)| (*ip, 5353, *s))
            .collect::<Vec<_>>(),
    ));
    lb.apply(); // drain timeout 0: now removable
    assert_eq!(lb.backend_id(a.ip, 8080), None, "A left the maps");

    let err = stream
        .ping()
        .expect_err("a flow whose backend is gone is reset");
    let io = err
        .downcast_ref::<std::io::Error>()
        .context("an io error")?;
    assert_eq!(io.kind(), ErrorKind::ConnectionReset, "{err:#}");
    assert!(lb.stat(Stat::StaleReset)? >= 1);

    // The UDP flow's next datagram gets a fresh pick on the survivor.
    udp.send_to(b"q", vip(VIP, 53))?;
    let mut buf = [0u8; 64];
    let (n, from) = udp.recv_from(&mut buf)?;
    assert_eq!(
        String::from_utf8_lossy(&buf[..n]),
        survivor.name,
        "moved off {}",
        gone.name
    );
    assert_eq!(
        from,
        std::net::SocketAddr::from(vip(VIP, 53)),
        "reply comes from the VIP"
    );
    Ok(())
}

#[test]
fn reused_source_port_after_close_reaches_a_live_backend() -> Result<()> {
    let topo = Topology::new(1, 3)?;
    let _servers = greeters(&topo)?;
    let mut lb = Lb::load(&topo)?;
    let client = &topo.clients[0].ns;
    lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &all(&topo, BackendState::Active),
    ));

    // The client closes first, so TIME_WAIT is on its side: allow reuse.
    client.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
    let port = 40_123;
    let first = clients::tcp_hello_from_port(client, vip(VIP, 80), port)?;
    let first_ip = topo.backend(&first).context("known backend")?.ip;

    // The backend that served the port turns terminating (its flow is
    // closed, so it is not kept alive by it). The same 5-tuple must now be
    // sent to a live backend even though conntrack remembers the old one.
    let states: Vec<_> = topo
        .backends
        .iter()
        .map(|b| {
            (
                b.ip,
                8080,
                if b.ip == first_ip {
                    BackendState::Terminating
                } else {
                    BackendState::Active
                },
            )
        })
        .collect();
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &states));
    std::thread::sleep(Duration::from_millis(1100)); // tw_reuse needs a newer timestamp second
    let second = clients::tcp_hello_from_port(client, vip(VIP, 80), port)?;
    assert_ne!(
        second, first,
        "the reused port left the terminating backend"
    );
    assert!(
        lb.stat(Stat::Reselected)? >= 1,
        "the SYN hit the closed entry and got a fresh pick"
    );
    Ok(())
}
