//! SCTP services with crafted packets (this kernel has no SCTP sockets:
//! `sluice_tests::sctp` speaks INIT / INIT-ACK over raw IP sockets and
//! checks every CRC32c it receives, which nothing else here does).
//!
//! Each scenario runs in both families (`v6_*`): a ClusterIP whose port
//! differs from the target port (so the CRC32c must follow both rewrites)
//! spread over two backends; a NodePort with externalTrafficPolicy Cluster
//! from a host outside the node (SNAT to the node, port and address
//! rewritten both ways); the association's life in conntrack (INIT, reply,
//! ABORT) and a zero checksum (CRC offload) left alone; kube-proxy's
//! `cluster-ips-check` (an unserved port refused, an unallocated service
//! IP dropped); and, through the
//! real agent, one Service with a TCP and an SCTP port on the same number,
//! both served.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use anyhow::{ensure, Result};
use sluice::model::{BackendState, FrontendKind, Proto};
use sluice_common::{
    conntrack::{CT_F_RST, CT_F_SEEN_REPLY, CT_F_SYN},
    CtKind, Stat, IPPROTO_SCTP,
};
use sluice_tests::{
    agent::{Agent, ManifestDir},
    clients,
    clients::ExtHeaders,
    lb::{frontend, service, Lb},
    sctp::{
        client_tag, init_exchange, init_exchange_ext, send_raw, Packet, Received, Responder, ABORT,
        INIT,
    },
    servers,
    topology::v6_of,
    Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 132);
const PORT: u16 = 3868;
const TARGET: u16 = 9868;
const NODE_PORT: u16 = 30132;
const WAIT: Duration = Duration::from_secs(3);

/// The address of a family: IPv4 as written, or its IPv6 twin.
fn ip(v6: bool, v4: Ipv4Addr) -> IpAddr {
    if v6 {
        IpAddr::V6(v6_of(v4))
    } else {
        IpAddr::V4(v4)
    }
}

fn active(backends: &[IpAddr], port: u16) -> Vec<(IpAddr, u16, BackendState)> {
    backends
        .iter()
        .map(|a| (*a, port, BackendState::Active))
        .collect()
}

/// Checks the INIT-ACKs a client got: one per source port, from the
/// frontend it addressed, with a valid CRC32c.
fn check_answers(
    answers: &BTreeMap<u16, Received>,
    sports: &[u16],
    from: SocketAddr,
) -> Result<()> {
    ensure!(
        answers.len() == sports.len(),
        "INIT-ACKs for {} of {} INITs (missing: {:?})",
        answers.len(),
        sports.len(),
        sports
            .iter()
            .filter(|p| !answers.contains_key(p))
            .collect::<Vec<_>>()
    );
    for (sport, got) in answers {
        ensure!(got.crc_ok, "INIT-ACK to port {sport}: bad CRC32c {got:?}");
        ensure!(
            got.src == from.ip() && got.packet.sport == from.port(),
            "INIT-ACK to port {sport} came from {}:{}, not from the frontend {from}",
            got.src,
            got.packet.sport
        );
    }
    Ok(())
}

/// The INITs a backend received.
fn inits(r: &Responder) -> Vec<Received> {
    r.seen()
        .into_iter()
        .filter(|g| g.packet.chunk == INIT)
        .collect()
}

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

both_families!(cluster_ip: sctp_inits_spread_over_two_backends_at_the_target_port_with_valid_crcs,
    v6_sctp_inits_spread_over_two_backends_at_the_target_port_with_valid_crcs);

fn cluster_ip(v6: bool) -> Result<()> {
    let topo = Topology::new(1, 2)?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    let backends: Vec<IpAddr> = topo.backends.iter().map(|b| b.addr(v6)).collect();
    let responders = topo
        .backends
        .iter()
        .enumerate()
        .map(|(k, b)| Responder::start(&b.ns, v6, TARGET, (k as u32 + 1) << 24))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let vip = ip(v6, VIP);
    let fe = frontend(
        FrontendKind::ClusterIp,
        vip,
        PORT,
        Proto::Sctp,
        &active(&backends, TARGET),
    );
    let report = lb.set(service("diameter", PORT, Proto::Sctp, vec![fe]));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);

    let client = &topo.clients[0];
    let sports: Vec<u16> = (0..40).map(|i| 40000 + i * 7).collect();
    let answers = init_exchange(&client.ns, SocketAddr::new(vip, PORT), &sports, WAIT)?;
    check_answers(&answers, &sports, SocketAddr::new(vip, PORT))?;

    // Every INIT reached a backend at the target port, from the client,
    // with a valid checksum; the source ports spread over both backends.
    let mut total = 0;
    for (r, addr) in responders.iter().zip(&backends) {
        let got = inits(r);
        for g in &got {
            ensure!(g.crc_ok, "INIT at {addr}: bad CRC32c {g:?}");
            ensure!(g.packet.dport == TARGET, "INIT at {addr}: {g:?}");
            ensure!(g.src == client.addr(v6), "INIT at {addr} from {}", g.src);
            if let Some(dst) = g.dst {
                ensure!(dst == *addr, "INIT at {addr} addressed to {dst}");
            }
        }
        ensure!(
            got.len() >= 8,
            "backend {addr} got {} of 40 INITs: not spread",
            got.len()
        );
        eprintln!("backend {addr}: {} of 40 INITs", got.len());
        total += got.len();
    }
    ensure!(total == sports.len(), "{total} INITs reached the backends");
    // Each answer came from the backend its INIT reached.
    for (sport, got) in &answers {
        let k = (got.packet.init_tag >> 24) as usize - 1;
        ensure!(
            inits(&responders[k])
                .iter()
                .any(|g| g.packet.sport == *sport),
            "the INIT-ACK to {sport} came from a backend that never saw its INIT"
        );
    }
    // An INIT again from a tracked port follows its conntrack entry.
    let again = init_exchange(&client.ns, SocketAddr::new(vip, PORT), &sports[..5], WAIT)?;
    check_answers(&again, &sports[..5], SocketAddr::new(vip, PORT))?;
    ensure!(lb.stat(Stat::NewFlow)? >= 40, "new flows counted");
    ensure!(lb.stat(Stat::ReplyNat)? >= 45, "replies reverse-NATed");
    ensure!(lb.stat(Stat::NatFailed)? == 0 && lb.stat(Stat::TailCallFailed)? == 0);
    Ok(())
}

both_families!(node_port: sctp_node_port_from_outside_is_snated_with_valid_crcs,
    v6_sctp_node_port_from_outside_is_snated_with_valid_crcs);

fn node_port(v6: bool) -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    let b = &topo.backends[0];
    let responder = Responder::start(&b.ns, v6, TARGET, 1 << 24)?;
    let mut lb = Lb::load(&topo)?;
    let node = ip(v6, topo.node_address(0));
    let mut np = frontend(
        FrontendKind::NodePort,
        node,
        NODE_PORT,
        Proto::Sctp,
        &active(&[b.addr(v6)], TARGET),
    );
    np.snat = true;
    let report = lb.set(service("diameter", PORT, Proto::Sctp, vec![np]));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);

    let ext = &topo.externals[0];
    let sports: Vec<u16> = (0..10).map(|i| 50000 + i).collect();
    let at = SocketAddr::new(node, NODE_PORT);
    let answers = init_exchange(&ext.ns, at, &sports, WAIT)?;
    check_answers(&answers, &sports, at)?;
    // The backend saw the node (SNAT), from ports of the SNAT range, with
    // valid checksums after both the source and the destination changed.
    let got = inits(&responder);
    ensure!(
        got.len() == sports.len(),
        "{} INITs at the backend",
        got.len()
    );
    let node_side = ip(v6, Ipv4Addr::new(10, 20, 0, 1));
    for g in &got {
        ensure!(g.crc_ok, "INIT at the backend: bad CRC32c {g:?}");
        ensure!(
            g.src == node_side,
            "policy Cluster: the backend sees the node, not {}",
            g.src
        );
        ensure!(
            g.packet.sport >= 61000 && g.packet.dport == TARGET,
            "SNAT port and target port: {g:?}"
        );
    }
    ensure!(lb.stat(Stat::SnatReply)? >= 10, "replies un-SNATed");
    ensure!(lb.stat(Stat::NatFailed)? == 0 && lb.stat(Stat::TailCallFailed)? == 0);
    Ok(())
}

both_families!(association: sctp_abort_closes_the_flow_and_a_zero_checksum_is_left_for_the_offload,
    v6_sctp_abort_closes_the_flow_and_a_zero_checksum_is_left_for_the_offload);

/// The flags of the forward conntrack entry of the SCTP flow from `sport`.
fn forward_flags(lb: &Lb, v6: bool, sport: u16) -> Result<Option<u8>> {
    let maps = lb.maps()?;
    let fwd = CtKind::Forward as u8;
    let found = if v6 {
        sluice::conntrack::read_all6(&maps)?
            .into_iter()
            .find(|(k, e)| k.sport == sport && k.proto == IPPROTO_SCTP && e.kind == fwd)
            .map(|(_, e)| e.flags)
    } else {
        sluice::conntrack::read_all(&maps)?
            .into_iter()
            .find(|(k, e)| k.sport == sport && k.proto == IPPROTO_SCTP && e.kind == fwd)
            .map(|(_, e)| e.flags)
    };
    Ok(found)
}

fn association(v6: bool) -> Result<()> {
    let topo = Topology::new(1, 1)?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    let b = &topo.backends[0];
    let responder = Responder::start(&b.ns, v6, TARGET, 1 << 24)?;
    let mut lb = Lb::load(&topo)?;
    let vip = ip(v6, VIP);
    let fe = frontend(
        FrontendKind::ClusterIp,
        vip,
        PORT,
        Proto::Sctp,
        &active(&[b.addr(v6)], TARGET),
    );
    lb.set(service("diameter", PORT, Proto::Sctp, vec![fe]));
    let client = &topo.clients[0];
    let at = SocketAddr::new(vip, PORT);

    // INIT and INIT-ACK: an open association, answered.
    let answers = init_exchange(&client.ns, at, &[41000], WAIT)?;
    check_answers(&answers, &[41000], at)?;
    let flags = forward_flags(&lb, v6, 41000)?.unwrap_or_default();
    ensure!(
        flags & (CT_F_SYN | CT_F_SEEN_REPLY) == CT_F_SYN | CT_F_SEEN_REPLY && flags & CT_F_RST == 0,
        "after INIT/INIT-ACK: flags {flags:#x}"
    );
    // The client aborts: the flow is closed (no longer live for a drain).
    let abort = Packet {
        sport: 41000,
        dport: PORT,
        vtag: answers[&41000].packet.init_tag,
        chunk: ABORT,
        init_tag: 0,
    };
    send_raw(&client.ns, vip, &[abort.encode()])?;
    // An INIT whose checksum field is 0, as Linux leaves it for CRC
    // offload: rewritten, and its checksum left for the offload to fill.
    let mut offloaded = Packet {
        sport: 41001,
        dport: PORT,
        vtag: 0,
        chunk: INIT,
        init_tag: client_tag(41001),
    }
    .encode();
    offloaded[8..12].fill(0);
    send_raw(&client.ns, vip, &[offloaded])?;
    std::thread::sleep(Duration::from_millis(300));

    let flags = forward_flags(&lb, v6, 41000)?.unwrap_or_default();
    ensure!(flags & CT_F_RST != 0, "after ABORT: flags {flags:#x}");
    let seen = responder.seen();
    let aborted = seen
        .iter()
        .find(|g| g.packet.chunk == ABORT)
        .ok_or_else(|| anyhow::anyhow!("the ABORT did not reach the backend: {seen:?}"))?;
    ensure!(
        aborted.crc_ok && aborted.packet.dport == TARGET,
        "ABORT at the backend: {aborted:?}"
    );
    let zero = seen
        .iter()
        .find(|g| g.packet.sport == 41001)
        .ok_or_else(|| anyhow::anyhow!("the offloaded INIT did not reach the backend"))?;
    ensure!(
        zero.packet.dport == TARGET && zero.checksum == 0,
        "an offloaded INIT keeps its zero checksum: {zero:?}"
    );
    ensure!(lb.stat(Stat::NatFailed)? == 0 && lb.stat(Stat::TailCallFailed)? == 0);
    Ok(())
}

both_families!(unserved: sctp_to_an_unserved_port_is_refused_and_to_an_unallocated_ip_dropped,
    v6_sctp_to_an_unserved_port_is_refused_and_to_an_unallocated_ip_dropped);

/// kube-proxy's `cluster-ips-check` for SCTP: a new flow to a cluster IP on
/// a port no service serves gets ICMP port unreachable, one to another
/// address of the service CIDRs is dropped; the served port still works.
fn unserved(v6: bool) -> Result<()> {
    let topo = Topology::new(1, 1)?;
    if v6 {
        topo.wait_ipv6_ready()?;
    }
    let b = &topo.backends[0];
    let responder = Responder::start(&b.ns, v6, TARGET, 1 << 24)?;
    let mut lb = Lb::load(&topo)?;
    let vip = ip(v6, VIP);
    let fe = frontend(
        FrontendKind::ClusterIp,
        vip,
        PORT,
        Proto::Sctp,
        &active(&[b.addr(v6)], TARGET),
    );
    lb.desired.service_cidrs.insert((
        ip(v6, Ipv4Addr::new(10, 96, 0, 0)),
        if v6 { 64 } else { 24 },
    ));
    lb.desired.cluster_ips.insert(vip);
    let report = lb.set(service("diameter", PORT, Proto::Sctp, vec![fe]));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);
    let client = &topo.clients[0];

    let unserved = init_exchange(
        &client.ns,
        SocketAddr::new(vip, PORT + 1),
        &[42000],
        WAIT / 3,
    )?;
    ensure!(
        unserved.is_empty(),
        "an unserved port answered: {unserved:?}"
    );
    ensure!(lb.stat(Stat::UnservedPort)? >= 1, "refused as unserved");
    let unallocated = ip(v6, Ipv4Addr::new(10, 96, 0, 133));
    let dropped = init_exchange(
        &client.ns,
        SocketAddr::new(unallocated, PORT),
        &[42001],
        WAIT / 3,
    )?;
    ensure!(
        dropped.is_empty(),
        "an unallocated address answered: {dropped:?}"
    );
    ensure!(lb.stat(Stat::UnallocatedIp)? >= 1, "dropped as unallocated");
    ensure!(inits(&responder).is_empty(), "neither reached the backend");
    let served = init_exchange(&client.ns, SocketAddr::new(vip, PORT), &[42002], WAIT)?;
    check_answers(&served, &[42002], SocketAddr::new(vip, PORT))?;
    Ok(())
}

/// A Service with a TCP and an SCTP port of the same number, and its
/// EndpointSlice, as the API would hold them.
fn tcp_and_sctp_manifests(dir: &ManifestDir, backends: &[Ipv4Addr]) -> Result<()> {
    dir.write(
        "svc.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: mixed\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: {VIP}\n  clusterIPs: [{VIP}]\n  ports:\n  - name: http\n    protocol: TCP\n    port: {PORT}\n    targetPort: 8080\n  - name: sig\n    protocol: SCTP\n    port: {PORT}\n    targetPort: {TARGET}\n"
        ),
    )?;
    let mut slice = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: mixed-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: mixed\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\n- name: sig\n  protocol: SCTP\n  port: {TARGET}\nendpoints:\n"
    );
    for b in backends {
        slice.push_str(&format!(
            "- addresses: [\"{b}\"]\n  nodeName: node-1\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n"
        ));
    }
    dir.write("slice.yaml", &slice)
}

#[test]
fn a_service_with_tcp_and_sctp_ports_serves_both_through_the_agent() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _tcp = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let responders = topo
        .backends
        .iter()
        .map(|b| Responder::start(&b.ns, false, TARGET, 1 << 24))
        .collect::<Result<Vec<_>>>()?;
    let dir = ManifestDir::create()?;
    let ips: Vec<Ipv4Addr> = topo.backends.iter().map(|b| b.ip).collect();
    tcp_and_sctp_manifests(&dir, &ips)?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let vip = SocketAddr::new(IpAddr::V4(VIP), PORT);
    let client = &topo.clients[0];
    // TCP on the port still works...
    let hello = clients::tcp_hello(&client.ns, vip)?;
    ensure!(hello.starts_with("backend-"), "TCP answer {hello:?}");
    // ... and SCTP on the same number reaches the SCTP target port.
    let sports: Vec<u16> = (0..20).map(|i| 45000 + i).collect();
    let answers = init_exchange(&client.ns, vip, &sports, WAIT)?;
    check_answers(&answers, &sports, vip)?;
    let reached: usize = responders.iter().map(|r| inits(r).len()).sum();
    ensure!(
        reached == sports.len(),
        "{reached} INITs reached the backends"
    );
    let problems = agent.metrics()?;
    ensure!(
        !problems
            .lines()
            .any(|l| l.contains("unsupported_protocol") && !l.ends_with(" 0")),
        "SCTP is no longer reported"
    );
    let lb = agent.cli(&["lb", "list"])?;
    ensure!(
        lb.contains("SCTP"),
        "lb list shows the SCTP frontend:\n{lb}"
    );
    Ok(())
}

/// SCTP behind a hop-by-hop and a destination options header, both ways:
/// the datapath walks them to the SCTP header, balances the INITs over
/// both backends at the target port and settles the CRC32c of the
/// rewritten ports there (the receivers check every CRC).
#[test]
fn v6_sctp_behind_extension_headers_is_balanced_with_valid_crcs() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    topo.wait_ipv6_ready()?;
    let both = Some(ExtHeaders::BOTH);
    let backends: Vec<IpAddr> = topo.backends.iter().map(|b| b.addr(true)).collect();
    let responders = topo
        .backends
        .iter()
        .enumerate()
        .map(|(k, b)| Responder::start_ext(&b.ns, true, TARGET, (k as u32 + 1) << 24, both))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let vip = ip(true, VIP);
    let fe = frontend(
        FrontendKind::ClusterIp,
        vip,
        PORT,
        Proto::Sctp,
        &active(&backends, TARGET),
    );
    let report = lb.set(service("diameter", PORT, Proto::Sctp, vec![fe]));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);
    let sports: Vec<u16> = (0..20).map(|i| 41000 + i * 7).collect();
    let answers = init_exchange_ext(
        &topo.clients[0].ns,
        SocketAddr::new(vip, PORT),
        &sports,
        WAIT,
        both,
    )?;
    check_answers(&answers, &sports, SocketAddr::new(vip, PORT))?;
    for (r, addr) in responders.iter().zip(&backends) {
        let got = inits(r);
        ensure!(
            got.iter().all(|g| g.crc_ok && g.packet.dport == TARGET),
            "{addr}: {got:?}"
        );
        ensure!(
            got.len() >= 2,
            "backend {addr} got {} of 20 INITs",
            got.len()
        );
    }
    ensure!(lb.stat(Stat::NewFlow)? == 20);
    ensure!(
        lb.stat(Stat::Ipv6ExtWalked)? >= 40,
        "INITs and INIT-ACKs walked"
    );
    ensure!(lb.stat(Stat::Ipv6ExtHeader)? == 0 && lb.stat(Stat::NatFailed)? == 0);
    Ok(())
}
