//! kube-proxy's endpoint rules: merging a service port's EndpointSlices
//! (pkg/proxy/endpointslicecache.go) and choosing which endpoints each
//! traffic policy may use (pkg/proxy/topology.go, CategorizeEndpoints).
//!
//! One difference by design: kube-proxy hands each frontend only the
//! endpoints it may use right now (ready ones, else serving-terminating
//! ones). Here every endpoint the policy allows is kept with its state,
//! and the datapath applies "active first, else terminating-serving, never
//! the rest"; the reconciler needs to see terminating endpoints to drain
//! them.

use std::collections::BTreeMap;

use super::{
    objects::{AddressFamily, Conditions, SliceInfo},
    topology::{available, topology_mode, Locality},
};
use crate::model::{DesiredBackend, Endpoint, Proto, WhenEmpty};

/// One endpoint of one service port, merged across slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Candidate<'a> {
    pub endpoint: Endpoint,
    pub conditions: Conditions,
    /// On this node.
    pub local: bool,
    pub zone_hints: &'a [crate::model::Name],
    pub node_hints: &'a [crate::model::Name],
}

impl Candidate<'_> {
    fn backend(&self) -> DesiredBackend {
        DesiredBackend {
            endpoint: self.endpoint,
            state: self.conditions.state(),
        }
    }
}

/// The endpoints of the service port named `port_name`/`proto` in `slices`
/// (already those of its service, in slice-name order), sorted by endpoint.
///
/// An endpoint (address and port) listed by several slices appears once:
/// the first listing in slice-name order, unless it is terminating and a
/// later one is not (kube-proxy prefers a non-terminating listing, for a
/// pod IP reused before the old pod is gone; among equals its choice
/// depends on map order, here on slice names).
pub(super) fn collect<'a>(
    slices: &[&'a SliceInfo],
    port_name: &str,
    proto: Proto,
    node_name: &str,
    ipv6: bool,
) -> Vec<Candidate<'a>> {
    let mut merged: BTreeMap<Endpoint, Candidate<'a>> = BTreeMap::new();
    for slice in slices {
        if slice.family == AddressFamily::V6 && !ipv6 {
            continue;
        }
        let Some(sp) = slice
            .ports
            .iter()
            .find(|p| *p.name == *port_name && p.proto == proto)
        else {
            continue;
        };
        for e in slice.endpoints.iter() {
            let cand = Candidate {
                endpoint: Endpoint {
                    addr: e.addr,
                    port: sp.port,
                },
                conditions: e.conditions,
                local: !node_name.is_empty() && e.node_name() == Some(node_name),
                zone_hints: e.zone_hints(),
                node_hints: e.node_hints(),
            };
            match merged.get_mut(&cand.endpoint) {
                None => {
                    merged.insert(cand.endpoint, cand);
                }
                Some(old) if old.conditions.terminating && !cand.conditions.terminating => {
                    *old = cand;
                }
                Some(_) => {}
            }
        }
    }
    merged.into_values().collect()
}

/// The backend lists of one service port for one address family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Selection {
    /// For cluster traffic policy: every endpoint, except ready ones not
    /// hinted for this node (or its zone) when topology hints apply.
    pub cluster: Vec<DesiredBackend>,
    /// For local traffic policy: the endpoints on this node.
    pub local: Vec<DesiredBackend>,
    /// Some local endpoint may take new flows.
    pub local_usable: bool,
    /// Some endpoint anywhere may take new flows.
    pub any_usable: bool,
}

impl Selection {
    pub fn new(all: &[Candidate<'_>], family: AddressFamily, here: Locality<'_>) -> Self {
        let cands: Vec<&Candidate<'_>> = all
            .iter()
            .filter(|c| AddressFamily::of(c.endpoint.addr) == family)
            .collect();
        let mode = topology_mode(&cands, here);
        // Endpoints that are not ready are kept whatever their hints: they
        // are picked only when nothing is ready, and kube-proxy ignores
        // topology then.
        let for_cluster = |c: &Candidate<'_>| !c.conditions.ready || available(c, mode, here);
        Self {
            cluster: cands
                .iter()
                .filter(|c| for_cluster(c))
                .map(|c| c.backend())
                .collect(),
            local: cands
                .iter()
                .filter(|c| c.local)
                .map(|c| c.backend())
                .collect(),
            local_usable: cands.iter().any(|c| c.local && c.conditions.usable()),
            any_usable: cands.iter().any(|c| c.conditions.usable()),
        }
    }

    /// The backends and empty-frontend behaviour of a frontend with the
    /// given traffic policy. Local policy with usable endpoints elsewhere
    /// but none here drops (kube-proxy: "has no local endpoints"); with
    /// none anywhere, and for cluster policy, it rejects ("has no
    /// endpoints").
    pub fn for_policy(&self, local: bool) -> (Vec<DesiredBackend>, WhenEmpty) {
        if local {
            let when_empty = if !self.local_usable && self.any_usable {
                WhenEmpty::Drop
            } else {
                WhenEmpty::Reject
            };
            (self.local.clone(), when_empty)
        } else {
            (self.cluster.clone(), WhenEmpty::Reject)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::BackendState,
        translate::{builders::*, objects::SliceInfo, topology::TopologyMode},
    };
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    fn nowhere() -> Locality<'static> {
        Locality::default()
    }

    fn info(s: &EndpointSlice) -> SliceInfo {
        SliceInfo::from_slice(s).unwrap().unwrap()
    }

    fn eps(c: &[Candidate<'_>]) -> Vec<String> {
        c.iter()
            .map(|c| format!("{}={}", c.endpoint, c.conditions.state().as_str()))
            .collect()
    }

    #[test]
    fn several_slices_merge() {
        let a = info(&mk_slice(
            "ns",
            "web-a",
            "web",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.2"), ep("10.0.0.1")],
        ));
        let b = info(&mk_slice(
            "ns",
            "web-b",
            "web",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.3")],
        ));
        let got = collect(&[&a, &b], "http", Proto::Tcp, "n1", false);
        assert_eq!(
            eps(&got),
            vec![
                "10.0.0.1:8080=active",
                "10.0.0.2:8080=active",
                "10.0.0.3:8080=active"
            ]
        );
    }

    #[test]
    fn endpoint_in_two_slices_prefers_non_terminating() {
        let term = with_conditions(ep("10.0.0.1"), Some(false), Some(true), Some(true));
        let a = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![term],
        ));
        let b = info(&mk_slice(
            "ns",
            "b",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![ep("10.0.0.1")],
        ));
        assert_eq!(
            eps(&collect(&[&a, &b], "", Proto::Tcp, "", false)),
            vec!["10.0.0.1:80=active"]
        );
        // Either order.
        assert_eq!(
            eps(&collect(&[&b, &a], "", Proto::Tcp, "", false)),
            vec!["10.0.0.1:80=active"]
        );
        // Two non-terminating listings: the first slice's wins.
        let nr = with_conditions(ep("10.0.0.1"), Some(false), None, None);
        let c = info(&mk_slice(
            "ns",
            "c",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![nr],
        ));
        assert_eq!(
            eps(&collect(&[&b, &c], "", Proto::Tcp, "", false)),
            vec!["10.0.0.1:80=active"]
        );
        assert_eq!(
            eps(&collect(&[&c, &b], "", Proto::Tcp, "", false)),
            vec!["10.0.0.1:80=not-ready"]
        );
    }

    #[test]
    fn same_address_different_ports_are_distinct() {
        let a = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.1")],
        ));
        let b = info(&mk_slice(
            "ns",
            "b",
            "web",
            &[slice_port("http", "TCP", 9090)],
            vec![ep("10.0.0.1")],
        ));
        assert_eq!(
            eps(&collect(&[&a, &b], "http", Proto::Tcp, "", false)),
            vec!["10.0.0.1:8080=active", "10.0.0.1:9090=active"]
        );
    }

    #[test]
    fn ports_match_by_name_and_protocol() {
        let s = info(&mk_slice(
            "ns",
            "a",
            "dns",
            &[
                slice_port("dns", "UDP", 5353),
                slice_port("dns-tcp", "TCP", 5354),
            ],
            vec![ep("10.0.0.1")],
        ));
        assert_eq!(
            eps(&collect(&[&s], "dns", Proto::Udp, "", false)),
            vec!["10.0.0.1:5353=active"]
        );
        assert!(collect(&[&s], "dns", Proto::Tcp, "", false).is_empty());
        assert!(collect(&[&s], "other", Proto::Udp, "", false).is_empty());
    }

    #[test]
    fn ipv6_slices_skipped_unless_enabled() {
        let s = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![ep("fd00::1")],
        ));
        assert!(collect(&[&s], "", Proto::Tcp, "", false).is_empty());
        assert_eq!(collect(&[&s], "", Proto::Tcp, "", true).len(), 1);
    }

    #[test]
    fn zone_hints_rules() {
        let s = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![
                hinted(ep("10.0.0.1"), &["a"]),
                hinted(ep("10.0.0.2"), &["b"]),
                // Not ready: its missing hint does not matter.
                with_conditions(ep("10.0.0.3"), Some(false), None, None),
            ],
        ));
        let all = collect(&[&s], "", Proto::Tcp, "", false);
        let refs: Vec<&Candidate<'_>> = all.iter().collect();
        let in_zone = |zone| Locality {
            node_name: "n1",
            zone,
        };
        let mode = |zone| topology_mode(&refs, in_zone(zone));
        assert_eq!(mode(Some("a")), TopologyMode::SameZone);
        assert_eq!(mode(Some("c")), TopologyMode::Everywhere);
        assert_eq!(mode(None), TopologyMode::Everywhere);
        assert_eq!(mode(Some("")), TopologyMode::Everywhere);
        let sel = Selection::new(&all, AddressFamily::V4, in_zone(Some("a")));
        let got: Vec<(String, BackendState)> = sel
            .cluster
            .iter()
            .map(|b| (b.endpoint.to_string(), b.state))
            .collect();
        assert_eq!(
            got,
            vec![
                ("10.0.0.1:80".to_string(), BackendState::Active),
                ("10.0.0.3:80".to_string(), BackendState::NotReady)
            ]
        );
    }

    #[test]
    fn when_empty_rules() {
        let remote = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![ep_on("10.0.0.1", "n2")],
        ));
        let all = collect(&[&remote], "", Proto::Tcp, "n1", false);
        let sel = Selection::new(&all, AddressFamily::V4, nowhere());
        assert_eq!(sel.for_policy(true), (vec![], WhenEmpty::Drop));
        assert_eq!(sel.for_policy(false).1, WhenEmpty::Reject);
        assert_eq!(sel.for_policy(false).0.len(), 1);

        // Only a not-ready endpoint anywhere: nothing usable, reject.
        let nr = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![with_conditions(
                ep_on("10.0.0.1", "n2"),
                Some(false),
                None,
                None,
            )],
        ));
        let all = collect(&[&nr], "", Proto::Tcp, "n1", false);
        let sel = Selection::new(&all, AddressFamily::V4, nowhere());
        assert_eq!(sel.for_policy(true), (vec![], WhenEmpty::Reject));

        // A local terminating-serving endpoint is usable.
        let ts = info(&mk_slice(
            "ns",
            "a",
            "web",
            &[slice_port("", "TCP", 80)],
            vec![
                with_conditions(ep_on("10.0.0.1", "n1"), Some(false), Some(true), Some(true)),
                ep_on("10.0.0.2", "n2"),
            ],
        ));
        let all = collect(&[&ts], "", Proto::Tcp, "n1", false);
        let sel = Selection::new(&all, AddressFamily::V4, nowhere());
        let (backends, when_empty) = sel.for_policy(true);
        assert_eq!(when_empty, WhenEmpty::Reject);
        assert_eq!(backends.len(), 1);
        assert_eq!(backends[0].state, BackendState::TerminatingServing);
    }
}
