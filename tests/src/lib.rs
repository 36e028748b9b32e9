//! Test support for sluice, used by every integration test and by the demo:
//! network namespaces as the node and its pods ([`netns`], [`topology`]),
//! small servers and clients that run inside them ([`servers`],
//! [`clients`], and crafted SCTP over raw sockets: [`sctp`]), and cleanup of what a killed test run left behind
//! ([`sweep`]), and the benchmark behind `cargo xtask bench` ([`bench`]).
//!
//! All traffic stays inside namespaces this crate creates; nothing touches
//! the root namespace's routes or firewall. Everything is removed on drop,
//! including while unwinding from a failed assertion.

pub mod agent;
pub mod apiserver;
pub mod bench;
pub mod bpf;
pub mod build;
pub mod clients;
pub mod fuzz;
pub mod host;
pub mod lb;
pub mod monitor;
pub mod netns;
pub mod sctp;
pub mod servers;
pub mod sweep;
pub mod topology;
pub mod upgrade;

pub use netns::Netns;
pub use topology::{Pod, Topology};

/// `SLUICE_TEST_XDP=native|generic`: the `Lb`-driven tests (`lb::Lb`)
/// run with `sl_xdp` on the node's devices facing outside hosts (`e*`)
/// and the second node (`u0`), and the topology prepares those devices'
/// peers (GRO on, TX checksum offload off on every sender): the existing
/// service tests then run with XDP on. Unset (the default): TC only.
pub fn xdp_under_test() -> Option<sluice::datapath::XdpMode> {
    match std::env::var("SLUICE_TEST_XDP").ok()?.as_str() {
        "native" => Some(sluice::datapath::XdpMode::Native),
        "generic" => Some(sluice::datapath::XdpMode::Generic),
        _ => None,
    }
}

/// Fails with a clear message when not running as root.
pub fn require_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!(
            "sluice's integration tests need root (network namespaces, BPF): run `cargo xtask test` as root"
        );
    }
    Ok(())
}
