//! The handover of an upgrade that moves conntrack to a new map, step by
//! step and deterministically (the upgrade tests catch a gap in it only
//! by chance): while the links are being swapped, a connection whose SYN
//! the old generation's ingress program tracked must get its first
//! SYN-ACK reverse-NATed by the new generation's egress program, which
//! hands it to the old program because its own conntrack lacks the flow.
//! Both families; flows opened before the upgrade keep working throughout.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use sluice::{
    datapath::{Datapath, Facing, Hook, MapSizes},
    model::Proto,
};
use sluice_tests::{
    clients::{self, Stream},
    lb::{cluster_ips, dual_stack_backends, vip, vip6, Lb},
    servers, Netns, Topology,
};

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 81);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x81);

/// Below the first SYN retransmission (1 s): a connect that completes in
/// time had its first SYN-ACK translated.
const FIRST_TRY: Duration = Duration::from_millis(800);

/// One connection that must complete on its first SYN: the name of the
/// backend that answered.
fn first_try(ns: &Netns, addr: SocketAddr) -> Result<String> {
    ns.run(move || TcpStream::connect_timeout(&addr, FIRST_TRY).and_then(clients::hello))?
        .with_context(|| format!("connect to {addr} on its first SYN"))
}

fn targets() -> [SocketAddr; 2] {
    [vip(VIP4, 80).into(), vip6(VIP6, 80).into()]
}

#[test]
fn replies_the_new_conntrack_lacks_go_to_the_old_programs_during_the_swap() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    topo.wait_ipv6_ready()?;
    let _servers = servers::tcp_greeters_dual(&topo.backends, 8080)?;
    let backends = dual_stack_backends(&topo.backends, 8080);
    let names: Vec<&str> = topo.backends.iter().map(|b| b.name.as_str()).collect();
    let client = &topo.clients[0];

    // Generation A: attached, with one long-lived stream per family.
    let mut lb = Lb::load(&topo)?;
    lb.set(cluster_ips(
        "web",
        &[IpAddr::V4(VIP4), IpAddr::V6(VIP6)],
        80,
        Proto::Tcp,
        &backends,
    ));
    let mut streams = targets()
        .into_iter()
        .map(|addr| Stream::connect(&client.ns, addr))
        .collect::<Result<Vec<_>>>()?;
    for s in &mut streams {
        s.ping()?;
    }
    drop(lb); // the old agent exits; its programs stay in the links

    // Generation B with a conntrack of another size: both conntrack maps
    // are staged and copied, and A's TC programs stand by in B's
    // `sl_handover`.
    let bigger = MapSizes {
        conntrack: MapSizes::default().conntrack * 2,
        ..MapSizes::default()
    };
    let (mut datapath, _maps) = Datapath::load(topo.bpf.path(), &bigger)?;
    ensure!(datapath.migrating(), "a resized conntrack is migrated");

    // The moment of the swap the ordering leaves: B on the client's
    // device's egress, A still on its ingress. A new connection's SYN is
    // tracked by A (in the old conntrack only); its SYN-ACK meets B, which
    // must hand it to A. Without the handover it would leave with the
    // backend's address, the client would reset it, and every retry would
    // meet the same fate.
    let dev = client.host_if.clone();
    topo.node
        .run(|| datapath.attach_hook(&dev, Hook::Egress, Facing::Any))??;
    for addr in targets() {
        for i in 0..8 {
            let backend = first_try(&client.ns, addr)
                .with_context(|| format!("new connection {i}, new egress and old ingress"))?;
            ensure!(names.contains(&backend.as_str()), "{backend}");
        }
    }
    for s in &mut streams {
        s.ping().context("a stream from before the upgrade")?;
    }

    // Every link swapped; the late entries copied, the handover emptied.
    let devices = topo.devices();
    topo.node.run(|| -> Result<()> {
        for d in &devices {
            datapath.attach(d)?;
        }
        Ok(())
    })??;
    datapath.finish_migration()?;
    ensure!(!datapath.migrating(), "migration finished");
    for addr in targets() {
        first_try(&client.ns, addr).context("after the upgrade")?;
    }
    for s in &mut streams {
        s.ping()
            .context("a stream from before the upgrade, after it")?;
    }
    Ok(())
}
