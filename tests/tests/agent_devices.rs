//! The agent detaches from devices it no longer manages, its own links
//! only: after a restart with a narrower `--devices` (links its
//! predecessor pinned) and when a device is deleted; a foreign TCX program
//! on the same device stays attached.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use sluice_tests::{
    agent::{yaml, Agent, ManifestDir},
    bpf::{self, ForeignTcx, BPF_TCX_EGRESS, BPF_TCX_INGRESS},
    clients,
    lb::vip,
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 71);
const READY: Duration = Duration::from_secs(20);

fn setup(topo: &Topology) -> Result<(Vec<servers::Server>, ManifestDir)> {
    let servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let dir = ManifestDir::create()?;
    dir.write("svc.yaml", &yaml::service("web", VIP, 80, 8080))?;
    let ready: Vec<_> = topo.backends.iter().map(|b| (b.ip, yaml::READY)).collect();
    dir.write("slice.yaml", &yaml::slice("web-1", "web", 8080, &ready))?;
    Ok((servers, dir))
}

/// Link ids of sluice's programs on `device` (ingress, egress).
fn sluice_links(topo: &Topology, device: &str) -> Result<Vec<u32>> {
    let programs = bpf::programs()?;
    let mut out = Vec::new();
    for attach in [BPF_TCX_INGRESS, BPF_TCX_EGRESS] {
        for (link, prog) in bpf::tcx_links(&topo.node, device, attach)? {
            if programs.get(&prog).is_some_and(|p| p.0.starts_with("sl_")) {
                out.push(link);
            }
        }
    }
    Ok(out)
}

fn wait_for(what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn a_restart_with_narrower_devices_detaches_the_predecessors_links_only() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let (_servers, dir) = setup(&topo)?;
    let source = format!("dir:{}", dir.path().display());
    let foreign_in = ForeignTcx::attach(&topo.node, "b1", BPF_TCX_INGRESS)?;
    let foreign_out = ForeignTcx::attach(&topo.node, "b1", BPF_TCX_EGRESS)?;

    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(READY)?;
    let kept_before: Vec<Vec<u32>> = ["c0", "b0"]
        .iter()
        .map(|d| sluice_links(&topo, d))
        .collect::<Result<_>>()?;
    assert_eq!(sluice_links(&topo, "b1")?.len(), 2, "attached to b1 first");
    agent.stop()?;

    let mut narrower = Agent::start_on(&topo, &source, "c*,b0", &[])?;
    narrower.wait_ready(READY)?;
    assert_eq!(
        sluice_links(&topo, "b1")?,
        Vec::<u32>::new(),
        "the predecessor's links on b1 are detached"
    );
    let links = topo.bpf.path().join("links");
    assert!(!links.join("b1_ingress").exists() && !links.join("b1_egress").exists());
    assert!(foreign_in.attached(&topo.node, "b1", BPF_TCX_INGRESS)?);
    assert!(foreign_out.attached(&topo.node, "b1", BPF_TCX_EGRESS)?);
    let kept_after: Vec<Vec<u32>> = ["c0", "b0"]
        .iter()
        .map(|d| sluice_links(&topo, d))
        .collect::<Result<_>>()?;
    assert_eq!(
        kept_after, kept_before,
        "the managed devices keep their links (programs swapped in place)"
    );
    // Pods still reach the service: its traffic enters at c0.
    let mut seen: Vec<String> = clients::tcp_hellos(&topo.clients[0].ns, vip(VIP, 80), 20)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["backend-0", "backend-1"]);
    Ok(())
}

#[test]
fn a_deleted_device_is_detached_and_other_programs_stay() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let (_servers, dir) = setup(&topo)?;
    let foreign = ForeignTcx::attach(&topo.node, "c0", BPF_TCX_INGRESS)?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(READY)?;
    let links = topo.bpf.path().join("links");
    assert!(links.join("b1_ingress").exists());
    let c0 = sluice_links(&topo, "c0")?;

    topo.node.ip(&["link", "del", "b1"])?;
    wait_for("b1's pins removed", || {
        Ok(!links.join("b1_ingress").exists() && !links.join("b1_egress").exists())
    })?;
    assert_eq!(sluice_links(&topo, "c0")?, c0, "c0 untouched");
    assert!(foreign.attached(&topo.node, "c0", BPF_TCX_INGRESS)?);
    assert!(agent.log().contains("device gone, detaching"));
    Ok(())
}

#[test]
fn a_device_renamed_while_the_agent_was_down_gets_its_own_links() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    let (_servers, dir) = setup(&topo)?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(READY)?;
    agent.stop()?;

    // b1 leaves the managed names, b0 takes its name: the pins named b1
    // now hold links on zz1.
    for (from, to) in [("b1", "zz1"), ("b0", "b1")] {
        topo.node.ip(&["link", "set", from, "down"])?;
        topo.node.ip(&["link", "set", from, "name", to])?;
        topo.node.ip(&["link", "set", to, "up"])?;
    }
    assert_eq!(sluice_links(&topo, "zz1")?.len(), 2);

    agent.restart(&topo.node)?;
    agent.wait_ready(READY)?;
    assert_eq!(
        sluice_links(&topo, "zz1")?,
        Vec::<u32>::new(),
        "no sluice left on the device that is no longer managed"
    );
    wait_for("exactly sluice's two links on the new b1", || {
        Ok(sluice_links(&topo, "b1")?.len() == 2)
    })?;
    let links = topo.bpf.path().join("links");
    assert!(!links.join("b0_ingress").exists());
    Ok(())
}
