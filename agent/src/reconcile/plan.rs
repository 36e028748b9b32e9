//! Planning one service port ("unit"): what its frontends and backends
//! should hold, as a pure function of its desired service, what the maps
//! hold for it now, and which of its draining backends may go.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fmt,
    net::IpAddr,
};

use sluice_common::{
    maps::MAX_SLOTS,
    service::{
        FRONTEND_KIND_MASK, SVC_F_AFFINITY, SVC_F_DRAINING, SVC_F_DROP_EMPTY, SVC_F_INTERNAL,
        SVC_F_MAGLEV, SVC_F_MASQ_OUTSIDE, SVC_F_NODE_DENIED, SVC_F_SNAT, SVC_F_SOURCE_RANGES,
    },
    Backend, BackendState, FAMILY_V4, FAMILY_V6,
};

use crate::fast_hash::HashMap;

use super::{
    ids::{BackendId, SvcId},
    state::{FrontendState, SourceRange},
};
use crate::model::{
    DesiredBackend, DesiredService, Endpoint, FrontendKey, Scope, ServicePortName, WhenEmpty,
};

/// Why a service port was not (re)programmed. Its previous state, if any,
/// stays as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooManyBackends(usize),
    FrontendTaken {
        frontend: FrontendKey,
        owner: ServicePortName,
    },
    MapsFull,
}

impl Refusal {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TooManyBackends(_) => "too_many_backends",
            Refusal::FrontendTaken { .. } => "frontend_conflict",
            Refusal::MapsFull => "maps_full",
        }
    }

    /// Every reason label, for zeroing gauges.
    pub const REASONS: [&'static str; 3] = ["too_many_backends", "frontend_conflict", "maps_full"];
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::TooManyBackends(n) => {
                write!(
                    f,
                    "{n} backends exceed the {MAX_SLOTS} slots a frontend can have"
                )
            }
            Refusal::FrontendTaken { frontend, owner } => {
                write!(f, "frontend {frontend} already belongs to {owner}")
            }
            Refusal::MapsFull => f.write_str("the service or backend map has no room for it"),
        }
    }
}

/// What one unit's entries should be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitPlan {
    pub frontends: Vec<(FrontendKey, FrontendState)>,
    pub backends: Vec<(BackendId, Backend)>,
    /// loadBalancerSourceRanges of the unit's frontends that enforce them.
    pub source_ranges: BTreeSet<SourceRange>,
}

impl UnitPlan {
    pub fn service_entries(&self) -> usize {
        self.frontends.iter().map(|(_, f)| 1 + f.slots.len()).sum()
    }
}

fn rank(state: BackendState) -> u8 {
    match state {
        BackendState::Active => 0,
        BackendState::TerminatingServing => 1,
        _ => 2,
    }
}

#[allow(clippy::needless_update)] // not needless in the `abi-probe` build
pub fn backend_value(endpoint: &Endpoint, state: BackendState, svc_id: SvcId) -> Backend {
    let (addr, family) = match endpoint.addr {
        IpAddr::V4(a) => {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&a.octets());
            (addr, FAMILY_V4)
        }
        IpAddr::V6(a) => (a.octets(), FAMILY_V6),
    };
    Backend {
        addr,
        port: endpoint.port,
        family,
        state: state as u8,
        svc_id: svc_id.get(),
        ..Backend::default()
    }
}

pub fn endpoint_of(backend: &Backend) -> Endpoint {
    let addr = if backend.family == FAMILY_V6 {
        IpAddr::from(backend.addr)
    } else {
        IpAddr::from(backend.addr_v4())
    };
    Endpoint {
        addr,
        port: backend.port,
    }
}

fn same_family(endpoint: &Endpoint, frontend: &FrontendKey) -> bool {
    endpoint.addr.is_ipv6() == frontend.addr.is_ipv6()
}

/// Orders backends into slots: active, then terminating-but-serving, then
/// the never-selected rest; deterministic so that an unchanged input gives
/// unchanged slots.
fn frontend_state(
    svc_id: SvcId,
    flags: u16,
    affinity_s: u32,
    members: &[(BackendId, Endpoint, BackendState)],
    maglev: bool,
) -> FrontendState {
    let mut order: Vec<(u8, Endpoint, BackendId)> = members
        .iter()
        .map(|(id, ep, state)| (rank(*state), *ep, *id))
        .collect();
    order.sort();
    order.dedup_by_key(|(_, _, id)| *id);
    let count = |r: u8| order.iter().filter(|(rank, _, _)| *rank == r).count() as u16;
    let (active, fallback) = (count(0), count(1));
    // A Maglev table spreads over what new flows may pick: the active
    // backends, or the serving-terminating ones while none is active.
    let pickable = if active > 0 { 0 } else { 1 };
    let mut table: Vec<(BackendId, Endpoint)> = if maglev {
        order
            .iter()
            .filter(|(rank, _, _)| *rank == pickable)
            .map(|(_, ep, id)| (*id, *ep))
            .collect()
    } else {
        Vec::new()
    };
    table.sort_by_key(|(_, ep)| *ep);
    let flags = if table.is_empty() {
        flags
    } else {
        flags | SVC_F_MAGLEV
    };
    FrontendState {
        svc_id,
        flags,
        active,
        fallback,
        affinity_s,
        slots: order.into_iter().map(|(_, _, id)| id).collect(),
        maglev: table.into(),
        sock_picks: false,
    }
}

/// The most selectable of two states of one endpoint.
fn better(a: BackendState, b: BackendState) -> BackendState {
    let order = |s: BackendState| match s {
        BackendState::Active => 0,
        BackendState::TerminatingServing => 1,
        BackendState::NotReady => 2,
        BackendState::Terminating => 3,
        BackendState::Draining => 4,
    };
    if order(b) < order(a) {
        b
    } else {
        a
    }
}

fn dedup_best(list: &[DesiredBackend]) -> BTreeMap<Endpoint, BackendState> {
    let mut out: BTreeMap<Endpoint, BackendState> = BTreeMap::new();
    for b in list {
        out.entry(b.endpoint)
            .and_modify(|s| *s = better(*s, b.state))
            .or_insert(b.state);
    }
    out
}

/// A desired service port. `existing` are its backends in the maps (by id),
/// `new_id` hands out fresh backend ids.
pub fn plan_desired(
    svc_id: SvcId,
    svc: &DesiredService,
    existing: &[(BackendId, Backend)],
    removable: &HashSet<BackendId>,
    mut new_id: impl FnMut() -> BackendId,
) -> UnitPlan {
    // Backend entries are per service port: one per endpoint that any
    // frontend wants, in its most selectable state.
    let all: Vec<DesiredBackend> = svc
        .frontends
        .iter()
        .flat_map(|f| f.backends.iter().copied())
        .collect();
    let wanted = dedup_best(&all);

    let mut by_endpoint: HashMap<Endpoint, BackendId> = HashMap::default();
    for (id, b) in existing {
        by_endpoint.entry(endpoint_of(b)).or_insert(*id);
    }
    let mut ids: HashMap<Endpoint, BackendId> = HashMap::default();
    let mut backends = Vec::new();
    for (endpoint, state) in &wanted {
        let current = by_endpoint.get(endpoint).copied();
        let id = match (state, current) {
            // A terminating endpoint is never added, only kept while its
            // flows drain.
            (BackendState::Terminating | BackendState::Draining, Some(id))
                if !removable.contains(&id) =>
            {
                id
            }
            (BackendState::Terminating | BackendState::Draining, _) => continue,
            (_, Some(id)) => id,
            (_, None) => new_id(),
        };
        let state = if *state == BackendState::Draining {
            BackendState::Terminating
        } else {
            *state
        };
        ids.insert(*endpoint, id);
        backends.push((id, backend_value(endpoint, state, svc_id)));
    }
    // In the maps but no longer wanted by any frontend: drain.
    let used: HashSet<BackendId> = ids.values().copied().collect();
    let mut draining = Vec::new();
    for (id, b) in existing {
        if !used.contains(id) && !removable.contains(id) {
            let endpoint = endpoint_of(b);
            backends.push((
                *id,
                backend_value(&endpoint, BackendState::Draining, svc_id),
            ));
            draining.push((*id, endpoint, BackendState::Draining));
        }
    }
    // An external frontend with an internal scope sends sources inside the
    // cluster there (the internal entries are written in the same unit).
    let internal: HashSet<FrontendKey> = svc
        .frontends
        .iter()
        .filter(|f| f.key.scope == Scope::Internal)
        .map(|f| f.key.in_scope(Scope::External))
        .collect();
    let frontends = svc
        .frontends
        .iter()
        .map(|fe| {
            let mut members: Vec<(BackendId, Endpoint, BackendState)> = dedup_best(&fe.backends)
                .into_iter()
                .filter_map(|(ep, state)| ids.get(&ep).map(|id| (*id, ep, state)))
                .collect();
            // A frontend lists only its own family's draining backends:
            // an IPv6 backend has no business in an `sl_svc4` slot.
            members.extend(
                draining
                    .iter()
                    .filter(|(_, ep, _)| same_family(ep, &fe.key))
                    .copied(),
            );
            let mut flags = fe.kind as u16;
            if fe.when_empty == WhenEmpty::Drop {
                flags |= SVC_F_DROP_EMPTY;
            }
            if fe.snat {
                flags |= SVC_F_SNAT;
            }
            let affinity_s = fe.affinity_timeout.unwrap_or(0);
            if affinity_s > 0 {
                flags |= SVC_F_AFFINITY;
            }
            if !fe.source_ranges.is_empty() {
                flags |= SVC_F_SOURCE_RANGES;
            }
            if fe.masquerade_outside {
                flags |= SVC_F_MASQ_OUTSIDE;
            }
            if fe.node_denied {
                flags |= SVC_F_NODE_DENIED;
            }
            if fe.key.scope == Scope::External && internal.contains(&fe.key) {
                flags |= SVC_F_INTERNAL;
            }
            let mut state = frontend_state(svc_id, flags, affinity_s, &members, fe.maglev);
            state.sock_picks = super::picks::qualifies(&fe.key, &state);
            (fe.key, state)
        })
        .collect();
    let source_ranges = svc
        .frontends
        .iter()
        .flat_map(|f| f.source_ranges.iter().copied())
        .collect();
    UnitPlan {
        frontends,
        backends,
        source_ranges,
    }
}

/// A service port that is no longer desired: its frontends stay (with no
/// selectable backend, so new flows are refused) while its backends drain.
/// `frontends` are the ones it still holds in the maps.
pub fn plan_leftover(
    svc_id: SvcId,
    frontends: &[(FrontendKey, u16)],
    existing: &[(BackendId, Backend)],
    removable: &HashSet<BackendId>,
) -> UnitPlan {
    let backends: Vec<(BackendId, Backend)> = existing
        .iter()
        .filter(|(id, _)| !removable.contains(id))
        .map(|(id, b)| {
            (
                *id,
                backend_value(&endpoint_of(b), BackendState::Draining, svc_id),
            )
        })
        .collect();
    if backends.is_empty() {
        return UnitPlan::default();
    }
    let members: Vec<(BackendId, Endpoint, BackendState)> = backends
        .iter()
        .map(|(id, b)| (*id, endpoint_of(b), BackendState::Draining))
        .collect();
    let frontends = frontends
        .iter()
        .map(|(key, flags)| {
            let kind = flags & FRONTEND_KIND_MASK;
            let own: Vec<_> = members
                .iter()
                .filter(|(_, ep, _)| same_family(ep, key))
                .copied()
                .collect();
            (
                *key,
                frontend_state(svc_id, kind | SVC_F_DRAINING, 0, &own, false),
            )
        })
        .collect();
    UnitPlan {
        frontends,
        backends,
        source_ranges: BTreeSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use sluice_common::FrontendKind;

    use super::*;
    use crate::model::{Frontend, Proto};

    fn ep(last: u8) -> Endpoint {
        Endpoint {
            addr: IpAddr::V4(Ipv4Addr::new(10, 20, 0, last)),
            port: 8080,
        }
    }

    fn svc(backends: &[(u8, BackendState)]) -> DesiredService {
        DesiredService {
            frontends: vec![Frontend::new(
                FrontendKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, Proto::Tcp),
                FrontendKind::ClusterIp,
                backends
                    .iter()
                    .map(|(l, s)| DesiredBackend {
                        endpoint: ep(*l),
                        state: *s,
                    })
                    .collect(),
                WhenEmpty::Reject,
            )],
        }
    }

    fn ids() -> impl FnMut() -> BackendId {
        let mut next = 100;
        move || {
            next += 1;
            BackendId(next)
        }
    }

    #[test]
    fn an_internal_scope_flags_its_external_master_and_masquerade_is_a_flag() {
        use BackendState::*;
        let mut service = svc(&[(1, Active), (2, Active)]);
        let cluster_ip = service.frontends[0].clone();
        let mut external = cluster_ip.clone();
        external.key = FrontendKey::new(
            IpAddr::V4(Ipv4Addr::new(192, 168, 1, 10)),
            30080,
            Proto::Tcp,
        );
        external.kind = FrontendKind::NodePort;
        external.backends.truncate(1);
        let mut internal = external.clone();
        internal.key = external.key.in_scope(Scope::Internal);
        internal.backends = cluster_ip.backends.clone();
        service.frontends[0].masquerade_outside = true;
        service
            .frontends
            .extend([external.clone(), internal.clone()]);
        let plan = plan_desired(SvcId(1), &service, &[], &HashSet::new(), ids());
        let flags = |k: &FrontendKey| {
            plan.frontends
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, f)| (f.flags, f.active))
                .unwrap()
        };
        let (f, _) = flags(&cluster_ip.key);
        assert_eq!(
            f & (SVC_F_MASQ_OUTSIDE | SVC_F_INTERNAL),
            SVC_F_MASQ_OUTSIDE
        );
        let (f, active) = flags(&external.key);
        assert_eq!((f & SVC_F_INTERNAL, active), (SVC_F_INTERNAL, 1));
        let (f, active) = flags(&internal.key);
        assert_eq!((f & SVC_F_INTERNAL, active), (0, 2));
        // Without its internal scope, the external master is not flagged.
        service.frontends.pop();
        let plan = plan_desired(SvcId(1), &service, &[], &HashSet::new(), ids());
        let (_, f) = plan
            .frontends
            .iter()
            .find(|(k, _)| *k == external.key)
            .unwrap();
        assert_eq!(f.flags & SVC_F_INTERNAL, 0);
    }

    #[test]
    fn slots_order_active_then_fallback_then_the_rest() {
        use BackendState::*;
        let plan = plan_desired(
            SvcId(1),
            &svc(&[
                (3, NotReady),
                (2, TerminatingServing),
                (1, Active),
                (4, Active),
            ]),
            &[],
            &HashSet::new(),
            ids(),
        );
        let (_, fe) = &plan.frontends[0];
        assert_eq!((fe.active, fe.fallback, fe.slots.len()), (2, 1, 4));
        let state_of = |id: BackendId| {
            plan.backends
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, b)| BackendState::from_u8(b.state))
        };
        assert_eq!(state_of(fe.slots[0]), Some(Active));
        assert_eq!(state_of(fe.slots[1]), Some(Active));
        assert_eq!(state_of(fe.slots[2]), Some(TerminatingServing));
        assert_eq!(state_of(fe.slots[3]), Some(NotReady));
    }

    #[test]
    fn maglev_tables_spread_over_what_new_flows_may_pick() {
        use BackendState::*;
        let maglev = |backends: &[(u8, BackendState)]| {
            let mut desired = svc(backends);
            desired.frontends[0].maglev = true;
            let plan = plan_desired(SvcId(1), &desired, &[], &HashSet::new(), ids());
            let (_, fe) = plan.frontends[0].clone();
            let members: Vec<Endpoint> = fe.maglev.iter().map(|(_, ep)| *ep).collect();
            (fe.flags & SVC_F_MAGLEV != 0, members)
        };
        // The active backends only, sorted by endpoint.
        assert_eq!(
            maglev(&[
                (3, Active),
                (2, TerminatingServing),
                (1, Active),
                (4, NotReady)
            ]),
            (true, vec![ep(1), ep(3)])
        );
        // None active: the serving-terminating fallback, as the slots do.
        assert_eq!(
            maglev(&[(2, TerminatingServing), (4, NotReady)]),
            (true, vec![ep(2)])
        );
        // Nothing selectable: no table, no flag (the frontend rejects).
        assert_eq!(maglev(&[(4, NotReady)]), (false, vec![]));
        // Without the annotation: no table.
        let plan = plan_desired(SvcId(1), &svc(&[(1, Active)]), &[], &HashSet::new(), ids());
        assert!(plan.frontends[0].1.maglev.is_empty());
        assert_eq!(plan.frontends[0].1.flags & SVC_F_MAGLEV, 0);
    }

    #[test]
    fn terminating_endpoints_are_kept_but_never_added() {
        let existing = [(
            BackendId(7),
            backend_value(&ep(1), BackendState::Active, SvcId(1)),
        )];
        let plan = plan_desired(
            SvcId(1),
            &svc(&[
                (1, BackendState::Terminating),
                (2, BackendState::Terminating),
            ]),
            &existing,
            &HashSet::new(),
            ids(),
        );
        assert_eq!(plan.backends.len(), 1, "only the programmed one stays");
        assert_eq!(plan.backends[0].0, BackendId(7));
        assert_eq!(plan.backends[0].1.state, BackendState::Terminating as u8);
        assert_eq!(plan.frontends[0].1.active, 0);
    }

    #[test]
    fn vanished_endpoints_drain_until_removable() {
        let existing = [(
            BackendId(7),
            backend_value(&ep(1), BackendState::Active, SvcId(1)),
        )];
        let plan = plan_desired(
            SvcId(1),
            &svc(&[(2, BackendState::Active)]),
            &existing,
            &HashSet::new(),
            ids(),
        );
        let drained: Vec<_> = plan
            .backends
            .iter()
            .filter(|(id, _)| *id == BackendId(7))
            .collect();
        assert_eq!(drained[0].1.state, BackendState::Draining as u8);
        assert_eq!(plan.frontends[0].1.slots.len(), 2);
        let plan = plan_desired(
            SvcId(1),
            &svc(&[(2, BackendState::Active)]),
            &existing,
            &HashSet::from([BackendId(7)]),
            ids(),
        );
        assert!(plan.backends.iter().all(|(id, _)| *id != BackendId(7)));
    }

    #[test]
    fn ids_are_kept_by_endpoint_and_revived_backends_reuse_them() {
        let existing = [(
            BackendId(7),
            backend_value(&ep(1), BackendState::Draining, SvcId(1)),
        )];
        let plan = plan_desired(
            SvcId(1),
            &svc(&[(1, BackendState::Active)]),
            &existing,
            &HashSet::new(),
            ids(),
        );
        assert_eq!(
            plan.backends,
            vec![(
                BackendId(7),
                backend_value(&ep(1), BackendState::Active, SvcId(1))
            )]
        );
    }

    #[test]
    fn same_input_same_plan() {
        let s = svc(&[(1, BackendState::Active), (2, BackendState::Active)]);
        let existing = [
            (
                BackendId(5),
                backend_value(&ep(1), BackendState::Active, SvcId(1)),
            ),
            (
                BackendId(6),
                backend_value(&ep(2), BackendState::Active, SvcId(1)),
            ),
        ];
        let a = plan_desired(SvcId(1), &s, &existing, &HashSet::new(), ids());
        let b = plan_desired(SvcId(1), &s, &existing, &HashSet::new(), ids());
        assert_eq!(a, b);
    }

    #[test]
    fn draining_backends_stay_within_their_family() {
        let v6 = Endpoint {
            addr: "fd00:20::2".parse().expect("literal"),
            port: 8080,
        };
        let existing = [
            (
                BackendId(7),
                backend_value(&ep(1), BackendState::Active, SvcId(1)),
            ),
            (
                BackendId(8),
                backend_value(&v6, BackendState::Active, SvcId(1)),
            ),
        ];
        let mut s = svc(&[(2, BackendState::Active)]);
        let mut fe6 = s.frontends[0].clone();
        fe6.key.addr = "fd00:96::1".parse().expect("literal");
        fe6.backends.clear();
        s.frontends.push(fe6);
        let plan = plan_desired(SvcId(1), &s, &existing, &HashSet::new(), ids());
        let slots = |i: usize| plan.frontends[i].1.slots.clone();
        assert!(
            slots(0).contains(&BackendId(7)) && !slots(0).contains(&BackendId(8)),
            "{plan:?}"
        );
        assert_eq!(*slots(1), [BackendId(8)], "{plan:?}");

        let fe4 = plan.frontends[0].0;
        let fe6 = plan.frontends[1].0;
        let plan = plan_leftover(SvcId(1), &[(fe4, 0), (fe6, 0)], &existing, &HashSet::new());
        assert_eq!(*plan.frontends[0].1.slots, [BackendId(7)]);
        assert_eq!(*plan.frontends[1].1.slots, [BackendId(8)]);
    }

    #[test]
    fn leftover_keeps_frontends_until_its_backends_are_gone() {
        let fe = FrontendKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, Proto::Tcp);
        let existing = [(
            BackendId(7),
            backend_value(&ep(1), BackendState::Active, SvcId(3)),
        )];
        let plan = plan_leftover(SvcId(3), &[(fe, 0)], &existing, &HashSet::new());
        assert_eq!(plan.frontends.len(), 1);
        let (_, state) = &plan.frontends[0];
        assert_eq!(
            (state.active, state.fallback, state.flags & SVC_F_DRAINING),
            (0, 0, SVC_F_DRAINING)
        );
        assert_eq!(
            plan_leftover(
                SvcId(3),
                &[(fe, 0)],
                &existing,
                &HashSet::from([BackendId(7)])
            ),
            UnitPlan::default()
        );
    }
}
