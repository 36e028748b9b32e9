//! Pinned state: readable with bpftool, adopted by a restarted loader
//! without a gap or a write, migrated with its flows when resized, and full maps
//! refuse a service whole while the others keep working.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result};
use sluice::{
    datapath::{Attached, Datapath, MapSizes, MapWriter},
    model::{BackendState, Proto},
    reconcile::{Reconciler, Refusal},
};
use sluice_common::{Ct4Key, CtEntry};
use sluice_tests::{
    clients::{self, Stream},
    lb::{cluster_ip, cluster_ip6, vip, vip6, Lb},
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 50);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x50);

fn bpftool_dump(path: &std::path::Path) -> Result<String> {
    let out = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(path)
        .output()
        .context("running bpftool")?;
    anyhow::ensure!(
        out.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn bpftool_shows_field_names_of_every_map() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let b = &topo.backends[0];
    let _server = servers::tcp_greeter(&b.ns, 8080, &b.name)?;
    let _server6 = servers::tcp_greeter6(&b.ns, 8080, &b.name)?;
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &[(b.ip, 8080, BackendState::Active)],
    ));
    lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &[(b.ip6, 8080, BackendState::Active)],
    ));
    clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80))?;
    clients::tcp_hello(&topo.clients[0].ns, vip6(VIP6, 80))?;
    let root = topo.bpf.path();
    let abi = format!("\"abi_version\": {}", sluice_common::ABI_VERSION);
    let expect: [(&str, &[&str]); 6] = [
        (
            "sl_svc4",
            &[
                "\"addr\"",
                "\"slot\"",
                "\"svc_id\"",
                "\"backend_id\"",
                "\"active\"",
                "\"fallback\"",
            ],
        ),
        (
            "sl_backends",
            &["\"addr\"", "\"port\": 8080", "\"state\"", "\"svc_id\""],
        ),
        (
            "sl_ct4",
            &[
                "\"src\"",
                "\"dport\": 80",
                "\"nat_port\": 80",
                "\"peer_addr\"",
                "\"kind\"",
                "\"last_seen_ns\"",
            ],
        ),
        (
            "sl_svc6",
            &[
                "\"addr\": [253,0,0,150,",
                "\"port\": 80",
                "\"slot\"",
                "\"svc_id\"",
            ],
        ),
        (
            "sl_ct6",
            &[
                "\"src\": [253,0,0,16,",
                "\"dport\": 80",
                "\"nat_addr\"",
                "\"kind\"",
            ],
        ),
        (
            "sl_config",
            &[abi.as_str(), "\"hash_seed\"", "\"snat_port_min\": 61000"],
        ),
    ];
    for (map, fields) in expect {
        let dump = bpftool_dump(&root.join(map))?;
        for field in fields {
            assert!(dump.contains(field), "{map}: {field} missing in\n{dump}");
        }
    }
    Ok(())
}

#[test]
fn a_second_loader_swaps_programs_in_place_and_adopts_without_writing() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, 8080, BackendState::Active))
        .collect();
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &backends));
    let mut stream = Stream::connect(&topo.clients[0].ns, vip(VIP, 80))?;
    stream.ping()?;
    let desired = lb.desired.clone();
    let programmed = lb.reconciler.programmed().clone();
    drop(lb); // the first "agent" exits: links and maps stay pinned

    stream
        .ping()
        .context("datapath keeps running with no loader")?;

    let sizes = MapSizes::default();
    let (mut datapath, maps) = Datapath::load(topo.bpf.path(), &sizes)?;
    assert!(!datapath.migrating(), "same layout: nothing to migrate");
    let devices = topo.devices();
    let outcomes = topo.node.run(|| -> Result<Vec<Attached>> {
        devices.iter().map(|d| Ok(datapath.attach(d)?)).collect()
    })??;
    assert!(
        outcomes.iter().all(|o| *o == Attached::Replaced),
        "{outcomes:?}"
    );
    stream.ping().context("flow survives the program swap")?;

    let mut reconciler = Reconciler::new(MapWriter::new(maps), &sizes, Duration::from_secs(60))?;
    assert_eq!(
        reconciler.programmed(),
        &programmed,
        "adopted exactly what was programmed"
    );
    let report = reconciler.reconcile(
        &desired,
        sluice::reconcile::Scope::All,
        std::time::Instant::now(),
    );
    assert_eq!(
        report.writes, 0,
        "an unchanged desired state writes nothing: {report:?}"
    );
    stream.ping()?;
    clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80))?;
    Ok(())
}

#[test]
fn a_resized_conntrack_map_is_migrated_with_its_flows() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, 8080, BackendState::Active))
        .collect();
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &backends));
    let mut streams = (0..8)
        .map(|_| Stream::connect(&topo.clients[0].ns, vip(VIP, 80)))
        .collect::<Result<Vec<_>>>()?;
    for s in &mut streams {
        s.ping()?;
    }
    let programmed = lb.reconciler.programmed().clone();
    // A node with many flows: synthetic entries beside the real ones
    // (fresh, so that nothing expires them meanwhile).
    const SYNTHETIC: u32 = 100_000;
    {
        let mut maps = lb.maps()?;
        let now = sluice::conntrack::monotonic_ns();
        for i in 0..SYNTHETIC {
            let [_, a, b, c] = i.to_be_bytes();
            let key = Ct4Key::new([172, a, b, c], [10, 96, 9, 9], 40000, 80, 6);
            let entry = CtEntry {
                last_seen_ns: now,
                backend_id: 1,
                svc_id: 1,
                ..CtEntry::default()
            };
            maps.conntrack_v4.insert(key, entry, 0)?;
        }
    }
    let flows_before = lb.maps()?.conntrack_v4.iter().count();
    assert!(flows_before >= SYNTHETIC as usize + 16);
    drop(lb);

    let bigger = MapSizes {
        conntrack: MapSizes::default().conntrack * 2,
        ..MapSizes::default()
    };
    let started = std::time::Instant::now();
    let lb = Lb::load_with(&topo, bigger, Duration::from_secs(60))?;
    eprintln!(
        "resize of sl_ct4 with {flows_before} entries: load, copy, swap and finish in {:?}",
        started.elapsed()
    );
    for (i, s) in streams.iter_mut().enumerate() {
        s.ping()
            .with_context(|| format!("stream {i} survives the resize"))?;
    }
    assert_eq!(
        lb.reconciler.programmed(),
        &programmed,
        "services, backends and ids carried over"
    );
    let ct = topo.bpf.path().join("sl_ct4");
    let info = aya::maps::MapInfo::from_pin(&ct)?;
    assert_eq!(
        info.max_entries(),
        bigger.conntrack,
        "the pin is the new map"
    );
    assert_eq!(
        lb.maps()?.conntrack_v4.iter().count(),
        flows_before,
        "every conntrack entry carried over"
    );
    assert!(
        !topo.bpf.path().join("migrate").exists(),
        "staging removed once finished"
    );
    clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80))?;
    for s in &mut streams {
        s.ping()?;
    }
    Ok(())
}

/// `flags` of the pinned map `name`.
fn pinned_flags(topo: &Topology, name: &str) -> Result<u32> {
    sluice_tests::bpf::pinned_map_flags(&topo.bpf.path().join(name))
}

#[test]
fn preallocating_the_service_maps_and_back_migrates_them_with_their_flows() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let _servers = servers::tcp_greeters(&topo, 8080)?;
    let _servers6 = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter6(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, 8080, BackendState::Active))
        .collect();
    let backends6: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip6, 8080, BackendState::Active))
        .collect();
    lb.set(cluster_ip("web", VIP, 80, Proto::Tcp, &backends));
    lb.set(cluster_ip6("web6", VIP6, 80, Proto::Tcp, &backends6));
    let ns = &topo.clients[0].ns;
    let mut streams = (0..4)
        .map(|_| Stream::connect(ns, vip(VIP, 80)))
        .chain((0..4).map(|_| Stream::connect(ns, vip6(VIP6, 80))))
        .collect::<Result<Vec<_>>>()?;
    for s in &mut streams {
        s.ping()?;
    }
    let programmed = lb.reconciler.programmed().clone();
    const MAPS: [&str; 3] = ["sl_svc4", "sl_svc6", "sl_backends"];
    for name in MAPS {
        assert_eq!(
            pinned_flags(&topo, name)?,
            1,
            "{name} starts unpreallocated"
        );
    }

    for preallocate in [true, false] {
        drop(lb);
        let sizes = MapSizes {
            preallocate,
            ..MapSizes::default()
        };
        lb = Lb::load_with(&topo, sizes, Duration::from_secs(60))?;
        for name in MAPS {
            assert_eq!(
                pinned_flags(&topo, name)?,
                u32::from(!preallocate),
                "{name}: BPF_F_NO_PREALLOC is off exactly when preallocated ({preallocate})"
            );
        }
        assert_eq!(
            pinned_flags(&topo, "sl_maglev4")?,
            1,
            "the Maglev tables stay unpreallocated (64 KiB each)"
        );
        // What `sluice status` prints.
        let preallocated: std::collections::BTreeSet<&str> =
            sluice::datapath::map_fill(topo.bpf.path())?
                .into_iter()
                .filter(|f| f.preallocated)
                .map(|f| f.map)
                .collect();
        // The object's flags are what the agent expects of the pins.
        let expected: std::collections::BTreeSet<&str> = if preallocate {
            sluice_common::abi::PREALLOCATABLE.into_iter().collect()
        } else {
            Default::default()
        };
        assert_eq!(preallocated, expected, "status names the preallocated maps");
        assert!(
            !topo.bpf.path().join("migrate").exists(),
            "staging removed once finished"
        );
        assert_eq!(
            lb.reconciler.programmed(),
            &programmed,
            "services, backends and ids carried over (preallocated: {preallocate})"
        );
        for (i, s) in streams.iter_mut().enumerate() {
            s.ping().with_context(|| {
                format!("stream {i} survives the migration (preallocated: {preallocate})")
            })?;
        }
        clients::tcp_hello(ns, vip(VIP, 80))?;
        clients::tcp_hello(ns, vip6(VIP6, 80))?;
        // A restart with the same choice adopts the pins as they are.
        drop(lb);
        let (datapath, _maps) = Datapath::load(topo.bpf.path(), &sizes)?;
        assert!(
            !datapath.migrating(),
            "a restart with the same choice ({preallocate}) migrates nothing"
        );
        drop(datapath);
        lb = Lb::load_with(&topo, sizes, Duration::from_secs(60))?;
        for s in &mut streams {
            s.ping()?;
        }
    }
    Ok(())
}

#[test]
fn a_service_that_does_not_fit_is_refused_whole_and_others_keep_working() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let b = &topo.backends[0];
    let _server = servers::tcp_greeter(&b.ns, 8080, &b.name)?;
    // Room for 8 service entries: "small" takes 2, "big" would take 11.
    let sizes = MapSizes {
        services: 8,
        ..MapSizes::default()
    };
    let mut lb = Lb::load_with(&topo, sizes, Duration::from_secs(60))?;
    lb.set(cluster_ip(
        "small",
        VIP,
        80,
        Proto::Tcp,
        &[(b.ip, 8080, BackendState::Active)],
    ));
    let many: Vec<_> = (1..=10)
        .map(|i| (Ipv4Addr::new(10, 30, 0, i), 8080, BackendState::Active))
        .collect();
    let report = lb.set(cluster_ip(
        "big",
        Ipv4Addr::new(10, 96, 0, 51),
        80,
        Proto::Tcp,
        &many,
    ));
    assert_eq!(report.refused.len(), 1, "{report:?}");
    assert_eq!(report.refused[0].1, Refusal::MapsFull);
    assert!(
        report.errors.is_empty(),
        "refused before any write failed: {:?}",
        report.errors
    );
    assert_eq!(
        lb.reconciler.programmed().service_entries(),
        2,
        "only the small service is programmed"
    );
    assert_eq!(
        clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80))?,
        b.name
    );
    Ok(())
}

/// Issue 17: the writer hands runs of entries of one map to the kernel as
/// one `BPF_MAP_UPDATE_BATCH`, keeps their order across maps, and a batch
/// that meets a full map stops at the first entry that did not fit and
/// says how many went in: exactly those are in the map.
#[test]
fn a_batch_of_writes_goes_in_order_and_stops_where_a_map_is_full() -> Result<()> {
    use sluice::{
        datapath::{Entry, MapReads, MapWrites, ServiceKey, WriteError},
        reconcile::BackendId,
    };
    use sluice_common::{Backend, Svc4Key, SvcValue};

    let root = sluice_tests::topology::BpfRoot::create()?;
    let sizes = MapSizes {
        backends: 4,
        ..MapSizes::default()
    };
    let (_datapath, maps) = Datapath::load(root.path(), &sizes)?;
    let mut writer = MapWriter::new(maps);
    let backend = |i: u8| Backend {
        addr: [10, 30, 0, i, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        port: 8080,
        family: sluice_common::FAMILY_V4,
        state: BackendState::Active as u8,
        svc_id: 7,
    };
    let backends: Vec<Backend> = (1..=6).map(backend).collect();
    let ids: Vec<BackendId> = (1..=6).map(BackendId).collect();
    let key = |slot: u16| ServiceKey::V4(Svc4Key::new([10, 96, 0, 9], 80, 6, slot));
    let slot = |id: u32| SvcValue {
        svc_id: 7,
        backend_id: id,
        ..SvcValue::default()
    };
    let slots = [slot(1), slot(2)];
    let master = SvcValue {
        svc_id: 7,
        active: 2,
        total: 2,
        ..SvcValue::default()
    };
    // Backends, slots, master: three runs, in that order.
    let entries = [
        Entry::Backend(ids[0], &backends[0]),
        Entry::Backend(ids[1], &backends[1]),
        Entry::Service(key(1), &slots[0]),
        Entry::Service(key(2), &slots[1]),
        Entry::Service(key(0), &master),
    ];
    writer
        .put_batch(&entries)
        .map_err(|(n, e)| anyhow::anyhow!("after {n}: {e}"))?;
    assert_eq!(writer.writes(), 5);
    let (state, _) = writer.state()?;
    assert_eq!(state.backends.len(), 2, "both backends in sl_backends");
    assert_eq!(
        state.service_entries(),
        3,
        "master and two slots in sl_svc4"
    );

    // Four more backends into a map with room for two more.
    let more: Vec<Entry<'_>> = (2..6)
        .map(|i| Entry::Backend(ids[i], &backends[i]))
        .collect();
    match writer.put_batch(&more) {
        Err((2, WriteError::Full { map })) => assert_eq!(map, "sl_backends"),
        other => panic!("expected the third of four to find sl_backends full, got {other:?}"),
    }
    assert_eq!(writer.writes(), 7, "the two that fitted count as writes");
    let (state, _) = writer.state()?;
    let mut have: Vec<u32> = state.backends.keys().map(|id| id.get()).collect();
    have.sort();
    assert_eq!(
        have,
        vec![1, 2, 3, 4],
        "exactly the entries before the full one"
    );
    Ok(())
}
