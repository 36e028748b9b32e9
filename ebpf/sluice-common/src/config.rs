//! `sl_config`: a one-entry array the agent writes before it attaches any
//! program, and keeps across restarts.

use crate::{assert_size, user_pod};

/// Value of `sl_config[0]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Config {
    /// `ABI_VERSION` of the agent that created the maps.
    pub abi_version: u32,
    /// Seed of the flow hash that picks backends; random per node, kept
    /// across restarts so that a flow hashes to the same slot.
    pub hash_seed: u32,
    /// Source ports SNAT may use (inclusive). Outside the kernel's
    /// ephemeral range (32768-60999) and the NodePort range (30000-32767).
    pub snat_port_min: u16,
    pub snat_port_max: u16,
    /// Feature switches the agent sets (`CFG_F_*`): read them with
    /// [`Config::flags`], write them with [`Config::set_flags`]. The word
    /// keeps release 0.1.0's name: 0.1.0 wrote it as padding (zero), never
    /// reads it, and compares maps' BTF field names before it adopts them,
    /// so a rename would make every rollback to it migrate `sl_config`.
    /// A bit may be given a meaning whose zero is the 0.1.0 behaviour.
    /// Bits 0-7: datapath events (`sluice monitor`); 8-15: socket-level
    /// balancing; 16-23: XDP; 24: host routing; 25-31: unassigned.
    pub _pad: u32,
    /// Network namespace cookie of the node (`SO_NETNS_COOKIE`): the
    /// socket-level programs act on sockets of this namespace, and on
    /// those of every other namespace (the pods') only with
    /// `CFG_F_SOCK_PODS`, as they are attached to a cgroup that may span
    /// several.
    pub netns_cookie: u64,
}
assert_size!(Config, 24);

impl Config {
    /// The feature switches (`CFG_F_*`).
    #[inline(always)]
    pub const fn flags(&self) -> u32 {
        self._pad
    }

    #[inline(always)]
    pub fn set_flags(&mut self, flags: u32) {
        self._pad = flags;
    }
}

/// `--socket-lb=all`: the socket-level programs balance the sockets of
/// every network namespace under their cgroup (the pods'), not only the
/// node's (`--socket-lb=host`, the behaviour without the bit).
pub const CFG_F_SOCK_PODS: u32 = 1 << 8;

/// Pods are local traffic: local-traffic detection is configured
/// (`--detect-local-mode`), so the socket-level programs give a pod's
/// socket the internal scope of an externalTrafficPolicy Local frontend,
/// as the TC path does for a source `sl_local4`/`sl_localif` recognise.
/// Without it a pod gets the external scope, as on the TC path.
pub const CFG_F_SOCK_PODS_LOCAL: u32 = 1 << 9;

/// Every pod's TCP and UDP sockets are balanced at `connect()`/`sendmsg()`
/// (`--socket-lb=all` over the whole node), no frontend is left to the TC
/// path for pods (SCTP, `loadBalancerSourceRanges`) and no flow the TC
/// path tracked before is still alive: a packet leaving towards a pod
/// carries no reply that needs reverse NAT. `sl_egress_pod`, the egress
/// program of the pods' devices (`--pod-devices`), then lets it pass at
/// once. The agent clears the bit before it writes a frontend the TC path
/// serves for pods, and sets it only when the conntrack entries that
/// existed while it was clear have gone. Without it (0.1.0 never sets
/// it), `sl_egress_pod` does what `sl_egress` does.
pub const CFG_F_PODS_ON_SOCKETS: u32 = 1 << 10;

/// `sl_sockfe4`/`sl_sockfe6` are kept in step with the service maps by a
/// running agent (`picks`): the socket programs take a frontend's entry
/// there before the general lookups. The agent sets it once it has
/// deleted every entry that disagrees with what it adopted, and clears it
/// as it stops (the next agent may be one that does not keep them, such
/// as 0.1.0, whose programs ignore the bit). Without it the socket
/// programs make the general lookups only.
pub const CFG_F_SOCK_PICKS: u32 = 1 << 11;

/// `--host-routing`: a service flow without SNAT between two of the pods'
/// devices (`sl_peer_devs`) skips the node's IP stack both ways: the
/// packets `sl_ingress` DNATs, and the backend's replies, which it then
/// reverse-NATs itself, are handed into the other pod's network namespace
/// at once (`bpf_redirect_peer`, the TTL decremented and the MAC addresses
/// from the FIB; `route.rs`). Without it (0.1.0 never sets it), both go on
/// to the node's stack.
pub const CFG_F_HOST_ROUTING: u32 = 1 << 24;

/// Default SNAT port range.
pub const SNAT_PORT_MIN: u16 = 61_000;
pub const SNAT_PORT_MAX: u16 = 65_535;

/// `Config::flags` bit: the programs write an event into `sl_events` for
/// every verdict that is not a plain forward (`sluice monitor`); off,
/// they do not (the behaviour before events existed).
pub const CFG_F_EVENTS_DROPS: u32 = 1 << 0;
/// `Config::flags` bit: also an event for new flows (reason `new_flow` or
/// `reselected`, with the backend picked), one in `2^n` of them where `n`
/// is the `CFG_EVENTS_SAMPLE_*` field; off, none (the behaviour before).
pub const CFG_F_EVENTS_TRACE: u32 = 1 << 1;
/// `Config::flags` bits 2-5: log2 of the new-flow sampling (0: every new
/// flow is traced, 4: one in 16).
pub const CFG_EVENTS_SAMPLE_SHIFT: u32 = 2;
pub const CFG_EVENTS_SAMPLE_MASK: u32 = 0xf << CFG_EVENTS_SAMPLE_SHIFT;
/// Mask of the bits owned by datapath events (bits 0-7).
pub const CFG_F_EVENTS_MASK: u32 = 0xff;

user_pod!(Config);
