//! `sluice monitor`: each drop and reject the datapath makes shows up in
//! `sluice monitor --json` with its reason and the packet's fields; with
//! events off nothing is written; a flood is held to the rate limit; the
//! agent's `--monitor-events` sets the switch, and a socket's refusal
//! shows too.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use sluice::{
    cli::MonitorEvents,
    datapath::Maps,
    model::{BackendState, FrontendKind, Proto, WhenEmpty},
};
use sluice_common::{
    config::{CFG_F_EVENTS_DROPS, CFG_F_EVENTS_MASK},
    events::{EVENTS_BURST, EVENTS_PER_SEC},
    Stat,
};
use sluice_tests::{
    agent::{yaml, Agent, ManifestDir},
    clients::{self, Stream},
    host::HostClient,
    lb::{cluster_ip, cluster_ip6, frontend, service, vip, vip6, Lb},
    monitor::Monitor,
    servers, Netns, Topology,
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 80);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 81);
const DROP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 82);
const UNALLOCATED: Ipv4Addr = Ipv4Addr::new(10, 96, 9, 9);
const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x81);
const WAIT: Duration = Duration::from_secs(5);

fn events_on(lb: &mut Lb, on: bool) -> Result<()> {
    let bits = if on { CFG_F_EVENTS_DROPS } else { 0 };
    lb.reconciler.set_config_flags(CFG_F_EVENTS_MASK, bits)?;
    Ok(())
}

fn times_out(ns: &Netns, addr: SocketAddr) -> Result<()> {
    let outcome = ns.run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(500)))?;
    ensure!(
        matches!(&outcome, Err(e) if e.kind() == std::io::ErrorKind::TimedOut),
        "expected a silent drop, got {outcome:?}"
    );
    Ok(())
}

fn udp_send(ns: &Netns, to: SocketAddr, n: usize) -> Result<Duration> {
    Ok(ns.run(move || -> std::io::Result<Duration> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        let started = Instant::now();
        for _ in 0..n {
            socket.send_to(b"q", to)?;
        }
        Ok(started.elapsed())
    })??)
}

fn is(v: &Value, reason: &str, dst: Ipv4Addr, dport: u16) -> bool {
    v["reason"] == reason && v["dst"] == dst.to_string() && v["dport"] == dport
}

#[test]
fn each_drop_and_reject_shows_in_sluice_monitor_with_its_fields() -> Result<()> {
    let mut topo = Topology::new(1, 1)?;
    topo.add_external()?;
    topo.add_external()?;
    let b0 = &topo.backends[0];
    let _server = servers::tcp_greeter(&b0.ns, 8080, &b0.name)?;
    let client = &topo.clients[0];
    let mut lb = Lb::load_with(&topo, Default::default(), Duration::ZERO)?;
    events_on(&mut lb, true)?;
    let monitor = Monitor::start(topo.bpf.path(), &[])?;

    // No endpoint, TCP: a RST, and an event naming the frontend.
    lb.set(cluster_ip("empty", EMPTY_VIP, 80, Proto::Tcp, &[]));
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 80)).expect_err("refused");
    let v = monitor.wait_for("no_backend", WAIT, |v| is(v, "no_backend", EMPTY_VIP, 80))?;
    assert_eq!(v["hook"], "ingress", "{v}");
    assert_eq!(v["family"], "ipv4", "{v}");
    assert_eq!(v["proto"], "tcp", "{v}");
    assert_eq!(v["src"], client.ip.to_string(), "{v}");
    assert!(v["sport"].as_u64().is_some_and(|p| p > 0), "{v}");
    assert_eq!(v["frontend"], format!("{EMPTY_VIP}:80"), "{v}");
    assert!(v["svc_id"].as_u64().is_some(), "{v}");
    assert!(v["backend"].is_null() && v["backend_id"].is_null(), "{v}");
    assert!(v["ifindex"].as_u64().is_some(), "{v}");
    assert!(v["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");

    // A tracked flow whose backend is gone: reset, with its backend id
    // (the only backend of b0 so far).
    let backends = [(b0.ip, 8080, BackendState::Active)];
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &backends));
    let id = lb.backend_id(b0.ip, 8080).context("backend id")?;
    let mut stream = Stream::connect(&client.ns, vip(VIP, 80))?;
    stream.ping()?;
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &[]));
    lb.apply();
    stream.ping().expect_err("reset");
    let v = monitor.wait_for("stale_reset", WAIT, |v| is(v, "stale_reset", VIP, 80))?;
    assert_eq!(v["backend_id"], id, "{v}");

    // No endpoint, drop when empty (externalTrafficPolicy Local), UDP.
    let (name, mut svc) = cluster_ip("drop", DROP_VIP, 53, Proto::Udp, &[]);
    svc.frontends[0].when_empty = WhenEmpty::Drop;
    lb.set((name, svc));
    udp_send(&client.ns, vip(DROP_VIP, 53).into(), 1)?;
    let v = monitor.wait_for("no_backend_drop", WAIT, |v| {
        is(v, "no_backend_drop", DROP_VIP, 53)
    })?;
    assert_eq!(v["proto"], "udp", "{v}");

    // A client outside loadBalancerSourceRanges.
    let mut fe = frontend(
        FrontendKind::LoadBalancer,
        IpAddr::V4(LB_IP),
        80,
        Proto::Tcp,
        &[(IpAddr::V4(b0.ip), 8080, BackendState::Active)],
    );
    fe.source_ranges = vec![(IpAddr::V4(Ipv4Addr::new(192, 168, 1, 0)), 24)];
    lb.set(service("public", 80, Proto::Tcp, vec![fe]));
    let denied = &topo.externals[1];
    times_out(&denied.ns, SocketAddr::new(IpAddr::V4(LB_IP), 80))?;
    let v = monitor.wait_for("source_denied", WAIT, |v| is(v, "source_denied", LB_IP, 80))?;
    assert_eq!(v["src"], denied.ip.to_string(), "{v}");
    assert!(v["svc_id"].as_u64().is_some(), "{v}");

    // The service address space: an unserved port of a cluster IP is
    // rejected, an unallocated address of the service CIDR dropped.
    lb.desired.cluster_ips.insert(IpAddr::V4(EMPTY_VIP));
    lb.desired
        .service_cidrs
        .insert((IpAddr::V4(Ipv4Addr::new(10, 96, 0, 0)), 16));
    assert!(lb.apply().errors.is_empty());
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 81)).expect_err("refused");
    monitor.wait_for("unserved_port", WAIT, |v| {
        is(v, "unserved_port", EMPTY_VIP, 81)
    })?;
    times_out(&client.ns, vip(UNALLOCATED, 80).into())?;
    monitor.wait_for("unallocated_ip", WAIT, |v| {
        is(v, "unallocated_ip", UNALLOCATED, 80)
    })?;

    // Ctrl-C: the count per reason.
    let summary = monitor.interrupt()?;
    for reason in [
        "no_backend=1",
        "no_backend_drop=1",
        "source_denied=",
        "unserved_port=1",
        "unallocated_ip=",
        "stale_reset=",
    ] {
        assert!(summary.contains(reason), "{reason} in {summary}");
    }

    // Filters: only what is asked for (one monitor at a time: a ring
    // buffer has one reader position, two readers would split the events).
    let filtered = Monitor::start(topo.bpf.path(), &["--reason", "no_backend", "--port", "80"])?;
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 81)).expect_err("refused");
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 80)).expect_err("refused");
    filtered.wait_for("filtered no_backend", WAIT, |v| {
        is(v, "no_backend", EMPTY_VIP, 80)
    })?;
    let summary = filtered.interrupt()?;
    assert!(summary.contains("1 events: no_backend=1"), "{summary}");

    Ok(())
}

#[test]
fn with_events_off_nothing_is_written() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    let client = &topo.clients[0];
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip("empty", EMPTY_VIP, 80, Proto::Tcp, &[]));
    lb.set(cluster_ip("empty2", EMPTY_VIP, 81, Proto::Tcp, &[]));
    let monitor = Monitor::start(topo.bpf.path(), &[])?;
    assert!(
        monitor.stderr().contains("events are off"),
        "{}",
        monitor.stderr()
    );

    // Off (a fresh datapath): the reject happens, no event is written.
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 80)).expect_err("refused");
    assert_eq!(lb.stat(Stat::NoBackend)?, 1);
    // On: the next one is written. The ring is in order, so had the first
    // been written, the monitor would print it before this one.
    events_on(&mut lb, true)?;
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 81)).expect_err("refused");
    monitor.wait_for("the second reject", WAIT, |v| {
        is(v, "no_backend", EMPTY_VIP, 81)
    })?;
    let events = monitor.events();
    assert_eq!(events.len(), 1, "only the event made while on: {events:#?}");
    Ok(())
}

#[test]
fn a_flood_of_drops_is_held_to_the_rate_limit() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    let client = &topo.clients[0];
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    lb.set(cluster_ip("empty-dns", EMPTY_VIP, 53, Proto::Udp, &[]));
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "no_backend"])?;

    const N: u64 = 20_000;
    let started = Instant::now();
    udp_send(&client.ns, vip(EMPTY_VIP, 53).into(), N as usize)?;
    // Every datagram reaches the program (its counter), each answered.
    let deadline = Instant::now() + WAIT;
    while lb.stat(Stat::NoBackend)? < N && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed();
    assert_eq!(lb.stat(Stat::NoBackend)?, N);
    let suppressed = lb.stat(Stat::EventsSuppressed)?;
    let lost = lb.stat(Stat::EventsLost)?;
    let written = N - suppressed - lost;
    let cpus = std::thread::available_parallelism()?.get() as u64;
    let allowed = cpus * (EVENTS_BURST + EVENTS_PER_SEC * (elapsed.as_millis() as u64 + 1) / 1000);
    assert!(suppressed > 0, "the rate limit held events back");
    assert!(
        written <= allowed,
        "{written} events written in {elapsed:?} on {cpus} CPUs, at most {allowed} allowed"
    );
    // What was written reaches the monitor.
    let seen = monitor.wait_count(written as usize, WAIT)?;
    assert_eq!(seen as u64, written, "suppressed {suppressed}, lost {lost}");
    let summary = monitor.interrupt()?;
    assert!(
        summary.contains(&format!("{suppressed} not written (rate limit)")),
        "{summary}"
    );
    Ok(())
}

#[test]
fn the_agent_flag_switches_events_and_socket_refusals_show() -> Result<()> {
    let topo = Topology::new(0, 0)?;
    let dir = ManifestDir::create()?;
    dir.write("empty.yaml", &yaml::service("empty", EMPTY_VIP, 80, 8080))?;
    let source = format!("dir:{}", dir.path().display());
    let flags = || -> Result<u32> { Ok(Maps::open_pinned(topo.bpf.path())?.config()?.flags()) };

    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    assert_eq!(
        flags()? & CFG_F_EVENTS_MASK,
        CFG_F_EVENTS_DROPS,
        "on by default"
    );
    let status = agent.cli(&["status"])?;
    assert!(
        status.contains("events:    on: `sluice monitor`"),
        "{status}"
    );
    let monitor = Monitor::start(topo.bpf.path(), &[])?;
    let out = HostClient::once(&topo, "tcp", &EMPTY_VIP.to_string(), 80)?;
    ensure!(out == ["error", "ECONNREFUSED"], "{out:?}");
    let v = monitor.wait_for("sock_refused", WAIT, |v| {
        is(v, "sock_refused", EMPTY_VIP, 80)
    })?;
    assert_eq!(v["hook"], "socket", "{v}");
    assert_eq!(v["proto"], "tcp", "{v}");
    assert_eq!(v["frontend"], format!("{EMPTY_VIP}:80"), "{v}");
    assert!(v["src"].is_null(), "{v}");
    drop(monitor);

    agent.stop()?;
    let mut agent = Agent::start(&topo, &source, &["--monitor-events=off"])?;
    agent.wait_ready(Duration::from_secs(20))?;
    assert_eq!(flags()? & CFG_F_EVENTS_MASK, 0, "--monitor-events=off");
    let status = agent.cli(&["status"])?;
    assert!(status.contains("events:    off"), "{status}");
    Ok(())
}

fn node_port_yaml(node_ip: Ipv4Addr) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {node_ip}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: np\n  namespace: default\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.91\n  clusterIPs: [10.96.0.91]\n  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8080\n    nodePort: 30090\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: np-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: np\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\nendpoints:\n- addresses: [\"10.20.0.2\"]\n  nodeName: node-1\n  conditions: {{ready: true}}\n"
    )
}

/// A TTL 1 packet on the SNAT path is dropped (`ttl_expired`). SNAT port
/// exhaustion (a range of one port): the second flow is dropped,
/// `sluice monitor` says so with the backend, and the datapath's debug log
/// (`--datapath-log-level debug`, aya-log) reaches the agent's output.
#[test]
fn snat_exhaustion_and_ttl_expiry_are_events_and_a_datapath_log() -> Result<()> {
    let mut topo = Topology::new(0, 1)?;
    topo.add_external()?;
    let b0 = &topo.backends[0];
    let _server = servers::tcp_greeter(&b0.ns, 8080, &b0.name)?;
    let dir = ManifestDir::create()?;
    dir.write("np.yaml", &node_port_yaml(topo.node_address(0)))?;
    let source = format!("dir:{}", dir.path().display());
    let mut agent = Agent::start(&topo, &source, &["--datapath-log-level", "debug"])?;
    agent.wait_ready(Duration::from_secs(20))?;
    let ext = &topo.externals[0];
    let node_port = SocketAddr::new(IpAddr::V4(topo.node_address(0)), 30090);

    // A SYN with TTL 1: the datapath routes SNATed packets itself, and
    // drops one that a router would drop.
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "ttl_expired"])?;
    let outcome = ext.ns.run(move || -> std::io::Result<()> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        socket.set_ttl_v4(1)?;
        socket.connect_timeout(&node_port.into(), Duration::from_millis(500))
    })?;
    ensure!(outcome.is_err(), "a TTL 1 SYN got through");
    let v = monitor.wait_for("ttl_expired", WAIT, |_| true)?;
    assert_eq!(v["hook"], "ingress", "{v}");
    drop(monitor);

    // One SNAT port (the test stands in for an operator's tiny range), one
    // the TTL 1 SYN did not claim.
    let mut maps = Maps::open_pinned(topo.bpf.path())?;
    let claimed: Vec<u16> = sluice::conntrack::read_all(&maps)?
        .iter()
        .map(|(k, _)| k.dport)
        .collect();
    let port = (61_000..)
        .find(|p| !claimed.contains(p))
        .context("a free port")?;
    let mut config = maps.config()?;
    config.snat_port_min = port;
    config.snat_port_max = port;
    maps.config.set(0, config, 0)?;
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "snat_failed"])?;

    let _first = Stream::connect(&ext.ns, node_port)?;
    times_out(&ext.ns, node_port)?;
    let v = monitor.wait_for("snat_failed", WAIT, |v| {
        is(v, "snat_failed", topo.node_address(0), 30090)
    })?;
    assert_eq!(v["src"], ext.ip.to_string(), "{v}");
    assert_eq!(v["backend"], format!("{}:8080", b0.ip), "{v}");
    assert!(v["svc_id"].as_u64().is_some(), "{v}");
    agent.wait_until("the datapath's debug log", WAIT, |a| {
        Ok(a.log().contains(&format!("no free port in {port}-{port}")))
    })?;
    Ok(())
}

/// IPv6: the event carries the 16-byte addresses and the family.
#[test]
fn an_ipv6_reject_is_an_ipv6_event() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    topo.wait_ipv6_ready()?;
    let client = &topo.clients[0];
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    lb.set(cluster_ip6("empty6", VIP6, 80, Proto::Tcp, &[]));
    let monitor = Monitor::start(topo.bpf.path(), &["--frontend", &format!("[{VIP6}]:80")])?;
    clients::tcp_hello(&client.ns, vip6(VIP6, 80)).expect_err("refused");
    let v = monitor.wait_for("no_backend (IPv6)", WAIT, |v| v["reason"] == "no_backend")?;
    assert_eq!(v["family"], "ipv6", "{v}");
    assert_eq!(v["src"], client.addr(true).to_string(), "{v}");
    assert_eq!(v["dst"], VIP6.to_string(), "{v}");
    assert_eq!(v["frontend"], format!("[{VIP6}]:80"), "{v}");
    Ok(())
}

/// A later IPv4 fragment whose first was never seen passes unbalanced:
/// an event without a tuple (its ports are unknown), reason
/// `fragment_unknown`.
#[test]
fn an_unknown_fragment_is_an_event() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    let client = &topo.clients[0];
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "fragment_unknown"])?;
    let (src, dst) = (client.ip, VIP);
    client.ns.run(move || -> std::io::Result<()> {
        // IPv4, UDP, id 0x5eed, fragment offset 8 bytes (1), last fragment.
        let mut p = vec![0x45u8, 0, 0, 28, 0x5e, 0xed, 0, 1, 64, 17, 0, 0];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&[0u8; 8]);
        let raw = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )?;
        raw.send_to(&p, &SockAddr::from(SocketAddr::new(IpAddr::V4(dst), 0)))?;
        Ok(())
    })??;
    let v = monitor.wait_for("fragment_unknown", WAIT, |_| true)?;
    assert_eq!(v["hook"], "ingress", "{v}");
    assert!(v["family"].is_null() && v["src"].is_null(), "{v}");
    assert_eq!(lb.stat(Stat::FragmentUnknown)?, 1);
    Ok(())
}

/// Sends one UDP datagram of `size` bytes to `to` from `ns`, fragmented
/// by the sender (no path MTU discovery), and waits up to 1 s for an
/// answer, which does not come.
fn fragmented_send(ns: &Netns, to: SocketAddr, size: usize) -> Result<()> {
    let v6 = to.is_ipv6();
    ns.run(move || -> std::io::Result<()> {
        let socket = UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" })?;
        clients::allow_fragments(&socket, v6)?;
        socket.set_read_timeout(Some(Duration::from_secs(1)))?;
        socket.connect(to)?;
        socket.send(&vec![1u8; size])?;
        let _ = socket.recv(&mut [0u8; 64]);
        Ok(())
    })??;
    Ok(())
}

/// The later fragments of a datagram whose first fragment was refused (a
/// frontend without backends) are dropped, each an event with the flow's
/// tuple (its ports come from the first fragment), in both families.
#[test]
fn dropped_later_fragments_are_events_with_their_flow() -> Result<()> {
    let topo = Topology::new(1, 0)?;
    topo.wait_ipv6_ready()?;
    let client = &topo.clients[0];
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    lb.set(cluster_ip("dns", EMPTY_VIP, 53, Proto::Udp, &[]));
    lb.set(cluster_ip6("dns6", VIP6, 53, Proto::Udp, &[]));
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "fragment_dropped"])?;
    for (to, family, src) in [
        (
            SocketAddr::from(vip(EMPTY_VIP, 53)),
            "ipv4",
            IpAddr::V4(client.ip),
        ),
        (SocketAddr::from(vip6(VIP6, 53)), "ipv6", client.addr(true)),
    ] {
        fragmented_send(&client.ns, to, 4000)?;
        let v = monitor.wait_for("fragment_dropped", WAIT, |v| {
            v["family"] == family && v["dst"] == to.ip().to_string()
        })?;
        assert_eq!(v["hook"], "ingress", "{v}");
        assert_eq!(v["proto"], "udp", "{v}");
        assert_eq!(v["src"], src.to_string(), "{v}");
        assert_eq!(v["dport"], 53, "{v}");
        assert!(v["sport"].as_u64().is_some_and(|p| p > 0), "{v}");
    }
    ensure!(
        lb.stat(Stat::FragmentDropped)? >= 4,
        "two later fragments each"
    );
    Ok(())
}

/// An IPv6 datagram whose routing header has a segment left is not for
/// the address in its fixed header: it passes unbalanced, an event.
#[test]
fn an_ipv6_extension_header_passed_unbalanced_is_an_event() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    topo.wait_ipv6_ready()?;
    let client = &topo.clients[0];
    let b = &topo.backends[0];
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    lb.set(cluster_ip6(
        "dns6",
        VIP6,
        53,
        Proto::Udp,
        &[(b.ip6, 5353, BackendState::Active)],
    ));
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "ipv6_ext_header"])?;
    let src = client.ip6;
    let waypoint = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
    client.ns.run(move || -> std::io::Result<()> {
        let raw = Socket::new(
            Domain::IPV6,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )?;
        let packet = clients::routed_udp(src, VIP6, waypoint, 1, 40053, 53);
        raw.send_to(&packet, &SockAddr::from(SocketAddr::from(vip6(VIP6, 0))))?;
        Ok(())
    })??;
    let v = monitor.wait_for("ipv6_ext_header", WAIT, |_| true)?;
    assert_eq!(v["hook"], "ingress", "{v}");
    assert_eq!(v["family"], "ipv6", "{v}");
    assert_eq!(v["src"], src.to_string(), "{v}");
    assert_eq!(v["dst"], VIP6.to_string(), "{v}");
    assert_eq!(lb.stat(Stat::NewFlow)?, 0, "nothing balanced");
    Ok(())
}

/// Deletes `key` (little-endian u32) from the map pinned at `pin`, as a
/// broken or foreign writer could: the datapath's own error paths are
/// provoked this way.
fn delete_u32_key(pin: &std::path::Path, key: u32) -> Result<()> {
    let bytes: Vec<String> = key.to_le_bytes().iter().map(|b| b.to_string()).collect();
    let mut cmd = std::process::Command::new("bpftool");
    cmd.args(["map", "delete", "pinned"]).arg(pin).arg("key");
    cmd.args(&bytes);
    sluice_tests::netns::run(&mut cmd)?;
    Ok(())
}

/// A slot whose backend is gone from `sl_backends` (which the agent's
/// write order never lets happen) drops the new flow: an event.
#[test]
fn a_dangling_slot_is_an_event() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let client = &topo.clients[0];
    let b = &topo.backends[0];
    let _server = servers::tcp_greeter(&b.ns, 8080, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &[(b.ip, 8080, BackendState::Active)],
    ));
    assert_eq!(clients::tcp_hello(&client.ns, vip(VIP, 80))?, b.name);
    let id = lb.backend_id(b.ip, 8080).context("backend id")?;
    delete_u32_key(&topo.bpf.path().join("sl_backends"), id)?;
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "dangling"])?;
    times_out(&client.ns, SocketAddr::from(vip(VIP, 80)))?;
    let v = monitor.wait_for("dangling", WAIT, |_| true)?;
    assert_eq!(v["hook"], "tc", "{v}");
    ensure!(lb.stat(Stat::Dangling)? >= 1);
    Ok(())
}

/// An empty slot of the IPv6 program array (which the agent fills before
/// it attaches anything): IPv6 passes unbalanced, `tail_call_failed` is
/// an event.
#[test]
fn a_missed_tail_call_is_an_event() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    topo.wait_ipv6_ready()?;
    let client = &topo.clients[0];
    let b = &topo.backends[0];
    let _server = servers::udp_greeter6(&b.ns, 5353, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    events_on(&mut lb, true)?;
    delete_u32_key(
        &topo.bpf.path().join("sl_progs"),
        sluice_common::maps::PROG_INGRESS6,
    )?;
    let monitor = Monitor::start(topo.bpf.path(), &["--reason", "tail_call_failed"])?;
    // Straight to the pod: IPv6 still flows, untouched.
    let (answer, _) = clients::udp_hello(&client.ns, SocketAddr::new(b.addr(true), 5353))?;
    assert_eq!(answer, b.name);
    let v = monitor.wait_for("tail_call_failed", WAIT, |_| true)?;
    assert_eq!(v["hook"], "tc", "{v}");
    ensure!(lb.stat(Stat::TailCallFailed)? >= 1);
    Ok(())
}

/// `--monitor-events all`: new flows are traced with the backend they
/// picked, one in `--monitor-trace-sample`.
#[test]
fn all_traces_new_flows_with_their_backend_sampled() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let b0 = &topo.backends[0];
    let _server = servers::tcp_greeter(&b0.ns, 8080, &b0.name)?;
    let client = &topo.clients[0];
    let mut lb = Lb::load(&topo)?;
    lb.reconciler
        .set_config_flags(CFG_F_EVENTS_MASK, MonitorEvents::All.flags(1))?;
    let backend = [(b0.ip, 8080, BackendState::Active)];
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &backend));
    lb.set(cluster_ip("dns", VIP, 53, Proto::Udp, &backend));
    lb.set(cluster_ip("empty", EMPTY_VIP, 80, Proto::Tcp, &[]));
    let monitor = Monitor::start(topo.bpf.path(), &[])?;

    assert_eq!(clients::tcp_hello(&client.ns, vip(VIP, 80))?, b0.name);
    let v = monitor.wait_for("new_flow", WAIT, |v| is(v, "new_flow", VIP, 80))?;
    assert_eq!(v["backend"], format!("{}:8080", b0.ip), "{v}");
    assert!(
        v["backend_id"].as_u64().is_some() && v["svc_id"].as_u64().is_some(),
        "{v}"
    );

    // One in 8: 400 new UDP flows (each from its own socket), then a
    // reject as a marker (the ring is in order).
    lb.reconciler
        .set_config_flags(CFG_F_EVENTS_MASK, MonitorEvents::All.flags(8))?;
    let to = SocketAddr::from(vip(VIP, 53));
    client.ns.run(move || -> std::io::Result<()> {
        for _ in 0..400 {
            UdpSocket::bind("0.0.0.0:0")?.send_to(b"q", to)?;
        }
        Ok(())
    })??;
    clients::tcp_hello(&client.ns, vip(EMPTY_VIP, 80)).expect_err("refused");
    monitor.wait_for("the marker", WAIT, |v| is(v, "no_backend", EMPTY_VIP, 80))?;
    let traced = monitor
        .events()
        .iter()
        .filter(|v| is(v, "new_flow", VIP, 53))
        .count();
    assert!(
        (16..=150).contains(&traced),
        "{traced} of 400 new flows traced, about 50 expected"
    );
    Ok(())
}
