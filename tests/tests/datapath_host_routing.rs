//! `--host-routing`: a service packet DNATed to a backend behind one of the
//! node's veths goes straight into the backend's namespace
//! (`bpf_redirect_peer`), past the node's IP stack. The node's netfilter
//! proves it: a FORWARD rule that resets every packet towards the backend
//! stops the connection through the stack and never sees the packets host
//! routing hands over. The client still talks to the service address
//! (the replies take the stack and their reverse NAT as before).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{ensure, Result};
use sluice::model::{BackendState, Proto};
use sluice_common::{config::CFG_F_HOST_ROUTING, Stat};
use sluice_tests::{
    clients,
    lb::{cluster_ip, cluster_ip6, vip, vip6, Lb},
    netns, servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 90);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x90);

/// Resets, in the node's FORWARD chain, every TCP packet routed towards
/// `backend:8080`.
fn forward_reset(topo: &Topology, backend: IpAddr) -> Result<()> {
    let tool = if backend.is_ipv4() {
        "iptables"
    } else {
        "ip6tables"
    };
    netns::run(topo.node.command(tool).args([
        "-I",
        "FORWARD",
        "-d",
        &backend.to_string(),
        "-p",
        "tcp",
        "--dport",
        "8080",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ]))?;
    Ok(())
}

fn host_routing(lb: &mut Lb, on: bool) -> Result<()> {
    let bits = if on { CFG_F_HOST_ROUTING } else { 0 };
    lb.reconciler.set_config_flags(CFG_F_HOST_ROUTING, bits)?;
    Ok(())
}

#[test]
fn host_routing_hands_service_packets_to_a_local_pod_past_the_node_stack() -> Result<()> {
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
    ensure!(report.errors.is_empty(), "{:?}", report.errors);
    let client = &topo.clients[0].ns;
    assert_eq!(clients::tcp_hello(client, vip(VIP, 80))?, backend.name);

    forward_reset(&topo, IpAddr::V4(backend.ip))?;
    assert!(
        clients::tcp_hello(client, vip(VIP, 80)).is_err(),
        "through the node's stack the FORWARD rule resets the connection"
    );
    assert_eq!(lb.stat(Stat::HostRouted)?, 0, "off: nothing host-routed");

    host_routing(&mut lb, true)?;
    for _ in 0..3 {
        assert_eq!(clients::tcp_hello(client, vip(VIP, 80))?, backend.name);
    }
    let routed = lb.stat(Stat::HostRouted)?;
    assert!(
        routed >= 6,
        "every connection's packets towards the backend were handed over ({routed})"
    );

    host_routing(&mut lb, false)?;
    assert!(
        clients::tcp_hello(client, vip(VIP, 80)).is_err(),
        "off again: the stack, and its rule, are back in the path"
    );
    Ok(())
}

#[test]
fn host_routing_serves_ipv6_the_same_way() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    topo.wait_ipv6_ready()?;
    let backend = &topo.backends[0];
    let _server = servers::tcp_greeter6(&backend.ns, 8080, &backend.name)?;
    let mut lb = Lb::load(&topo)?;
    let report = lb.set(cluster_ip6(
        "web6",
        VIP6,
        80,
        Proto::Tcp,
        &[(backend.ip6, 8080, BackendState::Active)],
    ));
    ensure!(report.errors.is_empty(), "{:?}", report.errors);
    let client = &topo.clients[0].ns;
    assert_eq!(clients::tcp_hello(client, vip6(VIP6, 80))?, backend.name);

    forward_reset(&topo, IpAddr::V6(backend.ip6))?;
    assert!(
        clients::tcp_hello(client, vip6(VIP6, 80)).is_err(),
        "through the node's stack the FORWARD rule resets the connection"
    );

    host_routing(&mut lb, true)?;
    for _ in 0..3 {
        assert_eq!(clients::tcp_hello(client, vip6(VIP6, 80))?, backend.name);
    }
    let routed = lb.stat(Stat::HostRouted)?;
    assert!(
        routed >= 6,
        "every connection's packets towards the backend were handed over ({routed})"
    );
    Ok(())
}
