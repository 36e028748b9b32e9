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
    agent::{binary, release_binary, Agent},
    bpf::pinned_map_flags,
    upgrade::{manifest_source, roll, topology, Flows},
};

const READY: Duration = Duration::from_secs(30);

#[test]
fn upgrade_and_rollback_across_an_abi_change_keep_every_flow() -> Result<()> {
    let (topo, servers) = topology()?;
    let (dir, source) = manifest_source(&topo)?;

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
        eprintln!("{:?} into the connect loops: {step}", begun.elapsed());
        roll(
            &mut agent,
            &mut flows,
            &topo,
            &dir,
            step,
            bin,
            &[],
            migrates,
        )?;
    }
    let connects = flows
        .finish()
        .with_context(|| format!("--- what the agents did ---\n{}", agent.migration_log()))?;
    eprintln!("connect loops: {connects} connections, none failed");
    Ok(())
}

/// `--preallocate-maps` turned on and off on a running node, and a rollback
/// to 0.1.0 (which predates the option) in between: main -> main
/// preallocated (the three maps migrate) -> 0.1.0 (adopts them as they
/// are) -> main (migrates them back), with the same flows and loops.
#[test]
fn preallocating_the_maps_and_rolling_back_to_0_1_0_keep_every_flow() -> Result<()> {
    let (topo, servers) = topology()?;
    let (dir, source) = manifest_source(&topo)?;

    let v010 = release_binary("0.1.0")?;
    let main = binary()?;

    let mut agent = Agent::start_bin(&main, &topo, &source, &[])?;
    agent.wait_ready(READY).context("main starts")?;
    let mut flows = Flows::open(&topo, &dir, servers)?;
    let begun = std::time::Instant::now();
    flows.check("main", &topo, &dir, &agent)?;

    // As a DaemonSet sets it; 0.1.0 ignores the variable.
    let prealloc: &[(&str, &str)] = &[("SLUICE_PREALLOCATE_MAPS", "true")];
    struct Step<'a> {
        what: &'a str,
        bin: &'a std::path::Path,
        env: &'a [(&'a str, &'a str)],
        migrates: bool,
        /// The three maps' flags after it (1: `BPF_F_NO_PREALLOC`).
        flags: u32,
    }
    let steps = [
        Step {
            what: "main -> main --preallocate-maps",
            bin: &main,
            env: prealloc,
            migrates: true,
            flags: 0,
        },
        Step {
            what: "rollback to 0.1.0 on preallocated maps",
            bin: &v010,
            env: &[],
            migrates: false,
            flags: 0,
        },
        Step {
            what: "upgrade 0.1.0 -> main without the option",
            bin: &main,
            env: &[],
            migrates: true,
            flags: 1,
        },
    ];
    for Step {
        what: step,
        bin,
        env,
        migrates,
        flags,
    } in steps
    {
        eprintln!("{:?} into the connect loops: {step}", begun.elapsed());
        roll(
            &mut agent, &mut flows, &topo, &dir, step, bin, env, migrates,
        )?;
        for name in ["sl_svc4", "sl_svc6", "sl_backends"] {
            let pinned = pinned_map_flags(&topo.bpf.path().join(name))?;
            ensure!(
                pinned == flags,
                "{step}: {name} has flags {pinned}, expected {flags}"
            );
        }
    }
    let connects = flows
        .finish()
        .with_context(|| format!("--- what the agents did ---\n{}", agent.migration_log()))?;
    eprintln!("connect loops: {connects} connections, none failed");
    Ok(())
}
