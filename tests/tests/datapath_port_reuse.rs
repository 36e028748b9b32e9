//! Source-port reuse after a service connection: a client that reached a
//! backend through a cluster IP from port P, and closed that connection,
//! may open a direct connection to the same backend address and port from
//! the same port P (the kernel only keeps 4-tuples unique). The backend's
//! SYN-ACK then has the reply tuple of the old, closed service flow: it
//! must reach the client as it is, not be reverse-NATed to the cluster IP
//! (the client would never see its connection established). netfilter
//! handles it (a new connection replaces a closed entry); so must sluice,
//! in both families, whether the old connection ended with a RST or FINs.

use std::{
    io::{BufRead, BufReader, Read},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use anyhow::{Context, Result};
use sluice::model::{BackendState, Proto};
use sluice_tests::{
    lb::{cluster_ips, Lb},
    servers, Netns, Topology,
};
use socket2::{Domain, Socket, Type};

const VIP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 61);
const VIP6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x61);

/// Connects from local port `port` to `to`, reads the greeting, and
/// closes with a RST (`reset`) or a FIN.
fn greet_from(ns: &Netns, port: u16, to: SocketAddr, reset: bool) -> Result<String> {
    Ok(ns.run(move || -> std::io::Result<String> {
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
        if reset {
            socket.set_linger(Some(Duration::ZERO))?;
        }
        let stream: std::net::TcpStream = socket.into();
        let mut greeting = String::new();
        BufReader::new(&stream).read_line(&mut greeting)?;
        if !reset {
            // Both FINs before the socket goes: the old flow is closed.
            stream.shutdown(std::net::Shutdown::Write)?;
            let mut rest = Vec::new();
            (&stream).read_to_end(&mut rest)?;
        }
        Ok(greeting.trim().to_owned())
    })??)
}

fn reuse(v6: bool, reset: bool) -> Result<()> {
    let topo = Topology::new(1, 1)?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    let b = &topo.backends[0];
    let _server = if v6 {
        servers::tcp_greeter6(&b.ns, 8080, &b.name)?
    } else {
        servers::tcp_greeter(&b.ns, 8080, &b.name)?
    };
    let mut lb = Lb::load(&topo)?;
    let vip = if v6 {
        IpAddr::V6(VIP6)
    } else {
        IpAddr::V4(VIP)
    };
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
    for port in [41_000u16, 41_001, 41_002] {
        assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
        let again = greet_from(&client.ns, port, direct, reset)
            .with_context(|| format!("direct connection from port {port} after a service one"))?;
        assert_eq!(again, b.name);
        // And back through the service from the same port.
        assert_eq!(greet_from(&client.ns, port, service, reset)?, b.name);
    }
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
