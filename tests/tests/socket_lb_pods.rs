//! Socket-level balancing for pods (`--socket-lb=all`, the default): a
//! client pod's process in the agent's cgroup reaches every kind of
//! frontend with the TC path's answers, in both families, while the TC
//! program translates none of its packets (its flow counters stay flat,
//! conntrack holds nothing of the pod). Each case checks the backend that
//! answered and the peer address the pod's socket reports (getpeername,
//! the source of a UDP reply).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use sluice::datapath::Maps;
use sluice_common::{socket::MARKS_VALID, Stat, IPPROTO_TCP, IPPROTO_UDP};
use sluice_tests::{
    agent::{Agent, ManifestDir},
    host::HostClient,
    servers, Topology,
};

/// One endpoint: address, node, and (ready, serving, terminating).
type Ep = (IpAddr, &'static str, (bool, bool, bool));

const READY: (bool, bool, bool) = (true, true, false);
const TERMINATING_SERVING: (bool, bool, bool) = (false, true, true);
const TERMINATING: (bool, bool, bool) = (false, false, true);

/// A Service `name` with one port `p` (`proto` `port` -> `target`, plus
/// `node_port`), cluster IPs `ips` (one family each), `spec` lines under
/// `spec:`, `status` after it, and one EndpointSlice per family of
/// `endpoints`.
#[allow(clippy::too_many_arguments)]
fn service(
    name: &str,
    ips: &[&str],
    spec: &str,
    status: &str,
    proto: &str,
    (port, target, node_port): (u16, u16, Option<u16>),
    endpoints: &[Ep],
) -> String {
    let families: Vec<&str> = ips
        .iter()
        .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
        .collect();
    let node_port = node_port.map_or(String::new(), |p| format!("    nodePort: {p}\n"));
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  ipFamilyPolicy: {policy}\n  ipFamilies: [{families}]\n  clusterIP: \"{first}\"\n  clusterIPs: [{ips}]\n{spec}  ports:\n  - name: p\n    protocol: {proto}\n    port: {port}\n    targetPort: {target}\n{node_port}{status}",
        policy = if ips.len() > 1 { "RequireDualStack" } else { "SingleStack" },
        families = families.join(", "),
        first = ips[0],
        ips = ips.iter().map(|i| format!("\"{i}\"")).collect::<Vec<_>>().join(", "),
    );
    for family in ["IPv4", "IPv6"] {
        if !families.contains(&family) {
            continue;
        }
        let eps: String = endpoints
            .iter()
            .filter(|(a, _, _)| a.is_ipv6() == (family == "IPv6"))
            .map(|(a, node, (r, s, t))| {
                format!(
                    "- addresses: [\"{a}\"]\n  nodeName: {node}\n  conditions: {{ready: {r}, serving: {s}, terminating: {t}}}\n"
                )
            })
            .collect();
        let eps = if eps.is_empty() {
            " []\n".to_owned()
        } else {
            format!("\n{eps}")
        };
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{f}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: {family}\nports:\n- name: p\n  protocol: {proto}\n  port: {target}\nendpoints:{eps}",
            f = family.to_lowercase(),
        ));
    }
    out
}

/// The TC path's flow counters (new flows and established packets of
/// either family).
fn tc_flows(maps: &Maps) -> Result<u64> {
    Ok(maps.stat(Stat::NewFlow)? + maps.stat(Stat::Established)? + maps.stat(Stat::Reselected)?)
}

/// Conntrack entries naming `ip` (as client or peer), both families.
fn conntrack_of(maps: &Maps, ip: IpAddr) -> usize {
    let v4 = maps
        .conntrack_v4
        .keys()
        .flatten()
        .filter(|k| IpAddr::from(k.src) == ip || IpAddr::from(k.dst) == ip)
        .count();
    let v6 = maps
        .conntrack_v6
        .keys()
        .flatten()
        .filter(|k| IpAddr::from(k.src) == ip || IpAddr::from(k.dst) == ip)
        .count();
    v4 + v6
}

fn node_yaml(topo: &Topology) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {}\n  - type: InternalIP\n    address: \"{}\"\n",
        topo.node_address(0),
        topo.node_address6(0)
    )
}

/// Connects `n` times from `client` (TCP): the set of backends reached,
/// each connection's peer checked against `peer`.
fn backends_reached(
    topo: &Topology,
    client: &sluice_tests::Pod,
    host: &str,
    port: u16,
    peer: &str,
    n: usize,
) -> Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let out = HostClient::once_in(topo, &client.ns, "tcp", host, port)?;
        ensure!(
            out.len() == 3 && out[0] == "ok" && out[2] == peer,
            "{host}:{port}: {out:?}"
        );
        seen.insert(out[1].clone());
    }
    Ok(seen)
}

/// Every kind of frontend from a pod, in both families, through its
/// sockets: ClusterIP (TCP, unconnected and connected UDP), NodePort on
/// the node's address, a load-balancer IP with externalTrafficPolicy
/// Local (the pod, inside the cluster, takes the short-circuit to a
/// backend on another node), an external IP, the pod reaching itself
/// through its service, internalTrafficPolicy Local (this node's endpoints
/// only; none: dropped, ETIMEDOUT at once), terminating backends as
/// fallback, REJECT without endpoints (ECONNREFUSED), and an `AF_INET6`
/// socket to an IPv4 service through its v4-mapped address. The TC program
/// translates none of it.
#[test]
fn pods_reach_every_kind_of_frontend_through_their_sockets() -> Result<()> {
    let mut topo = Topology::new(1, 3)?;
    topo.add_external()?;
    topo.wait_ipv6_ready()?;
    let mut servers = Vec::new();
    for pod in topo.backends.iter().chain(&topo.clients) {
        servers.push(servers::tcp_greeter(&pod.ns, 8080, &pod.name)?);
        servers.push(servers::tcp_greeter6(&pod.ns, 8080, &pod.name)?);
        servers.push(servers::udp_greeter(&pod.ns, 5353, &pod.name)?);
        servers.push(servers::udp_greeter6(&pod.ns, 5353, &pod.name)?);
    }
    let client = &topo.clients[0];
    let b = |k: usize, v6: bool| -> IpAddr {
        let pod = &topo.backends[k];
        if v6 {
            pod.ip6.into()
        } else {
            pod.ip.into()
        }
    };
    let both = |k: usize, node: &'static str, c| -> [Ep; 2] {
        [(b(k, false), node, c), (b(k, true), node, c)]
    };
    let web: Vec<Ep> = [both(0, "node-1", READY), both(1, "node-1", READY)].concat();
    let dir = ManifestDir::create()?;
    dir.write("node.yaml", &node_yaml(&topo))?;
    let tcp = (80, 8080, None);
    dir.write(
        "web.yaml",
        &service(
            "web",
            &["10.96.1.1", "fd00:96::1:1"],
            "",
            "",
            "TCP",
            tcp,
            &web,
        ),
    )?;
    dir.write(
        "dns.yaml",
        &service(
            "dns",
            &["10.96.1.2", "fd00:96::1:2"],
            "",
            "",
            "UDP",
            (53, 5353, None),
            &web,
        ),
    )?;
    dir.write(
        "np.yaml",
        &service(
            "np",
            &["10.96.1.3", "fd00:96::1:3"],
            "  type: NodePort\n",
            "",
            "TCP",
            (80, 8080, Some(30111)),
            &both(1, "node-1", READY),
        ),
    )?;
    // Load balancer, eTP Local, its only endpoint on another node: the
    // external scope is empty, the internal scope (pods, by
    // --cluster-cidr) reaches backend-2.
    dir.write(
        "lb.yaml",
        &service(
            "lb",
            &["10.96.1.4", "fd00:96::1:4"],
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  externalIPs: [\"203.0.113.5\", \"2001:db8::5\"]\n",
            "status:\n  loadBalancer:\n    ingress:\n    - ip: 203.0.113.4\n    - ip: \"2001:db8::4\"\n",
            "TCP",
            (80, 8080, Some(30112)),
            &both(2, "node-2", READY),
        ),
    )?;
    let me: Vec<Ep> = vec![
        (client.ip.into(), "node-1", READY),
        (client.ip6.into(), "node-1", READY),
    ];
    dir.write(
        "me.yaml",
        &service(
            "me",
            &["10.96.1.6", "fd00:96::1:6"],
            "",
            "",
            "TCP",
            tcp,
            &me,
        ),
    )?;
    let itp: Vec<Ep> = [both(0, "node-1", READY), both(2, "node-2", READY)].concat();
    dir.write(
        "itp.yaml",
        &service(
            "itp",
            &["10.96.1.7", "fd00:96::1:7"],
            "  internalTrafficPolicy: Local\n",
            "",
            "TCP",
            tcp,
            &itp,
        ),
    )?;
    dir.write(
        "itp-remote.yaml",
        &service(
            "itp-remote",
            &["10.96.1.8", "fd00:96::1:8"],
            "  internalTrafficPolicy: Local\n",
            "",
            "TCP",
            tcp,
            &both(2, "node-2", READY),
        ),
    )?;
    let fallback: Vec<Ep> = [
        both(0, "node-1", TERMINATING),
        both(1, "node-1", TERMINATING_SERVING),
    ]
    .concat();
    dir.write(
        "term.yaml",
        &service(
            "term",
            &["10.96.1.9", "fd00:96::1:9"],
            "",
            "",
            "TCP",
            tcp,
            &fallback,
        ),
    )?;
    dir.write(
        "empty.yaml",
        &service(
            "empty",
            &["10.96.1.10", "fd00:96::1:a"],
            "",
            "",
            "TCP",
            tcp,
            &[],
        ),
    )?;
    dir.write(
        "empty-udp.yaml",
        &service(
            "empty-udp",
            &["10.96.1.11", "fd00:96::1:b"],
            "",
            "",
            "UDP",
            (53, 5353, None),
            &[],
        ),
    )?;
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &["--cluster-cidr", "10.0.0.0/8,fd00::/8"],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    let status = agent.cli(&["status"])?;
    ensure!(status.contains("socket lb: all"), "{status}");

    let maps = || Maps::open_pinned(topo.bpf.path());
    let tc_before = tc_flows(&maps()?)?;
    let pod_before = maps()?.stat(Stat::SockPodConnect)?;
    let (node4, node6) = (topo.node_address(0), topo.node_address6(0));
    let mut balanced = 0;
    for v6 in [false, true] {
        let addr = |v4: &str, v6a: &str| if v6 { v6a.to_owned() } else { v4.to_owned() };
        let peer = |host: &str, port: u16| {
            if v6 {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        };
        // ClusterIP, TCP: both backends over a run, the VIP as peer.
        let vip = addr("10.96.1.1", "fd00:96::1:1");
        let seen = backends_reached(&topo, client, &vip, 80, &peer(&vip, 80), 16)?;
        ensure!(seen.len() == 2, "v6={v6}: {seen:?}");
        balanced += 16;
        // UDP, unconnected (DNS-like): the reply comes from the VIP, on
        // the first datagram and the next ones of the same socket.
        let dns = addr("10.96.1.2", "fd00:96::1:2");
        let mut udp = HostClient::start_in(&topo, &client.ns, "udp", &dns, 53, None)?;
        let first = udp.line()?;
        ensure!(
            first.len() == 3
                && first[0] == "ok"
                && first[1].starts_with("backend-")
                && first[2] == peer(&dns, 53),
            "v6={v6}: {first:?}"
        );
        for _ in 0..3 {
            let next = udp.exchange()?;
            ensure!(next == first, "v6={v6}: {next:?} after {first:?}");
        }
        balanced += 4;
        // A TCP socket held open: its peer is the VIP, read from its
        // `sl_socktab` slot or `sl_sock`; only the UDP socket has reverse
        // entries.
        let mut tcp = HostClient::start_in(&topo, &client.ns, "tcp", &vip, 80, None)?;
        let held = tcp.line()?;
        ensure!(
            held.len() == 3 && held[0] == "ok" && held[2] == peer(&vip, 80),
            "v6={v6}: {held:?}"
        );
        balanced += 1;
        let m = maps()?;
        let sockets: Vec<(u64, u8)> = m
            .sock_table
            .entries()
            .into_iter()
            .chain(m.sockets.iter().flatten())
            .map(|(cookie, e)| (cookie, e.proto))
            .collect();
        let revs: Vec<u64> = m.sock_rev.keys().flatten().map(|k| k.cookie).collect();
        let of = |proto: u8| sockets.iter().filter(move |(_, p)| *p == proto);
        ensure!(
            of(IPPROTO_TCP).count() >= 1 && of(IPPROTO_UDP).count() >= 1,
            "v6={v6}: sockets {sockets:?}"
        );
        ensure!(
            of(IPPROTO_TCP).all(|(c, _)| !revs.contains(c))
                && of(IPPROTO_UDP).all(|(c, _)| revs.contains(c)),
            "v6={v6}: sockets {sockets:?}, reverse entries of {revs:?}"
        );
        // The counts trusted before the closes, so that they run the
        // skipping path; `sluice status` says so.
        agent.wait_until("the counts trusted", Duration::from_secs(15), |_| {
            marks_trusted(&maps()?)
        })?;
        let status = agent.cli(&["status"])?;
        ensure!(
            status.contains("sock close: a TCP socket never balanced skips the sl_sock lookup"),
            "{status}"
        );
        drop((tcp, udp));
        // The TCP sockets' closes took their entries and their counts back
        // (`sl_sockmark`: a balanced TCP socket is counted in its cookie's
        // slot), and the counts are trusted, so that the close of a socket
        // never balanced skips the `sl_sock` lookup: the agent's scan found
        // every TCP entry counted.
        agent.wait_until(
            "the TCP sockets' entries and counts gone, the counts trusted",
            Duration::from_secs(15),
            |_| {
                let m = maps()?;
                Ok(tcp_sockets(&m).is_empty() && no_marks(&m)? && marks_trusted(&m)?)
            },
        )?;
        // UDP, connected: getpeername and the reply's source.
        let out = HostClient::once_in(&topo, &client.ns, "udpc", &dns, 53)?;
        ensure!(
            out.len() == 4
                && out[0] == "ok"
                && out[2] == peer(&dns, 53)
                && out[3] == peer(&dns, 53),
            "v6={v6}: {out:?}"
        );
        balanced += 1;
        // NodePort on the node's address.
        let node = if v6 {
            node6.to_string()
        } else {
            node4.to_string()
        };
        let seen = backends_reached(&topo, client, &node, 30111, &peer(&node, 30111), 2)?;
        ensure!(
            seen == BTreeSet::from(["backend-1".to_owned()]),
            "v6={v6}: {seen:?}"
        );
        balanced += 2;
        // Load-balancer IP, external IP and NodePort of an eTP Local
        // service whose endpoint is remote: the short-circuit.
        for (host, port) in [
            (addr("203.0.113.4", "2001:db8::4"), 80),
            (addr("203.0.113.5", "2001:db8::5"), 80),
            (node.clone(), 30112),
        ] {
            let seen = backends_reached(&topo, client, &host, port, &peer(&host, port), 2)?;
            ensure!(
                seen == BTreeSet::from(["backend-2".to_owned()]),
                "v6={v6} {host}: {seen:?}"
            );
            balanced += 2;
        }
        // The pod through its own service.
        let me = addr("10.96.1.6", "fd00:96::1:6");
        let seen = backends_reached(&topo, client, &me, 80, &peer(&me, 80), 2)?;
        ensure!(
            seen == BTreeSet::from(["client-0".to_owned()]),
            "v6={v6}: {seen:?}"
        );
        balanced += 2;
        // internalTrafficPolicy Local: this node's endpoint only.
        let itp = addr("10.96.1.7", "fd00:96::1:7");
        let seen = backends_reached(&topo, client, &itp, 80, &peer(&itp, 80), 8)?;
        ensure!(
            seen == BTreeSet::from(["backend-0".to_owned()]),
            "v6={v6}: {seen:?}"
        );
        balanced += 8;
        // ... and none on this node: dropped, said at once.
        let started = Instant::now();
        let out = HostClient::once_in(
            &topo,
            &client.ns,
            "tcp",
            &addr("10.96.1.8", "fd00:96::1:8"),
            80,
        )?;
        ensure!(out == ["error", "ETIMEDOUT"], "v6={v6}: {out:?}");
        ensure!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        // Terminating: the serving one is the fallback, never the other.
        let term = addr("10.96.1.9", "fd00:96::1:9");
        let seen = backends_reached(&topo, client, &term, 80, &peer(&term, 80), 6)?;
        ensure!(
            seen == BTreeSet::from(["backend-1".to_owned()]),
            "v6={v6}: {seen:?}"
        );
        balanced += 6;
        // No endpoints: REJECT, TCP and UDP.
        let out = HostClient::once_in(
            &topo,
            &client.ns,
            "tcp",
            &addr("10.96.1.10", "fd00:96::1:a"),
            80,
        )?;
        ensure!(out == ["error", "ECONNREFUSED"], "v6={v6}: {out:?}");
        let out = HostClient::once_in(
            &topo,
            &client.ns,
            "udpc",
            &addr("10.96.1.11", "fd00:96::1:b"),
            53,
        )?;
        ensure!(out == ["error", "ECONNREFUSED"], "v6={v6}: {out:?}");
    }
    // An AF_INET6 socket to the IPv4 ClusterIP, v4-mapped.
    let seen = backends_reached(
        &topo,
        client,
        "::ffff:10.96.1.1",
        80,
        "[::ffff:10.96.1.1]:80",
        8,
    )?;
    ensure!(
        !seen.is_empty() && seen.iter().all(|s| s.starts_with("backend-")),
        "{seen:?}"
    );
    balanced += 8;

    // None of it crossed the TC program as a service flow.
    let maps = maps()?;
    ensure!(
        tc_flows(&maps)? == tc_before,
        "the TC path translated pod traffic: {} -> {}",
        tc_before,
        tc_flows(&maps)?
    );
    ensure!(
        conntrack_of(&maps, client.ip.into()) == 0,
        "conntrack holds the pod's flows (v4)"
    );
    ensure!(
        conntrack_of(&maps, client.ip6.into()) == 0,
        "conntrack holds the pod's flows (v6)"
    );
    let pod_connects = maps.stat(Stat::SockPodConnect)? - pod_before;
    ensure!(
        pod_connects >= balanced,
        "{pod_connects} pod socket picks for {balanced} balanced calls"
    );
    drop(servers);
    Ok(())
}

/// A pod's sockets select as the TC path does: session affinity keeps a
/// pod on one backend (and a second pod is a client of its own), and a
/// Maglev frontend's table decides (proven by rewriting the table so that
/// it names a single backend).
#[test]
fn pods_select_as_the_tc_path_does() -> Result<()> {
    let topo = Topology::new(2, 3)?;
    let _tcp = servers::tcp_greeters(&topo, 8080)?;
    let eps: Vec<Ep> = topo
        .backends
        .iter()
        .map(|b| (IpAddr::from(b.ip), "node-1", READY))
        .collect();
    let dir = ManifestDir::create()?;
    let tcp = (80, 8080, None);
    dir.write(
        "sticky.yaml",
        &service(
            "sticky",
            &["10.96.2.1"],
            "  sessionAffinity: ClientIP\n",
            "",
            "TCP",
            tcp,
            &eps,
        ),
    )?;
    dir.write(
        "maglev.yaml",
        &service("maglev", &["10.96.2.2"], "", "", "TCP", tcp, &eps).replacen(
            "  namespace: default\n",
            "  namespace: default\n  annotations:\n    service.sluice.dev/lb-algorithm: maglev\n",
            1,
        ),
    )?;
    let agent = {
        let mut a = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
        a.wait_ready(Duration::from_secs(20))?;
        a
    };
    let maps = || Maps::open_pinned(topo.bpf.path());
    let tc_before = tc_flows(&maps()?)?;
    let hits = maps()?.stat(Stat::AffinityHit)?;

    for client in &topo.clients {
        let seen = backends_reached(&topo, client, "10.96.2.1", 80, "10.96.2.1:80", 8)?;
        ensure!(
            seen.len() == 1,
            "{}: affinity not kept: {seen:?}",
            client.name
        );
    }
    ensure!(
        maps()?.stat(Stat::AffinityHit)? >= hits + 14,
        "affinity hits not counted"
    );
    // Each pod is its own client: two affinity entries for the frontend.
    let entries = maps()?
        .affinity_v4
        .keys()
        .flatten()
        .filter(|k| k.frontend == [10, 96, 2, 1])
        .count();
    ensure!(entries == 2, "{entries} affinity entries for two pods");

    let b2 = format!("{}:8080", topo.backends[2].ip);
    let rows: serde_json::Value = serde_json::from_str(&agent.cli(&["lb", "list", "--json"])?)?;
    let b2_id = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["frontend"] == "10.96.2.2:80")
        .flat_map(|r| r["backends"].as_array().cloned().unwrap_or_default())
        .find(|b| b["address"] == b2.as_str())
        .and_then(|b| b["id"].as_u64())
        .context("backend-2 of the maglev frontend not listed")?;
    let key = sluice_common::Svc4Key::new([10, 96, 2, 2], 80, sluice_common::IPPROTO_TCP, 0);
    let mut table = Box::new(sluice_common::MaglevTable::default());
    table.backends.fill(u32::try_from(b2_id)?);
    maps()?.maglev_v4.insert(key, *table, 0)?;
    let seen = backends_reached(&topo, &topo.clients[0], "10.96.2.2", 80, "10.96.2.2:80", 8)?;
    ensure!(seen == BTreeSet::from(["backend-2".to_owned()]), "{seen:?}");
    ensure!(
        tc_flows(&maps()?)? == tc_before,
        "the TC path translated pod traffic"
    );
    Ok(())
}

/// `--socket-lb=host` (and its old spelling `true`) is the service-mesh
/// option: pods' sockets are left alone, so their packets carry the
/// service address to the TC path, which balances them (conntrack holds
/// the flow); the node's own sockets are still balanced at connect().
/// `sluice status` says the mode.
#[test]
fn host_mode_leaves_pods_to_the_tc_path() -> Result<()> {
    let mut topo = Topology::new(1, 2)?;
    topo.add_external()?;
    let _tcp = servers::tcp_greeters(&topo, 8080)?;
    let eps: Vec<Ep> = topo
        .backends
        .iter()
        .map(|b| (IpAddr::from(b.ip), "node-1", READY))
        .collect();
    let dir = ManifestDir::create()?;
    dir.write(
        "web.yaml",
        &service("web", &["10.96.3.1"], "", "", "TCP", (80, 8080, None), &eps),
    )?;
    let maps = || Maps::open_pinned(topo.bpf.path());
    for (flag, legacy) in [("host", false), ("true", true)] {
        let mut agent = Agent::start(
            &topo,
            &format!("dir:{}", dir.path().display()),
            &[&format!("--socket-lb={flag}")],
        )?;
        agent.wait_ready(Duration::from_secs(20))?;
        let status = agent.cli(&["status"])?;
        ensure!(status.contains("socket lb: host"), "{flag}: {status}");
        ensure!(
            agent.log().contains("deprecated") == legacy,
            "{flag}: deprecation line"
        );
        let (new_flows, pod_picks, node_picks) = {
            let m = maps()?;
            (
                m.stat(Stat::NewFlow)?,
                m.stat(Stat::SockPodConnect)?,
                m.stat(Stat::SockConnect)?,
            )
        };
        let client = &topo.clients[0];
        let seen = backends_reached(&topo, client, "10.96.3.1", 80, "10.96.3.1:80", 4)?;
        ensure!(seen.iter().all(|s| s.starts_with("backend-")), "{seen:?}");
        let m = maps()?;
        ensure!(
            m.stat(Stat::NewFlow)? >= new_flows + 4,
            "{flag}: the TC path did not balance the pod"
        );
        ensure!(
            m.stat(Stat::SockPodConnect)? == pod_picks,
            "{flag}: a pod socket was balanced"
        );
        ensure!(
            conntrack_of(&m, client.ip.into()) > 0,
            "{flag}: no conntrack entry of the pod"
        );
        // The node's own processes keep socket balancing.
        let out = HostClient::once(&topo, "tcp", "10.96.3.1", 80)?;
        ensure!(
            out.len() == 3 && out[0] == "ok" && out[2] == "10.96.3.1:80",
            "{out:?}"
        );
        ensure!(
            maps()?.stat(Stat::SockConnect)? > node_picks,
            "{flag}: node socket not balanced"
        );
        agent.stop()?;
    }
    // off: nothing attached, pods and node through TC.
    ensure!(
        maps()?.sock_picks_v4.keys().count() == 1,
        "host mode keeps the frontend's one-lookup entry"
    );
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &["--socket-lb=off"],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    let status = agent.cli(&["status"])?;
    ensure!(status.contains("socket lb: off"), "{status}");
    // No socket program reads the frontends' one-lookup entries: the ones
    // the agents before wrote are gone, and none is written.
    ensure!(
        status.contains("sock picks: off, no socket-level balancing (0 entries"),
        "{status}"
    );
    ensure!(
        maps()?.sock_picks_v4.keys().count() == 0,
        "entries kept under --socket-lb=off"
    );
    Ok(())
}

/// A UDP service at `vip`:53 on every backend of `topo` (port 5353): the
/// greeters (held while they serve) and the manifest directory.
fn dns_on_every_backend(topo: &Topology, vip: &str) -> Result<(Vec<servers::Server>, ManifestDir)> {
    let greeters = topo
        .backends
        .iter()
        .map(|b| servers::udp_greeter(&b.ns, 5353, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let all: Vec<_> = topo.backends.iter().collect();
    let dir = ManifestDir::create()?;
    dir.write(
        "dns.yaml",
        &service("dns", &[vip], "", "", "UDP", (53, 5353, None), &ready(&all)),
    )?;
    Ok((greeters, dir))
}

/// `pods` as ready endpoints on node-1 (IPv4).
fn ready(pods: &[&sluice_tests::Pod]) -> Vec<Ep> {
    pods.iter()
        .map(|p| (IpAddr::from(p.ip), "node-1", READY))
        .collect()
}

/// One client and two backends, each greeting on TCP 8080, and a
/// manifest directory with the node and service `web` at `vip` on both.
fn web_on_every_backend(vip: &str) -> Result<(Topology, Vec<servers::Server>, ManifestDir)> {
    let topo = Topology::new(1, 2)?;
    let servers = servers::tcp_greeters(&topo, 8080)?;
    let all: Vec<_> = topo.backends.iter().collect();
    let dir = ManifestDir::create()?;
    dir.write("node.yaml", &node_yaml(&topo))?;
    dir.write("web.yaml", &web_service(vip, &all))?;
    Ok((topo, servers, dir))
}

/// Service `web` at `vip` (TCP 80 -> 8080), `pods` its endpoints.
fn web_service(vip: &str, pods: &[&sluice_tests::Pod]) -> String {
    service("web", &[vip], "", "", "TCP", (80, 8080, None), &ready(pods))
}

/// The TCP sockets' entries: `sl_socktab`'s, then `sl_sock`'s.
fn tcp_sockets(maps: &Maps) -> Vec<(u64, sluice_common::SockEntry)> {
    maps.sock_table
        .entries()
        .into_iter()
        .chain(sl_sock_tcp(maps))
        .collect()
}

/// The TCP entries of `sl_sock`.
fn sl_sock_tcp(maps: &Maps) -> Vec<(u64, sluice_common::SockEntry)> {
    maps.sockets
        .iter()
        .flatten()
        .filter(|(_, e)| e.proto == IPPROTO_TCP)
        .collect()
}

/// Takes every free `sl_socktab` slot for a socket that does not exist
/// (cookies from `u64::MAX` down, far above any the kernel hands out;
/// with `SOCK_SLOT_BUSY` set, so the agent's scans and moves pass them
/// by, whatever their other bits), so that the next sockets go to `sl_sock`; `free_table` gives them
/// back.
fn fill_table(topo: &Topology) -> Result<()> {
    let mut table = table_array(topo)?;
    for i in 0..sluice_common::maps::SOCK_TABLE_SLOTS {
        if table.get(&i, 0)?.cookie == 0 {
            let slot = sluice_common::SockSlot {
                cookie: u64::MAX - u64::from(i),
                ..Default::default()
            };
            table.set(i, slot, 0)?;
        }
    }
    Ok(())
}

/// Sets `SOCK_SLOT_MOVING` on the slot `cookie` holds, as the agent does
/// while it moves the slot into `sl_sock`.
fn mark_moving(topo: &Topology, cookie: u64) -> Result<()> {
    let mut table = table_array(topo)?;
    let index = sluice_common::socket::table_slot(cookie);
    let mut slot = table.get(&index, 0)?;
    ensure!(slot.cookie == cookie, "slot {index}: {slot:?}");
    slot.cookie |= sluice_common::socket::SOCK_SLOT_MOVING;
    table.set(index, slot, 0)?;
    Ok(())
}

/// The non-zero cookie words of `sl_socktab` (whatever their bits).
fn table_words(topo: &Topology) -> Result<Vec<(u32, u64)>> {
    let table = table_array(topo)?;
    let mut out = Vec::new();
    for i in 0..sluice_common::maps::SOCK_TABLE_SLOTS {
        let word = table.get(&i, 0)?.cookie;
        if word != 0 {
            out.push((i, word));
        }
    }
    Ok(out)
}

/// Gives back the slots `fill_table` took.
fn free_table(topo: &Topology) -> Result<()> {
    let mut table = table_array(topo)?;
    for i in 0..sluice_common::maps::SOCK_TABLE_SLOTS {
        if table.get(&i, 0)?.cookie == u64::MAX - u64::from(i) {
            table.set(i, sluice_common::SockSlot::default(), 0)?;
        }
    }
    Ok(())
}

fn table_array(
    topo: &Topology,
) -> Result<aya::maps::Array<aya::maps::MapData, sluice_common::SockSlot>> {
    let data = aya::maps::MapData::from_pin(topo.bpf.path().join(sluice_common::maps::SOCK_TABLE))?;
    Ok(aya::maps::Array::try_from(aya::maps::Map::Array(data))?)
}

/// Whether `sl_sockmark`'s counts are trusted (its validity word).
fn marks_trusted(maps: &Maps) -> Result<bool> {
    Ok(maps.sock_marks.get(&MARKS_VALID, 0)? == 1)
}

/// Whether every `sl_sockmark` slot counts no socket.
fn no_marks(maps: &Maps) -> Result<bool> {
    Ok(maps.sock_marks()?.iter().all(|c| *c == 0))
}

/// `n` unconnected UDP sockets of the first client pod, bound to its
/// address, each after one exchange with `vip`:53: with the backend that
/// answered.
fn udp_flows(topo: &Topology, vip: &str, n: usize) -> Result<Vec<(HostClient, String)>> {
    let client = &topo.clients[0];
    let bind = client.ip.to_string();
    let mut flows = Vec::new();
    for _ in 0..n {
        let mut c = HostClient::start_in(topo, &client.ns, "udp", vip, 53, Some(&bind))?;
        let first = c.line()?;
        ensure!(
            first.len() == 3 && first[0] == "ok" && first[2] == format!("{vip}:53"),
            "{first:?}"
        );
        flows.push((c, first[1].clone()));
    }
    Ok(flows)
}

/// Two more exchanges on each of `flows`: the same backend answers, as
/// `vip`:53.
fn same_backends(flows: &mut [(HostClient, String)], vip: &str) -> Result<()> {
    let peer = format!("{vip}:53");
    for (c, backend) in flows {
        for _ in 0..2 {
            let out = c.exchange()?;
            ensure!(
                out == ["ok", backend.as_str(), peer.as_str()],
                "{out:?}, was {backend}"
            );
        }
    }
    Ok(())
}

/// A UDP flow that began on the TC path (`--socket-lb=host`) keeps its
/// backend once the agent restarts with socket balancing for pods: its
/// datagrams are left to the TC path while their conntrack entry lives
/// (`sock_left_to_tc`), and only new sockets are balanced at the socket.
/// Six flows over four backends: that all six keep their backend by
/// chance is unlikely (1 in 4096).
#[test]
fn a_udp_flow_that_began_on_the_tc_path_keeps_its_backend() -> Result<()> {
    let topo = Topology::new(1, 4)?;
    let (_udp, dir) = dns_on_every_backend(&topo, "10.96.4.1")?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    let bin = sluice_tests::agent::binary()?;
    agent.wait_ready(Duration::from_secs(20))?;
    agent.replace(&topo.node, &bin, &[("SLUICE_SOCKET_LB", "host")])?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(agent.cli(&["status"])?.contains("socket lb: host"));
    let client = &topo.clients[0];
    let mut flows = udp_flows(&topo, "10.96.4.1", 6)?;
    // A connected socket too: its datagrams never meet `sendmsg4`.
    let mut connected = HostClient::start_in(&topo, &client.ns, "udpc", "10.96.4.1", 53, None)?;
    let first = connected.line()?;
    ensure!(
        first.len() == 4 && first[0] == "ok" && first[2] == "10.96.4.1:53",
        "{first:?}"
    );
    let maps = || Maps::open_pinned(topo.bpf.path());
    ensure!(
        conntrack_of(&maps()?, client.ip.into()) > 0,
        "the flows are not on the TC path"
    );

    // The pods' devices run `sl_egress_pod` now, which must keep turning
    // these flows' replies back: the bit stays clear while they live.
    agent.replace(
        &topo.node,
        &bin,
        &[
            ("SLUICE_SOCKET_LB", "all"),
            ("SLUICE_POD_DEVICES", "c*,b*"),
            ("SLUICE_CLUSTER_CIDR", "10.0.0.0/8,fd00::/8"),
            ("SLUICE_CONNTRACK_GC_INTERVAL", "200ms"),
        ],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(agent.cli(&["status"])?.contains("socket lb: all"));
    ensure!(tcx_program(&topo, "c0", sluice_tests::bpf::BPF_TCX_EGRESS)? == "sl_egress_pod");
    // A scan has seen the flows (the gauge is set by scans only).
    agent.wait_until("a conntrack scan", Duration::from_secs(10), |a| {
        Ok(a.metric("sluice_conntrack_entries")? >= 12.0)
    })?;
    ensure!(!pods_bit(&topo)?, "set while flows of the TC path live");
    let left = maps()?.stat(Stat::SockLeftToTc)?;
    same_backends(&mut flows, "10.96.4.1")?;
    ensure!(
        maps()?.stat(Stat::SockLeftToTc)? >= left + 12,
        "old flows not left to TC"
    );
    // A new socket is balanced at the socket.
    let picks = maps()?.stat(Stat::SockPodConnect)?;
    let out = HostClient::once_in(&topo, &client.ns, "udp", "10.96.4.1", 53)?;
    ensure!(
        out.len() == 3 && out[0] == "ok" && out[2] == "10.96.4.1:53",
        "{out:?}"
    );
    ensure!(
        maps()?.stat(Stat::SockPodConnect)? > picks,
        "new socket not balanced"
    );
    ensure!(!pods_bit(&topo)?, "set while flows of the TC path live");

    // The old sockets outlive their entries (as after 60 s idle): the bit
    // is set once they are gone, and the sockets' next datagrams start
    // flows on the TC path again, for which the datapath takes it away
    // before their replies come.
    let m = maps()?;
    let mine: Vec<_> = m
        .conntrack_v4
        .keys()
        .flatten()
        .filter(|k| {
            IpAddr::from(k.src) == IpAddr::from(client.ip)
                || IpAddr::from(k.dst) == IpAddr::from(client.ip)
        })
        .collect();
    let mut ct = m.conntrack_v4;
    for k in &mine {
        let _ = ct.remove(k);
    }
    agent.wait_until("the pods' bit", Duration::from_secs(10), |_| {
        pods_bit(&topo)
    })?;
    // A reply from the backend's own address would not reach a connected
    // socket: this one must be turned back at c0.
    let out = connected.exchange()?;
    ensure!(
        out.len() == 3 && out[0] == "ok" && out[2] == "10.96.4.1:53",
        "{out:?}"
    );
    ensure!(!pods_bit(&topo)?, "the datapath left the bit set");
    // Its new entry is marked a pod's, so no scan sets the bit while it
    // lives.
    let marked = maps()?.conntrack_v4.iter().flatten().any(|(k, e)| {
        IpAddr::from(k.src) == IpAddr::from(client.ip)
            && e.kind == sluice_common::CtKind::Forward as u8
            && e.flags & sluice_common::conntrack::CT_F_POD != 0
    });
    if !marked {
        let dump: Vec<_> = maps()?.conntrack_v4.iter().flatten().collect();
        bail!("the pod's new flow on the TC path is not marked: {dump:?}");
    }
    // (The unconnected sockets are balanced at `sendmsg` now.)
    for (c, _) in &mut flows {
        let out = c.exchange()?;
        ensure!(
            out.len() == 3 && out[0] == "ok" && out[2] == "10.96.4.1:53",
            "{out:?}"
        );
    }
    Ok(())
}

/// The name of the program on `device`'s TCX hook `attach_type` (one link).
fn tcx_program(topo: &Topology, device: &str, attach_type: u32) -> Result<String> {
    let links = sluice_tests::bpf::tcx_links(&topo.node, device, attach_type)?;
    ensure!(links.len() == 1, "{device}: links {links:?}");
    let programs = sluice_tests::bpf::programs()?;
    Ok(programs
        .get(&links[0].1)
        .map(|(name, _)| name.clone())
        .unwrap_or_default())
}

fn pods_bit(topo: &Topology) -> Result<bool> {
    let flags = Maps::open_pinned(topo.bpf.path())?.config()?.flags();
    Ok(flags & sluice_common::config::CFG_F_PODS_ON_SOCKETS != 0)
}

/// With `--pod-devices`, the pods' devices run `sl_egress_pod` at egress,
/// which lets packets towards pods pass without a look once every pod's
/// flow is the sockets' (`CFG_F_PODS_ON_SOCKETS`). Pods still reach
/// services through their sockets; an outside client reaches a node port
/// whose backend is a local pod (the reply turned back at the uplink's
/// `sl_egress`); a frontend the sockets leave to the TC path for pods
/// (source ranges) clears the bit before it is written, and a pod then
/// reaches it through the TC path, its replies turned back at its device.
#[test]
fn pod_devices_pass_replies_while_every_pod_flow_is_the_sockets() -> Result<()> {
    use sluice_tests::bpf::{BPF_TCX_EGRESS, BPF_TCX_INGRESS};
    let mut topo = Topology::new(1, 2)?;
    topo.add_external()?;
    let _servers = servers::tcp_greeters(&topo, 8080)?;
    let b = |k: usize| -> IpAddr { topo.backends[k].ip.into() };
    let dir = ManifestDir::create()?;
    dir.write("node.yaml", &node_yaml(&topo))?;
    let tcp = (80, 8080, None);
    dir.write(
        "web.yaml",
        &service(
            "web",
            &["10.96.5.1"],
            "",
            "",
            "TCP",
            tcp,
            &[(b(0), "node-1", READY), (b(1), "node-1", READY)],
        ),
    )?;
    dir.write(
        "np.yaml",
        &service(
            "np",
            &["10.96.5.2"],
            "  type: NodePort\n  externalTrafficPolicy: Local\n",
            "",
            "TCP",
            (80, 8080, Some(30121)),
            &[(b(0), "node-1", READY)],
        ),
    )?;
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &[
            "--pod-devices",
            "c*,b*",
            "--cluster-cidr",
            "10.0.0.0/8,fd00::/8",
            "--conntrack-gc-interval",
            "200ms",
        ],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    for dev in ["c0", "b0", "b1"] {
        ensure!(tcx_program(&topo, dev, BPF_TCX_EGRESS)? == "sl_egress_pod");
        ensure!(tcx_program(&topo, dev, BPF_TCX_INGRESS)? == "sl_ingress");
    }
    ensure!(tcx_program(&topo, "e0", BPF_TCX_EGRESS)? == "sl_egress");
    agent.wait_until("the pods' bit", Duration::from_secs(10), |_| {
        pods_bit(&topo)
    })?;
    ensure!(agent
        .cli(&["status"])?
        .contains("pass replies without a look"));

    let client = &topo.clients[0];
    let maps = || Maps::open_pinned(topo.bpf.path());
    let seen = backends_reached(&topo, client, "10.96.5.1", 80, "10.96.5.1:80", 12)?;
    ensure!(seen.len() == 2, "{seen:?}");
    ensure!(conntrack_of(&maps()?, client.ip.into()) == 0);
    // An outside client: DNAT at e0's ingress, the reply from b0 turned
    // back at e0's egress (a connection needs the SYN-ACK from the node).
    let ext = &topo.externals[0];
    let np = std::net::SocketAddrV4::new(topo.node_address(0), 30121);
    for _ in 0..3 {
        ensure!(sluice_tests::clients::tcp_hello(&ext.ns, np)? == "backend-0");
    }

    // Source ranges: the sockets leave it to the TC path for pods. Policy
    // Local, so not SNATed: the reply is turned back at c0's egress.
    dir.write(
        "lb.yaml",
        &service(
            "lb",
            &["10.96.5.3"],
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  loadBalancerSourceRanges: [\"10.10.0.0/16\"]\n",
            "status:\n  loadBalancer:\n    ingress:\n    - ip: 203.0.113.9\n",
            "TCP",
            tcp,
            &[(b(1), "node-1", READY)],
        ),
    )?;
    let master = sluice_common::Svc4Key::new([203, 0, 113, 9], 80, IPPROTO_TCP, 0);
    agent.wait_until(
        "the source-ranged frontend",
        Duration::from_secs(10),
        |_| {
            let programmed = maps()?.services_v4.get(&master, 0).is_ok();
            // Never written while the bit is set.
            ensure!(
                !(programmed && pods_bit(&topo)?),
                "frontend written with the bit set"
            );
            Ok(programmed)
        },
    )?;
    let left = maps()?.stat(Stat::SockLeftToTc)?;
    let out = HostClient::once_in(&topo, &client.ns, "tcp", "203.0.113.9", 80)?;
    ensure!(out == ["ok", "backend-1", "203.0.113.9:80"], "{out:?}");
    ensure!(
        maps()?.stat(Stat::SockLeftToTc)? > left,
        "not left to the TC path"
    );
    ensure!(!pods_bit(&topo)?);
    // Other services still go through the sockets meanwhile.
    let seen = backends_reached(&topo, client, "10.96.5.1", 80, "10.96.5.1:80", 6)?;
    ensure!(!seen.is_empty());
    Ok(())
}

/// A rollback to 0.1.0, which balances only the node's sockets and never
/// looks at `CFG_F_PODS_ON_SOCKETS`, leaves the bit set while the pods'
/// flows go through its TC path. The upgrade back finds 0.1.0's
/// `sl_egress` in the pods' links, so it does not trust the bit: it clears
/// it before its `sl_egress_pod` runs, and those flows keep their reverse
/// NAT.
#[test]
fn a_bit_set_before_a_rollback_to_0_1_0_is_not_trusted_after_it() -> Result<()> {
    let topo = Topology::new(1, 3)?;
    let (_udp, dir) = dns_on_every_backend(&topo, "10.96.6.1")?;
    let source = format!("dir:{}", dir.path().display());
    // Options as environment, which 0.1.0 ignores where it has no option.
    let pods = [
        ("SLUICE_POD_DEVICES", "c*,b*"),
        ("SLUICE_CLUSTER_CIDR", "10.0.0.0/8,fd00::/8"),
        ("SLUICE_CONNTRACK_GC_INTERVAL", "200ms"),
    ];
    let bin = sluice_tests::agent::binary()?;
    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    agent.replace(&topo.node, &bin, &pods)?;
    agent.wait_ready(Duration::from_secs(20))?;
    agent.wait_until("the pods' bit", Duration::from_secs(10), |_| {
        pods_bit(&topo)
    })?;

    let old = sluice_tests::agent::release_binary("0.1.0")?;
    agent.replace(&topo.node, &old, &pods)?;
    agent.wait_ready(Duration::from_secs(20))?;
    let egress = sluice_tests::bpf::BPF_TCX_EGRESS;
    ensure!(tcx_program(&topo, "c0", egress)? == "sl_egress");
    ensure!(pods_bit(&topo)?, "0.1.0 left the word as it found it");
    let client = &topo.clients[0];
    let mut flows = udp_flows(&topo, "10.96.6.1", 4)?;
    let maps = || Maps::open_pinned(topo.bpf.path());
    ensure!(
        conntrack_of(&maps()?, client.ip.into()) > 0,
        "0.1.0 did not balance the pod on the TC path"
    );

    agent.replace(&topo.node, &bin, &pods)?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(tcx_program(&topo, "c0", egress)? == "sl_egress_pod");
    ensure!(!pods_bit(&topo)?, "a bit from before 0.1.0 ran was trusted");
    same_backends(&mut flows, "10.96.6.1")?;
    agent.wait_until("a conntrack scan", Duration::from_secs(10), |a| {
        Ok(a.metric("sluice_conntrack_entries")? >= 8.0)
    })?;
    ensure!(!pods_bit(&topo)?, "set while flows of the TC path live");
    Ok(())
}

/// A TCP socket that 0.1.0 balanced is looked up in `sl_sock` at its close
/// after the upgrade back, although `sl_sockmark`'s counts were trusted
/// before the rollback: 0.1.0 knows nothing of the counts, so its entry is
/// uncounted and its slot may count none. A stopping agent clears the
/// counts' validity; one that crashed leaves it (as here), and the loader
/// clears it at every start; the agent trusts the counts again only once
/// no uncounted TCP entry is left. (Were the stale validity kept, the
/// close would skip the lookup and the entry would outlive its socket.)
#[test]
fn a_tcp_socket_0_1_0_balanced_is_cleaned_at_its_close_after_the_upgrade() -> Result<()> {
    let (topo, _servers, dir) = web_on_every_backend("10.96.7.1")?;
    let source = format!("dir:{}", dir.path().display());
    let env = [("SLUICE_CONNTRACK_GC_INTERVAL", "200ms")];
    let maps = || Maps::open_pinned(topo.bpf.path());
    let valid = || marks_trusted(&maps()?);
    let bin = sluice_tests::agent::binary()?;
    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    agent.replace(&topo.node, &bin, &env)?;
    agent.wait_ready(Duration::from_secs(20))?;
    agent.wait_until("the counts trusted", Duration::from_secs(10), |_| valid())?;

    // A crash, then the rollback.
    agent.kill9();
    let old = sluice_tests::agent::release_binary("0.1.0")?;
    agent.replace(&topo.node, &old, &env)?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(valid()?, "0.1.0 left the validity word as the crash did");
    // The node's own socket, balanced by 0.1.0 and held open.
    let mut tcp = HostClient::start(&topo, "tcp", "10.96.7.1", 80)?;
    let held = tcp.line()?;
    ensure!(held.len() == 3 && held[0] == "ok", "{held:?}");
    let tcp_entries = || -> Result<_> { Ok(tcp_sockets(&maps()?)) };
    let entries = tcp_entries()?;
    ensure!(
        entries.len() == 1 && !entries[0].1.counted(),
        "0.1.0's entry: {entries:?}"
    );

    agent.replace(&topo.node, &bin, &env)?;
    agent.wait_ready(Duration::from_secs(20))?;
    // Scans every 200 ms: five of them find 0.1.0's entry.
    std::thread::sleep(Duration::from_secs(1));
    ensure!(!valid()?, "trusted while 0.1.0's socket lives");
    let status = agent.cli(&["status"])?;
    ensure!(
        status.contains("sock close: every TCP socket is looked up in sl_sock"),
        "{status}"
    );
    drop(tcp);
    agent.wait_until(
        "0.1.0's entry gone at its socket's close",
        Duration::from_secs(10),
        |_| Ok(tcp_entries()?.is_empty()),
    )?;
    agent.wait_until("the counts trusted again", Duration::from_secs(10), |_| {
        valid()
    })?;
    // A socket balanced now is counted, and its close takes the count back.
    let out = HostClient::once(&topo, "tcp", "10.96.7.1", 80)?;
    ensure!(out.len() == 3 && out[0] == "ok", "{out:?}");
    agent.wait_until(
        "the new socket's entry and count gone",
        Duration::from_secs(10),
        |_| Ok(tcp_entries()?.is_empty() && no_marks(&maps()?)?),
    )?;
    // A stopping agent takes the validity away for the next one.
    agent.stop()?;
    ensure!(!valid()?, "still trusted after the agent stopped");
    Ok(())
}

/// A balanced TCP socket takes its cookie's `sl_socktab` slot while the
/// counts are trusted (no `sl_sock` entry: no hash insert at connect, no
/// hash delete at close), is counted in `sl_sockmark`, reads the VIP as
/// its peer, and gives slot and count back at its close. A stopping agent
/// takes the counts' validity away and moves the table into `sl_sock`
/// (where an older release looks); the socket keeps its peer, and the
/// next agent leaves it there and puts new sockets in the table again.
/// After a crash the programs still use the table, and the next agent's
/// loader moves it, a slot the crashed agent was moving included; a
/// socket that closes while its slot is being moved takes it back with
/// its count. A socket whose slot is taken goes to `sl_sock` with the
/// same answers. Every close gives its entry and its count back.
#[test]
fn tcp_sockets_live_in_the_socket_table_and_move_to_sl_sock_when_the_agent_stops() -> Result<()> {
    let vip = "10.96.9.1";
    let (topo, _servers, dir) = web_on_every_backend(vip)?;
    let source = format!("dir:{}", dir.path().display());
    let env = [("SLUICE_CONNTRACK_GC_INTERVAL", "200ms")];
    let maps = || Maps::open_pinned(topo.bpf.path());
    let bin = sluice_tests::agent::binary()?;
    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.replace(&topo.node, &bin, &env)?;
    agent.wait_ready(Duration::from_secs(20))?;
    let trusted = |agent: &mut Agent| {
        agent.wait_until("the counts trusted", Duration::from_secs(15), |_| {
            marks_trusted(&maps()?)
        })
    };
    trusted(&mut agent)?;
    let peer = format!("{vip}:80");
    let connect = || -> Result<HostClient> {
        let mut c = HostClient::start(&topo, "tcp", vip, 80)?;
        let held = c.line()?;
        ensure!(
            held.len() == 3 && held[0] == "ok" && held[2] == peer,
            "{held:?}"
        );
        Ok(c)
    };
    let marks = || -> Result<u64> { Ok(maps()?.sock_marks()?.iter().sum()) };
    // Where the sockets are: (table, sl_sock) TCP entries.
    let places = || -> Result<(usize, usize)> {
        let m = maps()?;
        Ok((m.sock_table.entries().len(), sl_sock_tcp(&m).len()))
    };

    // Two sockets in the table; one closes and gives slot and count back.
    let a = connect()?;
    let mut b = connect()?;
    ensure!(places()? == (2, 0), "{:?}", places()?);
    ensure!(marks()? == 2);
    let entries = maps()?.sock_table.entries();
    ensure!(
        entries.iter().all(|(_, e)| e.counted()
            && e.proto == IPPROTO_TCP
            && e.frontend_port == 80
            && e.frontend[..4] == [10, 96, 9, 1]),
        "{entries:?}"
    );
    let status = agent.cli(&["status"])?;
    ensure!(
        status.contains("sock table: 2 of 65536 sl_socktab slots hold a TCP socket"),
        "{status}"
    );
    agent.wait_until("the table's fill gauge", Duration::from_secs(10), |a| {
        // Set by each scan (every 200 ms here).
        let ratio = a
            .metric("sluice_map_fill_ratio{map=\"sl_socktab\"}")
            .unwrap_or(0.0);
        Ok((ratio * 65536.0).round() == 2.0)
    })?;
    drop(a);
    agent.wait_until("a's slot and count back", Duration::from_secs(10), |_| {
        Ok(places()? == (1, 0) && marks()? == 1)
    })?;
    let (cookie, entry) = maps()?.sock_table.entries()[0];

    // The agent stops: the table moves into `sl_sock`, counted.
    agent.stop()?;
    let m = maps()?;
    ensure!(!marks_trusted(&m)?, "still trusted after the agent stopped");
    ensure!(
        m.sock_table.entries().is_empty() && sl_sock_tcp(&m) == vec![(cookie, entry)],
        "table {:?}, sl_sock {:?}",
        m.sock_table.entries(),
        sl_sock_tcp(&m)
    );
    ensure!(marks()? == 1);
    ensure!(b.ping_peer()? == peer, "b's peer after the move");

    // The next agent: b stays in `sl_sock`; new sockets take slots once
    // the counts are trusted again.
    agent.replace(&topo.node, &bin, &env)?;
    agent.wait_ready(Duration::from_secs(20))?;
    trusted(&mut agent)?;
    let c = connect()?;
    let mut d = connect()?;
    ensure!(places()? == (2, 1), "{:?}", places()?);
    ensure!(b.ping_peer()? == peer && d.ping_peer()? == peer);

    // A crash leaves the validity set, and the programs keep the table:
    // c closes and gives its slot back; the next agent's loader takes the
    // validity away and moves d.
    agent.kill9();
    ensure!(marks_trusted(&maps()?)?);
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while places()? != (1, 1) || marks()? != 2 {
        ensure!(
            std::time::Instant::now() < deadline,
            "c's close: {:?}, {} counted",
            places()?,
            marks()?
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // d's slot as an agent that crashed while it moved it left it: the
    // next loader takes the move up.
    let (d_cookie, _) = maps()?.sock_table.entries()[0];
    mark_moving(&topo, d_cookie)?;
    ensure!(d.ping_peer()? == peer, "d's peer while its slot moves");
    agent.replace(&topo.node, &bin, &env)?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(places()? == (0, 2), "{:?}", places()?);
    ensure!(table_words(&topo)?.is_empty(), "a slot left behind");
    ensure!(b.ping_peer()? == peer && d.ping_peer()? == peer);
    trusted(&mut agent)?;

    // A socket that closes while the agent moves its slot takes the slot
    // and its count back.
    let mut f = connect()?;
    ensure!(places()? == (1, 2), "{:?}", places()?);
    let (f_cookie, _) = maps()?.sock_table.entries()[0];
    mark_moving(&topo, f_cookie)?;
    ensure!(f.ping_peer()? == peer, "f's peer while its slot moves");
    ensure!(marks()? == 3);
    drop(f);
    agent.wait_until("f's slot and count back", Duration::from_secs(10), |_| {
        Ok(table_words(&topo)?.is_empty() && marks()? == 2)
    })?;

    // A socket whose slot is taken: `sl_sock`, with the same answers.
    fill_table(&topo)?;
    let mut e = connect()?;
    ensure!(places()? == (0, 3), "{:?}", places()?);
    ensure!(e.ping_peer()? == peer);
    free_table(&topo)?;
    ensure!(marks()? == 3);

    // Every close gives its entry and its count back.
    drop((b, d, e));
    agent.wait_until(
        "every entry and count gone",
        Duration::from_secs(10),
        |_| {
            let m = maps()?;
            Ok(tcp_sockets(&m).is_empty() && no_marks(&m)?)
        },
    )?;
    ensure!(marks_trusted(&maps()?)?, "the counts lost their validity");
    Ok(())
}

/// A balanced TCP socket outlives its backend (removed, and past the
/// drain timeout): the agent's scan does not delete its `sl_sock` entry
/// but orphans it (backend and service 0, so no backend counts it), so
/// that the socket's close still finds the entry and takes its count in
/// `sl_sockmark` back. Deleting it would leave the count too high for
/// good: its slot would never again spare a release the lookup.
#[test]
fn a_socket_whose_backend_is_gone_gives_its_count_back_at_its_close() -> Result<()> {
    let (topo, _servers, dir) = web_on_every_backend("10.96.8.1")?;
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &["--drain-timeout", "1s", "--conntrack-gc-interval", "200ms"],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    let maps = || Maps::open_pinned(topo.bpf.path());
    // Every `sl_socktab` slot taken: the socket goes to `sl_sock`, whose
    // entries the scan can rewrite (a table entry stays as it is).
    agent.wait_until("the counts trusted", Duration::from_secs(15), |_| {
        marks_trusted(&maps()?)
    })?;
    fill_table(&topo)?;
    let mut tcp = HostClient::start(&topo, "tcp", "10.96.8.1", 80)?;
    let held = tcp.line()?;
    ensure!(held.len() == 3 && held[0] == "ok", "{held:?}");
    ensure!(
        sl_sock_tcp(&maps()?).len() == 1,
        "{:?}",
        tcp_sockets(&maps()?)
    );
    free_table(&topo)?;
    let reached = topo
        .backends
        .iter()
        .position(|p| p.name == held[1])
        .with_context(|| format!("reached {held:?}"))?;
    let entry = || -> Result<_> { Ok(tcp_sockets(&maps()?).first().map(|(_, e)| *e)) };
    ensure!(
        entry()?.is_some_and(|e| e.counted() && e.backend_id != 0),
        "{:?}",
        entry()?
    );
    // Its backend goes; the drain gives up on the socket after 1 s.
    let left: Vec<_> = topo
        .backends
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != reached)
        .map(|(_, p)| p)
        .collect();
    dir.write("web.yaml", &web_service("10.96.8.1", &left))?;
    agent.wait_until("the entry orphaned", Duration::from_secs(15), |_| {
        Ok(entry()?.is_some_and(|e| e.counted() && e.backend_id == 0 && e.svc_id == 0))
    })?;
    ensure!(maps()?.sock_marks()?.iter().sum::<u64>() == 1);
    drop(tcp);
    agent.wait_until(
        "the entry and its count gone at the close",
        Duration::from_secs(10),
        |_| Ok(entry()?.is_none() && no_marks(&maps()?)?),
    )?;
    Ok(())
}

/// The backends of `vip:80/TCP`'s entry in `sl_sockfe4`/`sl_sockfe6`, in
/// slot order (`None`: no entry).
fn picks_of(maps: &Maps, vip: IpAddr) -> Result<Option<Vec<IpAddr>>> {
    let key = sluice::datapath::ServiceKey::of(
        &sluice::model::FrontendKey::new(vip, 80, sluice::model::Proto::Tcp),
        0,
    );
    Ok(maps
        .sock_picks()?
        .into_iter()
        .find(|e| e.key() == key)
        .map(|e| e.backends().into_iter().map(|(_, ep)| ep.addr).collect()))
}

/// A frontend a socket needs nothing more than a hash for (no affinity,
/// no Maglev, no source ranges) has its active backends in
/// `sl_sockfe4`/`sl_sockfe6`, which a connect takes in one lookup
/// (`sock_picked`), in both families, with the general path's answers:
/// the VIP as peer, every active backend over a run, never a terminating
/// one. A frontend with session affinity has none. A stopping agent turns
/// the entries off (`CFG_F_SOCK_PICKS`: the next agent may not keep them);
/// one that starts deletes an entry that disagrees with the service maps
/// (as a release that does not keep them would leave behind) before it
/// turns them on again.
#[test]
fn plain_frontends_give_sockets_their_backend_in_one_lookup() -> Result<()> {
    use sluice_common::config::CFG_F_SOCK_PICKS;
    let topo = Topology::new(1, 3)?;
    topo.wait_ipv6_ready()?;
    let mut servers = Vec::new();
    for pod in &topo.backends {
        servers.push(servers::tcp_greeter(&pod.ns, 8080, &pod.name)?);
        servers.push(servers::tcp_greeter6(&pod.ns, 8080, &pod.name)?);
    }
    let eps = |first: (bool, bool, bool)| -> Vec<Ep> {
        topo.backends
            .iter()
            .enumerate()
            .flat_map(|(i, b)| {
                let c = if i == 0 { first } else { READY };
                [
                    (IpAddr::from(b.ip), "node-1", c),
                    (IpAddr::from(b.ip6), "node-1", c),
                ]
            })
            .collect()
    };
    let tcp = (80, 8080, None);
    let plain = |first| {
        service(
            "plain",
            &["10.96.3.1", "fd00:96::3:1"],
            "",
            "",
            "TCP",
            tcp,
            &eps(first),
        )
    };
    let dir = ManifestDir::create()?;
    dir.write("node.yaml", &node_yaml(&topo))?;
    dir.write("plain.yaml", &plain(READY))?;
    let v4_only: Vec<Ep> = eps(READY)
        .into_iter()
        .filter(|(a, _, _)| a.is_ipv4())
        .collect();
    dir.write(
        "sticky.yaml",
        &service(
            "sticky",
            &["10.96.3.2"],
            "  sessionAffinity: ClientIP\n",
            "",
            "TCP",
            tcp,
            &v4_only,
        ),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;
    let maps = || Maps::open_pinned(topo.bpf.path());
    let client = &topo.clients[0];
    let (vip4, vip6): (IpAddr, IpAddr) = ("10.96.3.1".parse()?, "fd00:96::3:1".parse()?);
    let ips = |v6: bool, from: usize| -> BTreeSet<IpAddr> {
        topo.backends[from..]
            .iter()
            .map(|b| {
                if v6 {
                    IpAddr::from(b.ip6)
                } else {
                    IpAddr::from(b.ip)
                }
            })
            .collect()
    };
    let picked = |v6: bool| -> Result<Option<BTreeSet<IpAddr>>> {
        let m = maps()?;
        Ok(picks_of(&m, if v6 { vip6 } else { vip4 })?.map(|p| p.into_iter().collect()))
    };
    for v6 in [false, true] {
        ensure!(
            picked(v6)? == Some(ips(v6, 0)),
            "v6={v6}: {:?}",
            picked(v6)?
        );
    }
    ensure!(
        picks_of(&maps()?, "10.96.3.2".parse()?)?.is_none(),
        "a frontend with session affinity has no entry"
    );
    ensure!(
        maps()?.config()?.flags() & CFG_F_SOCK_PICKS != 0,
        "the entries are on"
    );
    let status = agent.cli(&["status"])?;
    ensure!(
        status.contains("sock picks: 2 frontends give a connect its backend in one lookup"),
        "{status}"
    );

    // Sockets take the entry, with the general path's answers.
    let run = |v6: bool, n: usize| -> Result<BTreeSet<String>> {
        let (host, peer) = if v6 {
            ("fd00:96::3:1", "[fd00:96::3:1]:80")
        } else {
            ("10.96.3.1", "10.96.3.1:80")
        };
        backends_reached(&topo, client, host, 80, peer, n)
    };
    let picks_taken = || -> Result<u64> { Ok(maps()?.stat(Stat::SockPicked)?) };
    let before = picks_taken()?;
    for v6 in [false, true] {
        let seen = run(v6, 16)?;
        ensure!(seen.len() >= 2, "v6={v6}: {seen:?}");
    }
    ensure!(
        picks_taken()? >= before + 32,
        "connects did not take the entries"
    );
    let before = picks_taken()?;
    let seen = backends_reached(&topo, client, "10.96.3.2", 80, "10.96.3.2:80", 4)?;
    ensure!(seen.len() == 1, "affinity not kept: {seen:?}");
    ensure!(
        picks_taken()? == before,
        "a frontend with affinity took an entry"
    );

    // backend-0 terminates: the entries follow, and no socket goes there.
    dir.write("plain.yaml", &plain(TERMINATING_SERVING))?;
    agent.wait_until(
        "the entries without backend-0",
        Duration::from_secs(15),
        |_| Ok(picked(false)? == Some(ips(false, 1)) && picked(true)? == Some(ips(true, 1))),
    )?;
    for v6 in [false, true] {
        let seen = run(v6, 16)?;
        ensure!(
            !seen.contains("backend-0"),
            "v6={v6}: a terminating backend picked: {seen:?}"
        );
    }

    // Stopped, the agent leaves the entries off: the general path answers.
    agent.stop()?;
    ensure!(
        maps()?.config()?.flags() & CFG_F_SOCK_PICKS == 0,
        "the entries stay on"
    );
    let status = agent.cli(&["status"])?;
    ensure!(status.contains("sock picks: off"), "{status}");
    let before = picks_taken()?;
    let seen = run(false, 8)?;
    ensure!(
        !seen.contains("backend-0") && picks_taken()? == before,
        "{seen:?}"
    );

    // An entry that disagrees (backend-0 only, as a release that does not
    // keep these maps would leave it) goes before they are on again.
    let key = sluice_common::Svc4Key::new([10, 96, 3, 1], 80, IPPROTO_TCP, 0);
    let m = maps()?;
    let mut stale = m.sock_picks_v4.get(&key, 0)?;
    stale.count = 1;
    stale.picks[0].addr = topo.backends[0].ip.octets();
    let mut m = m;
    m.sock_picks_v4.insert(key, stale, 0)?;
    agent.restart(&topo.node)?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(
        picked(false)? == Some(ips(false, 1)),
        "{:?}",
        picked(false)?
    );
    ensure!(
        maps()?.config()?.flags() & CFG_F_SOCK_PICKS != 0,
        "the entries are off"
    );
    let before = picks_taken()?;
    let seen = run(false, 16)?;
    ensure!(!seen.contains("backend-0") && seen.len() == 2, "{seen:?}");
    ensure!(picks_taken()? >= before + 16);

    // The same after a clean stop and a resize of the services' maps,
    // which migrates `sl_sockfe4` too: the migration's late copy (of what
    // the old maps gained meanwhile) must not bring the stale entries
    // back, the changed one nor one of a port no service has (which no
    // reconcile would rewrite).
    agent.stop()?;
    let migrations = agent.migration_log().matches("sl_sockfe4").count();
    let orphan = sluice_common::Svc4Key::new([10, 96, 3, 1], 81, IPPROTO_TCP, 0);
    let mut m = maps()?;
    m.sock_picks_v4.insert(key, stale, 0)?;
    m.sock_picks_v4.insert(orphan, stale, 0)?;
    drop(m);
    agent.add_args(&["--services-map-size=131072"]);
    agent.restart(&topo.node)?;
    agent.wait_ready(Duration::from_secs(20))?;
    ensure!(
        agent.migration_log().matches("sl_sockfe4").count() > migrations,
        "no migration of sl_sockfe4: {}",
        agent.migration_log()
    );
    ensure!(
        picked(false)? == Some(ips(false, 1)) && maps()?.config()?.flags() & CFG_F_SOCK_PICKS != 0,
        "after the resize: {:?}",
        picked(false)?
    );
    ensure!(
        maps()?.sock_picks_v4.get(&orphan, 0).is_err(),
        "the entry of a port no service has came back"
    );
    let seen = run(false, 16)?;
    ensure!(!seen.contains("backend-0") && seen.len() == 2, "{seen:?}");
    drop(servers);
    Ok(())
}
