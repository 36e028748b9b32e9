//! Property: whatever sequence of object events reaches the sync task,
//! applied incrementally (coalesced or not), it ends with exactly the
//! desired state that translating the final objects from scratch gives,
//! and, once drained, the maps of an agent that programmed those objects
//! from empty.

use std::{collections::BTreeMap, time::Duration, time::Instant};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proptest::{collection::vec, option, prelude::*};

use super::{
    tests::{
        list_end, list_start, no_service_cidrs, service_page, services, slice_page, slices,
        sync_draining, wake, NODE,
    },
    Due, Sync,
};
use crate::{
    reconcile::fake::FakeMaps,
    sources::{self, Change, Update},
    translate::builders::*,
};

/// Services `a`, `b`, `c`, each with its own cluster IP (two services on
/// one frontend is a conflict whose winner depends on history).
const SERVICES: [(&str, &str); 3] = [("a", "10.96.0.1"), ("b", "10.96.0.2"), ("c", "10.96.0.3")];
/// Slices and the service each belongs to.
/// Most named for their service (the service's name and a dash), as the
/// EndpointSlice controller names them; "b" and "a-3" are not (the
/// stores index those apart), and "a-3" begins like a slice of "a".
const SLICES: [(&str, &str); 6] = [
    ("a-1", "a"),
    ("a-2", "a"),
    ("b-1", "b"),
    ("c-1", "c"),
    ("b", "b"),
    ("a-3", "c"),
];

#[derive(Clone, Debug)]
enum Event {
    /// Service `i` with these of its ports (bit 0: http/TCP, bit 1:
    /// dns/UDP) and options (bit 2: Maglev, bit 3: session affinity,
    /// bit 4: type NodePort), or deleted.
    Service(usize, Option<u8>),
    /// Slice `i` with these endpoints (address suffix, condition), or
    /// deleted.
    Slice(usize, Option<Vec<(u8, u8)>>),
    /// The Node with this last byte of its InternalIP (NodePort
    /// frontends listen there): every service is translated again.
    Node(u8),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..SERVICES.len(), option::of(1u8..32)).prop_map(|(i, p)| Event::Service(i, p)),
        (
            0..SLICES.len(),
            option::weighted(0.8, vec((1u8..7, 0u8..4), 0..5))
        )
            .prop_map(|(i, e)| Event::Slice(i, e)),
        (1u8..3).prop_map(Event::Node),
    ]
}

fn service_object(i: usize, ports: u8) -> Service {
    let (name, ip) = SERVICES[i];
    let node_ports = ports & 16 != 0;
    let offset = 30000 + 10 * i as i32;
    let mut list = Vec::new();
    if ports & 1 != 0 || ports & 3 == 0 {
        list.push(node_port("http", "TCP", 80, offset));
    }
    if ports & 2 != 0 {
        list.push(node_port("dns", "UDP", 53, offset + 1));
    }
    if !node_ports {
        for p in &mut list {
            p.node_port = None;
        }
    }
    let mut svc = mk_service("default", name, ip, &list);
    if ports & 4 != 0 {
        svc.metadata.annotations = Some(
            [(
                "service.sluice.dev/lb-algorithm".to_owned(),
                "maglev".to_owned(),
            )]
            .into(),
        );
    }
    if ports & 8 != 0 {
        spec_mut(&mut svc).session_affinity = Some("ClientIP".into());
    }
    if node_ports {
        spec_mut(&mut svc).type_ = Some("NodePort".into());
    }
    svc
}

fn slice_object(i: usize, endpoints: &[(u8, u8)]) -> EndpointSlice {
    let (name, service) = SLICES[i];
    let eps = endpoints
        .iter()
        .map(|(host, cond)| {
            let e = ep(&format!("10.1.0.{host}"));
            match cond {
                0 => e,
                1 => with_conditions(e, Some(false), Some(true), Some(true)),
                2 => with_conditions(e, Some(false), Some(false), Some(true)),
                _ => with_conditions(e, Some(false), Some(false), Some(false)),
            }
        })
        .collect();
    let mut s = mk_slice(
        "default",
        name,
        service,
        &[
            slice_port("http", "TCP", 8080),
            slice_port("dns", "UDP", 5353),
        ],
        eps,
    );
    s.metadata.name = Some(name.into());
    s
}

/// The objects the events leave.
#[derive(Default)]
struct World {
    services: BTreeMap<usize, Service>,
    slices: BTreeMap<usize, EndpointSlice>,
    /// Last byte of the Node's InternalIP (0: the first one, `.1`).
    node: u8,
}

fn node_object(last: u8) -> Update {
    let addr = format!("192.0.2.{}", last.max(1));
    let n = mk_node(NODE, None, &[("InternalIP", addr.as_str())]);
    Update::Node(Change::Reset(sources::node(&n).into_iter().collect()))
}

impl World {
    fn apply(&mut self, e: &Event) -> Update {
        match e {
            Event::Service(i, Some(p)) => {
                let svc = service_object(*i, *p);
                self.services.insert(*i, svc.clone());
                Update::Services(Change::Apply(sources::service(&svc).unwrap()))
            }
            Event::Service(i, None) => {
                let svc = service_object(*i, 1);
                self.services.remove(i);
                Update::Services(Change::Delete(sources::service(&svc).unwrap().key))
            }
            Event::Slice(i, Some(eps)) => {
                let s = slice_object(*i, eps);
                self.slices.insert(*i, s.clone());
                Update::Slices(Change::Apply(sources::slice(&s).unwrap()))
            }
            Event::Slice(i, None) => {
                let s = slice_object(*i, &[]);
                self.slices.remove(i);
                Update::Slices(Change::Delete(sources::slice(&s).unwrap().key))
            }
            Event::Node(last) => {
                self.node = *last;
                node_object(*last)
            }
        }
    }

    fn listing(&self) -> Vec<Update> {
        let svcs: Vec<Service> = self.services.values().cloned().collect();
        let sls: Vec<EndpointSlice> = self.slices.values().cloned().collect();
        vec![
            services(&svcs),
            slices(&sls),
            node_object(self.node),
            no_service_cidrs(),
        ]
    }

    /// A first list as the API source sends it: this node and the
    /// service CIDRs, then every service and slice in a page of its own,
    /// in an order `seed` shuffles (the two kinds list side by side), then
    /// both lists' ends.
    fn first_list(&self, seed: u64) -> Vec<Update> {
        let pages: Vec<Update> = self
            .services
            .values()
            .map(|s| service_page(std::slice::from_ref(s)))
            .chain(
                self.slices
                    .values()
                    .map(|s| slice_page(std::slice::from_ref(s))),
            )
            .collect();
        let mut order: Vec<(u64, usize)> = (0..pages.len())
            .map(|i| ((i as u64 + 1).wrapping_mul(seed | 1).rotate_left(17), i))
            .collect();
        order.sort();
        let mut shuffled: Vec<Option<Update>> = pages.into_iter().map(Some).collect();
        let mut out = vec![node_object(self.node), no_service_cidrs()];
        out.extend(list_start());
        out.extend(order.into_iter().filter_map(|(_, i)| shuffled[i].take()));
        out.extend(list_end());
        out
    }
}

/// Full reconciles until one writes nothing: drained backends go (the
/// drain timeout is zero).
fn settle(sync: &mut Sync<FakeMaps>, due: &mut Due) {
    for _ in 0..4 {
        due.resync = Instant::now();
        if wake(sync, due, Vec::new()).is_empty() {
            return;
        }
    }
    panic!("the maps do not settle");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn incremental_events_end_where_a_translation_from_scratch_does(
        initial in vec(event(), 0..4),
        events in vec((event(), any::<bool>()), 1..24),
        part in 1usize..4,
    ) {
        let mut world = World::default();
        for e in &initial {
            world.apply(e);
        }
        // Full reconciles in parts of `part` services; the one from
        // scratch in one part.
        let (sync, mut due) = sync_draining(FakeMaps::new(), Duration::ZERO);
        let mut sync = sync.with_part_size(part);
        wake(&mut sync, &mut due, world.listing());
        let mut queued = Vec::new();
        for (e, wake_now) in &events {
            queued.push(world.apply(e));
            if *wake_now {
                wake(&mut sync, &mut due, std::mem::take(&mut queued));
            }
        }
        wake(&mut sync, &mut due, queued);

        let (mut scratch, mut scratch_due) = sync_draining(FakeMaps::new(), Duration::ZERO);
        wake(&mut scratch, &mut scratch_due, world.listing());
        // What the translations contributed (their service ports are
        // not kept between reconciles: the maps below hold them).
        prop_assert_eq!(&sync.desired.state, &scratch.desired.state);
        prop_assert!(sync.desired.state.services.is_empty());
        let ports = |s: &Sync<FakeMaps>| {
            s.desired
                .ports_of
                .iter()
                .map(|(k, v)| (k, v.as_slice().to_vec()))
                .collect::<BTreeMap<_, _>>()
        };
        prop_assert_eq!(ports(&sync), ports(&scratch));
        prop_assert_eq!(sync.desired.health_checks(), scratch.desired.health_checks());
        prop_assert_eq!(
            sync.desired.problems(&sync.stores, &sync.config.translate),
            scratch.desired.problems(&scratch.stores, &scratch.config.translate)
        );

        settle(&mut sync, &mut due);
        settle(&mut scratch, &mut scratch_due);
        prop_assert_eq!(
            sync.reconciler.writer().canonical(),
            scratch.reconciler.writer().canonical()
        );
        let held = crate::reconcile::adopted_state(sync.reconciler.writer()).unwrap();
        prop_assert_eq!(sync.reconciler.programmed(), &held);
    }

    #[test]
    fn a_first_list_programmed_as_it_streams_in_ends_where_a_translation_from_scratch_does(
        objects in vec(event(), 0..12),
        seed in any::<u64>(),
        wakes in vec(any::<bool>(), 16),
        node_moves_at in option::of((0usize..16, 1u8..3)),
        part in 1usize..4,
    ) {
        let mut world = World::default();
        for e in &objects {
            world.apply(e);
        }
        let mut list = world.first_list(seed);
        // The node may change while the list streams in.
        if let Some((at, last)) = node_moves_at {
            world.node = last;
            list.insert((2 + at).min(list.len() - 2), node_object(last));
        }
        let (sync, mut due) = sync_draining(FakeMaps::new(), Duration::ZERO);
        let mut sync = sync.with_part_size(part);
        let mut queued = Vec::new();
        for (i, update) in list.into_iter().enumerate() {
            queued.push(update);
            if wakes.get(i).copied().unwrap_or(true) {
                wake(&mut sync, &mut due, std::mem::take(&mut queued));
            }
        }
        wake(&mut sync, &mut due, queued);
        prop_assert!(sync.health.report().ready);

        let (mut scratch, mut scratch_due) = sync_draining(FakeMaps::new(), Duration::ZERO);
        wake(&mut scratch, &mut scratch_due, world.listing());
        prop_assert_eq!(&sync.desired.state, &scratch.desired.state);
        prop_assert_eq!(
            sync.reconciler.writer().canonical(),
            scratch.reconciler.writer().canonical()
        );
        settle(&mut sync, &mut due);
        prop_assert_eq!(
            sync.reconciler.writer().canonical(),
            scratch.reconciler.writer().canonical()
        );
    }
}
