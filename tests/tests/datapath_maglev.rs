//! Maglev frontends on real connections: every new flow lands on the
//! backend the frontend's table names for its 5-tuple (so a fallback to
//! the slots would fail the test), and when one of five backends goes,
//! the same 5-tuples keep their backends but for Maglev's small bound,
//! measured side by side with the default algorithm, which moves most.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use sluice::model::{BackendState, FrontendKind, Proto};
use sluice_common::{
    hash::{flow_hash_v4, flow_hash_v6},
    maglev::{index, MAGLEV_SEED},
    Stat, Svc4Key, Svc6Key, IPPROTO_TCP,
};
use sluice_tests::{
    clients,
    lb::{frontend, service, Lb},
    servers, Topology,
};

const MAGLEV_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 80);
const RANDOM_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 81);
const FLOWS: u16 = 150;

/// The two services over `backends` (address, state): one Maglev, one
/// with the default algorithm.
fn services(lb: &mut Lb, backends: &[(IpAddr, u16, BackendState)]) {
    let mut maglev = frontend(
        FrontendKind::ClusterIp,
        MAGLEV_VIP.into(),
        80,
        Proto::Tcp,
        backends,
    );
    maglev.maglev = true;
    lb.set(service("maglev", 80, Proto::Tcp, vec![maglev]));
    let random = frontend(
        FrontendKind::ClusterIp,
        RANDOM_VIP.into(),
        80,
        Proto::Tcp,
        backends,
    );
    lb.set(service("random", 80, Proto::Tcp, vec![random]));
}

/// The backend each source port's connection to `vip` lands on.
fn round(topo: &Topology, vip: Ipv4Addr, first_port: u16) -> Result<HashMap<u16, String>> {
    let client = &topo.clients[0].ns;
    (first_port..first_port + FLOWS)
        .map(|port| {
            let name = clients::tcp_hello_from_port(client, SocketAddr::new(vip.into(), 80), port)?;
            Ok((port, name))
        })
        .collect()
}

/// Of the flows not on `gone` before, how many changed backend.
fn moved(
    before: &HashMap<u16, String>,
    after: &HashMap<u16, String>,
    gone: &str,
) -> (usize, usize) {
    let kept: Vec<_> = before.iter().filter(|(_, b)| *b != gone).collect();
    let moved = kept
        .iter()
        .filter(|(p, b)| after.get(*p) != Some(*b))
        .count();
    (kept.len(), moved)
}

#[test]
fn maglev_flows_follow_the_table_and_move_little_when_a_backend_goes() -> Result<()> {
    let topo = Topology::new(1, 5)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let client = &topo.clients[0];
    // The client closes first, so TIME_WAIT is on its side: allow reuse of
    // the same 5-tuples in the second round.
    client.ns.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
    let all: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (IpAddr::V4(b.ip), 8080, BackendState::Active))
        .collect();
    services(&mut lb, &all);

    let maglev_before = round(&topo, MAGLEV_VIP, 41_000)?;
    let random_before = round(&topo, RANDOM_VIP, 42_000)?;

    // Every Maglev flow went where the table says for its 5-tuple.
    let maps = lb.maps()?;
    let table = maps
        .maglev_v4
        .get(&Svc4Key::new(MAGLEV_VIP.octets(), 80, IPPROTO_TCP, 0), 0)
        .context("the Maglev frontend has a table")?;
    // Backend ids are per service port: name the ids the table holds.
    let name_of = |id: u32| -> Option<String> {
        let b = maps.backends.get(&id, 0).ok()?;
        let ip = IpAddr::from(b.addr_v4());
        Some(
            topo.backends
                .iter()
                .find(|p| IpAddr::V4(p.ip) == ip)?
                .name
                .clone(),
        )
    };
    for (port, got) in &maglev_before {
        let h = flow_hash_v4(
            client.ip.octets(),
            MAGLEV_VIP.octets(),
            *port,
            80,
            IPPROTO_TCP,
            MAGLEV_SEED,
        );
        let want = name_of(table.backends[index(h)]);
        ensure!(
            want.as_ref() == Some(got),
            "port {port}: table says {want:?}, served by {got}"
        );
    }
    ensure!(lb.stat(Stat::MaglevFallback)? == 0);

    // backend-2 goes from both services.
    let gone = "backend-2";
    let fewer: Vec<_> = topo
        .backends
        .iter()
        .filter(|b| b.name != gone)
        .map(|b| (IpAddr::V4(b.ip), 8080, BackendState::Active))
        .collect();
    services(&mut lb, &fewer);
    std::thread::sleep(Duration::from_millis(1100)); // tw_reuse needs a newer timestamp second
    let maglev_after = round(&topo, MAGLEV_VIP, 41_000)?;
    let random_after = round(&topo, RANDOM_VIP, 42_000)?;
    ensure!(!maglev_after.values().any(|b| b == gone));
    ensure!(!random_after.values().any(|b| b == gone));

    let (m_kept, m_moved) = moved(&maglev_before, &maglev_after, gone);
    let (r_kept, r_moved) = moved(&random_before, &random_after, gone);
    eprintln!(
        "flows of surviving backends that moved: maglev {m_moved}/{m_kept}, default {r_moved}/{r_kept}"
    );
    ensure!(m_kept > 80 && r_kept > 80, "{m_kept} {r_kept}");
    // Maglev moves a few percent of the table beyond the gone backend's
    // share; the default (hash modulo the slot count) moves most flows.
    ensure!(
        m_moved * 100 <= m_kept * 8,
        "maglev moved {m_moved} of {m_kept}"
    );
    ensure!(
        r_moved * 100 >= r_kept * 40,
        "default moved only {r_moved} of {r_kept}: the comparison says nothing"
    );
    ensure!(lb.stat(Stat::MaglevFallback)? == 0);
    Ok(())
}

#[test]
fn maglev_ipv6_flows_follow_the_table() -> Result<()> {
    let topo = Topology::new(1, 3)?;
    topo.wait_ipv6_ready()?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter6(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let vip = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x80);
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (IpAddr::V6(b.ip6), 8080, BackendState::Active))
        .collect();
    let mut fe = frontend(
        FrontendKind::ClusterIp,
        vip.into(),
        80,
        Proto::Tcp,
        &backends,
    );
    fe.maglev = true;
    lb.set(service("maglev6", 80, Proto::Tcp, vec![fe]));
    let table = lb
        .maps()?
        .maglev_v6
        .get(&Svc6Key::new(vip.octets(), 80, IPPROTO_TCP, 0), 0)
        .context("the IPv6 Maglev frontend has a table")?;
    let names: HashMap<u32, String> = topo
        .backends
        .iter()
        .filter_map(|b| Some((lb.backend_id_of(IpAddr::V6(b.ip6), 8080)?, b.name.clone())))
        .collect();
    let client = &topo.clients[0];
    for port in 43_000..43_040u16 {
        let got = clients::tcp_hello_from_port(&client.ns, SocketAddr::new(vip.into(), 80), port)?;
        let h = flow_hash_v6(
            &client.ip6.octets(),
            &vip.octets(),
            port,
            80,
            IPPROTO_TCP,
            MAGLEV_SEED,
        );
        let want = names.get(&table.backends[index(h)]);
        ensure!(
            want == Some(&got),
            "port {port}: table says {want:?}, served by {got}"
        );
    }
    ensure!(lb.stat(Stat::MaglevFallback)? == 0);
    Ok(())
}
