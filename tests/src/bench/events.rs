//! The cost of datapath events (`sluice monitor`, issue 19): `sl_ingress`'s
//! own run time per packet (`run_time_ns / run_cnt`, the kernel's BPF
//! statistics, enabled with `BPF_ENABLE_STATS` for the scenario only),
//! with events off and on, for
//!
//! - forwarded packets (a UDP flood through a ClusterIP to a backend's
//!   open socket): no event call is made on this path, so on and off
//!   should not differ;
//! - rejected packets (a UDP flood to a ClusterIP without endpoints, each
//!   answered with an ICMP port unreachable): off, one BPF call that reads
//!   the flag; on, the rate limit holds most of the flood back
//!   (`suppressed`);
//! - rejected packets within the rate limit (`emitted`: a burst smaller
//!   than the bucket, after it refilled): each writes an event.
//!
//! Cases interleave round by round; each figure is the median of the
//! rounds.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::{FromRawFd, OwnedFd},
    time::Duration,
};

use anyhow::{Context, Result};
use aya::maps::{Map, MapData, RingBuf};
use serde::{Deserialize, Serialize};
use sluice::model::{BackendState, Proto};
use sluice_common::{
    config::{CFG_F_EVENTS_DROPS, CFG_F_EVENTS_MASK},
    maps as names,
};

use crate::{
    bpf::{put, sys_bpf, tcx_links, BPF_TCX_INGRESS},
    lb::{cluster_ip, Lb},
    Netns, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 60);
const EMPTY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 61);
const PORT: u16 = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;

/// One case's figure.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventsCase {
    pub case: String,
    /// `sl_ingress` nanoseconds per run, median of the rounds.
    pub ns_per_packet: f64,
    pub packets_per_round: usize,
}

/// The scenario's results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventsCost {
    pub rounds: usize,
    pub cases: Vec<EventsCase>,
}

/// (`run_time_ns`, `run_cnt`) of the program behind `fd`.
fn prog_stats(fd: &OwnedFd) -> Result<(u64, u64)> {
    let field =
        |name: &str| -> Result<u64> { Ok(crate::bpf::fdinfo_field(fd, name)?.unwrap_or(0)) };
    Ok((field("run_time_ns")?, field("run_cnt")?))
}

fn prog_fd(id: u32) -> Result<OwnedFd> {
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &id.to_ne_bytes());
    let fd = sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: a new fd the kernel just returned to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn flood(ns: &Netns, to: SocketAddr, n: usize) -> Result<()> {
    ns.run(move || -> std::io::Result<()> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..n {
            socket.send_to(b"x", to)?;
        }
        Ok(())
    })??;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the scenario: `rounds` rounds of `packets` packets per case.
pub fn run(rounds: usize, packets: usize) -> Result<EventsCost> {
    let topo = Topology::new(1, 1)?;
    let b = &topo.backends[0];
    // A socket that takes the datagrams and never answers.
    let _sink = b.ns.run(|| UdpSocket::bind(("0.0.0.0", PORT)))??;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip(
        "web",
        VIP,
        PORT,
        Proto::Udp,
        &[(b.ip, PORT, BackendState::Active)],
    ));
    lb.set(cluster_ip("empty", EMPTY, PORT, Proto::Udp, &[]));
    let client = &topo.clients[0];
    let device = topo
        .devices()
        .into_iter()
        .find(|d| d.starts_with('c'))
        .context("a client device")?;
    let (_, id) = *tcx_links(&topo.node, &device, BPF_TCX_INGRESS)?
        .first()
        .context("sl_ingress on the client device")?;
    let fd = prog_fd(id)?;
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")?;
    let ring = MapData::from_pin(topo.bpf.path().join(names::EVENTS))?;
    let mut ring = RingBuf::try_from(Map::from_map_data(ring)?)?;
    let burst = (sluice_common::events::EVENTS_BURST as usize / 2).min(packets);

    let cases: [(&str, bool, Ipv4Addr, usize); 5] = [
        ("forwarded, events off", false, VIP, packets),
        ("forwarded, events on", true, VIP, packets),
        ("rejected, events off", false, EMPTY, packets),
        (
            "rejected, events on (flood: mostly suppressed)",
            true,
            EMPTY,
            packets,
        ),
        (
            "rejected, events on (within the rate limit: emitted)",
            true,
            EMPTY,
            burst,
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        super::check_interrupted()?;
        for (i, (_, on, dst, n)) in cases.iter().enumerate() {
            lb.reconciler
                .set_config_flags(CFG_F_EVENTS_MASK, if *on { CFG_F_EVENTS_DROPS } else { 0 })?;
            if i == cases.len() - 1 {
                // Let every CPU's bucket refill.
                std::thread::sleep(Duration::from_millis(1100));
            }
            let (t0, c0) = prog_stats(&fd)?;
            flood(&client.ns, SocketAddr::from((*dst, PORT)), *n)?;
            let (t1, c1) = prog_stats(&fd)?;
            while ring.next().is_some() {}
            if c1 > c0 {
                samples[i].push((t1 - t0) as f64 / (c1 - c0) as f64);
            }
        }
    }
    lb.reconciler.set_config_flags(CFG_F_EVENTS_MASK, 0)?;
    let cases = cases
        .iter()
        .zip(samples)
        .map(|((name, _, _, n), s)| EventsCase {
            case: (*name).to_owned(),
            ns_per_packet: median(s),
            packets_per_round: *n,
        })
        .collect();
    Ok(EventsCost { rounds, cases })
}
