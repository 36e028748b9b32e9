//! The programs' filters (`sluice_common::filter`) on real traffic: a
//! packet whose destination no frontend has leaves `sl_ingress` before the
//! service lookup, and one from a port no backend listens on leaves
//! `sl_egress` before the conntrack lookup. Shown with map entries written
//! behind the agent's back, which the programs would act on if they
//! looked them up: they do not, until the agent admits them.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use sluice::model::{BackendState, Proto};
use sluice_common::{Ct4Key, Ct6Key, CtEntry, CtKind, Svc4Key, Svc6Key, IPPROTO_TCP};
use sluice_tests::{
    clients,
    lb::{cluster_ip, cluster_ip6, vip, vip6, Lb},
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);

fn setup6(clients: usize, backends: usize) -> anyhow::Result<Topology> {
    let topo = Topology::new(clients, backends)?;
    topo.wait_ipv6_ready()?;
    Ok(topo)
}

#[test]
fn a_frontend_the_agent_did_not_admit_is_never_looked_up() -> anyhow::Result<()> {
    let topo = Topology::new(1, 2)?;
    let (b0, b1) = (&topo.backends[0], &topo.backends[1]);
    let _s0 = servers::tcp_greeter(&b0.ns, 8080, &b0.name)?;
    let _s1 = servers::tcp_greeter(&b1.ns, 8080, &b1.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &[(b0.ip, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let pod = SocketAddrV4::new(b1.ip, 8080);
    let client = &topo.clients[0].ns;
    assert_eq!(clients::tcp_hello(client, pod)?, b1.name);

    // The VIP's entries copied under backend-1's address: a frontend in
    // sl_svc4 that would send backend-1:8080 to backend-0.
    let mut maps = lb.maps()?;
    for slot in 0..=1 {
        let value = maps
            .services_v4
            .get(&Svc4Key::new(VIP.octets(), 80, IPPROTO_TCP, slot), 0)?;
        maps.services_v4.insert(
            Svc4Key::new(b1.ip.octets(), 8080, IPPROTO_TCP, slot),
            value,
            0,
        )?;
    }
    // The filter has no bit for backend-1's address: the entry is not
    // looked up and the pod is reached directly.
    assert_eq!(clients::tcp_hello(client, pod)?, b1.name);

    // Once the agent programs a frontend there, its filter admits it first.
    let report = lb.set(cluster_ip(
        "pod-as-frontend",
        b1.ip,
        8080,
        Proto::Tcp,
        &[(b0.ip, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(clients::tcp_hello(client, pod)?, b0.name);
    assert_eq!(clients::tcp_hello(client, vip(VIP, 80))?, b0.name);
    Ok(())
}

#[test]
fn reverse_nat_is_looked_up_only_for_packets_from_backend_ports() -> anyhow::Result<()> {
    let topo = Topology::new(1, 1)?;
    let backend = &topo.backends[0];
    let _s8080 = servers::tcp_greeter(&backend.ns, 8080, &backend.name)?;
    let _s9000 = servers::tcp_greeter(&backend.ns, 9000, &backend.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &[(backend.ip, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let client = &topo.clients[0];

    // A reply entry for the backend's answers to a client port, as if
    // that connection had been DNATed from the VIP: `sl_egress` would give
    // those answers the VIP as source, and the client's socket, which
    // connected to the pod directly, would never see them.
    let mut maps = lb.maps()?;
    let mut plant = |from_port: u16, client_port: u16| -> anyhow::Result<()> {
        let mut entry = CtEntry {
            last_seen_ns: sluice::conntrack::monotonic_ns(),
            kind: CtKind::Reply as u8,
            nat_port: 80,
            peer_port: client_port,
            ..CtEntry::default()
        };
        entry.nat_addr[..4].copy_from_slice(&VIP.octets());
        entry.peer_addr[..4].copy_from_slice(&client.ip.octets());
        let key = Ct4Key::new(
            backend.ip.octets(),
            client.ip.octets(),
            from_port,
            client_port,
            IPPROTO_TCP,
        );
        maps.conntrack_v4.insert(key, entry, 0)?;
        // And its forward entry (client -> VIP), without which a SYN-ACK
        // would be taken for a new connection reusing the tuple.
        let forward = CtEntry {
            kind: CtKind::Forward as u8,
            peer_port: 0,
            nat_port: 0,
            nat_addr: [0; 16],
            peer_addr: [0; 16],
            ..entry
        };
        let key = Ct4Key::new(
            client.ip.octets(),
            VIP.octets(),
            client_port,
            80,
            IPPROTO_TCP,
        );
        maps.conntrack_v4.insert(key, forward, 0)?;
        Ok(())
    };
    // Port 9000 is no backend's: the entry is never looked up.
    plant(9000, 21_001)?;
    let answer =
        clients::tcp_hello_from_port(&client.ns, SocketAddrV4::new(backend.ip, 9000), 21_001)?;
    assert_eq!(answer, backend.name);
    // Port 8080 is a backend's: the same entry takes the answers away.
    plant(8080, 21_002)?;
    let direct =
        clients::tcp_hello_from_port(&client.ns, SocketAddrV4::new(backend.ip, 8080), 21_002);
    assert!(direct.is_err(), "{direct:?}");
    Ok(())
}

#[test]
fn v6_a_frontend_the_agent_did_not_admit_is_never_looked_up() -> anyhow::Result<()> {
    let topo = setup6(1, 2)?;
    let (b0, b1) = (&topo.backends[0], &topo.backends[1]);
    let _s0 = servers::tcp_greeter6(&b0.ns, 8080, &b0.name)?;
    let _s1 = servers::tcp_greeter6(&b1.ns, 8080, &b1.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip6(
        "web",
        VIP6,
        80,
        Proto::Tcp,
        &[(b0.ip6, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let pod = SocketAddrV6::new(b1.ip6, 8080, 0, 0);
    let client = &topo.clients[0].ns;
    assert_eq!(clients::tcp_hello(client, pod)?, b1.name);

    // The VIP's entries copied under backend-1's address in sl_svc6.
    let mut maps = lb.maps()?;
    for slot in 0..=1 {
        let value = maps
            .services_v6
            .get(&Svc6Key::new(VIP6.octets(), 80, IPPROTO_TCP, slot), 0)?;
        maps.services_v6.insert(
            Svc6Key::new(b1.ip6.octets(), 8080, IPPROTO_TCP, slot),
            value,
            0,
        )?;
    }
    assert_eq!(clients::tcp_hello(client, pod)?, b1.name);

    let report = lb.set(cluster_ip6(
        "pod-as-frontend",
        b1.ip6,
        8080,
        Proto::Tcp,
        &[(b0.ip6, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(clients::tcp_hello(client, pod)?, b0.name);
    assert_eq!(clients::tcp_hello(client, vip6(VIP6, 80))?, b0.name);
    Ok(())
}

#[test]
fn v6_reverse_nat_is_looked_up_only_for_packets_from_backend_ports() -> anyhow::Result<()> {
    let topo = setup6(1, 1)?;
    let backend = &topo.backends[0];
    let _s8080 = servers::tcp_greeter6(&backend.ns, 8080, &backend.name)?;
    let _s9000 = servers::tcp_greeter6(&backend.ns, 9000, &backend.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip6(
        "web",
        VIP6,
        80,
        Proto::Tcp,
        &[(backend.ip6, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let client = &topo.clients[0];

    // A reply entry and its forward entry, as in the IPv4 test.
    let mut maps = lb.maps()?;
    let mut plant = |from_port: u16, client_port: u16| -> anyhow::Result<()> {
        let reply = CtEntry {
            last_seen_ns: sluice::conntrack::monotonic_ns(),
            kind: CtKind::Reply as u8,
            nat_addr: VIP6.octets(),
            nat_port: 80,
            peer_addr: client.ip6.octets(),
            peer_port: client_port,
            ..CtEntry::default()
        };
        let key = Ct6Key::new(
            backend.ip6.octets(),
            client.ip6.octets(),
            from_port,
            client_port,
            IPPROTO_TCP,
        );
        maps.conntrack_v6.insert(key, reply, 0)?;
        let forward = CtEntry {
            kind: CtKind::Forward as u8,
            nat_addr: [0; 16],
            nat_port: 0,
            peer_addr: [0; 16],
            peer_port: 0,
            ..reply
        };
        let key = Ct6Key::new(
            client.ip6.octets(),
            VIP6.octets(),
            client_port,
            80,
            IPPROTO_TCP,
        );
        maps.conntrack_v6.insert(key, forward, 0)?;
        Ok(())
    };
    plant(9000, 21_011)?;
    let answer = clients::tcp_hello_from_port(
        &client.ns,
        SocketAddrV6::new(backend.ip6, 9000, 0, 0),
        21_011,
    )?;
    assert_eq!(answer, backend.name);
    plant(8080, 21_012)?;
    let direct = clients::tcp_hello_from_port(
        &client.ns,
        SocketAddrV6::new(backend.ip6, 8080, 0, 0),
        21_012,
    );
    assert!(direct.is_err(), "{direct:?}");
    Ok(())
}
