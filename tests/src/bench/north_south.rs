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
//! Delivery is NIC-like: the generator is the kernel's own XDP packet
//! generator (`BPF_PROG_TEST_RUN` with live frames, as xdp-trafficgen
//! uses it) running a program of ours (`bpf::WireAction::Generate`, a few
//! raw instructions) in the outside host, pinned to CPU 0: it writes each
//! frame anew with a random source port (1,024 flows) and redirects it
//! into the host's `eth0`, so the frames reach node 1's `e0` through
//! `ndo_xdp_xmit` as raw `xdp_frame`s, before any skb exists, as a NIC's
//! driver hands them to XDP. Node 1's `e0` runs its receive work (NAPI)
//! in a kernel thread pinned to CPU 1, alone there, polling under load
//! (deferred completions) as a NIC's NAPI does. The sink is node 2's `u0`,
//! where an XDP program drops and counts every frame (`xdp_drops`); its
//! NAPI thread shares CPU 0 with the generator at real-time priority, so
//! it never loses a frame to the generator. UDP frames of 60 bytes (64 on
//! a wire with the FCS), checksum 0 as a UDP sender may. Every variant
//! gets the same generator, wire, sink and devices, a fresh pair of
//! nodes, and runs in each round in turn. Reported: delivered packets per
//! second (median of rounds), what the wire handed to the node, and node
//! 1's CPU (CPU 1's busy time) per delivered packet, from which the
//! node's forwarding capacity per CPU follows.
//!
//! Denied sources: the same generator against a load-balancer IP whose
//! source ranges exclude it, with XDP and with TC only: packets dropped
//! per second (`xdp_drop`, `source_denied`) and node 1's CPU per drop.
//!
//! What a veth still does not show: a NIC's DMA, its interrupts and
//! multiple queues, and its rings of thousands of frames (a veth's holds
//! 256, which overflows whenever the node's thread is not polling). See
//! docs/performance.md.

use std::{
    fmt::Write as _,
    fs,
    net::Ipv4Addr,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
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
    bpf::{ifindex, xdp_live_frames, WireAction, WireXdp},
    fuzz::packet,
    lb::{service, Lb},
    topology::receive_xdp_frames,
    Netns, Topology,
};

/// The CPU node 1's receive work runs on; the generator, the wire and the
/// sink run on the other one.
const NODE_CPU: usize = 1;
const WIRE_CPU: usize = 0;

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
    /// Packets per second the wire handed to the node.
    pub offered_pps: Rate,
    /// Node 1's CPU time per delivered packet (ns): its receive work,
    /// the decision, the rewrite and the transmit, alone on its CPU.
    pub node_ns_per_packet: Rate,
}

impl NsResult {
    /// Packets per second one CPU of the node forwards at this cost.
    pub fn capacity_pps(&self) -> f64 {
        if self.node_ns_per_packet.median > 0.0 {
            1e9 / self.node_ns_per_packet.median
        } else {
            0.0
        }
    }
}

/// Denied sources dropped.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeniedResult {
    pub variant: String,
    pub error: Option<String>,
    /// Packets per second dropped as denied.
    pub dropped_pps: Rate,
    /// Packets per second the wire handed to the node.
    pub offered_pps: Rate,
    /// Node 1's CPU time per dropped packet (ns).
    pub node_ns_per_packet: Rate,
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
    _wire: Vec<WireXdp>,
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
        // The wire: the generator's program (run with live frames in the
        // outside host, see `blast`) redirects into its eth0, which hands
        // xdp_frames to node 1's e0.
        let mut wire = Vec::new();
        // Every variant alike: GRO (NAPI) on node 1's e0, which frames
        // sent with ndo_xdp_xmit need when no XDP program runs there.
        receive_xdp_frames(&node1.node, "e0")?;
        // The sink: node 2's u0 drops and counts at XDP. Node 1 knows its
        // MAC for good (the sink answers no ARP).
        wire.push(WireXdp::attach(&node2.node, "u0", WireAction::Drop)?);
        let peer_mac = mac(&node2.node, "u0")?;
        node1.node.ip(&[
            "neigh",
            "replace",
            "192.168.200.2",
            "lladdr",
            &peer_mac,
            "dev",
            "u0",
            "nud",
            "permanent",
        ])?;
        let backend = node2.backends[0].ip;
        let mut rig = Self {
            _wire: wire,
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
        napi_thread_on(&rig.node1.node, "e0", NODE_CPU, 20_000, false)?;
        // The sink preempts the generator on their shared CPU: nothing is
        // lost there, whatever the generator's pace.
        napi_thread_on(&rig.node2.node, "u0", WIRE_CPU, 100_000, true)?;
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

/// The sum of counters `names` of a veth's `ethtool -S`
/// (`rx_queue_0_xdp_drops`, ...), read in one call.
fn veth_stats(ns: &Netns, dev: &str, names: &[&str]) -> Result<u64> {
    let out = crate::netns::run(ns.command("ethtool").args(["-S", dev]))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut total = 0;
    for name in names {
        total += text
            .lines()
            .filter_map(|l| l.trim().split_once(':'))
            .find(|(k, _)| k.trim() == *name)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .with_context(|| format!("{name} in `ethtool -S {dev}`"))?;
    }
    Ok(total)
}

/// Turns on threaded NAPI for `dev` of `ns` and pins its kernel threads
/// (`napi/<dev>-<id>`) to `cpu`: that device's receive work then runs on
/// `cpu` whoever sent the frames.
/// With `realtime` (the sink, which shares its CPU with the generator),
/// the threads run SCHED_FIFO.
fn napi_thread_on(ns: &Netns, dev: &str, cpu: usize, poll_ns: u32, realtime: bool) -> Result<()> {
    // /sys/class/net shows the namespace's devices only under `ip netns
    // exec`, which mounts a /sys of its own.
    crate::netns::run(Command::new("ip").args([
        "netns",
        "exec",
        ns.name(),
        "sh",
        "-c",
        // Under load a NIC's NAPI keeps polling instead of waiting for an
        // interrupt per batch: deferred completions (re-polled every
        // `poll_ns`) do the same for a veth, whose ring (256 frames)
        // would otherwise overflow while its thread is being woken.
        &format!(
            "echo {poll_ns} > /sys/class/net/{dev}/gro_flush_timeout && echo 1000 > /sys/class/net/{dev}/napi_defer_hard_irqs && echo 1 > /sys/class/net/{dev}/threaded"
        ),
    ]))?;
    let prefix = format!("napi/{dev}-");
    let mut pinned = 0;
    for entry in fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !comm.starts_with(&prefix) {
            continue;
        }
        // SAFETY: a zeroed cpu_set_t with one CPU set, passed by pointer
        // with its size.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            continue;
        }
        if realtime {
            let param = libc::sched_param { sched_priority: 50 };
            // SAFETY: a valid sched_param for SCHED_FIFO.
            if unsafe { libc::sched_setscheduler(pid, libc::SCHED_FIFO, &param) } != 0 {
                bail!(
                    "SCHED_FIFO for {}: {}",
                    comm.trim(),
                    std::io::Error::last_os_error()
                );
            }
        }
        pinned += 1;
    }
    if pinned == 0 {
        bail!("no NAPI thread {prefix}* to pin after turning threaded NAPI on");
    }
    Ok(())
}

fn mac(ns: &Netns, dev: &str) -> Result<String> {
    let out = crate::netns::run(ns.command("ip").args(["-j", "link", "show", dev]))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v[0]["address"].as_str().context("MAC address")?.to_owned())
}

/// The generator's frame: UDP from the outside host to `dst:dport`
/// (source port rewritten per packet by the generator's program),
/// checksum 0, as a UDP sender may.
fn frame(dmac: [u8; 6], smac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let (src, dst) = (src.octets(), dst.octets());
    let udp = packet::udp(&src, &dst, 20000, dport, &[0x41; PAYLOAD], true);
    let mut f = Vec::with_capacity(packet::ETH_LEN + 20 + udp.len());
    f.extend_from_slice(&dmac);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&packet::ETH_P_IP.to_be_bytes());
    // TTL 64, id 0, DF.
    f.extend_from_slice(&packet::ipv4_header(
        src,
        dst,
        packet::UDP,
        udp.len(),
        &[],
        64,
        0,
        0x4000,
    ));
    f.extend_from_slice(&udp);
    f
}

/// `mac` as bytes.
fn mac_octets(ns: &Netns, dev: &str) -> Result<[u8; 6]> {
    let text = mac(ns, dev)?;
    packet::unhex(&text.replace(':', ""))
        .and_then(|b| b.try_into().ok())
        .with_context(|| format!("MAC address {text}"))
}

/// Busy ticks (user, nice, system, irq, softirq, steal) of one CPU.
fn cpu_busy_ticks(cpu: usize) -> u64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let label = format!("cpu{cpu}");
    let f: Vec<u64> = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    get(0) + get(1) + get(2) + get(5) + get(6) + get(7)
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

/// What one generator run saw.
struct Blast {
    seconds: f64,
    /// Frames the wire handed to node 1 (accepted or not).
    offered: u64,
    /// Frames the sink on node 2 counted.
    delivered: u64,
    /// Node 1's CPU time (ns).
    node_cpu_ns: f64,
}

/// One generator run against `dst:dport`.
fn blast(rig: &Rig, dst: Ipv4Addr, dport: u16, seconds: f64) -> Result<Blast> {
    let ext = &rig.node1.externals[0];
    let frame = frame(
        mac_octets(&rig.node1.node, "e0")?,
        mac_octets(&ext.ns, "eth0")?,
        ext.ip,
        dst,
        dport,
    );
    let offered = || {
        veth_stats(
            &ext.ns,
            "eth0",
            &["tx_queue_0_xdp_xmit", "tx_queue_0_xdp_xmit_errors"],
        )
    };
    let delivered = || veth_stats(&rig.node2.node, "u0", &["rx_queue_0_xdp_drops"]);
    let (offered0, delivered0) = (offered()?, delivered()?);
    let busy0 = cpu_busy_ticks(NODE_CPU);
    let start = Instant::now();
    let stop = AtomicBool::new(false);
    let prog = WireAction::Generate(ifindex(&ext.ns, "eth0")?, frame.clone()).load()?;
    let (prog, frame) = (&prog, &frame);
    std::thread::scope(|scope| -> Result<()> {
        let gen = scope.spawn(|| {
            ext.ns.run(|| -> Result<()> {
                pin_current_thread(WIRE_CPU)?;
                while !stop.load(Ordering::Relaxed) {
                    xdp_live_frames(prog, frame, 1 << 16)?;
                }
                Ok(())
            })
        });
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        gen.join()
            .map_err(|_| anyhow::anyhow!("the generator thread panicked"))???;
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64();
    // Let the last frames drain.
    std::thread::sleep(Duration::from_millis(100));
    let busy1 = cpu_busy_ticks(NODE_CPU);
    Ok(Blast {
        seconds: secs,
        offered: offered()?.saturating_sub(offered0),
        delivered: delivered()?.saturating_sub(delivered0),
        node_cpu_ns: busy1.saturating_sub(busy0) as f64 * 1e9 / ticks_per_second(),
    })
}

fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace(['\n', '|'], " ")
}

/// Pins the calling thread to `cpu`.
fn pin_current_thread(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread (0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        bail!(
            "pinning the generator to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Per-round figures of one variant: delivered pps, offered pps, node ns
/// per packet; the last error.
#[derive(Default)]
struct Samples(Vec<f64>, Vec<f64>, Vec<f64>, Option<String>);

/// Runs the scenario.
pub fn run(cfg: &NsConfig) -> Result<NorthSouth> {
    let mut out = NorthSouth {
        generator: format!(
            "the kernel's XDP generator (BPF_PROG_TEST_RUN, live frames) on CPU {WIRE_CPU}, UDP frames handed to node 1 as xdp_frames (as from a NIC); node 1's receive work on CPU {NODE_CPU}"
        ),
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
                // A short warm-up: conntrack of every flow.
                blast(&rig, node_ip(), NODE_PORT, 0.3)?;
                blast(&rig, node_ip(), NODE_PORT, cfg.seconds)
            });
            let slot = &mut per[i];
            match outcome {
                Ok(b) if b.delivered > 0 => {
                    let ns = b.node_cpu_ns / b.delivered as f64;
                    eprintln!(
                        "north-south {}: offered {:.0} pps, delivered {:.0} pps, node {ns:.0} ns/packet",
                        variant.name(),
                        b.offered as f64 / b.seconds,
                        b.delivered as f64 / b.seconds
                    );
                    slot.0.push(b.delivered as f64 / b.seconds);
                    slot.1.push(b.offered as f64 / b.seconds);
                    slot.2.push(ns);
                }
                Ok(b) => slot.3 = Some(format!("nothing delivered ({} frames offered)", b.offered)),
                Err(e) => slot.3 = Some(one_line(&e)),
            }
        }
    }
    for (variant, Samples(delivered, offered, ns, error)) in NsVariant::ALL.iter().zip(per) {
        out.forwarded.push(NsResult {
            variant: variant.name().into(),
            error,
            delivered_pps: Rate::from_rounds(&delivered),
            offered_pps: Rate::from_rounds(&offered),
            node_ns_per_packet: Rate::from_rounds(&ns),
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
    let mut per_packet = Vec::new();
    let mut share = 0.0;
    let mut error = None;
    for _ in 0..cfg.rounds {
        let outcome = Rig::new(variant, true).and_then(|rig| {
            let (xdp0, denied0) = (rig.stat(Stat::XdpDrop), rig.stat(Stat::SourceDenied));
            let b = blast(&rig, LB_IP, 80, cfg.seconds)?;
            let (xdp, denied) = (
                rig.stat(Stat::XdpDrop) - xdp0,
                rig.stat(Stat::SourceDenied) - denied0,
            );
            Ok((b, xdp, denied))
        });
        match outcome {
            Ok((b, xdp, den)) => {
                dropped.push(den as f64 / b.seconds);
                offered.push(b.offered as f64 / b.seconds);
                if den > 0 {
                    per_packet.push(b.node_cpu_ns / den as f64);
                    share = xdp as f64 / den as f64;
                } else {
                    share = 0.0;
                }
            }
            Err(e) => error = Some(one_line(&e)),
        }
    }
    DeniedResult {
        variant: variant.name().into(),
        error,
        dropped_pps: Rate::from_rounds(&dropped),
        offered_pps: Rate::from_rounds(&offered),
        node_ns_per_packet: Rate::from_rounds(&per_packet),
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
        "\n## North-south: NodePort to a backend on another node\n\n{}; frames of {} bytes, {} flows, {} round(s) of {:.1} s per variant. Delivered: packets the sink on node 2 counted; offered: packets the wire handed to node 1; node ns/packet: node 1's CPU time (its CPU alone) per delivered packet; capacity: 1 s / that cost, the packets per second one CPU of the node forwards.\n",
        ns.generator, ns.frame_bytes, ns.flows, ns.rounds, ns.seconds_per_round
    );
    let _ = writeln!(s, "| variant | delivered pps | offered pps | node ns/packet | capacity pps | capacity vs sluice-tc | vs iptables | vs nftables |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let cap = |name: &str| {
        ns.forwarded
            .iter()
            .find(|v| v.variant == name && v.error.is_none())
            .map(NsResult::capacity_pps)
            .unwrap_or(0.0)
    };
    let (tc, ipt, nft) = (cap("sluice-tc"), cap("iptables"), cap("nftables"));
    for v in &ns.forwarded {
        if let Some(e) = &v.error {
            let _ = writeln!(s, "| {} | failed: {e} | | | | | | |", v.variant);
            continue;
        }
        let ratio = |base: f64| {
            if base > 0.0 {
                format!("{:.2}x", v.capacity_pps() / base)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            v.variant,
            v.delivered_pps.median,
            v.offered_pps.median,
            v.node_ns_per_packet.median,
            v.capacity_pps(),
            ratio(tc),
            ratio(ipt),
            ratio(nft)
        );
    }
    let _ = writeln!(
        s,
        "\nDenied sources (a load-balancer IP whose source ranges exclude the generator):\n"
    );
    let _ = writeln!(
        s,
        "| variant | dropped pps | offered pps | node ns/packet | dropped in XDP |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    for d in &ns.denied {
        if let Some(e) = &d.error {
            let _ = writeln!(s, "| {} | failed: {e} | | | |", d.variant);
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0}% |",
            d.variant,
            d.dropped_pps.median,
            d.offered_pps.median,
            d.node_ns_per_packet.median,
            100.0 * d.xdp_share
        );
    }
    s
}

/// A bar chart of the node's forwarding capacity per variant.
pub fn svg(ns: &NorthSouth) -> String {
    let max = ns
        .forwarded
        .iter()
        .map(NsResult::capacity_pps)
        .fold(1.0, f64::max);
    let (w, bar, gap, left) = (660.0, 28.0, 12.0, 135.0);
    let h = 40.0 + (bar + gap) * ns.forwarded.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\">North-south: packets per second one node CPU forwards (1 s / node CPU per packet)</text>\n"
    );
    for (i, v) in ns.forwarded.iter().enumerate() {
        let y = 32.0 + i as f64 * (bar + gap);
        let len = (w - left - 120.0) * v.capacity_pps() / max;
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.0}\">{}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{len:.0}\" height=\"{bar}\" fill=\"#4a7ebb\"/><text x=\"{:.0}\" y=\"{:.0}\">{:.0}</text>",
            y + bar * 0.65,
            v.variant,
            left + len + 6.0,
            y + bar * 0.65,
            v.capacity_pps()
        );
    }
    s.push_str("</svg>\n");
    s
}
