//! Upgrades and rollbacks the way a DaemonSet rollout does them (SIGTERM
//! the running agent, start the other release on the same pins), with
//! long-lived TCP streams, UDP flows, SNATed NodePort streams from outside
//! and affinity in flight and two connect loops running, against real
//! releases: 0.1.0 built from its commit (`releases.toml`), the working
//! tree, and the working tree's `abi-probe` build, whose datapath layout
//! differs (ABI 5: a field added in front of `CtEntry` and `Backend`).
//!
//! 0.1.0 -> main -> abi-probe (migration up) -> main (migration down, a
//! layout main has never seen) -> 0.1.0: zero broken flows, zero failed
//! connects, zero datapath drops, and each agent follows a change.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use sluice_tests::{
    agent::{binary, release_binary, Agent, ManifestDir},
    upgrade::{manifests, topology, Flows},
};

const READY: Duration = Duration::from_secs(30);

#[test]
fn upgrade_and_rollback_across_an_abi_change_keep_every_flow() -> Result<()> {
    let (topo, servers) = topology()?;
    let dir = ManifestDir::create()?;
    let backends: Vec<_> = topo.backends.iter().map(|b| b.ip).collect();
    dir.write(
        "all.yaml",
        &manifests(topo.node_address(0), &backends, None, &[]),
    )?;
    let source = format!("dir:{}", dir.path().display());

    let v010 = release_binary("0.1.0")?;
    let probe = release_binary("abi-probe")?;
    let main = binary()?;

    let mut agent = Agent::start_bin(&v010, &topo, &source, &[])?;
    agent.wait_ready(READY).context("0.1.0 starts")?;
    let mut flows = Flows::open(&topo, &dir, servers)?;
    let begun = std::time::Instant::now();
    flows.check("0.1.0", &topo, &dir, &agent)?;

    let steps = [
        ("upgrade 0.1.0 -> main", &main, false),
        ("upgrade main -> abi-probe (ABI 4 -> 5)", &probe, true),
        ("rollback abi-probe -> main (ABI 5 -> 4)", &main, true),
        ("rollback main -> 0.1.0", &v010, false),
    ];
    for (step, bin, migrates) in steps {
        let migrations = agent.log().matches("migration finished").count();
        eprintln!("{:?} into the connect loops: {step}", begun.elapsed());
        agent.replace(&topo.node, bin, &[])?;
        agent
            .wait_ready(READY)
            .with_context(|| format!("{step}: agent ready"))?;
        flows.check(step, &topo, &dir, &agent)?;
        let now = agent.log().matches("migration finished").count();
        if migrates {
            ensure!(
                now == migrations + 1,
                "{step}: no migration in the log:\n{}",
                agent.log_tail()
            );
        }
        if !migrates {
            ensure!(
                now == migrations,
                "{step}: migrated although the layout is the same"
            );
        }
        ensure!(
            !topo.bpf.path().join("migrate").exists(),
            "{step}: migration staging left behind"
        );
    }
    let connects = flows.finish()?;
    eprintln!("connect loops: {connects} connections, none failed");
    Ok(())
}
