//! The north-south scenario (`--north-south`): many UDP flows from an
//! outside host to a NodePort of node 1 whose backend runs on node 2, the
//! node in the middle forwarding (DNAT + SNAT) with each variant:
//!
//! - `sluice-xdp`: `sl_xdp` natively on node 1's `e0` (generator side)
//!   and `u0` (towards node 2), TC programs everywhere as always;
//! - `sluice-xdp-generic`: the same in generic mode (on the skb);
//! - `sluice-tc`: the same without XDP;
//! - `iptables`: kube-proxy's NodePort path for one service (`nat`
//!   PREROUTING -> KUBE-SERVICES -> KUBE-NODEPORTS -> KUBE-EXT -> KUBE-SVC
//!   -> KUBE-SEP DNAT, KUBE-MARK-MASQ and MASQUERADE), iptables-legacy;
//! - `nftables`: kube-proxy's nftables layout of the same path.
//!
//! The generator is `trafgen` (netsniff-ng) on the outside host's `eth0`:
//! UDP frames of 64 bytes from one source address and `FLOWS` source
//! ports (checksum 0, as a UDP sender may), to the node's MAC. The sink
//! is node 2's backend pod, which drops them in its prerouting hook
//! (nftables) and counts what arrived (`eth0` RX packets). Every variant
//! gets the same generator, the same sink, the same devices (GRO on the
//! receiving veths, which a frame sent by XDP needs), a fresh pair of
//! nodes, and runs in each round in turn. Reported: delivered packets per
//! second (median of rounds), what the generator got out, and the
//! machine's busy CPU (user, system, softirq) per delivered packet.
//!
//! Denied sources: the same generator against a load-balancer IP whose
//! source ranges exclude it, with XDP and with TC only: packets dropped
//! per second (`xdp_drop`, `source_denied`) against the generator's rate.
//!
//! Veths are not NICs, and this is where XDP loses its edge: trafgen's
//! frames enter the node as skbs already allocated by the sender (a NIC
//! hands XDP a raw buffer before any skb exists), a veth's XDP copies an
//! skb that lacks XDP's headroom into a new buffer, and a frame
//! redirected into a veth becomes an skb again at its peer. The
//! generator's transmit also runs the node's receive path on its own CPU,
//! so the generator is the bottleneck and a cheaper datapath shows as a
//! higher offered rate. A NIC-like delivery (frames entering through
//! `ndo_xdp_xmit`, e.g. `xdp-bench redirect` between two veths) failed
//! here: xdp-bench's programs do not load on this kernel (libbpf: no BTF
//! for its tracepoints, EPERM for the dispatcher), and the kernel has no
//! pktgen. See docs/performance.md.

use std::{
    fmt::Write as _,
    fs,
    net::Ipv4Addr,
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sluice::{
    datapath::{MapSizes, XdpMode},
    model::{
        BackendState, DesiredBackend, Endpoint, Frontend, FrontendKey, FrontendKind, Proto,
        WhenEmpty,
    },
};
use sluice_common::Stat;

use super::{env::TempFile, stats::Rate};
use crate::{
    lb::{service, Lb},
    topology::receive_xdp_frames,
    Netns, Topology,
};

const NODE_PORT: u16 = 30080;
const TARGET_PORT: u16 = 8080;
const LB_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 9);
/// Distinct source ports (flows) the generator cycles through.
pub const FLOWS: u32 = 1024;
/// UDP payload bytes: 64-byte frames with the 4-byte FCS a NIC adds.
const PAYLOAD: usize = 18;

/// How long and how often.
#[derive(Clone, Debug)]
pub struct NsConfig {
    pub seconds: f64,
    pub rounds: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsVariant {
    SluiceXdp,
    SluiceXdpGeneric,
    SluiceTc,
    Iptables,
    Nftables,
}

impl NsVariant {
    pub const ALL: [NsVariant; 5] = [
        NsVariant::SluiceXdp,
        NsVariant::SluiceXdpGeneric,
        NsVariant::SluiceTc,
        NsVariant::Iptables,
        NsVariant::Nftables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NsVariant::SluiceXdp => "sluice-xdp",
            NsVariant::SluiceXdpGeneric => "sluice-xdp-generic",
            NsVariant::SluiceTc => "sluice-tc",
            NsVariant::Iptables => "iptables",
            NsVariant::Nftables => "nftables",
        }
    }
}

/// One variant's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NsResult {
    pub variant: String,
    pub error: Option<String>,
    /// Packets per second the sink received.
    pub delivered_pps: Rate,
    /// Packets per second the node received from the generator.
    pub offered_pps: Rate,
    /// Busy CPU of the whole machine per delivered packet (ns).
    pub cpu_ns_per_packet: Rate,
    /// Softirq share of that busy time.
    pub softirq_share: Rate,
}

/// Denied sources dropped.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeniedResult {
    pub variant: String,
    pub error: Option<String>,
    /// Packets per second dropped as denied.
    pub dropped_pps: Rate,
    /// Packets per second the node received from the generator.
    pub offered_pps: Rate,
    /// Share of the denied drops that XDP made (1 = all at the driver).
    pub xdp_share: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NorthSouth {
    /// Why the scenario did not run (no generator), if it did not.
    #[serde(default)]
    pub error: Option<String>,
    pub generator: String,
    pub flows: u32,
    pub frame_bytes: usize,
    pub seconds_per_round: f64,
    pub rounds: usize,
    pub forwarded: Vec<NsResult>,
    pub denied: Vec<DeniedResult>,
}

/// Two nodes, an outside host (generator) and a backend on node 2 (sink).
struct Rig {
    lb: Option<Lb>,
    _rules: Option<TempFile>,
    node2: Topology,
    node1: Topology,
}

fn node_ip() -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 1, 1)
}

fn frontend(kind: FrontendKind, addr: Ipv4Addr, port: u16, backend: Ipv4Addr) -> Frontend {
    let mut fe = Frontend::new(
        FrontendKey::new(addr.into(), port, Proto::Udp),
        kind,
        vec![DesiredBackend {
            endpoint: Endpoint {
                addr: backend.into(),
                port: TARGET_PORT,
            },
            state: BackendState::Active,
        }],
        WhenEmpty::Reject,
    );
    fe.snat = true;
    fe
}

impl Rig {
    fn new(variant: NsVariant, denied: bool) -> Result<Self> {
        let mut node1 = Topology::with_index(1, 0, 0)?;
        node1.add_external()?;
        let node2 = Topology::with_index(2, 0, 1)?;
        Topology::join(&node1, &node2)?;
        node1.strict_checksums()?;
        node2.strict_checksums()?;
        // Every variant alike: GRO on the veths that receive forwarded
        // frames (an XDP-sent frame needs it).
        node1.externals[0].receive_xdp_frames()?;
        receive_xdp_frames(&node2.node, "u0")?;
        let sink = &node2.backends[0];
        let rules = "table ip sink {\n  chain pre {\n    type filter hook prerouting priority -300;\n    udp dport 8080 drop\n  }\n}\n";
        let file = TempFile::write("sink-nft", rules)?;
        crate::netns::run(sink.ns.command("nft").arg("-f").arg(file.path()))?;
        let backend = sink.ip;
        let mut rig = Self {
            lb: None,
            _rules: None,
            node2,
            node1,
        };
        match variant {
            NsVariant::SluiceXdp | NsVariant::SluiceXdpGeneric | NsVariant::SluiceTc => {
                let mut lb =
                    Lb::load_with(&rig.node1, MapSizes::default(), Duration::from_secs(60))?;
                let fe = if denied {
                    let mut fe = frontend(FrontendKind::LoadBalancer, LB_IP, 80, backend);
                    fe.source_ranges = vec![(Ipv4Addr::new(203, 0, 113, 0).into(), 24)];
                    fe
                } else {
                    frontend(FrontendKind::NodePort, node_ip(), NODE_PORT, backend)
                };
                let report = lb.set(service("edge", 80, Proto::Udp, vec![fe]));
                if !report.errors.is_empty() {
                    bail!("programming sluice: {:?}", report.errors);
                }
                let mode = match variant {
                    NsVariant::SluiceXdp => Some(XdpMode::Native),
                    NsVariant::SluiceXdpGeneric => Some(XdpMode::Generic),
                    _ => None,
                };
                if let Some(mode) = mode {
                    let datapath = &mut lb.datapath;
                    rig.node1.node.run(|| -> Result<()> {
                        for dev in ["e0", "u0"] {
                            datapath.attach_xdp(dev, mode)?;
                        }
                        Ok(())
                    })??;
                }
                rig.lb = Some(lb);
            }
            NsVariant::Iptables => {
                let file = TempFile::write("ns-iptables", &iptables_rules(backend))?;
                crate::netns::run(
                    rig.node1
                        .node
                        .command("iptables-legacy-restore")
                        .arg("-w")
                        .stdin(fs::File::open(file.path())?),
                )?;
                rig._rules = Some(file);
            }
            NsVariant::Nftables => {
                let file = TempFile::write("ns-nftables", &nftables_rules(backend))?;
                crate::netns::run(rig.node1.node.command("nft").arg("-f").arg(file.path()))?;
                rig._rules = Some(file);
            }
        }
        Ok(rig)
    }

    fn stat(&self, stat: Stat) -> u64 {
        self.lb
            .as_ref()
            .and_then(|lb| lb.stat(stat).ok())
            .unwrap_or(0)
    }
}

/// kube-proxy's iptables NodePort path for one UDP service port with one
/// endpoint (externalTrafficPolicy Cluster: masquerade).
fn iptables_rules(backend: Ipv4Addr) -> String {
    format!(
        "*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-EXT-EDGE - [0:0]
:KUBE-SVC-EDGE - [0:0]
:KUBE-SEP-EDGE - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -m comment --comment \"bench/edge:80\" -m udp -p udp --dport {NODE_PORT} -j KUBE-EXT-EDGE
-A KUBE-EXT-EDGE -m comment --comment \"masquerade traffic for bench/edge:80 external destinations\" -j KUBE-MARK-MASQ
-A KUBE-EXT-EDGE -j KUBE-SVC-EDGE
-A KUBE-SVC-EDGE -m comment --comment \"bench/edge:80 -> {backend}:{TARGET_PORT}\" -j KUBE-SEP-EDGE
-A KUBE-SEP-EDGE -m comment --comment bench/edge:80 -s {backend} -j KUBE-MARK-MASQ
-A KUBE-SEP-EDGE -m comment --comment bench/edge:80 -m udp -p udp -j DNAT --to-destination {backend}:{TARGET_PORT}
COMMIT
"
    )
}

/// kube-proxy's nftables NodePort path for the same service port.
fn nftables_rules(backend: Ipv4Addr) -> String {
    let node = node_ip();
    format!(
        "table ip kube-proxy {{
  set nodeport-ips {{
    type ipv4_addr
    elements = {{ {node} }}
  }}
  map service-nodeports {{
    type inet_proto . inet_service : verdict
    elements = {{ udp . {NODE_PORT} : goto external-EDGE-bench/edge/udp/80 }}
  }}
  chain mark-for-masquerade {{
    meta mark set meta mark | 0x4000
  }}
  chain masquerading {{
    meta mark & 0x4000 == 0 return
    meta mark set meta mark ^ 0x4000
    masquerade fully-random
  }}
  chain services {{
    ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
  }}
  chain nat-prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    jump services
  }}
  chain nat-postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    jump masquerading
  }}
  chain endpoint-EDGE-bench/edge/udp/80__{backend}/{TARGET_PORT} {{
    ip saddr {backend} jump mark-for-masquerade
    meta l4proto udp dnat to {backend}:{TARGET_PORT}
  }}
  chain service-EDGE-bench/edge/udp/80 {{
    numgen random mod 1 vmap {{ 0 : goto endpoint-EDGE-bench/edge/udp/80__{backend}/{TARGET_PORT} }}
  }}
  chain external-EDGE-bench/edge/udp/80 {{
    jump mark-for-masquerade
    goto service-EDGE-bench/edge/udp/80
  }}
}}
"
    )
}

/// RX packets of `dev` in `ns`.
fn rx_packets(ns: &Netns, dev: &str) -> Result<u64> {
    let out = crate::netns::run(ns.command("ip").args(["-s", "-j", "link", "show", dev]))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .context("rx packets in `ip -s -j link`")
}

fn mac(ns: &Netns, dev: &str) -> Result<String> {
    let out = crate::netns::run(ns.command("ip").args(["-j", "link", "show", dev]))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v[0]["address"].as_str().context("MAC address")?.to_owned())
}

/// The trafgen configuration: UDP from the outside host to `dst:dport`,
/// `FLOWS` source ports.
fn trafgen_conf(dmac: &str, smac: &str, src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{{\n  eth(da={dmac}, sa={smac}, type=0x0800),\n  ipv4(saddr={src}, daddr={dst}, ttl=64, df),\n  udp(sp=dinc(20000, {}), dp={dport}, csum=0),\n  fill(0x41, {PAYLOAD})\n}}",
        20000 + FLOWS - 1
    );
    s
}

/// Busy and softirq ticks of the whole machine.
fn cpu_ticks() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    (get(0) + get(1) + get(2) + get(5) + get(6) + get(7), get(6))
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// One generator run against `dst:dport`; returns (seconds, offered
/// packets at the node, delivered packets at the sink, busy ns, softirq
/// ns).
fn blast(rig: &Rig, dst: Ipv4Addr, dport: u16, seconds: f64) -> Result<(f64, u64, u64, f64, f64)> {
    let ext = &rig.node1.externals[0];
    let conf = trafgen_conf(
        &mac(&rig.node1.node, "e0")?,
        &mac(&ext.ns, "eth0")?,
        ext.ip,
        dst,
        dport,
    );
    let file = TempFile::write("trafgen", &conf)?;
    let sink = &rig.node2.backends[0];
    let (offered0, delivered0) = (
        rx_packets(&rig.node1.node, "e0")?,
        rx_packets(&sink.ns, "eth0")?,
    );
    let (busy0, soft0) = cpu_ticks();
    let start = Instant::now();
    // trafgen forks a worker per CPU and stops them on SIGINT to the
    // group: it runs in a process group of its own, signalled whole.
    let mut child = ext
        .ns
        .command("trafgen")
        .args(["--dev", "eth0", "--cpus", "1", "--no-sock-mem", "--conf"])
        .arg(file.path())
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting trafgen (apt-get install netsniff-ng)")?;
    let group = child.id() as i32;
    std::thread::sleep(Duration::from_secs_f64(seconds));
    // SAFETY: signalling the process group of our own child.
    unsafe { libc::kill(-group, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = start.elapsed().as_secs_f64();
    // Let the last frames drain.
    std::thread::sleep(Duration::from_millis(100));
    let (busy1, soft1) = cpu_ticks();
    let offered = rx_packets(&rig.node1.node, "e0")?.saturating_sub(offered0);
    let delivered = rx_packets(&sink.ns, "eth0")?.saturating_sub(delivered0);
    let tick_ns = 1e9 / ticks_per_second();
    Ok((
        secs,
        offered,
        delivered,
        busy1.saturating_sub(busy0) as f64 * tick_ns,
        soft1.saturating_sub(soft0) as f64 * tick_ns,
    ))
}

fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace(['\n', '|'], " ")
}

/// Whether the generator is installed.
pub fn available() -> bool {
    Command::new("trafgen")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Per-round figures of one variant: delivered pps, offered pps, CPU ns
/// per packet, softirq share; the last error.
#[derive(Default)]
struct Samples(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Option<String>);

/// Runs the scenario.
pub fn run(cfg: &NsConfig) -> Result<NorthSouth> {
    if !available() {
        bail!("the north-south scenario needs trafgen: apt-get install netsniff-ng (cargo xtask setup installs it)");
    }
    let mut out = NorthSouth {
        generator: "trafgen (netsniff-ng), 1 CPU, UDP".into(),
        flows: FLOWS,
        frame_bytes: 14 + 20 + 8 + PAYLOAD,
        seconds_per_round: cfg.seconds,
        rounds: cfg.rounds,
        ..NorthSouth::default()
    };
    let mut per: Vec<Samples> = NsVariant::ALL.iter().map(|_| Samples::default()).collect();
    for round in 0..cfg.rounds {
        for k in 0..NsVariant::ALL.len() {
            let i = (k + round) % NsVariant::ALL.len();
            let variant = NsVariant::ALL[i];
            super::check_interrupted()?;
            let outcome = Rig::new(variant, false).and_then(|rig| {
                // A short warm-up: neighbours, conntrack of every flow.
                blast(&rig, node_ip(), NODE_PORT, 0.3)?;
                blast(&rig, node_ip(), NODE_PORT, cfg.seconds)
            });
            let slot = &mut per[i];
            match outcome {
                Ok((secs, offered, delivered, busy, soft)) => {
                    eprintln!(
                        "north-south {}: offered {:.0} pps, delivered {:.0} pps",
                        variant.name(),
                        offered as f64 / secs,
                        delivered as f64 / secs
                    );
                    slot.0.push(delivered as f64 / secs);
                    slot.1.push(offered as f64 / secs);
                    if delivered > 0 {
                        slot.2.push(busy / delivered as f64);
                        slot.3.push(if busy > 0.0 { soft / busy } else { 0.0 });
                    }
                }
                Err(e) => slot.4 = Some(one_line(&e)),
            }
        }
    }
    for (variant, Samples(delivered, offered, cpu, soft, error)) in NsVariant::ALL.iter().zip(per) {
        out.forwarded.push(NsResult {
            variant: variant.name().into(),
            error,
            delivered_pps: Rate::from_rounds(&delivered),
            offered_pps: Rate::from_rounds(&offered),
            cpu_ns_per_packet: Rate::from_rounds(&cpu),
            softirq_share: Rate::from_rounds(&soft),
        });
    }
    for variant in [NsVariant::SluiceXdp, NsVariant::SluiceTc] {
        out.denied.push(denied(variant, cfg));
    }
    Ok(out)
}

/// The denied-source run of `variant`.
fn denied(variant: NsVariant, cfg: &NsConfig) -> DeniedResult {
    let mut dropped = Vec::new();
    let mut offered = Vec::new();
    let mut share = 0.0;
    let mut error = None;
    for _ in 0..cfg.rounds {
        let outcome = Rig::new(variant, true).and_then(|rig| {
            let (xdp0, denied0) = (rig.stat(Stat::XdpDrop), rig.stat(Stat::SourceDenied));
            let (secs, off, _, _, _) = blast(&rig, LB_IP, 80, cfg.seconds)?;
            let (xdp, denied) = (
                rig.stat(Stat::XdpDrop) - xdp0,
                rig.stat(Stat::SourceDenied) - denied0,
            );
            Ok((secs, off, xdp, denied))
        });
        match outcome {
            Ok((secs, off, xdp, den)) => {
                dropped.push(den as f64 / secs);
                offered.push(off as f64 / secs);
                share = if den > 0 {
                    xdp as f64 / den as f64
                } else {
                    0.0
                };
            }
            Err(e) => error = Some(one_line(&e)),
        }
    }
    DeniedResult {
        variant: variant.name().into(),
        error,
        dropped_pps: Rate::from_rounds(&dropped),
        offered_pps: Rate::from_rounds(&offered),
        xdp_share: share,
    }
}

/// The report's section.
pub fn markdown(ns: &NorthSouth) -> String {
    let mut s = String::new();
    if let Some(e) = &ns.error {
        let _ = writeln!(s, "\n## North-south\n\nNot measured: {e}");
        return s;
    }
    let _ = writeln!(
        s,
        "\n## North-south: NodePort to a backend on another node\n\n{} frames of {} bytes, {} flows, {} round(s) of {:.1} s per variant. Delivered: packets the backend on node 2 received; offered: packets the node received from the generator; CPU: busy time of the whole machine (user, system, softirq) per delivered packet.\n",
        ns.generator, ns.frame_bytes, ns.flows, ns.rounds, ns.seconds_per_round
    );
    let _ = writeln!(s, "| variant | delivered pps | offered pps | CPU ns/packet | softirq share | vs sluice-tc | vs iptables |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    let of = |name: &str| {
        ns.forwarded
            .iter()
            .find(|v| v.variant == name)
            .map(|v| v.delivered_pps.median)
            .unwrap_or(0.0)
    };
    let (tc, ipt) = (of("sluice-tc"), of("iptables"));
    for v in &ns.forwarded {
        if let Some(e) = &v.error {
            let _ = writeln!(s, "| {} | failed: {e} | | | | | |", v.variant);
            continue;
        }
        let ratio = |base: f64| {
            if base > 0.0 {
                format!("{:.2}x", v.delivered_pps.median / base)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0}% | {} | {} |",
            v.variant,
            v.delivered_pps.median,
            v.offered_pps.median,
            v.cpu_ns_per_packet.median,
            100.0 * v.softirq_share.median,
            ratio(tc),
            ratio(ipt)
        );
    }
    let _ = writeln!(
        s,
        "\nDenied sources (a load-balancer IP whose source ranges exclude the generator):\n"
    );
    let _ = writeln!(
        s,
        "| variant | dropped pps | offered pps | dropped in XDP |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|");
    for d in &ns.denied {
        if let Some(e) = &d.error {
            let _ = writeln!(s, "| {} | failed: {e} | | |", d.variant);
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.0}% |",
            d.variant,
            d.dropped_pps.median,
            d.offered_pps.median,
            100.0 * d.xdp_share
        );
    }
    s
}

/// A bar chart of the delivered rates.
pub fn svg(ns: &NorthSouth) -> String {
    let max = ns
        .forwarded
        .iter()
        .map(|v| v.delivered_pps.median)
        .fold(1.0, f64::max);
    let (w, bar, gap, left) = (660.0, 28.0, 12.0, 135.0);
    let h = 40.0 + (bar + gap) * ns.forwarded.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\">North-south: delivered packets per second (median)</text>\n"
    );
    for (i, v) in ns.forwarded.iter().enumerate() {
        let y = 32.0 + i as f64 * (bar + gap);
        let len = (w - left - 120.0) * v.delivered_pps.median / max;
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.0}\">{}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{len:.0}\" height=\"{bar}\" fill=\"#4a7ebb\"/><text x=\"{:.0}\" y=\"{:.0}\">{:.0}</text>",
            y + bar * 0.65,
            v.variant,
            left + len + 6.0,
            y + bar * 0.65,
            v.delivered_pps.median
        );
    }
    s.push_str("</svg>\n");
    s
}
