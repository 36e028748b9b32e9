//! The flows an upgrade must not break, for the upgrade and crash tests:
//! long-lived TCP streams to a ClusterIP, connected UDP flows, TCP streams
//! from outside the cluster through a NodePort with externalTrafficPolicy
//! Cluster (SNATed), a ClientIP-affinity service, and connect loops. One
//! backend is made *terminating* once flows are on it, so that every flow
//! to it lives on conntrack alone: a conntrack entry lost in an upgrade is
//! a broken stream (TCP) or a reply from another backend (UDP).

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    agent::{Agent, ManifestDir},
    clients::{self, Prober, Stream},
    servers::{self, Server},
    Topology,
};

pub const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 1);
pub const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 2);
pub const STICKY: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 3);
pub const NODE_PORT: u16 = 30080;
const BACKENDS: usize = 3;
/// Flows of each kind that must sit on the terminating backend.
const ON_TERMINATING: usize = 2;
/// The long-lived flows' local ports, below the ephemeral range: Linux
/// gives an ephemeral port to connections with different peers, and a
/// connect loop's connection to another service on the same backend
/// from a long-lived flow's port would clash with it after DNAT. Main
/// masquerades such a connection (`tuple_clash`, tested on its own in
/// `datapath_port_reuse`); 0.1.0, which these tests also run, does not.
const LONG_LIVED_PORTS: u16 = 20_000;

fn service(name: &str, ip: Ipv4Addr, port: u16, proto: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  type: {kind}
  clusterIP: {ip}
  clusterIPs: [{ip}]
  ipFamilies: [IPv4]
{extra}  ports:
  - name: p
    protocol: {proto}
    port: {port}
    targetPort: {target}
{node_port}---
"#,
        kind = if name == "edge" {
            "NodePort"
        } else {
            "ClusterIP"
        },
        target = if proto == "UDP" { 5353 } else { 8080 },
        node_port = if name == "edge" {
            format!("    nodePort: {NODE_PORT}\n")
        } else {
            String::new()
        },
    )
}

fn slice(svc: &str, proto: &str, backends: &[Ipv4Addr], terminating: Option<usize>) -> String {
    let port = if proto == "UDP" { 5353 } else { 8080 };
    let mut out = format!(
        r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {svc}-1
  namespace: default
  labels:
    kubernetes.io/service-name: {svc}
addressType: IPv4
ports:
- name: p
  protocol: {proto}
  port: {port}
endpoints:
"#
    );
    for (i, b) in backends.iter().enumerate() {
        let ready = terminating != Some(i);
        out.push_str(&format!(
            "- addresses: [\"{b}\"]\n  nodeName: node-1\n  conditions: {{ready: {ready}, serving: {ready}, terminating: {t}}}\n",
            t = !ready
        ));
    }
    out.push_str("---\n");
    out
}

/// The manifests: `web`, `dns`, `edge` (NodePort, policy Cluster) with
/// backend `terminating` (if any) draining, `sticky` with ClientIP
/// affinity, and one `follow-<n>` ClusterIP service per entry of `follow`
/// (10.96.8.<n>), the change each step must pick up.
pub fn manifests(
    node_ip: Ipv4Addr,
    backends: &[Ipv4Addr],
    terminating: Option<usize>,
    follow: &[u8],
) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {node_ip}\n---\n"
    );
    out += &service("web", WEB, 80, "TCP", "");
    out += &slice("web", "TCP", backends, terminating);
    out += &service("dns", DNS, 53, "UDP", "");
    out += &slice("dns", "UDP", backends, terminating);
    out += &service(
        "edge",
        Ipv4Addr::new(10, 96, 7, 4),
        80,
        "TCP",
        "  externalTrafficPolicy: Cluster\n",
    );
    out += &slice("edge", "TCP", backends, terminating);
    out += &service("sticky", STICKY, 80, "TCP", "  sessionAffinity: ClientIP\n");
    out += &slice("sticky", "TCP", backends, None);
    for n in follow {
        let name = format!("follow-{n}");
        out += &service(&name, Ipv4Addr::new(10, 96, 8, *n), 80, "TCP", "");
        out += &slice(&name, "TCP", backends, None);
    }
    out
}

/// A connected UDP socket: every datagram of it is one flow.
pub struct UdpFlow {
    socket: UdpSocket,
    pub backend: String,
}

impl UdpFlow {
    fn open(topo: &Topology, port: u16) -> Result<Self> {
        let ns = &topo.clients[0].ns;
        let socket = ns.run(move || -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind(("0.0.0.0", port))?;
            s.connect(SocketAddrV4::new(DNS, 53))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            Ok(s)
        })??;
        let mut flow = Self {
            socket,
            backend: String::new(),
        };
        flow.backend = flow.ask()?;
        Ok(flow)
    }

    fn ask(&self) -> Result<String> {
        self.socket.send(b"hello")?;
        let mut buf = [0u8; 256];
        let n = self
            .socket
            .recv(&mut buf)
            .context("UDP flow got no answer")?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// The flow still reaches its backend.
    pub fn check(&self) -> Result<()> {
        let now = self.ask()?;
        ensure!(
            now == self.backend,
            "UDP flow moved from {} to {now}",
            self.backend
        );
        Ok(())
    }
}

/// Everything in flight.
pub struct Flows {
    pub streams: Vec<Stream>,
    pub udp: Vec<UdpFlow>,
    pub edge: Vec<Stream>,
    pub sticky_backend: String,
    pub web_prober: Prober,
    pub edge_prober: Prober,
    pub terminating: String,
    follow: Vec<u8>,
    _servers: Vec<Server>,
}

/// Starts one TCP greeter (8080) and one UDP greeter (5353) per backend.
pub fn topology() -> Result<(Topology, Vec<Server>)> {
    topology_with_uplink("e0")
}

/// `topology` with the outside host's node device named `uplink`.
pub fn topology_with_uplink(uplink: &str) -> Result<(Topology, Vec<Server>)> {
    let mut topo = Topology::new(1, BACKENDS)?;
    topo.add_external_on(uplink)?;
    let mut servers = Vec::new();
    for b in &topo.backends {
        servers.push(servers::tcp_greeter(&b.ns, 8080, &b.name)?);
        servers.push(servers::udp_greeter(&b.ns, 5353, &b.name)?);
    }
    Ok((topo, servers))
}

/// The manifest directory an upgrade test starts from (the services on
/// `topo`'s backends), and the agent's `--source` for it.
pub fn manifest_source(topo: &Topology) -> Result<(ManifestDir, String)> {
    let dir = ManifestDir::create()?;
    dir.write(
        "all.yaml",
        &manifests(topo.node_address(0), &backend_ips(topo), None, &[]),
    )?;
    let source = format!("dir:{}", dir.path().display());
    Ok((dir, source))
}

/// One step of a rollout: replaces the running agent by `bin` (with
/// `env`) as a DaemonSet does, waits for it, checks every flow
/// (`Flows::check`), and that it migrated the pins exactly when
/// `migrates` says, leaving no staging behind.
#[allow(clippy::too_many_arguments)]
pub fn roll(
    agent: &mut Agent,
    flows: &mut Flows,
    topo: &Topology,
    dir: &ManifestDir,
    step: &str,
    bin: &std::path::Path,
    env: &[(&str, &str)],
    migrates: bool,
) -> Result<()> {
    let migrations = agent.log().matches("migration finished").count();
    agent.replace(&topo.node, bin, env)?;
    agent
        .wait_ready(READY)
        .with_context(|| format!("{step}: agent ready"))?;
    flows.check(step, topo, dir, agent)?;
    let now = agent.log().matches("migration finished").count();
    if migrates {
        ensure!(
            now == migrations + 1,
            "{step}: no migration in the log:\n{}",
            agent.log_tail()
        );
    } else {
        ensure!(
            now == migrations,
            "{step}: migrated although the layout is the same"
        );
    }
    ensure!(
        !topo.bpf.path().join("migrate").exists(),
        "{step}: migration staging left behind"
    );
    Ok(())
}

/// How long an agent of a rollout may take to be ready.
const READY: Duration = Duration::from_secs(30);

fn backend_ips(topo: &Topology) -> Vec<Ipv4Addr> {
    topo.backends.iter().map(|b| b.ip).collect()
}

fn until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            bail!("{what} not within {timeout:?} (last error: {last})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Flows {
    /// With an agent running on `dir`: opens flows until each kind has
    /// some on backend 0, then makes backend 0 terminating and starts the
    /// connect loops.
    pub fn open(topo: &Topology, dir: &ManifestDir, servers: Vec<Server>) -> Result<Self> {
        let node_ip = topo.node_address(0);
        let backends = backend_ips(topo);
        let terminating = topo.backends[0].name.clone();
        let client = &topo.clients[0].ns;
        let external = &topo.externals[0].ns;
        let edge_addr = SocketAddrV4::new(node_ip, NODE_PORT);

        let mut streams = Vec::new();
        let mut udp = Vec::new();
        let mut edge = Vec::new();
        for _ in 0..80 {
            let on = |v: &[String]| v.iter().filter(|b| **b == terminating).count();
            let names = |s: &[Stream]| s.iter().map(|s| s.backend.clone()).collect::<Vec<_>>();
            let (a, b, c) = (
                on(&names(&streams)),
                on(&udp
                    .iter()
                    .map(|u: &UdpFlow| u.backend.clone())
                    .collect::<Vec<_>>()),
                on(&names(&edge)),
            );
            if a >= ON_TERMINATING && b >= ON_TERMINATING && c >= ON_TERMINATING {
                break;
            }
            if a < ON_TERMINATING || streams.len() < 6 {
                let port = LONG_LIVED_PORTS + streams.len() as u16;
                streams.push(Stream::connect_from(
                    client,
                    port,
                    SocketAddrV4::new(WEB, 80),
                )?);
            }
            if b < ON_TERMINATING || udp.len() < 6 {
                udp.push(UdpFlow::open(
                    topo,
                    LONG_LIVED_PORTS + 500 + udp.len() as u16,
                )?);
            }
            if c < ON_TERMINATING || edge.len() < 4 {
                edge.push(Stream::connect(external, edge_addr).context("NodePort from outside")?);
            }
        }
        let sticky_backend = clients::tcp_hello(client, SocketAddrV4::new(STICKY, 80))?;

        dir.write("all.yaml", &manifests(node_ip, &backends, Some(0), &[]))?;
        // Applied once new connections no longer reach it.
        until("backend 0 terminating", Duration::from_secs(10), || {
            let seen = clients::tcp_hellos(client, SocketAddrV4::new(WEB, 80), 12)?;
            let seen: Vec<String> = seen.into_iter().collect::<std::io::Result<_>>()?;
            Ok((!seen.contains(&terminating)).then_some(()))
        })?;

        let web_prober = Prober::start(
            client,
            SocketAddrV4::new(WEB, 80),
            Duration::from_millis(10),
        );
        let edge_prober = Prober::start(external, edge_addr, Duration::from_millis(10));
        Ok(Self {
            streams,
            udp,
            edge,
            sticky_backend,
            web_prober,
            edge_prober,
            terminating,
            follow: Vec::new(),
            _servers: servers,
        })
    }

    /// Every flow still works and affinity holds (no agent needed).
    pub fn check_flows(&mut self, step: &str, topo: &Topology) -> Result<()> {
        for (i, s) in self.streams.iter_mut().enumerate() {
            let from = s.local();
            s.ping().with_context(|| {
                format!("{step}: stream {i} from {from:?} to {} broke", s.backend)
            })?;
        }
        for (i, u) in self.udp.iter().enumerate() {
            u.check().with_context(|| format!("{step}: UDP flow {i}"))?;
        }
        for (i, s) in self.edge.iter_mut().enumerate() {
            let from = s.local();
            s.ping().with_context(|| {
                format!(
                    "{step}: NodePort stream {i} from {from:?} to {} broke",
                    s.backend
                )
            })?;
        }
        let client = &topo.clients[0].ns;
        for _ in 0..5 {
            let b = clients::tcp_hello(client, SocketAddrV4::new(STICKY, 80))?;
            ensure!(
                b == self.sticky_backend,
                "{step}: affinity lost ({b} instead of {})",
                self.sticky_backend
            );
        }
        Ok(())
    }

    /// `check_flows`, and the running agent follows a change (a new
    /// service) and its datapath counted no drop.
    pub fn check(
        &mut self,
        step: &str,
        topo: &Topology,
        dir: &ManifestDir,
        agent: &Agent,
    ) -> Result<()> {
        self.check_flows(step, topo)?;
        let client = &topo.clients[0].ns;
        let n = self.follow.len() as u8 + 1;
        self.follow.push(n);
        dir.write(
            "all.yaml",
            &manifests(
                topo.node_address(0),
                &backend_ips(topo),
                Some(0),
                &self.follow,
            ),
        )?;
        let addr = SocketAddr::from(SocketAddrV4::new(Ipv4Addr::new(10, 96, 8, n), 80));
        until(
            &format!("{step}: new service follow-{n} served"),
            Duration::from_secs(15),
            || Ok(clients::tcp_hello(client, addr).ok()),
        )?;
        let status: serde_json::Value = serde_json::from_str(&agent.cli(&["status", "--json"])?)?;
        for counter in [
            "tail_call_failed",
            "stale_reset",
            "ct_insert_failed",
            "dangling",
            "no_backend_drop",
        ] {
            let v = status["datapath"][counter].as_u64();
            ensure!(
                v == Some(0),
                "{step}: datapath counter {counter} = {v:?}\n{status:#}"
            );
        }
        Ok(())
    }

    /// Stops the connect loops: every connection they made must have
    /// worked.
    pub fn finish(self) -> Result<u64> {
        let (ok, failed) = self.finish_counting()?;
        ensure!(failed.is_empty(), "failed connects: {failed:?}");
        Ok(ok)
    }

    /// Stops the connect loops: (connections made, failures).
    pub fn finish_counting(self) -> Result<(u64, Vec<String>)> {
        let (web_ok, mut web_failed) = self.web_prober.finish()?;
        let (edge_ok, edge_failed) = self.edge_prober.finish()?;
        ensure!(
            web_ok > 0 && edge_ok > 0,
            "the connect loops made no connection"
        );
        web_failed.extend(edge_failed.into_iter().map(|f| format!("NodePort: {f}")));
        Ok((web_ok + edge_ok, web_failed))
    }
}
