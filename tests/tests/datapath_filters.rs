//! The programs' filters (`sluice_common::filter`) on real traffic: a
//! packet whose destination no frontend has leaves `sl_ingress` before the
//! service lookup, and one from a port no backend listens on leaves
//! `sl_egress` before the conntrack lookup. Shown with map entries written
//! behind the agent's back, which the programs would act on if they
//! looked them up: they do not, until the agent admits them. Each test
//! runs over IPv4 (`sl_svc4`, `sl_ct4`) and IPv6 (`sl_svc6`, `sl_ct6`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use sluice::{
    datapath::Maps,
    model::{BackendState, Proto},
};
use sluice_common::{Ct4Key, Ct6Key, CtEntry, CtKind, Svc4Key, Svc6Key, IPPROTO_TCP};
use sluice_tests::{
    clients,
    lb::{cluster_ips, Lb},
    servers::{self, Server},
    Pod, Topology,
};

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);

fn vip(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(VIP6)
    } else {
        IpAddr::V4(VIP4)
    }
}

fn setup(v6: bool, backends: usize) -> anyhow::Result<Topology> {
    let topo = Topology::new(1, backends)?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    Ok(topo)
}

fn greeter(pod: &Pod, port: u16, v6: bool) -> anyhow::Result<Server> {
    if v6 {
        servers::tcp_greeter6(&pod.ns, port, &pod.name)
    } else {
        servers::tcp_greeter(&pod.ns, port, &pod.name)
    }
}

/// Programs `name`: frontend `fe:port` to `backend:8080`.
fn program(lb: &mut Lb, name: &str, fe: IpAddr, port: u16, backend: IpAddr) {
    let report = lb.set(cluster_ips(
        name,
        &[fe],
        port,
        Proto::Tcp,
        &[(backend, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

/// Copies the master entry and slot 1 of frontend `from:80` to `to:8080`
/// in the service map of their family, behind the agent's back.
fn copy_frontend(maps: &mut Maps, from: IpAddr, to: IpAddr) -> anyhow::Result<()> {
    for slot in 0..=1 {
        match (from, to) {
            (IpAddr::V4(from), IpAddr::V4(to)) => {
                let value = maps
                    .services_v4
                    .get(&Svc4Key::new(from.octets(), 80, IPPROTO_TCP, slot), 0)?;
                let key = Svc4Key::new(to.octets(), 8080, IPPROTO_TCP, slot);
                maps.services_v4.insert(key, value, 0)?;
            }
            (IpAddr::V6(from), IpAddr::V6(to)) => {
                let value = maps
                    .services_v6
                    .get(&Svc6Key::new(from.octets(), 80, IPPROTO_TCP, slot), 0)?;
                let key = Svc6Key::new(to.octets(), 8080, IPPROTO_TCP, slot);
                maps.services_v6.insert(key, value, 0)?;
            }
            _ => anyhow::bail!("{from} and {to} are of two families"),
        }
    }
    Ok(())
}

/// The 16-byte form of an address, as conntrack values hold it.
fn bytes16(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => {
            let mut out = [0; 16];
            out[..4].copy_from_slice(&a.octets());
            out
        }
        IpAddr::V6(a) => a.octets(),
    }
}

/// Puts conntrack entries `key -> entry` in the map of `key`'s family:
/// `(src, dst, sport, dport)`.
fn put_ct(
    maps: &mut Maps,
    (src, dst, sport, dport): (IpAddr, IpAddr, u16, u16),
    entry: CtEntry,
) -> anyhow::Result<()> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let key = Ct4Key::new(s.octets(), d.octets(), sport, dport, IPPROTO_TCP);
            maps.conntrack_v4.insert(key, entry, 0)?;
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let key = Ct6Key::new(s.octets(), d.octets(), sport, dport, IPPROTO_TCP);
            maps.conntrack_v6.insert(key, entry, 0)?;
        }
        _ => anyhow::bail!("{src} and {dst} are of two families"),
    }
    Ok(())
}

fn a_frontend_the_agent_did_not_admit_is_never_looked_up(v6: bool) -> anyhow::Result<()> {
    let topo = setup(v6, 2)?;
    let (b0, b1) = (&topo.backends[0], &topo.backends[1]);
    let _servers = [greeter(b0, 8080, v6)?, greeter(b1, 8080, v6)?];
    let mut lb = Lb::load(&topo)?;
    program(&mut lb, "web", vip(v6), 80, b0.addr(v6));
    let pod = SocketAddr::new(b1.addr(v6), 8080);
    let client = &topo.clients[0].ns;
    assert_eq!(clients::tcp_hello(client, pod)?, b1.name);

    // The VIP's entries copied under backend-1's address: a frontend in
    // the service map that would send backend-1:8080 to backend-0.
    copy_frontend(&mut lb.maps()?, vip(v6), b1.addr(v6))?;
    // The filter has no bit for backend-1's address: the entry is not
    // looked up and the pod is reached directly.
    assert_eq!(clients::tcp_hello(client, pod)?, b1.name);

    // Once the agent programs a frontend there, its filter admits it first.
    program(&mut lb, "pod-as-frontend", b1.addr(v6), 8080, b0.addr(v6));
    assert_eq!(clients::tcp_hello(client, pod)?, b0.name);
    assert_eq!(
        clients::tcp_hello(client, SocketAddr::new(vip(v6), 80))?,
        b0.name
    );
    Ok(())
}

fn reverse_nat_is_looked_up_only_for_packets_from_backend_ports(v6: bool) -> anyhow::Result<()> {
    let topo = setup(v6, 1)?;
    let backend = &topo.backends[0];
    let _servers = [greeter(backend, 8080, v6)?, greeter(backend, 9000, v6)?];
    let mut lb = Lb::load(&topo)?;
    program(&mut lb, "web", vip(v6), 80, backend.addr(v6));
    let client = &topo.clients[0];
    let (server, peer) = (backend.addr(v6), client.addr(v6));

    // A reply entry for the backend's answers to a client port, as if
    // that connection had been DNATed from the VIP (with its forward
    // entry, without which a SYN-ACK would be taken for a new connection
    // reusing the tuple): `sl_egress` would give those answers the VIP as
    // source, and the client's socket, which connected to the pod
    // directly, would never see them.
    let mut maps = lb.maps()?;
    let mut plant = |from_port: u16, client_port: u16| -> anyhow::Result<()> {
        let reply = CtEntry {
            last_seen_ns: sluice::conntrack::monotonic_ns(),
            kind: CtKind::Reply as u8,
            nat_addr: bytes16(vip(v6)),
            nat_port: 80,
            peer_addr: bytes16(peer),
            peer_port: client_port,
            ..CtEntry::default()
        };
        put_ct(&mut maps, (server, peer, from_port, client_port), reply)?;
        let forward = CtEntry {
            kind: CtKind::Forward as u8,
            nat_addr: [0; 16],
            nat_port: 0,
            peer_addr: [0; 16],
            peer_port: 0,
            ..reply
        };
        put_ct(&mut maps, (peer, vip(v6), client_port, 80), forward)
    };
    let base = if v6 { 21_010 } else { 21_000 };
    // Port 9000 is no backend's: the entry is never looked up.
    plant(9000, base + 1)?;
    let answer = clients::tcp_hello_from_port(&client.ns, SocketAddr::new(server, 9000), base + 1)?;
    assert_eq!(answer, backend.name);
    // Port 8080 is a backend's: the same entry takes the answers away.
    plant(8080, base + 2)?;
    let direct = clients::tcp_hello_from_port(&client.ns, SocketAddr::new(server, 8080), base + 2);
    assert!(direct.is_err(), "{direct:?}");
    Ok(())
}

#[test]
fn v4_a_frontend_the_agent_did_not_admit_is_never_looked_up() -> anyhow::Result<()> {
    a_frontend_the_agent_did_not_admit_is_never_looked_up(false)
}

#[test]
fn v6_a_frontend_the_agent_did_not_admit_is_never_looked_up() -> anyhow::Result<()> {
    a_frontend_the_agent_did_not_admit_is_never_looked_up(true)
}

#[test]
fn v4_reverse_nat_is_looked_up_only_for_packets_from_backend_ports() -> anyhow::Result<()> {
    reverse_nat_is_looked_up_only_for_packets_from_backend_ports(false)
}

#[test]
fn v6_reverse_nat_is_looked_up_only_for_packets_from_backend_ports() -> anyhow::Result<()> {
    reverse_nat_is_looked_up_only_for_packets_from_backend_ports(true)
}
