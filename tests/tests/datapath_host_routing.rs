//! `--host-routing`: a service flow between two pods' veths skips the
//! node's IP stack both ways: the packets DNATed towards the backend and
//! the backend's replies (reverse-NATed at the backend's device) go
//! straight into the other pod's namespace (`bpf_redirect_peer`). The
//! node's netfilter proves it: FORWARD rules that stop every packet to and
//! from the backend stop the connection through the stack and never see
//! the packets host routing hands over. The client still talks to the
//! service address.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use sluice::{
    datapath::Maps,
    model::{BackendState, Proto},
};
use sluice_common::Stat;
use sluice_tests::{
    agent::{yaml, Agent, ManifestDir},
    clients,
    lb::{cluster_ip, cluster_ip6, vip, vip6, Lb},
    netns,
    servers::{self, Server},
    Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 90);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x90);

/// Resets, in the node's FORWARD chain, every TCP packet routed towards
/// `backend:8080`, and drops every one routed from it: a flow through the
/// node's stack cannot pass either way.
fn forward_reset(topo: &Topology, backend: IpAddr) -> Result<()> {
    let tool = if backend.is_ipv4() {
        "iptables"
    } else {
        "ip6tables"
    };
    let backend = backend.to_string();
    let to = ["-d", &backend, "-p", "tcp", "--dport", "8080"];
    let reset = ["-j", "REJECT", "--reject-with", "tcp-reset"];
    netns::run(
        topo.node
            .command(tool)
            .args(["-I", "FORWARD"])
            .args(to)
            .args(reset),
    )?;
    let from = ["-s", &backend, "-p", "tcp", "--sport", "8080", "-j", "DROP"];
    netns::run(topo.node.command(tool).args(["-I", "FORWARD"]).args(from))?;
    Ok(())
}

/// The TCP service at `vip`, whose one backend is `backend` (greeting
/// `name`), from the topology's client: reached through the node's stack,
/// stopped there by the FORWARD rules, host-routed past them (starting
/// with no neighbour entry, so that the first packets take
/// `bpf_redirect_neigh` and the next ones `bpf_redirect_peer`), then
/// stopped again once host routing is off. `meanwhile` runs while it is on.
fn past_the_stack_and_back(
    topo: &Topology,
    lb: &mut Lb,
    vip: SocketAddr,
    backend: IpAddr,
    name: &str,
    meanwhile: impl FnOnce(&mut Lb) -> Result<()>,
) -> Result<()> {
    let client = &topo.clients[0].ns;
    assert_eq!(clients::tcp_hello(client, vip)?, name);

    forward_reset(topo, backend)?;
    assert!(
        clients::tcp_hello(client, vip).is_err(),
        "through the node's stack the FORWARD rules stop the connection"
    );
    assert_eq!(lb.stat(Stat::HostRouted)?, 0, "off: nothing host-routed");

    netns::run(topo.node.command("ip").args(["neigh", "flush", "all"]))?;
    lb.host_routing(topo, true)?;
    for _ in 0..3 {
        assert_eq!(clients::tcp_hello(client, vip)?, name);
    }
    let routed = lb.stat(Stat::HostRouted)?;
    assert!(
        routed >= 12,
        "every connection's packets both ways were handed over ({routed})"
    );
    meanwhile(lb)?;

    lb.host_routing(topo, false)?;
    assert!(
        clients::tcp_hello(client, vip).is_err(),
        "off again: the stack, and its rules, are back in the path"
    );
    Ok(())
}

/// The topology's backend greeting on TCP 8080, behind `VIP:80`, the
/// programs loaded and attached.
fn web(topo: &Topology) -> Result<(Server, Lb)> {
    let backend = &topo.backends[0];
    let server = servers::tcp_greeter(&backend.ns, 8080, &backend.name)?;
    let mut lb = Lb::load(topo)?;
    let report = lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &[(backend.ip, 8080, BackendState::Active)],
    ));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);
    Ok((server, lb))
}

#[test]
fn host_routing_hands_service_packets_to_a_local_pod_past_the_node_stack() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let backend = &topo.backends[0];
    let (_server, mut lb) = web(&topo)?;
    let _dns = servers::udp_greeter(&backend.ns, 8053, &backend.name)?;
    // UDP both ways too, while host routing is on: the reply comes from
    // the service address, past FORWARD rules that drop the datagrams.
    let udp = |lb: &mut Lb| -> Result<()> {
        let report = lb.set(cluster_ip(
            "dns",
            VIP,
            53,
            Proto::Udp,
            &[(backend.ip, 8053, BackendState::Active)],
        ));
        ensure!(report.errors.is_empty(), "{:?}", report.errors);
        let b = backend.ip.to_string();
        for (dir, port) in [("-d", "--dport"), ("-s", "--sport")] {
            netns::run(topo.node.command("iptables").args([
                "-I", "FORWARD", dir, &b, "-p", "udp", port, "8053", "-j", "DROP",
            ]))?;
        }
        let (answer, from) = clients::udp_hello(&topo.clients[0].ns, vip(VIP, 53))?;
        ensure!(answer == backend.name, "{answer}");
        ensure!(from == SocketAddr::from(vip(VIP, 53)), "reply from {from}");
        Ok(())
    };
    past_the_stack_and_back(
        &topo,
        &mut lb,
        vip(VIP, 80).into(),
        IpAddr::V4(backend.ip),
        &backend.name,
        udp,
    )
}

#[test]
fn host_routing_serves_ipv6_the_same_way() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    topo.wait_ipv6_ready()?;
    let backend = &topo.backends[0];
    let _server = servers::tcp_greeter6(&backend.ns, 8080, &backend.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &[(backend.ip6, 8080, BackendState::Active)],
    ));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);
    past_the_stack_and_back(
        &topo,
        &mut lb,
        vip6(VIP6, 80).into(),
        IpAddr::V6(backend.ip6),
        &backend.name,
        |lb| {
            // Remembered for IPv6 too (`sl_hops6`).
            let key = sluice_common::Hop6Key {
                dst: backend.ip6.octets(),
                ingress: sluice_tests::bpf::ifindex(&topo.node, &topo.clients[0].host_if)?,
            };
            let e = lb.datapath.hops_v6()?.get(&key, 0)?;
            ensure!(
                (e.out, e.dmac, e.smac) == hop_to(&topo, backend)?,
                "the IPv6 hop to the backend as the FIB gave it: {e:?}"
            );
            Ok(())
        },
    )
}

/// The agent's side: `--host-routing` with `--pod-devices` enters the
/// pods' veths and sets the bit (`sluice status` says so); a pod reaching
/// a service on a local pod is host-routed, an outside client reaching a
/// node port on that pod is not (its packets came in through the uplink,
/// not a pod's device: the node's stack, and its FORWARD rule, see them).
#[test]
fn the_agent_host_routes_only_between_its_pods_devices() -> Result<()> {
    let mut topo = Topology::new(1, 1)?;
    topo.add_external()?;
    let _servers = servers::tcp_greeters(&topo, 8080)?;
    let backend = topo.backends[0].ip;
    let dir = ManifestDir::create()?;
    dir.write(
        "node.yaml",
        &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {}\n",
            topo.node_address(0)
        ),
    )?;
    dir.write("web.yaml", &yaml::service("web", VIP, 80, 8080))?;
    dir.write(
        "web-1.yaml",
        &yaml::slice("web-1", "web", 8080, &[(backend, yaml::READY)]),
    )?;
    let node_port = yaml::service("np", Ipv4Addr::new(10, 96, 0, 91), 80, 8080).replace(
        "type: ClusterIP",
        "type: NodePort\n  externalTrafficPolicy: Local",
    ) + "    nodePort: 30141\n";
    dir.write("np.yaml", &node_port)?;
    dir.write(
        "np-1.yaml",
        &yaml::slice("np-1", "np", 8080, &[(backend, yaml::READY)]),
    )?;
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &[
            "--host-routing",
            "--pod-devices",
            "c*,b*",
            "--socket-lb",
            "off",
            "--cluster-cidr",
            "10.0.0.0/8",
        ],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    let status = agent.cli(&["status"])?;
    ensure!(status.contains("routing:   host"), "{status}");

    forward_reset(&topo, IpAddr::V4(backend))?;
    let client = &topo.clients[0].ns;
    for _ in 0..3 {
        ensure!(clients::tcp_hello(client, vip(VIP, 80))? == "backend-0");
    }
    // The connections' last packets (their FINs and ACKs) may still be
    // on their way when the clients return: the count is taken once it
    // holds still.
    let routed = settled_count(&topo, Stat::HostRouted)?;
    ensure!(routed >= 12, "host-routed packets both ways: {routed}");

    let outside = &topo.externals[0].ns;
    let np = SocketAddrV4::new(topo.node_address(0), 30141);
    ensure!(
        clients::tcp_hello(outside, np).is_err(),
        "an outside client's packets take the node's stack (and its FORWARD rule)"
    );
    ensure!(
        Maps::open_pinned(topo.bpf.path())?.stat(Stat::HostRouted)? == routed,
        "nothing from the uplink was host-routed"
    );
    Ok(())
}

/// Counter `stat` once it has not moved for 300 ms (at most 10 s).
fn settled_count(topo: &Topology, stat: Stat) -> Result<u64> {
    let maps = Maps::open_pinned(topo.bpf.path())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = maps.stat(stat)?;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = maps.stat(stat)?;
        if now == last {
            return Ok(now);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{stat:?} still moving after 10 s: {now}"
        );
        last = now;
    }
}

/// Host routing forwards as a router would: the TTL goes down by one, and
/// a packet whose TTL would reach 0 is left to the node's stack (which
/// answers time exceeded) instead of being delivered.
#[test]
fn host_routing_keeps_the_ttl_rule_of_a_router() -> Result<()> {
    use socket2::{Domain, Socket, Type};
    let topo = Topology::new(1, 1)?;
    let (_server, mut lb) = web(&topo)?;
    lb.host_routing(&topo, true)?;
    let connect = |ttl: u32| -> Result<()> {
        let addr = std::net::SocketAddr::from(vip(VIP, 80));
        topo.clients[0].ns.run(move || -> std::io::Result<()> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            socket.set_ttl_v4(ttl)?;
            socket.connect_timeout(&addr.into(), Duration::from_secs(2))
        })??;
        Ok(())
    };
    connect(2)?;
    let routed = lb.stat(Stat::HostRouted)?;
    ensure!(routed >= 1, "the TTL-2 SYN was host-routed");
    ensure!(
        connect(1).is_err(),
        "a TTL-1 SYN must not reach the backend through the node"
    );
    Ok(())
}

/// The MAC address of `device` in `ns`.
fn mac(ns: &netns::Netns, device: &str) -> Result<[u8; 6]> {
    let out = netns::run(ns.command("ip").args(["-o", "link", "show", "dev", device]))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .with_context(|| format!("no MAC address for {device}: {text}"))?;
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(hex.split(':')) {
        *byte = u8::from_str_radix(part, 16)?;
    }
    Ok(mac)
}

/// The hop the FIB gives to `pod`: its node-side device, its own MAC
/// address (destination) and the node side's (source).
fn hop_to(topo: &Topology, pod: &sluice_tests::Pod) -> Result<(u32, [u8; 6], [u8; 6])> {
    Ok((
        sluice_tests::bpf::ifindex(&topo.node, &pod.host_if)?,
        mac(&pod.ns, "eth0")?,
        mac(&topo.node, &pod.host_if)?,
    ))
}

/// Host routing remembers each pod's hop (`sl_hops4`, keyed by
/// destination and ingress device) instead of asking the FIB for every
/// packet: after a few connections the cache holds the backend's device
/// and MAC addresses (for the packets from the client's device) and the
/// client's (for the replies from the backend's), as the FIB gave them. A
/// remembered hop is used only while it is young, its device is still one
/// of the pods' and is not the packet's own: an entry that names a device
/// which is not a pod's, or the client's own device, or one past its life
/// with wrong MAC addresses, is not used; the connection goes through past
/// the stack at once all the same (a hop used wrongly would lose the SYN,
/// and the retransmission comes a second later), and the entry is
/// corrected.
#[test]
fn host_routing_remembers_each_pods_hop_and_checks_it_before_use() -> Result<()> {
    use sluice_common::{hop::HOP_TTL_NS, Hop4Key, HopEntry};
    let topo = Topology::new(1, 1)?;
    let (client, backend) = (&topo.clients[0], &topo.backends[0]);
    let (_server, mut lb) = web(&topo)?;
    forward_reset(&topo, IpAddr::V4(backend.ip))?;
    lb.host_routing(&topo, true)?;
    let vip = vip(VIP, 80);
    for _ in 0..3 {
        assert_eq!(clients::tcp_hello(&client.ns, vip)?, backend.name);
    }
    let client_dev = sluice_tests::bpf::ifindex(&topo.node, &client.host_if)?;
    let backend_dev = sluice_tests::bpf::ifindex(&topo.node, &backend.host_if)?;
    let to_backend = Hop4Key {
        dst: backend.ip.octets(),
        ingress: client_dev,
    };
    let to_client = Hop4Key {
        dst: client.ip.octets(),
        ingress: backend_dev,
    };
    let remembered = |lb: &mut Lb, key: Hop4Key| -> Result<HopEntry> {
        Ok(lb.datapath.hops_v4()?.get(&key, 0)?)
    };
    for (key, pod) in [(to_backend, backend), (to_client, client)] {
        let e = remembered(&mut lb, key)?;
        assert_eq!(
            (e.out, e.dmac, e.smac),
            hop_to(&topo, pod)?,
            "the hop to {} as the FIB gave it",
            pod.name
        );
    }

    let (out, dmac, smac) = hop_to(&topo, backend)?;
    let (client_mac, client_node_mac) =
        (mac(&client.ns, "eth0")?, mac(&topo.node, &client.host_if)?);
    // (young, device, MAC addresses): young ones stamped with the
    // datapath's clock just before the connection.
    for (young, out, dmac, smac) in [
        (true, 0x7fff_0000, dmac, smac),
        (true, client_dev, client_mac, client_node_mac),
        (
            false,
            out,
            [0x02, 0, 0, 0, 0xde, 0xad],
            [0x02, 0, 0, 0, 0xbe, 0xef],
        ),
    ] {
        let now = coarse_now_ns()?;
        let bad = HopEntry {
            stamp_ns: if young { now } else { now - 2 * HOP_TTL_NS },
            out,
            dmac,
            smac,
        };
        lb.datapath.hops_v4()?.insert(to_backend, bad, 0)?;
        let routed = lb.stat(Stat::HostRouted)?;
        let started = std::time::Instant::now();
        assert_eq!(
            clients::tcp_hello(&client.ns, vip)?,
            backend.name,
            "a hop that may not be used is asked of the FIB again ({bad:?})"
        );
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "no SYN lost to {bad:?} ({:?})",
            started.elapsed()
        );
        assert!(
            lb.stat(Stat::HostRouted)? >= routed + 4,
            "still past the node's stack (its FORWARD rules stop the flow there)"
        );
        let e = remembered(&mut lb, to_backend)?;
        assert_eq!(
            (e.out, e.dmac, e.smac),
            hop_to(&topo, backend)?,
            "corrected"
        );
    }

    // A device entered for host routing (again: as a new device that
    // reused a gone one's index would be) loses the hops remembered
    // through its index.
    lb.host_routing(&topo, true)?;
    let left: Vec<_> = lb
        .datapath
        .hops_v4()?
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, e)| e.out == backend_dev || e.out == client_dev)
        .collect();
    assert!(left.is_empty(), "forgotten when entered: {left:?}");
    Ok(())
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the datapath's clock.
fn coarse_now_ns() -> Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        anyhow::bail!("clock_gettime: {}", std::io::Error::last_os_error());
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
