//! Fuzzing the loaded datapath with `BPF_PROG_TEST_RUN` (issue 18):
//! generated and mutated frames through `sl_ingress` and `sl_egress`
//! (both families; IPv6 through the tail call), those arriving on the
//! outside-facing device through `sl_xdp` first, with the invariants of
//! `sluice_tests::fuzz` checked after every packet and batch. A fixed
//! seed, then a time-seeded part (its seed printed), then the corpus in
//! `tests/fuzz-corpus/`. `SLUICE_FUZZ_PACKETS` sets the count (default
//! 200,000), `SLUICE_FUZZ_SEED` replays a run's time-seeded part after the fixed
//! part, as in the run (the datapath's own random choices, a flow's
//! backend among them, may still differ: a failure found this way goes
//! into the corpus as frames that do not depend on them).

use std::{
    ffi::CString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use sluice::{
    datapath::XdpMode,
    model::{BackendState, FrontendKind, Proto},
};
use sluice_tests::{
    fuzz::{self, gen::Target, testrun, Harness},
    lb::{frontend, service, Lb},
    Topology,
};

const FIXED_SEED: u64 = 0x5111_ce00_f022;
const BATCH: usize = 256;
const SOCKET_PROGRAMS: [&str; 9] = [
    "sl_connect4",
    "sl_connect6",
    "sl_sendmsg4",
    "sl_sendmsg6",
    "sl_recvmsg4",
    "sl_recvmsg6",
    "sl_getpeername4",
    "sl_getpeername6",
    "sl_sock_release",
];

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim().replace('_', "");
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Services of every kind the datapath treats differently, both families.
fn program(lb: &mut Lb, topo: &Topology) -> Target {
    let mut target = Target {
        snat_ports: (
            sluice_common::config::SNAT_PORT_MIN,
            sluice_common::config::SNAT_PORT_MAX,
        ),
        ..Target::default()
    };
    for v6 in [false, true] {
        let ip = |a: Ipv4Addr| -> IpAddr {
            if v6 {
                IpAddr::V6(sluice_tests::topology::v6_of(a))
            } else {
                IpAddr::V4(a)
            }
        };
        let vip = |last: u16| -> IpAddr {
            if v6 {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, last))
            } else {
                IpAddr::V4(Ipv4Addr::new(10, 96, 0, last as u8))
            }
        };
        let backends: Vec<(IpAddr, u16, BackendState)> = topo
            .backends
            .iter()
            .map(|b| (b.addr(v6), 8080, BackendState::Active))
            .collect();
        let node = ip(topo.node_address(0));
        let fam = if v6 { "6" } else { "4" };
        let mut services = Vec::new();
        for (proto, port) in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
            services.push((
                format!("plain{fam}-{port}"),
                port,
                proto,
                frontend(FrontendKind::ClusterIp, vip(10), port, proto, &backends),
            ));
            let mut np = frontend(FrontendKind::NodePort, node, 30000 + port, proto, &backends);
            np.snat = true;
            services.push((format!("np{fam}-{port}"), port, proto, np));
            services.push((
                format!("empty{fam}-{port}"),
                port,
                proto,
                frontend(FrontendKind::ClusterIp, vip(12), port, proto, &[]),
            ));
        }
        let mut sticky = frontend(FrontendKind::ClusterIp, vip(11), 80, Proto::Tcp, &backends);
        sticky.affinity_timeout = Some(10_800);
        services.push((format!("sticky{fam}"), 80, Proto::Tcp, sticky));
        let mut drop = frontend(FrontendKind::ClusterIp, vip(13), 80, Proto::Tcp, &[]);
        drop.when_empty = sluice::model::WhenEmpty::Drop;
        services.push((format!("drop{fam}"), 80, Proto::Tcp, drop));
        let mut maglev = frontend(FrontendKind::ClusterIp, vip(14), 80, Proto::Tcp, &backends);
        maglev.maglev = true;
        services.push((format!("maglev{fam}"), 80, Proto::Tcp, maglev));
        let mut lbip = frontend(
            FrontendKind::LoadBalancer,
            vip(200),
            443,
            Proto::Tcp,
            &backends,
        );
        lbip.snat = true;
        lbip.source_ranges = vec![(ip(Ipv4Addr::new(192, 168, 1, 0)), if v6 { 120 } else { 24 })];
        services.push((format!("lb{fam}"), 443, Proto::Tcp, lbip));
        for (name, port, proto, fe) in services {
            target
                .frontends
                .push((fe.key.addr, fe.key.port, proto.number()));
            let report = lb.set(service(&name, port, proto, vec![fe]));
            assert!(report.errors.is_empty(), "{name}: {:?}", report.errors);
        }
        // Backends behind the outside-facing devices (another node's pods,
        // as far as this node can tell): `sl_xdp` sends their flows itself,
        // out of the device they came in on (`XDP_TX`) or the other one
        // (`XDP_REDIRECT`), and turns their replies back.
        let remote: Vec<(IpAddr, u16, BackendState)> = topo
            .externals
            .iter()
            .map(|e| (e.addr(v6), 8080, BackendState::Active))
            .collect();
        for (proto, port) in [(Proto::Tcp, 31080), (Proto::Udp, 31053)] {
            let mut fe = frontend(FrontendKind::NodePort, node, port, proto, &remote);
            fe.snat = true;
            target
                .frontends
                .push((fe.key.addr, fe.key.port, proto.number()));
            let name = format!("remote{fam}-{port}");
            let report = lb.set(service(&name, port, proto, vec![fe]));
            assert!(report.errors.is_empty(), "{name}: {:?}", report.errors);
        }
        for b in &topo.backends {
            target.backends.push((b.addr(v6), 8080));
        }
        for (k, e) in topo.externals.iter().enumerate() {
            target.backends.push((e.addr(v6), 8080));
            if k > 0 {
                target.nodes.push(ip(topo.node_address(k)));
            }
        }
        target.nodes.push(node);
        target.nodes.push(ip(Ipv4Addr::new(10, 10, 0, 1)));
        for b in 0..topo.backends.len() {
            target.nodes.push(ip(Ipv4Addr::new(10, 20, b as u8, 1)));
        }
        target.clients.push(topo.clients[0].addr(v6));
        target.clients.push(topo.externals[0].addr(v6));
    }
    target
}

fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

#[test]
fn generated_and_mutated_packets_keep_every_invariant() -> Result<()> {
    let mut topo = Topology::new(1, 2)?;
    topo.add_external()?;
    topo.add_external()?;
    topo.wait_ipv6_ready()?;
    let mut lb = Lb::load(&topo)?;
    let mut target = program(&mut lb, &topo);
    let root = lb.datapath.root().to_owned();
    let devices = topo.devices();
    // `sl_xdp` on the devices that face outside hosts, as `--xdp-devices`
    // puts it (generic mode unless the run tests native XDP): frames that
    // arrive there meet it before `sl_ingress`.
    let xdp_devices: Vec<String> = devices
        .iter()
        .filter(|d| d.starts_with('e'))
        .cloned()
        .collect();
    let mode = sluice_tests::xdp_under_test().unwrap_or(XdpMode::Generic);
    {
        let datapath = &mut lb.datapath;
        topo.node.run(|| -> Result<()> {
            for d in &xdp_devices {
                datapath.attach_xdp(d, mode)?;
            }
            Ok(())
        })??;
    }
    // `sl_xdp` sends only to a resolved neighbour (else TC resolves it):
    // the node connects to a closed port of each outside host first, and
    // its reset proves the round trip.
    for e in &topo.externals {
        for addr in [e.addr(false), e.addr(true)] {
            let to = std::net::SocketAddr::new(addr, 9);
            let answer = topo.node.run(move || {
                std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(3))
            })?;
            anyhow::ensure!(
                answer
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
                "the node reaches {addr}: {answer:?}"
            );
        }
    }
    let packets = env_u64("SLUICE_FUZZ_PACKETS").unwrap_or(200_000);
    let corpus_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus");

    let report = topo.node.run(move || -> Result<fuzz::Report> {
        target.ifindexes = devices
            .iter()
            .map(|d| ifindex(d).with_context(|| format!("no device {d}")))
            .collect::<Result<_>>()?;
        target.xdp_ifindexes = xdp_devices
            .iter()
            .map(|d| ifindex(d).with_context(|| format!("no device {d}")))
            .collect::<Result<_>>()?;
        // The socket programs: does test-run take them on this kernel?
        for prog in testrun::open_programs(&root, &SOCKET_PROGRAMS)? {
            match testrun::probe(&prog) {
                None => println!("{}: test-run supported (not fuzzed yet)", prog.name),
                Some(e) => println!(
                    "{}: test-run not supported on this kernel ({e}, errno {:?})",
                    prog.name,
                    e.raw_os_error()
                ),
            }
        }
        let mut h = Harness::new(&root, target)?;
        let start = Instant::now();

        // The corpus: cases that once failed or cover edge cases.
        let mut files: Vec<_> = std::fs::read_dir(&corpus_dir)?
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "txt"))
            .collect();
        files.sort();
        let mut corpus = Vec::new();
        for file in &files {
            for (n, line) in std::fs::read_to_string(file)?.lines().enumerate() {
                if let Some(p) = fuzz::parse_corpus_line(line, ifindex) {
                    corpus.push(p.with_context(|| format!("{}:{}", file.display(), n + 1))?);
                }
            }
        }
        println!(
            "corpus: {} packets from {} files",
            corpus.len(),
            files.len()
        );
        for chunk in corpus.chunks(BATCH) {
            h.run_batch(chunk).context("corpus")?;
        }

        // A replay runs the fixed part first, as the run it replays did:
        // a packet may fail only with the conntrack entries the packets
        // before it left.
        let (fixed, timed) = match env_u64("SLUICE_FUZZ_SEED") {
            Some(seed) => (FIXED_SEED, Some(seed)),
            None => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
                (FIXED_SEED, Some(now.as_nanos() as u64))
            }
        };
        let first = if timed.is_some() {
            packets / 2
        } else {
            packets
        };
        println!("fuzzing {first} packets with seed {fixed:#x}");
        fuzz::fuzz(&mut h, fixed, first, BATCH)?;
        if let Some(seed) = timed {
            println!(
                "fuzzing {} packets with time seed {seed:#x} (replay: SLUICE_FUZZ_SEED={seed:#x})",
                packets - first
            );
            fuzz::fuzz(&mut h, seed, packets - first, BATCH)?;
        }
        println!("{:.1} s", start.elapsed().as_secs_f64());
        Ok(h.report)
    })??;
    println!("{report}");
    let decided_by_xdp: u64 = report
        .xdp_verdicts
        .iter()
        .filter(|(v, _)| **v != "pass")
        .map(|(_, n)| n)
        .sum();
    assert!(
        report.packets + report.refused + decided_by_xdp >= packets,
        "every packet ran, was refused by test-run or was decided by sl_xdp"
    );
    assert!(report.ct_created > 0, "service traffic created flows");
    assert!(report.modified > 0, "packets were rewritten");
    assert!(report.xdp > 0, "frames went through sl_xdp");
    for sent in ["tx", "redirect", "drop"] {
        assert!(
            report.xdp_verdicts.get(sent).is_some_and(|n| *n > 0),
            "sl_xdp decided some frames itself ({sent}): {:?}",
            report.xdp_verdicts
        );
    }
    Ok(())
}
