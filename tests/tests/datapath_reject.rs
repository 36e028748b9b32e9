//! Frontends without a selectable backend answer at once (RST / ICMP port
//! unreachable, as kube-proxy's REJECT), or drop when told to (kube-proxy's
//! DROP); UDP request/response through a VIP carries the VIP back.

use std::{
    io::ErrorKind,
    net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use sluice::model::{BackendState, Proto, WhenEmpty};
use sluice_common::Stat;
use sluice_tests::{
    clients,
    lb::{cluster_ip, vip, Lb},
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 40);

#[test]
fn tcp_to_a_service_without_backends_is_refused_at_once() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip("empty", VIP, 80, Proto::Tcp, &[]));
    let started = Instant::now();
    let err = clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80)).expect_err("refused");
    let elapsed = started.elapsed();
    let io = err.downcast_ref::<std::io::Error>().context("io error")?;
    assert_eq!(io.kind(), ErrorKind::ConnectionRefused, "{err:#}");
    assert!(
        elapsed < Duration::from_millis(500),
        "refused in {elapsed:?}, not timed out"
    );
    assert_eq!(lb.stat(Stat::NoBackend)?, 1);
    Ok(())
}

#[test]
fn udp_to_a_service_without_backends_gets_port_unreachable() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip("empty-dns", VIP, 53, Proto::Udp, &[]));
    let outcome = topo.clients[0].ns.run(|| -> std::io::Result<usize> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        // A connected socket reports the ICMP error on its next receive.
        socket.connect(vip(VIP, 53))?;
        socket.send(b"q")?;
        socket.recv(&mut [0u8; 64])
    })?;
    let err = outcome.expect_err("ICMP port unreachable");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    assert_eq!(lb.stat(Stat::NoBackend)?, 1);
    Ok(())
}

#[test]
fn drop_when_empty_frontend_drops_silently() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    let mut lb = Lb::load(&topo)?;
    let (name, mut svc) = cluster_ip("local-only", VIP, 80, Proto::Tcp, &[]);
    svc.frontends[0].when_empty = WhenEmpty::Drop;
    lb.set((name, svc));
    let outcome = topo.clients[0].ns.run(|| {
        TcpStream::connect_timeout(&SocketAddr::from(vip(VIP, 80)), Duration::from_millis(800))
    })?;
    let err = outcome.expect_err("dropped");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(lb.stat(Stat::NoBackendDrop)? >= 1);
    assert_eq!(lb.stat(Stat::NoBackend)?, 0);
    Ok(())
}

#[test]
fn udp_request_response_through_a_vip_comes_back_from_the_vip() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::udp_greeter(&b.ns, 5353, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, 5353, BackendState::Active))
        .collect();
    lb.set(cluster_ip("dns", VIP, 53, Proto::Udp, &backends));
    for _ in 0..20 {
        let (answer, from) = clients::udp_hello(&topo.clients[0].ns, vip(VIP, 53))?;
        assert!(answer.starts_with("backend-"), "{answer}");
        assert_eq!(
            from,
            SocketAddr::from(vip(VIP, 53)),
            "reply source is the VIP"
        );
    }
    assert_eq!(lb.stat(Stat::NewFlow)?, 20);
    assert_eq!(lb.stat(Stat::ReplyNat)?, 20);
    Ok(())
}
