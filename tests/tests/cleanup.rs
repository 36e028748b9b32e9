//! `sluice cleanup` on a real node namespace after the real agent: every
//! pin, link, program and map of that instance goes, pod-to-pod traffic
//! keeps working, and nothing of another instance or another tool is
//! touched. Idempotent, safe on nothing, refuses while the agent runs and
//! refuses roots that are not sluice's to remove.

use std::{
    collections::HashSet,
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    process::Output,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use sluice_tests::{
    agent::{self, yaml, Agent, ManifestDir},
    bpf::{self, ForeignTcx, Instance, BPF_TCX_EGRESS, BPF_TCX_INGRESS},
    clients,
    lb::vip,
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 70);
const READY: Duration = Duration::from_secs(20);

struct Node {
    topo: Topology,
    _servers: Vec<servers::Server>,
    _dir: ManifestDir,
    agent: Agent,
}

/// A node with `backends` backends behind VIP:80 and a ready agent.
fn node(backends: usize) -> Result<Node> {
    let topo = Topology::new(1, backends)?;
    let servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let dir = ManifestDir::create()?;
    dir.write("svc.yaml", &yaml::service("web", VIP, 80, 8080))?;
    let ready: Vec<_> = topo.backends.iter().map(|b| (b.ip, yaml::READY)).collect();
    dir.write("slice.yaml", &yaml::slice("web-1", "web", 8080, &ready))?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(READY)?;
    Ok(Node {
        topo,
        _servers: servers,
        _dir: dir,
        agent,
    })
}

/// The backends that answered 30 connections to the VIP (all must answer).
fn served_by(topo: &Topology) -> Result<HashSet<String>> {
    clients::tcp_hellos(&topo.clients[0].ns, vip(VIP, 80), 30)?
        .into_iter()
        .collect::<std::io::Result<_>>()
        .context("a connection to the VIP failed")
}

fn all_backends(topo: &Topology) -> HashSet<String> {
    topo.backends.iter().map(|b| b.name.clone()).collect()
}

/// `sluice cleanup` in the node's namespace, on its root and cgroup.
fn cleanup(topo: &Topology, extra: &[&str]) -> Result<Output> {
    Ok(topo
        .node
        .command(agent::binary()?)
        .arg("cleanup")
        .arg("--bpf-root")
        .arg(topo.bpf.path())
        .arg("--cgroup-root")
        .arg(topo.cgroup.path())
        .args(extra)
        .output()?)
}

fn succeeded(out: Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "cleanup failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Names of the programs on every TCX hook of `topo`'s devices.
fn tcx_program_names(topo: &Topology) -> Result<Vec<String>> {
    let programs = bpf::programs()?;
    let mut names = Vec::new();
    for device in topo.devices() {
        for attach in [BPF_TCX_INGRESS, BPF_TCX_EGRESS] {
            for (link, prog) in bpf::tcx_links(&topo.node, &device, attach)? {
                let name = programs.get(&prog).map(|p| p.0.clone()).unwrap_or_default();
                names.push(format!("{device}: {name} (link {link})"));
            }
        }
    }
    Ok(names)
}

fn sluice_on_devices(topo: &Topology) -> Result<Vec<String>> {
    Ok(tcx_program_names(topo)?
        .into_iter()
        .filter(|n| n.contains(" sl_"))
        .collect())
}

/// Waits until none of `instance`'s maps and programs is loaded (the
/// kernel frees them asynchronously once the last reference goes).
fn wait_freed(instance: &Instance) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (maps, programs) = instance.remaining()?;
        if maps.is_empty() && programs.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("still loaded after cleanup: maps {maps:?}, programs {programs:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cleanup_removes_every_trace_of_an_instance_and_nothing_else() -> Result<()> {
    let mut a = node(2)?;
    let mut b = node(1)?;
    let (ta, tb) = (&a.topo, &b.topo);
    let foreign = ForeignTcx::attach(&ta.node, "c0", BPF_TCX_INGRESS)?;
    assert_eq!(served_by(ta)?, all_backends(ta));
    assert_eq!(served_by(tb)?, all_backends(tb));

    a.agent.stop()?;
    b.agent.stop()?;
    assert_eq!(
        served_by(ta)?,
        all_backends(ta),
        "the pinned datapath keeps balancing with no agent"
    );
    let instance_a = Instance::of(ta.bpf.path())?;
    let instance_b = Instance::of(tb.bpf.path())?;
    assert!(
        instance_a.programs.len() >= 4,
        "sl_ingress, sl_egress, their IPv6 halves, socket programs: {instance_a:?}"
    );
    let cgroup_before = bpf::cgroup_programs(ta.cgroup.path())?;
    assert!(
        cgroup_before.iter().any(|n| n == "sl_connect4"),
        "{cgroup_before:?}"
    );

    // Two links lose their pins but stay attached, held by this process:
    // what a crash between attach and pin, or a stray holder, leaves.
    let links = ta.bpf.path().join("links");
    let held = [
        bpf::hold_pin(&links.join("c0_egress"))?,
        bpf::hold_pin(&links.join("cgroup").join("sl_connect4"))?,
    ];
    std::fs::remove_file(links.join("c0_egress"))?;
    std::fs::remove_file(links.join("cgroup").join("sl_connect4"))?;
    assert!(sluice_on_devices(ta)?
        .iter()
        .any(|n| n.starts_with("c0: sl_egress")));

    let out = succeeded(cleanup(ta, &[])?)?;
    assert!(
        out.contains("(sl_egress tcx egress on c0), not pinned")
            && out.contains("(sl_connect4 cgroup ")
            && out.contains("removed map "),
        "{out}"
    );

    assert!(!ta.bpf.path().exists(), "the root is gone");
    assert_eq!(
        sluice_on_devices(ta)?,
        Vec::<String>::new(),
        "no TCX link of sluice on the node's devices"
    );
    assert!(
        foreign.attached(&ta.node, "c0", BPF_TCX_INGRESS)?,
        "the foreign program on c0 stays: {:?}",
        tcx_program_names(ta)?
    );
    assert_eq!(
        bpf::cgroup_programs(ta.cgroup.path())?,
        Vec::<String>::new(),
        "no cgroup link on the node's cgroup"
    );
    drop(held);
    wait_freed(&instance_a)?;

    let backend = &ta.backends[0];
    assert_eq!(
        clients::tcp_hello(&ta.clients[0].ns, SocketAddrV4::new(backend.ip, 8080))?,
        backend.name,
        "pod-to-pod traffic still works"
    );
    assert!(
        clients::tcp_hello(&ta.clients[0].ns, vip(VIP, 80)).is_err(),
        "the VIP is no longer translated"
    );

    // The other node's instance is untouched.
    assert_eq!(Instance::of(tb.bpf.path())?, instance_b);
    assert_eq!(instance_b.remaining()?.0.len(), instance_b.maps.len());
    assert_eq!(served_by(tb)?, all_backends(tb));
    assert_eq!(sluice_on_devices(tb)?.len(), 2 * tb.devices().len());

    let again = succeeded(cleanup(ta, &[])?)?;
    assert!(again.starts_with("nothing to clean up"), "{again}");
    Ok(())
}

#[test]
fn cleanup_refuses_while_the_agent_runs_unless_forced() -> Result<()> {
    let n = node(1)?;
    let t = &n.topo;
    let pid = n.agent.pid().context("agent not running")?;
    let out = cleanup(t, &[])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "cleanup ran under a live agent");
    assert!(
        stderr.contains(&format!("in use by pid {pid} (sluice)")) && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(t.bpf.path().join("sl_svc4").exists(), "nothing removed");
    assert_eq!(served_by(t)?, all_backends(t), "and nothing detached");

    let out = succeeded(cleanup(t, &["--force"])?)?;
    assert!(
        out.contains(&format!("warning: pid {pid} (sluice) still holds the maps")),
        "{out}"
    );
    assert!(!t.bpf.path().exists());
    assert_eq!(sluice_on_devices(t)?, Vec::<String>::new());
    assert!(clients::tcp_hello(&t.clients[0].ns, vip(VIP, 80)).is_err());
    Ok(())
}

#[test]
fn cleanup_of_a_root_that_never_existed_succeeds_and_says_so() -> Result<()> {
    let topo = Topology::new(0, 0)?;
    assert!(!topo.bpf.path().exists());
    let out = succeeded(cleanup(&topo, &[])?)?;
    assert!(out.starts_with("nothing to clean up:"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&succeeded(cleanup(&topo, &["--json"])?)?)?;
    assert_eq!(json["detached"], serde_json::json!([]));
    assert_eq!(json["removed"], serde_json::json!([]));
    Ok(())
}

#[test]
fn cleanup_refuses_what_is_not_a_sluice_root() -> Result<()> {
    let topo = Topology::new(0, 0)?;
    // A directory outside bpffs keeps its content.
    let dir = ManifestDir::create()?;
    dir.write("keep.yaml", "precious")?;
    let out = cleanup_root(&topo, dir.path())?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a directory on a bpffs mount"),
        "{out:?}"
    );
    assert!(dir.path().join("keep.yaml").exists());

    // A bpffs mount itself (as /sys/fs/bpf is), in a private mount
    // namespace that takes the mount with it.
    let bin = agent::binary()?;
    let mnt = std::env::temp_dir().join(sluice_tests::netns::unique_name("bpffs"));
    let script = format!(
        "set -e; mkdir -p {m}; mount -t bpf bpf {m}; mkdir {m}/other-tool; \
         if {bin} cleanup --bpf-root {m} --cgroup-root {cg}; then exit 3; fi; \
         test -d {m}/other-tool",
        m = mnt.display(),
        bin = bin.display(),
        cg = topo.cgroup.path().display(),
    );
    let out = topo
        .node
        .command("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()?;
    let _ = std::fs::remove_dir(&mnt);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a bpffs mount itself"),
        "{out:?}"
    );
    Ok(())
}

fn cleanup_root(topo: &Topology, root: &Path) -> Result<Output> {
    Ok(topo
        .node
        .command(agent::binary()?)
        .arg("cleanup")
        .arg("--bpf-root")
        .arg(root)
        .arg("--cgroup-root")
        .arg(topo.cgroup.path())
        .output()?)
}
