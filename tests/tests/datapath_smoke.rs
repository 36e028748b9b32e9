//! The smallest end-to-end path: the real programs, loaded into the
//! kernel, attached to veths in a test namespace, balance a real TCP
//! connection, and their counters say so.

use std::net::Ipv4Addr;

use sluice::model::{BackendState, Proto};
use sluice_common::Stat;
use sluice_tests::{
    clients,
    lb::{cluster_ip, vip, Lb},
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

#[test]
fn tcp_through_a_vip_is_balanced_and_counted() -> anyhow::Result<()> {
    let topo = Topology::new(1, 1)?;
    let backend = &topo.backends[0];
    let _server = servers::tcp_greeter(&backend.ns, 8080, &backend.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip(
        "web",
        VIP,
        80,
        Proto::Tcp,
        &[(backend.ip, 8080, BackendState::Active)],
    ));
    assert!(report.errors.is_empty(), "{:?}", report.errors);

    let answer = clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80))?;
    assert_eq!(answer, "backend-0");
    assert_eq!(lb.stat(Stat::NewFlow)?, 1, "one new flow");
    assert!(
        lb.stat(Stat::Established)? >= 1,
        "the ACKs after the SYN follow conntrack"
    );
    assert!(
        lb.stat(Stat::ReplyNat)? >= 2,
        "SYN-ACK and greeting were reverse-NATed"
    );
    assert_eq!(lb.stat(Stat::Dangling)?, 0);
    Ok(())
}
