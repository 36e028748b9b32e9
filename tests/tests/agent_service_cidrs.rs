//! Unserved ports and unallocated service IPs, through the real agent on
//! manifests and real connections, as kube-proxy's nftables proxier
//! (`cluster-ips-check`, 1.33+) decides them:
//! - a new flow to a cluster IP on a port its service does not serve is
//!   rejected at once (TCP refused, UDP port unreachable), both families,
//!   from a pod (TC path) and from the node itself (socket programs);
//! - one to an address of the service CIDRs that no service holds is
//!   dropped (the client times out) and counted;
//! - an address outside the CIDRs is routed as before, and the served
//!   port still works;
//! - the CIDRs come from `--service-cluster-ip-range` and from
//!   ServiceCIDR objects; removing the object stops the drops in its
//!   range, and a restarted agent adopts what the pins hold.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use sluice_common::Stat;
use sluice_tests::{
    agent::{
        yaml::{self, READY},
        Agent, ManifestDir,
    },
    clients::{self, ExtHeaders},
    host::HostClient,
    netns::Netns,
    servers, Topology,
};

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 70);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x70);
/// In the service CIDRs, held by no service.
const FREE4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
const FREE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x99);
/// Outside the service CIDRs.
const OUTSIDE4: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 1);
const READY_TIMEOUT: Duration = Duration::from_secs(20);

const SERVICE_CIDR_V6: &str = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: v6\nspec:\n  cidrs: [\"fd00:96::/112\"]\n";

fn stat(topo: &Topology, stat: Stat) -> Result<u64> {
    Ok(sluice::datapath::Maps::open_pinned(topo.bpf.path())?.stat(stat)?)
}

/// A TCP connection from `ns` to `to`: the error kind and how long it took
/// (`None`: it connected).
fn tcp_outcome(ns: &Netns, to: SocketAddr) -> (Option<ErrorKind>, Duration) {
    let started = Instant::now();
    let kind = match clients::tcp_hello(ns, to) {
        Ok(_) => None,
        Err(e) => Some(
            e.chain()
                .find_map(|c| c.downcast_ref::<std::io::Error>())
                .map_or(ErrorKind::Other, std::io::Error::kind),
        ),
    };
    (kind, started.elapsed())
}

/// A UDP datagram from `ns` to `to` on a connected socket: the error its
/// next receive reports (ICMP errors surface there).
fn udp_outcome(ns: &Netns, to: SocketAddr) -> Result<Option<ErrorKind>> {
    let outcome = ns.run(move || -> std::io::Result<usize> {
        let any = if to.is_ipv4() {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        } else {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
        };
        let socket = UdpSocket::bind(any)?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(to)?;
        socket.send(b"q")?;
        socket.recv(&mut [0u8; 64])
    })?;
    Ok(outcome.err().map(|e| e.kind()))
}

fn refused_at_once(ns: &Netns, to: SocketAddr) -> Result<()> {
    let (kind, took) = tcp_outcome(ns, to);
    ensure!(
        kind == Some(ErrorKind::ConnectionRefused),
        "TCP to {to}: {kind:?}, expected refused"
    );
    ensure!(
        took < Duration::from_millis(500),
        "TCP to {to} refused in {took:?}"
    );
    eprintln!("TCP to {to} refused in {took:?}");
    Ok(())
}

fn timed_out(ns: &Netns, to: SocketAddr) -> Result<()> {
    let (kind, took) = tcp_outcome(ns, to);
    ensure!(
        matches!(kind, Some(ErrorKind::TimedOut | ErrorKind::WouldBlock)),
        "TCP to {to}: {kind:?} after {took:?}, expected a timeout (dropped)"
    );
    eprintln!("TCP to {to} dropped: timed out after {took:?}");
    Ok(())
}

/// The node's own process: `ok ...` or `error ERRNO`.
fn from_node(topo: &Topology, addr: IpAddr, port: u16) -> Result<Vec<String>> {
    HostClient::once(topo, "tcp", &addr.to_string(), port)
}

/// One ICMP echo request from `ns` to `to` over a raw socket: the (type,
/// code) of the first ICMP message from `to` within a second, if any.
fn ping(ns: &Netns, to: Ipv4Addr) -> Result<Option<(u8, u8)>> {
    ns.run(move || -> std::io::Result<Option<(u8, u8)>> {
        use socket2::{Domain, Protocol, SockAddr, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        // Echo request, id 0x5c1c, sequence 1, no payload.
        let mut echo = [8u8, 0, 0, 0, 0x5c, 0x1c, 0, 1];
        let sum = echo
            .chunks(2)
            .fold(0u32, |s, w| s + u32::from(u16::from_be_bytes([w[0], w[1]])));
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        echo[2..4].copy_from_slice(&sum.to_be_bytes());
        sock.send_to(&echo, &SockAddr::from(SocketAddr::from((to, 0))))?;
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1500];
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                Err(e) => return Err(e),
            };
            // SAFETY: recv initialised the first n bytes.
            let pkt: Vec<u8> = buf[..n]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            let ihl = usize::from(pkt.first().copied().unwrap_or(0) & 0x0f) * 4;
            if pkt.len() < ihl + 2 || pkt[12..16] != to.octets() {
                continue;
            }
            let (kind, code) = (pkt[ihl], pkt[ihl + 1]);
            if kind == 8 {
                continue; // our own request, looped back on some setups
            }
            return Ok(Some((kind, code)));
        }
        Ok(None)
    })?
    .context("ping")
}

/// `ping` for IPv6: the (type, code) of the first ICMPv6 message from `to`
/// within a second (the kernel fills in the checksum of a raw ICMPv6
/// socket, and gives no IPv6 header on receive).
fn ping6(ns: &Netns, to: Ipv6Addr) -> Result<Option<(u8, u8)>> {
    ping6_ext(ns, to, None)
}

/// `ping6` with the echo request behind the IPv6 extension headers `ext`.
fn ping6_ext(ns: &Netns, to: Ipv6Addr, ext: Option<ExtHeaders>) -> Result<Option<(u8, u8)>> {
    ns.run(move || -> std::io::Result<Option<(u8, u8)>> {
        use socket2::{Domain, Protocol, SockAddr, Socket, Type};
        let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        if let Some(which) = ext {
            clients::ext_headers(&sock, which)?;
        }
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let echo = [128u8, 0, 0, 0, 0x5c, 0x1c, 0, 1];
        sock.send_to(&echo, &SockAddr::from(SocketAddr::from((to, 0))))?;
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1500];
            let (n, from) = match sock.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                Err(e) => return Err(e),
            };
            if from.as_socket().map(|a| a.ip()) != Some(IpAddr::V6(to)) || n < 2 {
                continue;
            }
            // SAFETY: recv_from initialised the first n bytes.
            let (kind, code) = unsafe { (buf[0].assume_init(), buf[1].assume_init()) };
            if kind == 128 {
                continue;
            }
            return Ok(Some((kind, code)));
        }
        Ok(None)
    })?
    .context("ping6")
}

#[test]
fn unserved_ports_are_rejected_and_unallocated_addresses_dropped_as_kube_proxy_does() -> Result<()>
{
    let topo = Topology::new(1, 1)?;
    topo.wait_ipv6_ready()?;
    let backend = &topo.backends[0];
    let _servers = [
        servers::tcp_greeter(&backend.ns, 8080, &backend.name)?,
        servers::tcp_greeter6(&backend.ns, 8080, &backend.name)?,
    ];
    let dir = ManifestDir::create()?;
    dir.write(
        "web.yaml",
        &yaml::dual_stack_service("web", VIP4, VIP6, 80, 8080),
    )?;
    dir.write(
        "web-v4.yaml",
        &yaml::slice("web-v4", "web", 8080, &[(backend.ip, READY)]),
    )?;
    dir.write(
        "web-v6.yaml",
        &yaml::slice6("web-v6", "web", 8080, &[(backend.ip6, READY)]),
    )?;
    // The IPv4 range from the flag, the IPv6 one from a ServiceCIDR object.
    dir.write("cidr-v6.yaml", SERVICE_CIDR_V6)?;
    let source = format!("dir:{}", dir.path().display());
    let flags = ["--service-cluster-ip-range", "10.96.0.0/16"];
    let mut agent = Agent::start(&topo, &source, &flags)?;
    agent.wait_ready(READY_TIMEOUT)?;
    let pod = &topo.clients[0].ns;
    let v4 = |ip: Ipv4Addr, port: u16| SocketAddr::from((ip, port));
    let v6 = |ip: Ipv6Addr, port: u16| SocketAddr::from((ip, port));

    // The served port works in both families.
    for to in [v4(VIP4, 80), v6(VIP6, 80)] {
        let greeting = clients::tcp_hello(pod, to).with_context(|| format!("served {to}"))?;
        ensure!(greeting == backend.name, "{to}: {greeting}");
    }

    // A pod to an unserved port of the cluster IP: refused at once (TCP),
    // port unreachable (UDP), counted.
    let unserved = stat(&topo, Stat::UnservedPort)?;
    for to in [v4(VIP4, 81), v6(VIP6, 81)] {
        refused_at_once(pod, to)?;
    }
    for to in [v4(VIP4, 53), v6(VIP6, 53)] {
        let got = udp_outcome(pod, to)?;
        ensure!(
            got == Some(ErrorKind::ConnectionRefused),
            "UDP to {to}: {got:?}, expected port unreachable"
        );
    }
    let counted = stat(&topo, Stat::UnservedPort)? - unserved;
    ensure!(counted >= 4, "unserved_port counted {counted}, expected 4");

    // A pod to an address of the CIDRs no service holds: dropped, counted.
    let unallocated = stat(&topo, Stat::UnallocatedIp)?;
    for to in [v4(FREE4, 80), v6(FREE6, 80)] {
        timed_out(pod, to)?;
    }
    ensure!(
        stat(&topo, Stat::UnallocatedIp)? > unallocated + 1,
        "unallocated_ip not counted for both families"
    );

    // A ping (an ICMP query: a new flow in conntrack's eyes) to the cluster
    // IP gets port unreachable from it, as nft's `reject`; one to a free
    // address of the CIDRs gets nothing, and both are counted.
    let (unserved, unallocated) = (
        stat(&topo, Stat::UnservedPort)?,
        stat(&topo, Stat::UnallocatedIp)?,
    );
    let got = ping(pod, VIP4)?;
    ensure!(
        got == Some((3, 3)),
        "ping to the cluster IP: {got:?}, expected ICMP port unreachable (3, 3) from it"
    );
    let got = ping(pod, FREE4)?;
    ensure!(got.is_none(), "ping to a free service IP answered: {got:?}");
    let got = ping6(pod, VIP6)?;
    ensure!(
        got == Some((1, 4)),
        "ping to the IPv6 cluster IP: {got:?}, expected ICMPv6 port unreachable (1, 4) from it"
    );
    // Behind a hop-by-hop and a destination options header alike.
    let got = ping6_ext(pod, VIP6, Some(ExtHeaders::BOTH))?;
    ensure!(
        got == Some((1, 4)),
        "ping with extension headers to the IPv6 cluster IP: {got:?}, expected (1, 4)"
    );
    let got = ping6(pod, FREE6)?;
    ensure!(
        got.is_none(),
        "ping to a free IPv6 service IP answered: {got:?}"
    );
    ensure!(stat(&topo, Stat::UnservedPort)? > unserved);
    ensure!(stat(&topo, Stat::UnallocatedIp)? > unallocated);

    // Outside the CIDRs: routed as before (nothing counted, the backend
    // pod itself answers).
    let before = (
        stat(&topo, Stat::UnservedPort)?,
        stat(&topo, Stat::UnallocatedIp)?,
    );
    let _ = udp_outcome(pod, v4(OUTSIDE4, 80))?;
    let _ = tcp_outcome(pod, v4(OUTSIDE4, 80));
    let greeting = clients::tcp_hello(pod, v4(backend.ip, 8080))?;
    ensure!(greeting == backend.name, "direct: {greeting}");
    let after = (
        stat(&topo, Stat::UnservedPort)?,
        stat(&topo, Stat::UnallocatedIp)?,
    );
    ensure!(
        before == after,
        "outside the CIDRs counted: {before:?} -> {after:?}"
    );

    // The node's own processes (socket programs): the same answers.
    for vip in [IpAddr::V4(VIP4), IpAddr::V6(VIP6)] {
        let served = from_node(&topo, vip, 80)?;
        ensure!(
            served.first().map(String::as_str) == Some("ok"),
            "{vip}:80 {served:?}"
        );
        let out = from_node(&topo, vip, 81)?;
        ensure!(
            out == ["error", "ECONNREFUSED"],
            "node to {vip}:81: {out:?}"
        );
    }
    for free in [IpAddr::V4(FREE4), IpAddr::V6(FREE6)] {
        let out = from_node(&topo, free, 80)?;
        ensure!(out == ["error", "ETIMEDOUT"], "node to {free}:80: {out:?}");
    }

    // A restarted agent adopts the entries from the pins: same answers.
    agent.restart(&topo.node)?;
    agent.wait_ready(READY_TIMEOUT)?;
    refused_at_once(pod, v6(VIP6, 81))?;
    timed_out(pod, v4(FREE4, 80))?;

    // The ServiceCIDR object goes: its range is no longer dropped (the
    // cluster IP keeps rejecting unserved ports).
    dir.remove("cidr-v6.yaml")?;
    agent.wait_until(
        "the ServiceCIDR's range to leave sl_svcnet6",
        READY_TIMEOUT,
        |_| {
            let maps = sluice::datapath::Maps::open_pinned(topo.bpf.path())?;
            let (state, _) = sluice::datapath::read_map_state(&maps)?;
            Ok(!state
                .service_nets
                .keys()
                .any(|(a, len)| a.is_ipv6() && *len == 112))
        },
    )?;
    let unallocated = stat(&topo, Stat::UnallocatedIp)?;
    let _ = tcp_outcome(pod, v6(FREE6, 80));
    ensure!(
        stat(&topo, Stat::UnallocatedIp)? == unallocated,
        "{FREE6} still dropped without its ServiceCIDR"
    );
    refused_at_once(pod, v6(VIP6, 81))?;
    agent.stop()?;
    Ok(())
}
