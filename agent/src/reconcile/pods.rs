//! When the pods' egress may skip reverse NAT (`CFG_F_PODS_ON_SOCKETS`).
//!
//! With `--socket-lb=all` over the whole node, a pod's TCP and UDP sockets
//! are sent to their backend at `connect()`/`sendmsg()`, so no reply
//! towards a pod needs its source turned back, and `sl_egress_pod` (the
//! egress program of `--pod-devices`) can let every packet pass. That holds
//! only while the TC path tracks no flow of a pod, which it does for:
//! - frontends the socket programs leave to it for pods: SCTP ones, and
//!   those with `loadBalancerSourceRanges` (`left_to_tc`);
//! - a pod's socket connected before the socket programs served it (an
//!   upgrade from 0.1.0 or from `--socket-lb=host`): its flow's entry, or,
//!   once that expired while the socket lived on, a new flow.
//!
//! The datapath marks the forward entry of every flow without SNAT it
//! starts for a pod (`CT_F_POD`, by local-traffic detection) and takes the
//! bit away itself when it starts one. So the bit is cleared before a
//! frontend of the first kind is written (`must_clear`, by the one map
//! writer, in its order) and set by a conntrack scan (`step`) only when
//! no such frontend is programmed, no marked flow lives, and the unmarked
//! forward entries an older agent may have left for pods, taken once when
//! the agent starts, have gone (an outside client's entries among them:
//! the agent cannot tell them apart). SNATed flows need no egress program
//! (their replies are turned back on the way in). After writing the bit a
//! scan reads conntrack once more and clears it if a marked flow began in
//! between (`pod_flows`).

use std::collections::HashSet;

use sluice_common::{
    conntrack::{CT_F_POD, CT_F_SNAT},
    service::SVC_F_SOURCE_RANGES,
    CtEntry, CtKind,
};

use crate::model::{FrontendKey, Proto};

/// Whether the socket programs leave `key` (master flags `flags`) to the
/// TC path when a pod connects to it (`sock.rs`: SCTP is not balanced at
/// the socket; a source range needs the pod's address).
pub fn left_to_tc(key: &FrontendKey, flags: u16) -> bool {
    key.proto == Proto::Sctp || flags & SVC_F_SOURCE_RANGES != 0
}

/// Whether `entries` hold a live flow of a pod on the TC path (an entry
/// marked `CT_F_POD`, not SNATed: the forward one, or the reply one that
/// an LRU eviction of the other left).
pub fn pod_flows<K>(entries: &[(K, CtEntry)]) -> bool {
    entries
        .iter()
        .any(|(_, e)| e.flags & CT_F_POD != 0 && e.flags & CT_F_SNAT == 0)
}

/// What a conntrack scan asks of `CFG_F_PODS_ON_SOCKETS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Set,
    Clear,
}

/// The unmarked forward entries an older agent may have left for pods.
#[derive(Debug)]
enum Legacy<K4, K6> {
    /// Not taken yet (the first scan takes them).
    Unknown,
    /// Waiting for these to go.
    Waiting { v4: HashSet<K4>, v6: HashSet<K6> },
    /// None left (or the bit was kept from an agent that marks its own).
    Done,
}

/// The bit's state, as the reconciler wrote it.
#[derive(Debug)]
pub struct PodFlows<K4, K6> {
    /// The socket programs serve every pod and some device is a pod's.
    allowed: bool,
    /// Set in the map.
    set: bool,
    legacy: Legacy<K4, K6>,
}

impl<K4: Copy + Eq + std::hash::Hash, K6: Copy + Eq + std::hash::Hash> Default
    for PodFlows<K4, K6>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K4: Copy + Eq + std::hash::Hash, K6: Copy + Eq + std::hash::Hash> PodFlows<K4, K6> {
    /// Not allowed; the bit is taken as clear.
    pub fn new() -> Self {
        Self {
            allowed: false,
            set: false,
            legacy: Legacy::Unknown,
        }
    }

    /// Whether the bit may be set at all, and whether the map holds it
    /// set now (`set_in_map`) from an agent whose word still holds
    /// (`kept`: the pods' devices still run `sl_egress_pod`, so no other
    /// agent ran since, such as 0.1.0 or one in `host` mode, whose pods'
    /// flows the TC path would track unmarked). A set bit that is not
    /// allowed or kept, or while `left` frontends are left to the TC path,
    /// must be cleared at once (`Action::Clear`).
    pub fn start(&mut self, allowed: bool, set_in_map: bool, kept: bool, left: usize) -> Action {
        self.allowed = allowed;
        self.set = set_in_map;
        let trusted = set_in_map && allowed && kept && left == 0;
        self.legacy = if trusted {
            Legacy::Done
        } else {
            Legacy::Unknown
        };
        // A clear bit stays clear until a scan; a set one stays if trusted.
        self.toward(trusted)
    }

    /// Whether the bit is set in the map (so that a frontend left to the
    /// TC path must wait for it to be cleared).
    pub fn must_clear(&self) -> bool {
        self.set
    }

    /// Whether the bit is set, for `sluice status` and the metrics.
    pub fn is_set(&self) -> bool {
        self.set
    }

    /// The map holds the bit clear though it was written set: the datapath
    /// took it away (a pod's flow began on the TC path). Returns whether
    /// it was set.
    pub fn taken_away(&mut self) -> bool {
        std::mem::take(&mut self.set)
    }

    /// The map now holds the bit as `action` said.
    pub fn written(&mut self, action: Action) {
        match action {
            Action::Set => self.set = true,
            Action::Clear => self.set = false,
            Action::None => {}
        }
    }

    /// One conntrack scan (`ct4`, `ct6`: every entry read), with `left`
    /// frontends left to the TC path programmed.
    pub fn step(&mut self, left: usize, ct4: &[(K4, CtEntry)], ct6: &[(K6, CtEntry)]) -> Action {
        if !self.allowed || left > 0 || pod_flows(ct4) || pod_flows(ct6) {
            return self.toward(false);
        }
        let (v4, v6) = match &self.legacy {
            Legacy::Done => return self.toward(true),
            Legacy::Unknown => (unmarked(ct4, |_| true), unmarked(ct6, |_| true)),
            Legacy::Waiting { v4, v6 } => (
                unmarked(ct4, |k| v4.contains(k)),
                unmarked(ct6, |k| v6.contains(k)),
            ),
        };
        if v4.is_empty() && v6.is_empty() {
            self.legacy = Legacy::Done;
            return self.toward(true);
        }
        self.legacy = Legacy::Waiting { v4, v6 };
        self.toward(false)
    }

    /// What brings the bit from where the map holds it to `set`.
    fn toward(&self, set: bool) -> Action {
        match (self.set, set) {
            (false, true) => Action::Set,
            (true, false) => Action::Clear,
            _ => Action::None,
        }
    }

    /// Forward entries still awaited, for the log.
    pub fn awaited(&self) -> usize {
        match &self.legacy {
            Legacy::Waiting { v4, v6 } => v4.len() + v6.len(),
            _ => 0,
        }
    }
}

/// The keys of forward entries neither SNATed nor marked among `entries`
/// that `keep` accepts.
fn unmarked<K: Copy + Eq + std::hash::Hash>(
    entries: &[(K, CtEntry)],
    keep: impl Fn(&K) -> bool,
) -> HashSet<K> {
    entries
        .iter()
        .filter(|(k, e)| {
            e.kind == CtKind::Forward as u8 && e.flags & (CT_F_SNAT | CT_F_POD) == 0 && keep(k)
        })
        .map(|(k, _)| *k)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: CtKind, flags: u8) -> CtEntry {
        CtEntry {
            kind: kind as u8,
            flags,
            ..CtEntry::default()
        }
    }

    type Flows = PodFlows<u32, u64>;

    #[test]
    fn set_at_once_when_no_flow_is_tracked() {
        let mut p = Flows::new();
        assert_eq!(p.start(true, false, true, 0), Action::None);
        // Reply entries and SNATed flows need no egress program.
        let ct4 = [
            (1, entry(CtKind::Reply, 0)),
            (2, entry(CtKind::Forward, CT_F_SNAT)),
            (3, entry(CtKind::Forward, CT_F_SNAT | CT_F_POD)),
        ];
        assert_eq!(p.step(0, &ct4, &[]), Action::Set);
        assert!(!p.must_clear(), "set only once written");
        p.written(Action::Set);
        assert!(p.must_clear());
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
    }

    #[test]
    fn waits_for_the_unmarked_flows_found_at_start() {
        let mut p = Flows::new();
        p.start(true, false, true, 0);
        let ct4 = [
            (1, entry(CtKind::Forward, 0)),
            (2, entry(CtKind::Forward, 0)),
        ];
        let ct6 = [(7, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &ct6), Action::None);
        assert_eq!(p.awaited(), 3);
        // An unmarked flow that began since (an outside client's) is not
        // waited for; one of the first ended; the IPv6 one too.
        let ct4 = [
            (2, entry(CtKind::Forward, 0)),
            (3, entry(CtKind::Forward, 0)),
        ];
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
        assert_eq!(p.awaited(), 1);
        let ct4 = [(3, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &[]), Action::Set);
    }

    /// A fresh agent's record after its first scan set the bit (no flow
    /// on the TC path).
    fn with_the_bit_set() -> Flows {
        let mut p = Flows::new();
        p.start(true, false, true, 0);
        assert_eq!(p.step(0, &[], &[]), Action::Set);
        p.written(Action::Set);
        p
    }

    #[test]
    fn a_marked_flow_keeps_the_bit_clear_while_it_lives() {
        let mut p = with_the_bit_set();
        // One began while the bit was set: the datapath took it away.
        assert!(p.taken_away());
        assert!(!p.taken_away(), "once");
        let pod = [(9, entry(CtKind::Forward, CT_F_POD))];
        let pod6 = [(9u64, entry(CtKind::Forward, CT_F_POD))];
        assert_eq!(p.step(0, &pod, &[]), Action::None);
        assert_eq!(p.step(0, &[], &pod6), Action::None, "IPv6 too");
        assert_eq!(p.step(0, &[], &[]), Action::Set);
        p.written(Action::Set);
        // One the datapath did not see while the bit was clear, found set
        // (it began between the agent's read and its write): cleared.
        assert_eq!(p.step(0, &pod, &[]), Action::Clear);
        assert!(pod_flows(&pod));
        // A reply entry whose forward one the LRU took counts too.
        assert!(pod_flows(&[(9, entry(CtKind::Reply, CT_F_POD))]));
    }

    #[test]
    fn a_frontend_left_to_tc_keeps_the_bit_clear() {
        let mut p = with_the_bit_set();
        // The reconciler clears it before writing such a frontend...
        assert!(p.must_clear());
        p.written(Action::Clear);
        // ...and while one is programmed, the bit stays clear.
        assert_eq!(p.step(1, &[], &[]), Action::None);
        // Its pods' flows are marked: gone with them.
        let pod = [(1, entry(CtKind::Forward, CT_F_POD))];
        assert_eq!(p.step(0, &pod, &[]), Action::None);
        assert_eq!(p.step(0, &[], &[]), Action::Set);
    }

    #[test]
    fn a_set_bit_is_trusted_only_from_an_agent_that_kept_it() {
        let mut p = Flows::new();
        assert_eq!(p.start(false, true, true, 0), Action::Clear);
        p.written(Action::Clear);
        assert_eq!(
            p.step(0, &[], &[]),
            Action::None,
            "never set unless allowed"
        );
        let mut p = Flows::new();
        assert_eq!(p.start(true, true, true, 2), Action::Clear);
        // Another agent ran since the bit was set: its word does not hold,
        // and the unmarked flows found are waited for.
        assert_eq!(p.start(true, true, false, 0), Action::Clear);
        p.written(Action::Clear);
        let old = [(4, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &old, &[]), Action::None);
        assert_eq!(p.awaited(), 1);
        // Kept: trusted, and unmarked entries (outside clients') do not
        // matter.
        let mut p = Flows::new();
        assert_eq!(p.start(true, true, true, 0), Action::None);
        assert!(p.must_clear());
        assert_eq!(p.step(0, &old, &[]), Action::None);
        assert_eq!(p.step(1, &[], &[]), Action::Clear);
    }

    #[test]
    fn sctp_and_source_ranged_frontends_are_left_to_tc() {
        use std::net::{IpAddr, Ipv4Addr};
        let addr = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1));
        let tcp = FrontendKey::new(addr, 80, Proto::Tcp);
        let sctp = FrontendKey::new(addr, 80, Proto::Sctp);
        assert!(!left_to_tc(&tcp, 0));
        assert!(left_to_tc(&sctp, 0));
        assert!(left_to_tc(&tcp, SVC_F_SOURCE_RANGES));
    }
}
