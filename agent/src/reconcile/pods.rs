//! When the pods' egress may skip reverse NAT (`CFG_F_PODS_ON_SOCKETS`).
//!
//! With `--socket-lb=all` over the whole node, a pod's TCP and UDP sockets
//! are sent to their backend at `connect()`/`sendmsg()`, so no reply
//! towards a pod needs its source turned back, and `sl_egress_pod` (the
//! egress program of `--pod-devices`) can let every packet pass. That holds
//! only while the TC path tracks no flow of a pod, which it does for:
//! - frontends the socket programs leave to it for pods: SCTP ones, and
//!   those with `loadBalancerSourceRanges` (`left_to_tc`);
//! - flows that began on it before the socket programs served the pods
//!   (an upgrade from 0.1.0 or from `--socket-lb=host`).
//!
//! So the bit is cleared before a frontend of the first kind is written
//! (`must_clear`, by the one map writer, in its order), and set only once
//! no such frontend is programmed and every forward conntrack entry that
//! existed while it was clear has gone (`step`, at each conntrack scan).
//! A socket of a pod connected before the socket programs served it may
//! outlive its conntrack entry (an idle UDP socket, 60 s): its next packet
//! starts a flow on the TC path, and the datapath itself takes the bit away
//! for it (`maps::new_flow_from_v4`, a source inside the cluster by
//! local-traffic detection, which is why the bit needs one); a scan that
//! finds the bit gone waits again (`taken_away`). After writing the bit a
//! scan reads conntrack once more, and clears it again if a flow began
//! between its two reads (`began_since`).
//! The entries are not told apart by client: an outside client's flow to
//! a node port delays the bit as a pod's would. SNATed flows need no
//! egress program (their replies are turned back on the way in).

use std::collections::HashSet;

use sluice_common::{conntrack::CT_F_SNAT, service::SVC_F_SOURCE_RANGES, CtEntry, CtKind};

use crate::model::{FrontendKey, Proto};

/// Whether the socket programs leave `key` (master flags `flags`) to the
/// TC path when a pod connects to it (`sock.rs`: SCTP is not balanced at
/// the socket; a source range needs the pod's address).
pub fn left_to_tc(key: &FrontendKey, flags: u16) -> bool {
    key.proto == Proto::Sctp || flags & SVC_F_SOURCE_RANGES != 0
}

/// What a conntrack scan asks of `CFG_F_PODS_ON_SOCKETS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Set,
    Clear,
}

#[derive(Debug)]
enum State<K4, K6> {
    /// Clear in the map; the next scan takes the flows to wait for.
    Clear,
    /// Clear in the map, waiting for these forward entries to go.
    Draining { v4: HashSet<K4>, v6: HashSet<K6> },
    /// Set in the map.
    Set,
}

/// The bit's state, as the reconciler wrote it.
#[derive(Debug)]
pub struct PodFlows<K4, K6> {
    /// The socket programs serve every pod and some device is a pod's.
    allowed: bool,
    state: State<K4, K6>,
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
            state: State::Clear,
        }
    }

    /// Whether the bit may be set at all, and whether the map holds it
    /// set now (`set_in_map`) from an agent whose word still holds
    /// (`kept`: the pods' devices still run `sl_egress_pod`, so no other
    /// agent ran since, such as 0.1.0 or one in `host` mode, whose pods'
    /// flows the TC path would track). A set bit that is not allowed or
    /// kept, or while `left` frontends are left to the TC path, must be
    /// cleared at once (`Action::Clear`).
    pub fn start(&mut self, allowed: bool, set_in_map: bool, kept: bool, left: usize) -> Action {
        self.allowed = allowed;
        self.state = if set_in_map { State::Set } else { State::Clear };
        if set_in_map && (!allowed || !kept || left > 0) {
            Action::Clear
        } else {
            Action::None
        }
    }

    /// Whether the bit is set in the map (so that a frontend left to the
    /// TC path must wait for it to be cleared).
    pub fn must_clear(&self) -> bool {
        matches!(self.state, State::Set)
    }

    /// Whether the bit is set, for `sluice status` and the metrics.
    pub fn is_set(&self) -> bool {
        self.must_clear()
    }

    /// A frontend left to the TC path is about to be written while the bit
    /// is clear: the flows to wait for are taken afresh once none is left
    /// (those it gets meanwhile included).
    pub fn restart(&mut self) {
        if !matches!(self.state, State::Set) {
            self.state = State::Clear;
        }
    }

    /// The map holds the bit clear though it was written set: the datapath
    /// took it away (a pod's flow began on the TC path). Returns whether
    /// it was set.
    pub fn taken_away(&mut self) -> bool {
        let was = matches!(self.state, State::Set);
        if was {
            self.state = State::Clear;
        }
        was
    }

    /// The map now holds the bit as `action` said.
    pub fn written(&mut self, action: Action) {
        match action {
            Action::Set => self.state = State::Set,
            Action::Clear => self.state = State::Clear,
            Action::None => {}
        }
    }

    /// One conntrack scan (`ct4`, `ct6`: every entry read), with `left`
    /// frontends left to the TC path programmed.
    pub fn step(&mut self, left: usize, ct4: &[(K4, CtEntry)], ct6: &[(K6, CtEntry)]) -> Action {
        if !self.allowed || left > 0 {
            if matches!(self.state, State::Set) {
                return Action::Clear;
            }
            self.state = State::Clear;
            return Action::None;
        }
        let (v4, v6) = match &self.state {
            State::Set => return Action::None,
            State::Clear => (tracked(ct4, |_| true), tracked(ct6, |_| true)),
            State::Draining { v4, v6 } => (
                tracked(ct4, |k| v4.contains(k)),
                tracked(ct6, |k| v6.contains(k)),
            ),
        };
        if v4.is_empty() && v6.is_empty() {
            return Action::Set;
        }
        self.state = State::Draining { v4, v6 };
        Action::None
    }

    /// Forward entries still awaited, for the log.
    pub fn awaited(&self) -> usize {
        match &self.state {
            State::Draining { v4, v6 } => v4.len() + v6.len(),
            _ => 0,
        }
    }
}

/// Whether `after` holds a forward entry without SNAT that `before` does
/// not: a flow that began between two reads (the bit set in between
/// must go again).
pub fn began_since<K: Copy + Eq + std::hash::Hash>(
    before: &[(K, CtEntry)],
    after: &[(K, CtEntry)],
) -> bool {
    let known = tracked(before, |_| true);
    !tracked(after, |k| !known.contains(k)).is_empty()
}

/// The keys of forward entries without SNAT among `entries` that `keep`
/// accepts.
fn tracked<K: Copy + Eq + std::hash::Hash>(
    entries: &[(K, CtEntry)],
    keep: impl Fn(&K) -> bool,
) -> HashSet<K> {
    entries
        .iter()
        .filter(|(k, e)| e.kind == CtKind::Forward as u8 && e.flags & CT_F_SNAT == 0 && keep(k))
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
        ];
        assert_eq!(p.step(0, &ct4, &[]), Action::Set);
        assert!(!p.must_clear(), "set only once written");
        p.written(Action::Set);
        assert!(p.must_clear());
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
    }

    #[test]
    fn waits_for_the_flows_tracked_while_clear() {
        let mut p = Flows::new();
        p.start(true, false, true, 0);
        let ct4 = [
            (1, entry(CtKind::Forward, 0)),
            (2, entry(CtKind::Forward, 0)),
        ];
        let ct6 = [(7, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &ct6), Action::None);
        assert_eq!(p.awaited(), 3);
        // A flow that began since is not waited for; one of the first
        // ended; the IPv6 one too.
        let ct4 = [
            (2, entry(CtKind::Forward, 0)),
            (3, entry(CtKind::Forward, 0)),
        ];
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
        assert_eq!(p.awaited(), 1);
        let ct4 = [(3, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &[]), Action::Set);
    }

    #[test]
    fn a_frontend_left_to_tc_clears_and_restarts_the_wait() {
        let mut p = Flows::new();
        p.start(true, false, true, 0);
        assert_eq!(p.step(0, &[], &[]), Action::Set);
        p.written(Action::Set);
        // The reconciler clears it before writing such a frontend...
        assert!(p.must_clear());
        p.written(Action::Clear);
        assert!(!p.must_clear());
        // ...and while one is programmed, the bit stays clear.
        let ct4 = [(1, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(1, &ct4, &[]), Action::None);
        // Gone: the flows of now are waited for first.
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
        assert_eq!(p.awaited(), 1);
        assert_eq!(p.step(0, &[], &[]), Action::Set);
    }

    #[test]
    fn a_scan_clears_a_set_bit_that_is_not_allowed() {
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
        // Another agent ran since the bit was set: its word does not hold.
        assert_eq!(p.start(true, true, false, 0), Action::Clear);
        assert_eq!(p.start(true, true, true, 0), Action::None);
        assert!(p.must_clear());
        assert_eq!(p.step(1, &[], &[]), Action::Clear);
    }

    #[test]
    fn a_frontend_left_to_tc_while_draining_restarts_the_wait() {
        let mut p = Flows::new();
        p.start(true, false, true, 0);
        let ct4 = [(1, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
        // Written and gone again between two scans: its flow (2) began
        // after the first snapshot and is waited for too.
        p.restart();
        let ct4 = [(2, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
        assert_eq!(p.awaited(), 1);
        assert_eq!(p.step(0, &[], &[]), Action::Set);
    }

    #[test]
    fn the_datapath_taking_the_bit_away_restarts_the_wait() {
        let mut p = Flows::new();
        p.start(true, true, true, 0);
        assert!(p.taken_away());
        assert!(!p.taken_away(), "once");
        let ct4 = [(5, entry(CtKind::Forward, 0))];
        assert_eq!(p.step(0, &ct4, &[]), Action::None);
        assert_eq!(p.awaited(), 1);
    }

    #[test]
    fn a_flow_that_began_between_two_reads_is_seen() {
        let before = [(1u32, entry(CtKind::Forward, 0))];
        let after = [
            (1u32, entry(CtKind::Forward, 0)),
            (2, entry(CtKind::Reply, 0)),
            (3, entry(CtKind::Forward, CT_F_SNAT)),
        ];
        assert!(!began_since(&before, &after));
        let after = [(4u32, entry(CtKind::Forward, 0))];
        assert!(began_since(&before, &after));
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
