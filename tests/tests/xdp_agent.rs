//! The agent runs `sl_xdp` where `--xdp-mode`/`--xdp-devices` say: pinned
//! XDP links on node 1's devices facing the outside host (`e0`) and node
//! 2 (`u0`), a NodePort flow to node 2 balanced in XDP, `sluice status`
//! and the metrics saying so; a device whose driver refuses native XDP (a
//! bridge) stays on TC with a log line and a metric; a restart swaps the
//! program into the pinned links under a live flow; `--xdp-mode off`
//! detaches them.
//!
//! The receiving peers of XDP-sent frames (the outside host's `eth0`,
//! node 2's `u0`) have GRO on, and every sender TX checksum offload off
//! (see `xdp_north_south.rs`).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use anyhow::{ensure, Result};
use sluice::datapath::Maps;
use sluice_common::Stat;
use sluice_tests::{
    agent::{Agent, ManifestDir},
    clients::{self, Stream},
    servers,
    topology::receive_xdp_frames,
    Topology,
};

const READY: Duration = Duration::from_secs(20);
const NODE_PORT: u16 = 30090;

/// A Node object for node 1 and a NodePort service (policy Cluster) whose
/// one endpoint is `backend`, on node 2.
fn manifests(node: Ipv4Addr, backend: Ipv4Addr) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: node-1
status:
  addresses:
  - type: InternalIP
    address: {node}
---
apiVersion: v1
kind: Service
metadata:
  name: edge
  namespace: default
spec:
  type: NodePort
  clusterIP: 10.96.9.2
  clusterIPs: [10.96.9.2]
  externalTrafficPolicy: Cluster
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: {NODE_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: edge-1
  namespace: default
  labels:
    kubernetes.io/service-name: edge
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: ["{backend}"]
  nodeName: node-2
  conditions: {{ready: true, serving: true, terminating: false}}
"#
    )
}

fn xdp_stat(root: &Path, stat: Stat) -> Result<u64> {
    Ok(Maps::open_pinned(root)?.stat(stat)?)
}

#[test]
fn the_agent_runs_xdp_where_asked_adopts_it_on_restart_and_detaches_it_when_off() -> Result<()> {
    let mut node1 = Topology::with_index(1, 0, 0)?;
    node1.add_external()?;
    let node2 = Topology::with_index(2, 0, 1)?;
    Topology::join(&node1, &node2)?;
    node1.strict_checksums()?;
    node2.strict_checksums()?;
    node1.externals[0].receive_xdp_frames()?;
    receive_xdp_frames(&node2.node, "u0")?;
    // A device without native XDP support (no dummy module here).
    node1.node.ip(&["link", "add", "d0", "type", "bridge"])?;
    node1.node.ip(&["link", "set", "d0", "up"])?;
    let remote = &node2.backends[0];
    let _server = servers::tcp_whoami(&remote.ns, 8080, &remote.name)?;
    let dir = ManifestDir::create()?;
    dir.write("edge.yaml", &manifests(node1.node_address(0), remote.ip))?;
    let source = format!("dir:{}", dir.path().display());
    let root = node1.bpf.path().to_owned();
    let links = root.join("links");
    let node_port = SocketAddr::new(IpAddr::V4(node1.node_address(0)), NODE_PORT);
    let ext = &node1.externals[0];

    let xdp_args = ["--xdp-mode", "native", "--xdp-devices", "e0,u0,d0"];
    let mut agent = Agent::start_on(&node1, &source, "e*,u*,d0", &xdp_args)?;
    agent.wait_ready(READY)?;
    agent.wait_until("XDP on e0 and u0, refused on d0", READY, |a| {
        Ok(a.metric("sluice_xdp_devices{mode=\"native\"}")? == 2.0
            && a.metric("sluice_xdp_attach_failures_total")? == 1.0)
    })?;
    ensure!(links.join("e0_xdp").exists() && links.join("u0_xdp").exists());
    ensure!(!links.join("d0_xdp").exists(), "d0 stays on TC only");
    ensure!(
        agent
            .log()
            .contains("cannot attach XDP: the device stays on TC only"),
        "the refusal is logged:\n{}",
        agent.log_tail()
    );
    let status = agent.cli(&["status"])?;
    ensure!(status.contains("xdp:       e0, u0"), "{status}");

    // Warm the neighbours up (XDP hands a frame to TC until they are
    // known), then a new flow is decided and forwarded at the driver.
    clients::tcp_hello(&ext.ns, node_port)?;
    let redirected = xdp_stat(&root, Stat::XdpRedirect)?;
    let hello = clients::tcp_hello(&ext.ns, node_port)?;
    ensure!(
        hello.starts_with("node2-backend-0 192.168.200.1"),
        "{hello}"
    );
    ensure!(xdp_stat(&root, Stat::XdpRedirect)? >= redirected + 6);
    let events = agent.metrics()?;
    ensure!(
        events.contains("sluice_datapath_events{reason=\"xdp_redirect\"}"),
        "the XDP verdicts are in the metrics:\n{events}"
    );

    // A restart swaps the program into the pinned links under a live flow.
    let mut stream = Stream::connect(&ext.ns, node_port)?;
    stream.ping()?;
    agent.restart(&node1.node)?;
    agent.wait_ready(READY)?;
    agent.wait_until("XDP adopted", READY, |a| {
        Ok(a.log()
            .matches("replaced XDP program in pinned link")
            .count()
            >= 2)
    })?;
    let redirected = xdp_stat(&root, Stat::XdpRedirect)?;
    for _ in 0..3 {
        stream.ping()?;
    }
    ensure!(xdp_stat(&root, Stat::XdpRedirect)? >= redirected + 6);
    agent.stop()?;

    // --xdp-mode off: the links go, the flow carries on through TC.
    let mut off = Agent::start_on(&node1, &source, "e*,u*,d0", &["--xdp-mode", "off"])?;
    off.wait_ready(READY)?;
    off.wait_until("XDP links detached", READY, |_| {
        Ok(!links.join("e0_xdp").exists() && !links.join("u0_xdp").exists())
    })?;
    let redirected = xdp_stat(&root, Stat::XdpRedirect)?;
    stream.ping()?;
    ensure!(
        xdp_stat(&root, Stat::XdpRedirect)? == redirected,
        "XDP is off"
    );
    let status = off.cli(&["status"])?;
    ensure!(status.contains("xdp:       (none"), "{status}");
    off.stop()?;

    // The default devices: those holding the node's addresses (the Node
    // object's 192.168.1.1 is on e0), but a veth is left to TC, logged.
    let mut default = Agent::start_on(&node1, &source, "e*,u*,d0", &[])?;
    default.wait_ready(READY)?;
    default.wait_until("e0 left to TC as a veth", READY, |a| {
        Ok(a.log().contains("device=e0")
            && a.log()
                .contains("is left to TC unless named in --xdp-devices"))
    })?;
    ensure!(!links.join("e0_xdp").exists() && !links.join("u0_xdp").exists());
    ensure!(
        !default.log().contains("device=u0 XDP: a veth"),
        "u0 holds no node address"
    );
    default.stop()?;

    // `sluice cleanup` detaches pinned XDP links with the rest.
    let mut again = Agent::start_on(&node1, &source, "e*,u*,d0", &xdp_args)?;
    again.wait_ready(READY)?;
    again.wait_until("XDP on e0 again", READY, |_| {
        Ok(links.join("e0_xdp").exists())
    })?;
    again.stop()?;
    ensure!(node1.node.ip(&["link", "show", "e0"])?.contains("xdp"));
    let out = node1
        .node
        .command(sluice_tests::agent::binary()?)
        .arg("cleanup")
        .arg("--bpf-root")
        .arg(&root)
        .arg("--cgroup-root")
        .arg(node1.cgroup.path())
        .output()?;
    let report = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "cleanup: {report}");
    ensure!(report.contains("xdp on e0"), "{report}");
    ensure!(
        !node1.node.ip(&["link", "show", "e0"])?.contains("xdp"),
        "no XDP program left on e0"
    );
    Ok(())
}
