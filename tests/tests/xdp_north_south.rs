//! `sl_xdp` on real packets: an outside host reaches a NodePort, a
//! load-balancer IP and an external IP of node 1 whose backend runs on
//! node 2. XDP runs natively on node 1's devices facing the outside hosts
//! (`e0`, `e1`) and node 2 (`u0`); TC runs on every device as always.
//!
//! Frames that XDP sends out of a veth (`XDP_TX`, or redirected into
//! another device) are dropped silently by the receiving peer unless it
//! runs XDP or has GRO on: the outside hosts' `eth0` and node 2's `u0`
//! get GRO on (`receive_xdp_frames`). XDP sees no checksum state, so
//! every sender has TX checksum offload off (`strict_checksums`), which
//! also makes every receiver verify the incrementally updated checksums.
//!
//! Whether XDP or TC decided is read from the counters: `xdp_redirect`
//! (frames XDP sent on), `xdp_pass` (service frames XDP handed to TC),
//! `xdp_drop`.

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use sluice::{
    datapath::{detach_xdp, XdpMode},
    model::{BackendState, FrontendKind, Proto, WhenEmpty},
};
use sluice_common::{
    config::{CFG_F_EVENTS_DROPS, CFG_F_EVENTS_MASK},
    Stat,
};
use sluice_tests::{
    clients::{self, Stream},
    lb::{frontend, service, Lb},
    monitor::Monitor,
    servers::{self, Server},
    topology::{receive_xdp_frames, v6_of},
    Netns, Topology,
};

const NODE_PORT: u16 = 30080;
const EVENT_WAIT: Duration = Duration::from_secs(5);
const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
/// Node 1's address on the underlay: the SNAT source towards node 2.
const NODE1_UNDERLAY: Ipv4Addr = Ipv4Addr::new(192, 168, 200, 1);
/// Node 1's devices facing the outside hosts and node 2.
const XDP_DEVICES: [&str; 3] = ["e0", "e1", "u0"];

struct Cluster {
    lb: Lb,
    _server: Server,
    node2: Topology,
    node1: Topology,
}

impl Cluster {
    /// Node 1 (sluice, `local_backends` backend pods, two outside hosts)
    /// joined to node 2 (one backend pod, routing only). XDP not attached.
    fn new(local_backends: usize) -> Result<Self> {
        let mut node1 = Topology::with_index(1, 0, local_backends)?;
        node1.add_external()?;
        node1.add_external()?;
        let node2 = Topology::with_index(2, 0, 1)?;
        Topology::join(&node1, &node2)?;
        node1.strict_checksums()?;
        node2.strict_checksums()?;
        for ext in &node1.externals {
            ext.receive_xdp_frames()?;
        }
        receive_xdp_frames(&node2.node, "u0")?;
        let remote = &node2.backends[0];
        let server = servers::tcp_whoami(&remote.ns, 8080, &remote.name)?;
        let lb = Lb::load(&node1)?;
        Ok(Self {
            lb,
            _server: server,
            node2,
            node1,
        })
    }

    fn remote(&self) -> IpAddr {
        IpAddr::V4(self.node2.backends[0].ip)
    }

    fn stat(&self, stat: Stat) -> Result<u64> {
        self.lb.stat(stat)
    }
}

/// Attaches `sl_xdp` natively to node 1's `XDP_DEVICES`.
fn enable_xdp(lb: &mut Lb, node1: &Topology) -> Result<()> {
    let datapath = &mut lb.datapath;
    node1.node.run(|| -> Result<()> {
        for dev in XDP_DEVICES {
            datapath.attach_xdp(dev, XdpMode::Native)?;
        }
        Ok(())
    })?
}

/// Detaches `sl_xdp` (its pinned links) from node 1's devices.
fn disable_xdp(lb: &Lb) -> Result<()> {
    let root = lb.datapath.root().to_owned();
    for dev in XDP_DEVICES {
        detach_xdp(&root, dev)?;
    }
    Ok(())
}

/// A frontend of `kind` at `addr:port` (policy Cluster: SNAT) with
/// `backends`.
fn cluster_policy(
    kind: FrontendKind,
    addr: Ipv4Addr,
    port: u16,
    backends: &[IpAddr],
) -> sluice::model::Frontend {
    let mut fe = frontend(
        kind,
        IpAddr::V4(addr),
        port,
        Proto::Tcp,
        &backends
            .iter()
            .map(|ip| (*ip, 8080, BackendState::Active))
            .collect::<Vec<_>>(),
    );
    fe.snat = true;
    fe
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

#[test]
fn node_port_lb_ip_and_external_ip_are_balanced_in_xdp_with_policy_cluster() -> Result<()> {
    let mut c = Cluster::new(0)?;
    let remote = c.remote();
    let node_ip = c.node1.node_address(0);
    let fes = vec![
        cluster_policy(FrontendKind::NodePort, node_ip, NODE_PORT, &[remote]),
        cluster_policy(FrontendKind::LoadBalancer, LB_IP, 80, &[remote]),
        cluster_policy(FrontendKind::ExternalIp, EXTERNAL_IP, 80, &[remote]),
    ];
    let report = c.lb.set(service("web", 80, Proto::Tcp, fes));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    enable_xdp(&mut c.lb, &c.node1)?;
    let ext = &c.node1.externals[0];
    // The first connection may meet unresolved neighbours (XDP then
    // hands it to TC, which resolves them).
    whoami(&ext.ns, SocketAddr::new(node_ip.into(), NODE_PORT))?;

    for target in [
        SocketAddr::new(node_ip.into(), NODE_PORT),
        SocketAddr::new(LB_IP.into(), 80),
        SocketAddr::new(EXTERNAL_IP.into(), 80),
    ] {
        let (redirected, passed, new) = (
            c.stat(Stat::XdpRedirect)?,
            c.stat(Stat::XdpPass)?,
            c.stat(Stat::NewFlow)?,
        );
        let (name, peer) = whoami(&ext.ns, target)?;
        assert_eq!(name, "node2-backend-0", "{target}");
        assert_eq!(peer, IpAddr::V4(NODE1_UNDERLAY), "{target}: SNAT to node 1");
        // SYN, ACK, FIN and ACK each way at least: all sent on by XDP.
        assert!(
            c.stat(Stat::XdpRedirect)? >= redirected + 6,
            "{target}: both directions forwarded in XDP"
        );
        assert_eq!(
            c.stat(Stat::XdpPass)?,
            passed,
            "{target}: nothing left to TC"
        );
        assert_eq!(c.stat(Stat::NewFlow)?, new + 1, "{target}: one new flow");
    }
    assert_eq!(c.stat(Stat::XdpAborted)?, 0);
    assert_eq!(c.stat(Stat::NatFailed)?, 0);
    Ok(())
}

#[test]
fn ipv6_node_port_and_lb_ip_are_balanced_in_xdp_both_ways() -> Result<()> {
    let mut c = Cluster::new(0)?;
    let remote = &c.node2.backends[0];
    let _server6 = servers::tcp_whoami6(&remote.ns, 8080, &remote.name)?;
    let remote6 = IpAddr::V6(remote.ip6);
    let node6 = c.node1.node_address6(0);
    let lb6 = v6_of(LB_IP);
    let backends = [(remote6, 8080, BackendState::Active)];
    let mut np = frontend(
        FrontendKind::NodePort,
        node6.into(),
        NODE_PORT,
        Proto::Tcp,
        &backends,
    );
    np.snat = true;
    let mut lb = frontend(
        FrontendKind::LoadBalancer,
        lb6.into(),
        80,
        Proto::Tcp,
        &backends,
    );
    lb.snat = true;
    let report = c.lb.set(service("web6", 80, Proto::Tcp, vec![np, lb]));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    enable_xdp(&mut c.lb, &c.node1)?;
    let ext = &c.node1.externals[0];
    // Neighbours first (XDP hands frames to TC until they are known).
    whoami(&ext.ns, SocketAddr::new(node6.into(), NODE_PORT))?;
    for target in [
        SocketAddr::new(node6.into(), NODE_PORT),
        SocketAddr::new(lb6.into(), 80),
    ] {
        let (redirected, passed, new) = (
            c.stat(Stat::XdpRedirect)?,
            c.stat(Stat::XdpPass)?,
            c.stat(Stat::NewFlow)?,
        );
        let (name, peer) = whoami(&ext.ns, target)?;
        assert_eq!(name, "node2-backend-0", "{target}");
        assert_eq!(
            peer,
            IpAddr::V6(v6_of(NODE1_UNDERLAY)),
            "{target}: SNAT to node 1"
        );
        assert!(
            c.stat(Stat::XdpRedirect)? >= redirected + 6,
            "{target}: both directions forwarded in XDP"
        );
        assert_eq!(
            c.stat(Stat::XdpPass)?,
            passed,
            "{target}: nothing left to TC"
        );
        assert_eq!(c.stat(Stat::NewFlow)?, new + 1, "{target}: one new flow");
    }
    assert_eq!(c.stat(Stat::XdpAborted)?, 0);
    Ok(())
}

#[test]
fn udp_to_a_node_port_is_balanced_in_xdp_both_ways_with_valid_checksums() -> Result<()> {
    let mut c = Cluster::new(0)?;
    let remote = &c.node2.backends[0];
    let _udp = servers::udp_greeter(&remote.ns, 8080, &remote.name)?;
    let node_ip = c.node1.node_address(0);
    let mut np = frontend(
        FrontendKind::NodePort,
        IpAddr::V4(node_ip),
        NODE_PORT,
        Proto::Udp,
        &[(c.remote(), 8080, BackendState::Active)],
    );
    np.snat = true;
    c.lb.set(service("dns", 53, Proto::Udp, vec![np]));
    enable_xdp(&mut c.lb, &c.node1)?;
    let ext = &c.node1.externals[0];
    let target = SocketAddr::new(node_ip.into(), NODE_PORT);
    // Neighbours first (XDP hands frames to TC until they are known).
    clients::udp_hello(&ext.ns, target)?;
    let (redirected, passed) = (c.stat(Stat::XdpRedirect)?, c.stat(Stat::XdpPass)?);
    for _ in 0..3 {
        // Each from a fresh socket: a new flow each time. Every receiver
        // verifies the UDP checksum XDP updated (strict checksums).
        let (greeting, from) = clients::udp_hello(&ext.ns, target)?;
        assert!(greeting.starts_with("node2-backend-0"), "{greeting}");
        assert_eq!(from, target, "the reply carries the frontend");
    }
    assert!(
        c.stat(Stat::XdpRedirect)? >= redirected + 6,
        "requests and replies forwarded in XDP"
    );
    assert_eq!(c.stat(Stat::XdpPass)?, passed, "nothing left to TC");
    Ok(())
}

#[test]
fn policy_local_passes_to_tc_and_an_empty_local_frontend_drops_in_xdp() -> Result<()> {
    let mut c = Cluster::new(1)?;
    let local = &c.node1.backends[0];
    let _local_server = servers::tcp_whoami(&local.ns, 8080, &local.name)?;
    let local_ip = IpAddr::V4(local.ip);
    let node_ip = c.node1.node_address(0);
    let node_port = SocketAddr::new(node_ip.into(), NODE_PORT);
    let mut np = frontend(
        FrontendKind::NodePort,
        IpAddr::V4(node_ip),
        NODE_PORT,
        Proto::Tcp,
        &[(local_ip, 8080, BackendState::Active)],
    );
    c.lb.set(service("web", 80, Proto::Tcp, vec![np.clone()]));
    enable_xdp(&mut c.lb, &c.node1)?;
    let ext = &c.node1.externals[0];
    let passed = c.stat(Stat::XdpPass)?;
    let (name, peer) = whoami(&ext.ns, node_port)?;
    assert_eq!(name, "backend-0");
    assert_eq!(peer, IpAddr::V4(ext.ip), "policy Local keeps the client");
    assert!(
        c.stat(Stat::XdpPass)? > passed,
        "a local backend is TC's (XDP passes undecided)"
    );

    // Policy Local without local endpoints: dropped at the driver.
    np.backends.clear();
    np.when_empty = WhenEmpty::Drop;
    c.lb.set(service("web", 80, Proto::Tcp, vec![np]));
    let (xdp_drops, drops) = (c.stat(Stat::XdpDrop)?, c.stat(Stat::NoBackendDrop)?);
    times_out(&ext.ns, node_port)?;
    let dropped = c.stat(Stat::NoBackendDrop)? - drops;
    assert!(dropped >= 1);
    assert_eq!(
        c.stat(Stat::XdpDrop)? - xdp_drops,
        dropped,
        "every drop was XDP's"
    );
    Ok(())
}

#[test]
fn denied_sources_are_dropped_in_xdp() -> Result<()> {
    let mut c = Cluster::new(0)?;
    let remote = c.remote();
    let mut fe = cluster_policy(FrontendKind::LoadBalancer, LB_IP, 80, &[remote]);
    fe.source_ranges = vec![(IpAddr::V4(Ipv4Addr::new(192, 168, 1, 0)), 24)];
    c.lb.set(service("public", 80, Proto::Tcp, vec![fe]));
    enable_xdp(&mut c.lb, &c.node1)?;
    c.lb.reconciler
        .set_config_flags(CFG_F_EVENTS_MASK, CFG_F_EVENTS_DROPS)?;
    let monitor = Monitor::start(c.node1.bpf.path(), &[])?;
    let lb_addr = SocketAddr::new(LB_IP.into(), 80);
    let (e0, e1) = (&c.node1.externals[0], &c.node1.externals[1]);
    assert_eq!(whoami(&e0.ns, lb_addr)?.0, "node2-backend-0");
    let (xdp_drops, denied) = (c.stat(Stat::XdpDrop)?, c.stat(Stat::SourceDenied)?);
    times_out(&e1.ns, lb_addr)?;
    // Visible in `sluice monitor`, made at the driver.
    let v = monitor.wait_for("source_denied in XDP", EVENT_WAIT, |v| {
        v["reason"] == "source_denied" && v["family"] == "ipv4"
    })?;
    assert_eq!(v["hook"], "xdp", "{v}");
    assert_eq!(v["src"], e1.ip.to_string(), "{v}");
    assert_eq!(v["frontend"], format!("{LB_IP}:80"), "{v}");
    assert!(v["svc_id"].as_u64().is_some_and(|id| id > 0), "{v}");
    let dropped = c.stat(Stat::SourceDenied)? - denied;
    assert!(dropped >= 1, "the SYN (and its retries) denied");
    assert_eq!(
        c.stat(Stat::XdpDrop)? - xdp_drops,
        dropped,
        "every denied packet was dropped by XDP, not TC"
    );

    // The same for an IPv6 load-balancer IP.
    let remote = &c.node2.backends[0];
    let _server6 = servers::tcp_whoami6(&remote.ns, 8080, &remote.name)?;
    let mut fe6 = frontend(
        FrontendKind::LoadBalancer,
        v6_of(LB_IP).into(),
        80,
        Proto::Tcp,
        &[(IpAddr::V6(remote.ip6), 8080, BackendState::Active)],
    );
    fe6.snat = true;
    fe6.source_ranges = vec![(IpAddr::V6(v6_of(Ipv4Addr::new(192, 168, 1, 0))), 64)];
    c.lb.set(service("public6", 80, Proto::Tcp, vec![fe6]));
    let lb6 = SocketAddr::new(v6_of(LB_IP).into(), 80);
    assert_eq!(whoami(&e0.ns, lb6)?.0, "node2-backend-0");
    let (xdp_drops, denied) = (c.stat(Stat::XdpDrop)?, c.stat(Stat::SourceDenied)?);
    times_out(&e1.ns, lb6)?;
    let v = monitor.wait_for("IPv6 source_denied in XDP", EVENT_WAIT, |v| {
        v["reason"] == "source_denied" && v["family"] == "ipv6"
    })?;
    assert_eq!(v["hook"], "xdp", "{v}");
    assert_eq!(v["dst"], v6_of(LB_IP).to_string(), "{v}");
    let dropped = c.stat(Stat::SourceDenied)? - denied;
    assert!(dropped >= 1, "IPv6: the SYN denied");
    assert_eq!(
        c.stat(Stat::XdpDrop)? - xdp_drops,
        dropped,
        "IPv6: every denied packet was dropped by XDP"
    );

    // An address of the service CIDRs that no service holds: dropped at
    // the driver too.
    c.lb.desired
        .service_cidrs
        .insert((IpAddr::V4(Ipv4Addr::new(10, 96, 0, 0)), 12));
    c.lb.apply();
    let (xdp_drops, unallocated) = (c.stat(Stat::XdpDrop)?, c.stat(Stat::UnallocatedIp)?);
    times_out(
        &e0.ns,
        SocketAddr::new(Ipv4Addr::new(10, 96, 7, 7).into(), 80),
    )?;
    let dropped = c.stat(Stat::UnallocatedIp)? - unallocated;
    assert!(dropped >= 1);
    assert_eq!(c.stat(Stat::XdpDrop)? - xdp_drops, dropped, "in XDP");
    let v = monitor.wait_for("unallocated_ip in XDP", EVENT_WAIT, |v| {
        v["reason"] == "unallocated_ip"
    })?;
    assert_eq!(v["hook"], "xdp", "{v}");
    assert_eq!(v["dst"], "10.96.7.7", "{v}");
    Ok(())
}

#[test]
fn a_flow_moves_from_tc_to_xdp_and_back() -> Result<()> {
    let mut c = Cluster::new(0)?;
    let remote = c.remote();
    let node_ip = c.node1.node_address(0);
    let np = cluster_policy(FrontendKind::NodePort, node_ip, NODE_PORT, &[remote]);
    c.lb.set(service("web", 80, Proto::Tcp, vec![np]));
    let ext = &c.node1.externals[0];
    let node_port = SocketAddr::new(node_ip.into(), NODE_PORT);

    // Started on TC (no XDP yet).
    let mut stream = Stream::connect(&ext.ns, node_port)?;
    stream.ping()?;
    assert_eq!(c.stat(Stat::XdpRedirect)?, 0);

    // XDP enabled under it: the same conntrack entries, now followed at
    // the driver.
    enable_xdp(&mut c.lb, &c.node1)?;
    let redirected = c.stat(Stat::XdpRedirect)?;
    for _ in 0..5 {
        stream.ping()?;
    }
    assert!(
        c.stat(Stat::XdpRedirect)? >= redirected + 10,
        "both directions of the TC-started flow continue in XDP"
    );

    // A flow started in XDP continues on TC once XDP is gone.
    let mut second = Stream::connect(&ext.ns, node_port)?;
    second.ping()?;
    disable_xdp(&c.lb)?;
    let (redirected, replies) = (c.stat(Stat::XdpRedirect)?, c.stat(Stat::SnatReply)?);
    for _ in 0..5 {
        second.ping()?;
        stream.ping()?;
    }
    assert_eq!(c.stat(Stat::XdpRedirect)?, redirected, "XDP is off");
    assert!(
        c.stat(Stat::SnatReply)? >= replies + 10,
        "TC reverse-NATs the replies of both flows"
    );
    Ok(())
}
