//! The migration's crash points: the agent of the `abi-probe` build (a
//! different datapath layout) is started on main's pins with
//! `SLUICE_FAILPOINT` set and exits at that point as if it crashed. With
//! no agent the node keeps forwarding every flow in flight; the next agent
//! (the same release, or main again: a rollback after a crashed upgrade)
//! finishes or undoes the migration, with every flow still working.
//!
//! Points, in order: `migrate-copied` (new maps filled, not committed),
//! `migrate-committed`, `migrate-swapped-one` (one link, a pod device's
//! egress link, runs the new programs, the others the old ones: in a
//! topology whose uplink, `a0`, sorts before the pods' devices),
//! `migrate-swapped` (all links
//! swapped, late entries not yet copied), `migrate-promoted-one` (one
//! staged pin renamed over the old one).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use sluice_tests::{
    agent::{binary, release_binary, Agent},
    bpf::{fdinfo_field, hold_pin, tcx_links, BPF_TCX_EGRESS, BPF_TCX_INGRESS},
    upgrade::{manifest_source, topology, topology_with_uplink, Flows},
    Topology,
};

const READY: Duration = Duration::from_secs(30);

/// What the next agent after the crash is.
#[derive(Clone, Copy)]
enum Then {
    SameRelease,
    Rollback,
}

/// The uplink's name where the order of the link swaps is checked: it
/// sorts before the pods' devices (`b*`, `c*`), so a swap in name order
/// would begin with it.
const UPLINK_FIRST_BY_NAME: &str = "a0";

/// The pods' devices named, as the agent is started where the order of
/// the link swaps is checked: without local-traffic detection their
/// egress keeps `sl_egress`, with it (`--cluster-cidr`, every pod on its
/// sockets) it runs `sl_egress_pod`. Either way they are swapped first.
const PODS_NAMED: &[&str] = &["--pod-devices", "b*,c*"];
const PODS_NAMED_AND_DETECTED: &[&str] = &[
    "--pod-devices",
    "b*,c*",
    "--cluster-cidr",
    "10.0.0.0/8,fd00::/8",
];

fn crash_at(point: &str, then: Then) -> Result<()> {
    crash_with(point, then, &[])
}

fn crash_with(point: &str, then: Then, args: &[&str]) -> Result<()> {
    let swapped_one = point == "migrate-swapped-one";
    let (topo, servers) = if swapped_one {
        topology_with_uplink(UPLINK_FIRST_BY_NAME)?
    } else {
        topology()?
    };
    let (dir, source) = manifest_source(&topo)?;
    let main = binary()?;
    let probe = release_binary("abi-probe")?;

    let mut agent = if swapped_one {
        Agent::start_on(
            &topo,
            &source,
            &format!("{UPLINK_FIRST_BY_NAME},b*,c*"),
            args,
        )?
    } else {
        Agent::start(&topo, &source, args)?
    };
    agent.wait_ready(READY)?;
    let mut flows = Flows::open(&topo, &dir, servers)?;
    flows.check("main", &topo, &dir, &agent)?;

    agent.replace(&topo.node, &probe, &[("SLUICE_FAILPOINT", point)])?;
    let code = agent.wait_exit(READY)?;
    ensure!(
        code == Some(86),
        "the agent did not stop at {point} (exit {code:?}):\n{}",
        agent.log_tail()
    );
    if swapped_one {
        first_swap_is_a_pod_devices_egress_link(&topo)?;
    }
    flows
        .check_flows(&format!("no agent after a crash at {point}"), &topo)
        .with_context(|| {
            // What the pins hold (read by this release's CLI, which knows
            // the staged layout too) and what the agent did before it died.
            let show = |args: &[&str]| {
                agent
                    .cli(args)
                    .unwrap_or_else(|e| format!("sluice {args:?}: {e:#}"))
            };
            format!(
                "the node must keep forwarding\n--- sluice status ---\n{}\n--- sluice ct list ---\n{}\n--- the crashed agent's log ---\n{}",
                show(&["status", "--json"]),
                show(&["ct", "list"]),
                agent.log_tail()
            )
        })?;

    let (next, step) = match then {
        Then::SameRelease => (&probe, "the same release restarted"),
        Then::Rollback => (&main, "rolled back to main"),
    };
    agent.replace(&topo.node, next, &[])?;
    agent
        .wait_ready(READY)
        .with_context(|| format!("{step} after a crash at {point}"))?;
    flows.check(
        &format!("{step} after a crash at {point}"),
        &topo,
        &dir,
        &agent,
    )?;
    ensure!(
        !topo.bpf.path().join("migrate").exists(),
        "migration staging left behind"
    );
    let (connects, failed) = flows.finish_counting()?;
    // At `migrate-swapped-one` two program generations with two conntrack
    // maps ran side by side until the restart: the new one on one egress
    // link only, handing what its conntrack lacks to the old one.
    ensure!(
        failed.is_empty(),
        "failed connects after a crash at {point} ({} of {connects}): {failed:?}\n--- what the agents did ---\n{}",
        failed.len(),
        agent.migration_log()
    );
    Ok(())
}

/// The one link the crashed agent swapped is a pod device's egress link:
/// the new generation's newest program runs there, and every other link
/// still runs the old generation's. A device's egress goes first
/// (`Hook::SWAP_ORDER`), so that no flow is created by a new ingress
/// program while an old egress program, which has no handover, takes its
/// replies; the pods' devices go before the others (`devices::swap_order`),
/// so that an outside client's SNATed flow is not created by the uplink's
/// new program while a backend's device, where its replies are turned
/// back, still runs the old one.
fn first_swap_is_a_pod_devices_egress_link(topo: &Topology) -> Result<()> {
    let mut links = Vec::new();
    for dev in topo.devices() {
        for (hook, attach_type) in [("ingress", BPF_TCX_INGRESS), ("egress", BPF_TCX_EGRESS)] {
            for (_, prog) in tcx_links(&topo.node, &dev, attach_type)? {
                links.push((prog, format!("{dev} {hook}")));
            }
        }
    }
    links.sort();
    let Some((_, newest)) = links.last() else {
        anyhow::bail!("no TCX link left after the crash");
    };
    let pods: Vec<String> = topo
        .clients
        .iter()
        .chain(&topo.backends)
        .map(|p| format!("{} egress", p.host_if))
        .collect();
    ensure!(
        pods.contains(newest),
        "the first link swapped is {newest}, not a pod device's egress link: {links:?}"
    );
    Ok(())
}

/// The program the XDP link pinned for `device` runs.
fn xdp_program(topo: &Topology, device: &str) -> Result<u64> {
    let link = hold_pin(&topo.bpf.path().join("links").join(format!("{device}_xdp")))?;
    fdinfo_field(&link, "prog_id")?.context("an XDP link's prog_id")
}

/// An agent that runs `sl_xdp` on the uplink is upgraded by one that does
/// not know the node's addresses at its first scan (`--xdp-devices` left
/// to its default: the devices holding a node address, known only after
/// the first translation), and the migration ends right after that scan.
/// The XDP link must run the new generation by then: an old `sl_xdp` left
/// on it would go on balancing outside clients on the old maps, its flows
/// unknown to the new conntrack once the handover is gone.
#[test]
fn xdp_links_are_swapped_before_the_migration_ends() -> Result<()> {
    let (topo, servers) = topology()?;
    topo.externals[0].receive_xdp_frames()?;
    let (dir, source) = manifest_source(&topo)?;
    let probe = release_binary("abi-probe")?;
    let mut agent = Agent::start(
        &topo,
        &source,
        &["--xdp-mode", "native", "--xdp-devices", "e0"],
    )?;
    agent.wait_ready(READY)?;
    let old = xdp_program(&topo, "e0").context("the first agent's XDP link on e0")?;
    let mut flows = Flows::open(&topo, &dir, servers)?;
    flows.check("main", &topo, &dir, &agent)?;

    agent.drop_arg("--xdp-devices")?;
    agent.replace(
        &topo.node,
        &probe,
        &[("SLUICE_FAILPOINT", "migrate-swapped")],
    )?;
    let code = agent.wait_exit(READY)?;
    ensure!(
        code == Some(86),
        "the agent did not stop at migrate-swapped (exit {code:?}):\n{}",
        agent.log_tail()
    );
    let new = xdp_program(&topo, "e0").context("the XDP link after the swaps")?;
    ensure!(
        new > old,
        "e0's XDP link still runs program {old} of the previous generation (now {new}) when the migration would end:\n{}",
        agent.log_tail()
    );
    flows.check_flows("no agent after a crash at migrate-swapped", &topo)?;

    agent.replace(&topo.node, &probe, &[])?;
    agent.wait_ready(READY)?;
    flows.check("the same release restarted", &topo, &dir, &agent)?;
    let (connects, failed) = flows.finish_counting()?;
    ensure!(
        failed.is_empty(),
        "failed connects ({} of {connects}): {failed:?}",
        failed.len()
    );
    Ok(())
}

#[test]
fn crash_after_the_copy_is_undone() -> Result<()> {
    crash_at("migrate-copied", Then::SameRelease)
}

#[test]
fn crash_after_the_commit_is_finished() -> Result<()> {
    crash_at("migrate-committed", Then::SameRelease)
}

#[test]
fn crash_in_the_middle_of_the_link_swaps_is_finished() -> Result<()> {
    crash_with("migrate-swapped-one", Then::SameRelease, PODS_NAMED)
}

#[test]
fn crash_after_the_link_swaps_is_finished() -> Result<()> {
    crash_at("migrate-swapped", Then::SameRelease)
}

#[test]
fn crash_during_the_pin_renames_is_finished() -> Result<()> {
    crash_at("migrate-promoted-one", Then::SameRelease)
}

#[test]
fn crash_in_the_middle_of_the_link_swaps_then_a_rollback() -> Result<()> {
    crash_with(
        "migrate-swapped-one",
        Then::Rollback,
        PODS_NAMED_AND_DETECTED,
    )
}

#[test]
fn crash_during_the_pin_renames_then_a_rollback() -> Result<()> {
    crash_at("migrate-promoted-one", Then::Rollback)
}
