//! Backend selection: fair spread, and no failed connection while the
//! backend set is rewritten under load (the write order never exposes a
//! slot without its backend).

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use sluice::model::{BackendState, Proto};
use sluice_common::Stat;
use sluice_tests::{
    clients,
    lb::{cluster_ip, vip, Lb},
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);

#[test]
fn three_backends_share_3000_connections_fairly() -> anyhow::Result<()> {
    let topo = Topology::new(1, 3)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut lb = Lb::load(&topo)?;
    let backends: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, 8080, BackendState::Active))
        .collect();
    lb.set(cluster_ip("spread", VIP, 80, Proto::Tcp, &backends));

    let mut hits: HashMap<String, usize> = HashMap::new();
    let mut failures = Vec::new();
    for (i, outcome) in clients::tcp_hellos(&topo.clients[0].ns, vip(VIP, 80), 3000)?
        .into_iter()
        .enumerate()
    {
        match outcome {
            Ok(name) => *hits.entry(name).or_default() += 1,
            Err(e) => failures.push(format!("connection {i}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} connections failed: {failures:?}",
        failures.len()
    );
    // Expected 1000 each; sd of a fair split is ~26, so +-15% is > 5 sd.
    assert_eq!(hits.len(), 3, "every backend got connections: {hits:?}");
    for (backend, n) in &hits {
        assert!(
            (850..=1150).contains(n),
            "{backend} got {n} of 3000: {hits:?}"
        );
    }
    // Every connection was one new pick: normally `new_flow`; when the
    // client's kernel reuses the source port of an earlier, closed
    // connection (seen: 2 in 3000), its SYN finds the closed entry and
    // counts as `reselected` instead.
    let (new, reselected) = (lb.stat(Stat::NewFlow)?, lb.stat(Stat::Reselected)?);
    assert_eq!(new + reselected, 3000, "new {new}, reselected {reselected}");
    assert!(
        reselected < 30,
        "{reselected} reselections: port reuse is rare"
    );
    Ok(())
}

#[test]
fn rewriting_the_backend_set_in_a_loop_fails_no_connection() -> anyhow::Result<()> {
    let topo = Topology::new(1, 4)?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut lb = Lb::load_with(&topo, Default::default(), Duration::from_secs(60))?;
    let ips: Vec<Ipv4Addr> = topo.backends.iter().map(|b| b.ip).collect();
    let set = |mask: u32| -> Vec<(Ipv4Addr, u16, BackendState)> {
        ips.iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, ip)| (*ip, 8080, BackendState::Active))
            .collect()
    };
    lb.set(cluster_ip("churn", VIP, 80, Proto::Tcp, &set(0b1111)));

    let done = Arc::new(AtomicBool::new(false));
    let client_ns = &topo.clients[0].ns;
    let (outcomes, rewrites) = std::thread::scope(|s| {
        let done2 = done.clone();
        let client = s.spawn(move || {
            let r = clients::tcp_hellos(client_ns, vip(VIP, 80), 3000);
            done2.store(true, Ordering::Relaxed);
            r
        });
        // Every non-empty subset of the four backends, over and over, with
        // drain ticks so that backends also leave the maps when idle.
        let mut rewrites = 0u32;
        let mut mask = 1u32;
        while !done.load(Ordering::Relaxed) {
            let report = lb.set(cluster_ip("churn", VIP, 80, Proto::Tcp, &set(mask)));
            assert!(report.errors.is_empty(), "{:?}", report.errors);
            if rewrites.is_multiple_of(8) {
                lb.drain_tick().expect("drain tick");
            }
            mask = mask % 15 + 1;
            rewrites += 1;
            // Leave the client a core on this 2-core machine.
            std::thread::sleep(Duration::from_micros(200));
        }
        (client.join().expect("client thread"), rewrites)
    });
    let failures: Vec<String> = outcomes?
        .into_iter()
        .filter_map(|o| o.err().map(|e| e.to_string()))
        .collect();
    assert!(
        rewrites > 100,
        "the writer kept rewriting ({rewrites} rewrites)"
    );
    assert!(
        failures.is_empty(),
        "{} of 3000 connections failed during {rewrites} rewrites: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(
        lb.stat(Stat::Dangling)?,
        0,
        "no packet ever saw a dangling slot"
    );
    Ok(())
}
