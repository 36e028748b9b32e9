//! What the maps should hold: a pure function of the desired state, what
//! is programmed now (for ids and for backends that must drain) and which
//! draining backends may go.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt,
    net::IpAddr,
};

use sluice_common::{
    maps::MAX_SLOTS,
    service::{SVC_F_DRAINING, SVC_F_DROP_EMPTY},
    Backend, BackendState, FAMILY_V4, FAMILY_V6,
};

use super::ids::Ids;
use crate::{
    model::{
        DesiredBackend, DesiredService, DesiredState, Endpoint, FrontendKey, ServicePortName,
        WhenEmpty,
    },
    state::{FrontendState, MapState},
};

/// Entries the maps can hold.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// `sl_svc4` entries (masters plus slots).
    pub service_entries: usize,
    pub backends: usize,
}

/// Why a service port was not (re)programmed. Its previous state, if any,
/// stays as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooManyBackends(usize),
    FrontendTaken {
        frontend: FrontendKey,
        owner: ServicePortName,
    },
    Ipv6Frontend(FrontendKey),
    MapsFull,
}

impl Refusal {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TooManyBackends(_) => "too_many_backends",
            Refusal::FrontendTaken { .. } => "frontend_conflict",
            Refusal::Ipv6Frontend(_) => "ipv6_unsupported",
            Refusal::MapsFull => "maps_full",
        }
    }
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
            Refusal::Ipv6Frontend(fe) => write!(f, "IPv6 frontend {fe} is not balanced yet"),
            Refusal::MapsFull => f.write_str("the service or backend map has no room for it"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Target {
    pub maps: MapState,
    pub refused: Vec<(ServicePortName, Refusal)>,
}

/// One service port's share of the target.
#[derive(Default)]
struct Plan {
    frontends: Vec<(FrontendKey, FrontendState)>,
    backends: Vec<(u32, Backend)>,
}

impl Plan {
    fn service_entries(&self) -> usize {
        self.frontends.iter().map(|(_, f)| 1 + f.slots.len()).sum()
    }

    fn add_to(self, maps: &mut MapState) {
        maps.frontends.extend(self.frontends);
        maps.backends.extend(self.backends);
    }
}

fn rank(state: BackendState) -> u8 {
    match state {
        BackendState::Active => 0,
        BackendState::TerminatingServing => 1,
        _ => 2,
    }
}

fn backend_value(endpoint: &Endpoint, state: BackendState, svc_id: u32) -> Backend {
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
        svc_id,
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

/// Orders backends into slots: active, then terminating-but-serving, then
/// the never-selected rest; deterministic so that an unchanged input gives
/// unchanged slots.
fn frontend_state(
    svc_id: u32,
    flags: u16,
    members: &[(u32, Endpoint, BackendState)],
) -> FrontendState {
    let mut order: Vec<(u8, Endpoint, u32)> = members
        .iter()
        .map(|(id, ep, state)| (rank(*state), *ep, *id))
        .collect();
    order.sort();
    order.dedup_by_key(|(_, _, id)| *id);
    let count = |r: u8| order.iter().filter(|(rank, _, _)| *rank == r).count() as u16;
    FrontendState {
        svc_id,
        flags,
        active: count(0),
        fallback: count(1),
        slots: order.into_iter().map(|(_, _, id)| id).collect(),
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

/// Programmed backends of each service port, keyed by endpoint.
type ProgrammedBackends = HashMap<u32, Vec<(u32, Backend)>>;

struct Pass<'a> {
    programmed: &'a MapState,
    by_svc: ProgrammedBackends,
    removable: &'a HashSet<u32>,
    ids: &'a mut Ids,
    new_backend_ids: HashSet<u32>,
}

impl Pass<'_> {
    fn plan_desired(&mut self, svc_id: u32, svc: &DesiredService) -> Plan {
        // Backend entries are per service port: one per endpoint that any
        // frontend wants, in its most selectable state.
        let all: Vec<DesiredBackend> = svc
            .frontends
            .iter()
            .flat_map(|f| f.backends.iter().copied())
            .collect();
        let wanted = dedup_best(&all);

        let existing = self.by_svc.get(&svc_id).cloned().unwrap_or_default();
        let mut by_endpoint: HashMap<Endpoint, u32> = HashMap::new();
        for (id, b) in &existing {
            by_endpoint.entry(endpoint_of(b)).or_insert(*id);
        }
        let mut ids: HashMap<Endpoint, u32> = HashMap::new();
        let mut backends = Vec::new();
        for (endpoint, state) in &wanted {
            let current = by_endpoint.get(endpoint).copied();
            let id = match (state, current) {
                // A terminating endpoint is never added, only kept while
                // its flows drain.
                (BackendState::Terminating | BackendState::Draining, Some(id))
                    if !self.removable.contains(&id) =>
                {
                    id
                }
                (BackendState::Terminating | BackendState::Draining, _) => continue,
                (_, Some(id)) => id,
                (_, None) => {
                    let id = self.ids.backend(self.programmed, &self.new_backend_ids);
                    self.new_backend_ids.insert(id);
                    id
                }
            };
            let state = if *state == BackendState::Draining {
                BackendState::Terminating
            } else {
                *state
            };
            ids.insert(*endpoint, id);
            backends.push((id, backend_value(endpoint, state, svc_id)));
        }
        // Programmed but no longer wanted by any frontend: drain.
        let used: HashSet<u32> = ids.values().copied().collect();
        let mut draining = Vec::new();
        for (id, b) in &existing {
            if !used.contains(id) && !self.removable.contains(id) {
                let endpoint = endpoint_of(b);
                backends.push((
                    *id,
                    backend_value(&endpoint, BackendState::Draining, svc_id),
                ));
                draining.push((*id, endpoint, BackendState::Draining));
            }
        }
        let frontends = svc
            .frontends
            .iter()
            .map(|fe| {
                let mut members: Vec<(u32, Endpoint, BackendState)> = dedup_best(&fe.backends)
                    .into_iter()
                    .filter_map(|(ep, state)| ids.get(&ep).map(|id| (*id, ep, state)))
                    .collect();
                members.extend(draining.iter().copied());
                let mut flags = fe.kind as u16;
                if fe.when_empty == WhenEmpty::Drop {
                    flags |= SVC_F_DROP_EMPTY;
                }
                (fe.key, frontend_state(svc_id, flags, &members))
            })
            .collect();
        Plan {
            frontends,
            backends,
        }
    }

    /// A service port that is no longer desired keeps its frontends (no
    /// selectable backend) while its backends drain.
    fn plan_leftover(&self, svc_id: u32, taken: &HashMap<FrontendKey, ServicePortName>) -> Plan {
        let backends: Vec<(u32, Backend)> = self
            .by_svc
            .get(&svc_id)
            .into_iter()
            .flatten()
            .filter(|(id, _)| !self.removable.contains(id))
            .map(|(id, b)| {
                (
                    *id,
                    backend_value(&endpoint_of(b), BackendState::Draining, svc_id),
                )
            })
            .collect();
        if backends.is_empty() {
            return Plan::default();
        }
        let members: Vec<(u32, Endpoint, BackendState)> = backends
            .iter()
            .map(|(id, b)| (*id, endpoint_of(b), BackendState::Draining))
            .collect();
        let frontends = self
            .programmed
            .frontends
            .iter()
            .filter(|(key, fe)| fe.svc_id == svc_id && !taken.contains_key(key))
            .map(|(key, fe)| {
                let kind = fe.flags & sluice_common::service::FRONTEND_KIND_MASK;
                (
                    *key,
                    frontend_state(svc_id, kind | SVC_F_DRAINING, &members),
                )
            })
            .collect();
        Plan {
            frontends,
            backends,
        }
    }

    /// What is programmed for `svc_id` now, for a refused service port
    /// (minus frontends another service port has taken).
    fn plan_unchanged(
        &self,
        svc_id: u32,
        name: &ServicePortName,
        taken: &HashMap<FrontendKey, ServicePortName>,
    ) -> Plan {
        Plan {
            frontends: self
                .programmed
                .frontends
                .iter()
                .filter(|(key, fe)| {
                    fe.svc_id == svc_id && taken.get(*key).is_none_or(|owner| owner == name)
                })
                .map(|(key, fe)| (*key, fe.clone()))
                .collect(),
            backends: self.by_svc.get(&svc_id).cloned().unwrap_or_default(),
        }
    }
}

/// Computes the target map content.
pub fn compute(
    desired: &DesiredState,
    programmed: &MapState,
    ids: &mut Ids,
    removable: &HashSet<u32>,
    capacity: Capacity,
) -> Target {
    let mut by_svc: ProgrammedBackends = HashMap::new();
    for (id, b) in &programmed.backends {
        by_svc.entry(b.svc_id).or_default().push((*id, *b));
    }
    for list in by_svc.values_mut() {
        list.sort_by_key(|(id, _)| *id);
    }
    let mut pass = Pass {
        programmed,
        by_svc,
        removable,
        ids,
        new_backend_ids: HashSet::new(),
    };

    let mut refused = Vec::new();
    let mut taken: HashMap<FrontendKey, ServicePortName> = HashMap::new();
    let mut claimed: HashSet<u32> = HashSet::new();
    let mut wanted: Vec<(&ServicePortName, u32, Plan)> = Vec::new();

    for (name, svc) in &desired.services {
        if let Some(fe) = svc.frontends.iter().find(|f| f.key.addr.is_ipv6()) {
            refused.push((name.clone(), Refusal::Ipv6Frontend(fe.key)));
            continue;
        }
        if let Some((fe, owner)) = svc
            .frontends
            .iter()
            .find_map(|f| taken.get(&f.key).map(|owner| (f.key, owner.clone())))
        {
            refused.push((
                name.clone(),
                Refusal::FrontendTaken {
                    frontend: fe,
                    owner,
                },
            ));
            continue;
        }
        let svc_id = pass.ids.service(name, &svc.frontends, programmed, &claimed);
        claimed.insert(svc_id);
        for fe in &svc.frontends {
            taken.insert(fe.key, name.clone());
        }
        let plan = pass.plan_desired(svc_id, svc);
        let slots = plan
            .frontends
            .iter()
            .map(|(_, f)| f.slots.len())
            .max()
            .unwrap_or(0);
        if slots > MAX_SLOTS as usize {
            refused.push((name.clone(), Refusal::TooManyBackends(slots)));
            wanted.push((name, svc_id, pass.plan_unchanged(svc_id, name, &taken)));
            continue;
        }
        wanted.push((name, svc_id, plan));
    }

    // Leftovers drain first: what they hold must stay regardless.
    let mut maps = MapState::default();
    let mut service_entries = 0usize;
    let mut backends = 0usize;
    let leftover_ids: BTreeSet<u32> = programmed
        .frontends
        .values()
        .map(|f| f.svc_id)
        .chain(programmed.backends.values().map(|b| b.svc_id))
        .filter(|id| !claimed.contains(id))
        .collect();
    for svc_id in leftover_ids {
        let plan = pass.plan_leftover(svc_id, &taken);
        service_entries += plan.service_entries();
        backends += plan.backends.len();
        plan.add_to(&mut maps);
    }
    for (name, svc_id, plan) in wanted {
        let fits = service_entries + plan.service_entries() <= capacity.service_entries
            && backends + plan.backends.len() <= capacity.backends;
        let plan = if fits {
            plan
        } else {
            refused.push((name.clone(), Refusal::MapsFull));
            pass.plan_unchanged(svc_id, name, &taken)
        };
        service_entries += plan.service_entries();
        backends += plan.backends.len();
        plan.add_to(&mut maps);
    }
    Target { maps, refused }
}
