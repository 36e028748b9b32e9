//! Topology-aware routing as kube-proxy does it (pkg/proxy/topology.go,
//! topologyModeFromHints and availableForTopology): which ready endpoints
//! cluster-policy traffic on this node keeps to.
//!
//! The hints are the switch. The EndpointSlice controller writes
//! `hints.forNodes` for services with `trafficDistribution:
//! PreferSameNode` and `hints.forZones` for `PreferClose` /
//! `PreferSameZone` (or the topology-mode annotation); kube-proxy reads
//! only the hints, not the service's field, and so does sluice.
//!
//! Both kinds follow one all-or-nothing rule: hints are used only when
//! every ready endpoint has some and at least one is for this node (its
//! zone); otherwise traffic goes everywhere, never to an empty set. Node
//! hints take precedence over zone hints. Endpoints that are not ready
//! neither vote nor get filtered: they only matter when no endpoint is
//! ready, and then topology no longer applies.

use crate::model::Name;

use super::endpoints::Candidate;

/// Where this node is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Locality<'a> {
    /// This node's name ("" when unknown: node hints never match).
    pub node_name: &'a str,
    /// Its `topology.kubernetes.io/zone` label, if any.
    pub zone: Option<&'a str>,
}

/// Which ready endpoints cluster-policy traffic may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TopologyMode {
    /// All of them (no usable hints).
    Everywhere,
    /// Those hinted for this node (`PreferSameNode`).
    SameNode,
    /// Those hinted for this node's zone (`PreferSameZone`).
    SameZone,
}

/// The mode the hints of `cands` (one family's endpoints of one service
/// port) give on this node.
pub(super) fn topology_mode(cands: &[&Candidate<'_>], here: Locality<'_>) -> TopologyMode {
    let node = Some(here.node_name).filter(|n| !n.is_empty());
    let zone = here.zone.filter(|z| !z.is_empty());
    let ready: Vec<&Candidate<'_>> = cands
        .iter()
        .copied()
        .filter(|c| c.conditions.ready)
        .collect();
    if ready.is_empty() {
        return TopologyMode::Everywhere;
    }
    if hints_apply(&ready, |c| c.node_hints, node) {
        TopologyMode::SameNode
    } else if hints_apply(&ready, |c| c.zone_hints, zone) {
        TopologyMode::SameZone
    } else {
        TopologyMode::Everywhere
    }
}

/// Every ready endpoint has hints of one kind and one is for `name`.
fn hints_apply<'a>(
    ready: &[&Candidate<'a>],
    hints: fn(&Candidate<'a>) -> &'a [Name],
    name: Option<&str>,
) -> bool {
    let Some(name) = name else { return false };
    ready.iter().all(|c| !hints(c).is_empty()) && ready.iter().any(|c| hinted(hints(c), name))
}

/// Whether a ready endpoint may take cluster-policy traffic in `mode`.
pub(super) fn available(c: &Candidate<'_>, mode: TopologyMode, here: Locality<'_>) -> bool {
    match mode {
        TopologyMode::Everywhere => true,
        TopologyMode::SameNode => hinted(c.node_hints, here.node_name),
        TopologyMode::SameZone => here.zone.is_some_and(|z| hinted(c.zone_hints, z)),
    }
}

fn hinted(hints: &[Name], name: &str) -> bool {
    hints.iter().any(|h| &**h == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::Endpoint, translate::objects::Conditions};

    fn cand<'a>(last: u8, ready: bool, zones: &'a [Name], nodes: &'a [Name]) -> Candidate<'a> {
        Candidate {
            endpoint: Endpoint {
                addr: std::net::IpAddr::from([10, 0, 0, last]),
                port: 80,
            },
            conditions: Conditions {
                ready,
                serving: ready,
                terminating: false,
            },
            local: false,
            zone_hints: zones,
            node_hints: nodes,
        }
    }

    fn names(list: &[&str]) -> Vec<Name> {
        list.iter().map(|s| Name::from(*s)).collect()
    }

    const HERE: Locality<'static> = Locality {
        node_name: "n1",
        zone: Some("a"),
    };

    #[test]
    fn node_hints_win_over_zone_hints() {
        let (za, zb) = (names(&["a"]), names(&["b"]));
        let (n1, n2) = (names(&["n1"]), names(&["n2"]));
        let all = [cand(1, true, &za, &n1), cand(2, true, &zb, &n2)];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        assert_eq!(topology_mode(&refs, HERE), TopologyMode::SameNode);
        assert!(available(&all[0], TopologyMode::SameNode, HERE));
        assert!(!available(&all[1], TopologyMode::SameNode, HERE));
        // Another node: no endpoint for it, the zone hints decide.
        let there = Locality {
            node_name: "n3",
            ..HERE
        };
        assert_eq!(topology_mode(&refs, there), TopologyMode::SameZone);
        // No node name known: node hints never match.
        let unnamed = Locality {
            node_name: "",
            ..HERE
        };
        assert_eq!(topology_mode(&refs, unnamed), TopologyMode::SameZone);
    }

    #[test]
    fn one_unhinted_ready_endpoint_disables_that_kind() {
        let (za, none, n1) = (names(&["a"]), Vec::new(), names(&["n1"]));
        let all = [cand(1, true, &za, &n1), cand(2, true, &za, &none)];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        assert_eq!(topology_mode(&refs, HERE), TopologyMode::SameZone);
        let all = [cand(1, true, &none, &n1), cand(2, true, &za, &none)];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        assert_eq!(topology_mode(&refs, HERE), TopologyMode::Everywhere);
    }

    #[test]
    fn endpoints_that_are_not_ready_do_not_vote() {
        let (none, n1, n2) = (Vec::new(), names(&["n1"]), names(&["n2"]));
        // The only endpoint for this node is not ready: no node mode.
        let all = [cand(1, false, &none, &n1), cand(2, true, &none, &n2)];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        assert_eq!(topology_mode(&refs, HERE), TopologyMode::Everywhere);
        // An unhinted endpoint that is not ready does not spoil the hints.
        let all = [cand(1, false, &none, &none), cand(2, true, &none, &n1)];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        assert_eq!(topology_mode(&refs, HERE), TopologyMode::SameNode);
        // Nothing ready at all.
        let all = [cand(1, false, &none, &n1)];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        assert_eq!(topology_mode(&refs, HERE), TopologyMode::Everywhere);
    }

    #[test]
    fn zone_mode_needs_a_zone() {
        let za = names(&["a"]);
        let all = [cand(1, true, &za, &[])];
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        for zone in [None, Some("")] {
            let here = Locality { zone, ..HERE };
            assert_eq!(topology_mode(&refs, here), TopologyMode::Everywhere);
        }
    }
}
