//! The sync task through the fake maps: driven step by step (`receive`,
//! then `step`, as the loop does after each wake-up), so that every
//! assertion sees exactly what one wake-up wrote.

use std::{collections::BTreeSet, sync::Arc, time::Duration, time::Instant};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use tokio::sync::watch;

use super::{Due, Sync, SyncConfig};
use crate::{
    datapath::{EntryKey, MapReads, MapSizes},
    health::Health,
    metrics::Metrics,
    reconcile::{
        fake::{FakeMaps, Write},
        Reconciler,
    },
    sources::{self, Change, Update},
    translate::{builders::*, TranslateConfig},
};

pub(super) const NODE: &str = "node-a";

fn config() -> SyncConfig {
    SyncConfig {
        translate: TranslateConfig {
            node_name: NODE.into(),
            ..TranslateConfig::default()
        },
        sizes: MapSizes::default(),
        gc_interval: Duration::from_secs(3600),
        drain_interval: Duration::from_secs(3600),
        resync_interval: Duration::from_secs(3600),
    }
}

fn sync_on(maps: FakeMaps) -> (Sync<FakeMaps>, Due) {
    sync_draining(maps, Duration::from_secs(60))
}

pub(super) fn sync_draining(maps: FakeMaps, drain: Duration) -> (Sync<FakeMaps>, Due) {
    sync_sized(maps, &MapSizes::default(), drain)
}

fn sync_sized(maps: FakeMaps, sizes: &MapSizes, drain: Duration) -> (Sync<FakeMaps>, Due) {
    let reconciler = Reconciler::new(maps, sizes, drain).unwrap();
    let (checks, _) = watch::channel(Default::default());
    let sync = Sync::new(
        config(),
        reconciler,
        Arc::new(Health::new(
            Duration::from_secs(60),
            Duration::from_secs(60),
        )),
        Arc::new(Metrics::new()),
        checks,
    );
    let due = sync.timers();
    (sync, due)
}

pub(super) fn web(name: &str, ip: &str) -> Service {
    mk_service("default", name, ip, &[port("http", "TCP", 80)])
}

pub(super) fn web_slice(service: &str, addrs: &[&str]) -> EndpointSlice {
    mk_slice(
        "default",
        &format!("{service}-1"),
        service,
        &[slice_port("http", "TCP", 8080)],
        addrs.iter().map(|a| ep(a)).collect(),
    )
}

pub(super) fn services(list: &[Service]) -> Update {
    Update::Services(Change::Reset(
        list.iter().filter_map(sources::service).collect(),
    ))
}

pub(super) fn slices(list: &[EndpointSlice]) -> Update {
    Update::Slices(Change::Reset(
        list.iter().filter_map(sources::slice).collect(),
    ))
}

pub(super) fn node() -> Update {
    node_at("192.0.2.1")
}

/// This node's Node object with InternalIP `addr`, listed.
fn node_at(addr: &str) -> Update {
    let n = mk_node(NODE, None, &[("InternalIP", addr)]);
    Update::Node(Change::Reset(sources::node(&n).into_iter().collect()))
}

pub(super) fn no_service_cidrs() -> Update {
    Update::ServiceCidrs(Change::Reset(Vec::new()))
}

/// Hands `updates` to the task and runs one wake-up; returns the writes it
/// made.
pub(super) fn wake(sync: &mut Sync<FakeMaps>, due: &mut Due, updates: Vec<Update>) -> Vec<Write> {
    let before = sync.reconciler.writer().log.len();
    for u in updates {
        sync.receive((Instant::now(), u));
    }
    sync.step(due);
    sync.reconciler.writer().log[before..].to_vec()
}

fn two_services() -> Vec<Update> {
    vec![
        services(&[web("web", "10.96.0.10"), web("api", "10.96.0.11")]),
        slices(&[
            web_slice("web", &["10.1.0.1", "10.1.0.2"]),
            web_slice("api", &["10.1.0.3"]),
        ]),
        node(),
        no_service_cidrs(),
    ]
}

fn frontends(writes: &[Write]) -> BTreeSet<std::net::IpAddr> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::Put(EntryKey::Service(k)) | Write::Delete(EntryKey::Service(k)) => {
                k.frontend().map(|(f, _)| f.addr)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn nothing_is_written_before_the_node_and_the_service_cidrs_are_listed() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    let mut updates = two_services();
    let last = updates.pop().unwrap();
    assert!(wake(&mut sync, &mut due, updates).is_empty());
    assert!(!sync.health.report().ready);
    let writes = wake(&mut sync, &mut due, vec![last]);
    assert_eq!(frontends(&writes).len(), 2);
    assert!(sync.health.report().ready);
    assert_eq!(sync.reconciler.writer().backends.len(), 3);
}

#[test]
fn an_endpoint_change_writes_only_its_service() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    wake(&mut sync, &mut due, two_services());
    let change = Update::Slices(Change::Apply(
        sources::slice(&web_slice("web", &["10.1.0.1", "10.1.0.2", "10.1.0.4"])).unwrap(),
    ));
    let writes = wake(&mut sync, &mut due, vec![change]);
    assert_eq!(
        frontends(&writes),
        ["10.96.0.10".parse().unwrap()].into(),
        "{writes:?}"
    );
    assert_eq!(sync.reconciler.writer().backends.len(), 4);
}

#[test]
fn a_relist_with_nothing_changed_writes_nothing() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    wake(&mut sync, &mut due, two_services());
    assert!(wake(&mut sync, &mut due, two_services()).is_empty());
}

#[test]
fn a_restarted_agent_given_the_same_objects_writes_nothing() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    wake(&mut sync, &mut due, two_services());
    let held = sync.reconciler.writer().restarted();
    let (mut again, mut due) = sync_on(held.clone());
    assert!(wake(&mut again, &mut due, two_services()).is_empty());
    assert_eq!(again.reconciler.writer().canonical(), held.canonical());
}

#[test]
fn a_failed_write_is_retried_at_the_next_wake_up() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    let attempts = sync.reconciler.writer().attempts;
    sync.reconciler.writer_mut().fail_at = Some(attempts + 2);
    wake(&mut sync, &mut due, two_services());
    assert!(!sync.health.report().ready, "not synced after a failure");
    // The retry needs no new update (a failed full reconcile is retried
    // whole: it keeps no list of names).
    wake(&mut sync, &mut due, Vec::new());
    assert!(sync.pending.is_empty());
    assert!(sync.health.report().ready);
    let (clean, mut clean_due) = sync_on(FakeMaps::new());
    let mut clean = clean;
    wake(&mut clean, &mut clean_due, two_services());
    assert_eq!(
        sync.reconciler.writer().canonical(),
        clean.reconciler.writer().canonical()
    );
    let (state, _) = sync.reconciler.writer().state().unwrap();
    assert_eq!(sync.reconciler.programmed().backends, state.backends);
}

#[test]
fn fill_ratios_count_each_family_under_its_own_map() {
    use sluice_common::maps as names;
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    sync.config.translate.ipv6 = true;
    sync.config.sizes = MapSizes {
        services: 100,
        backends: 10,
        ..MapSizes::default()
    };
    let mut v6 = mk_service("default", "v6", "fd00:96::10", &[port("http", "TCP", 80)]);
    set_ip_families(&mut v6, &["IPv6"]);
    let mut updates = two_services();
    updates[0] = services(&[web("web", "10.96.0.10"), v6]);
    updates[1] = slices(&[
        web_slice("web", &["10.1.0.1", "10.1.0.2"]),
        web_slice("v6", &["fd00:1::1"]),
    ]);
    wake(&mut sync, &mut due, updates);
    let fill = |map: &str| {
        sync.metrics
            .map_fill
            .get_or_create(&crate::metrics::MapLabel { map: map.into() })
            .get()
    };
    // web: a master and two slots; v6: a master and one slot.
    assert_eq!(fill(names::SERVICES_V4), 0.03);
    assert_eq!(fill(names::SERVICES_V6), 0.02);
    assert_eq!(fill(names::BACKENDS), 0.3);
    assert_eq!(sync.metrics.slots.get(), 3);
}

#[test]
fn while_backends_drain_a_scan_is_due_within_the_drain_interval_and_they_go() {
    let (mut sync, mut due) = sync_draining(FakeMaps::new(), Duration::ZERO);
    sync.config.drain_interval = Duration::from_millis(250);
    wake(&mut sync, &mut due, two_services());
    let one_left = Update::Slices(Change::Apply(
        sources::slice(&web_slice("web", &["10.1.0.1"])).unwrap(),
    ));
    let before = Instant::now();
    wake(&mut sync, &mut due, vec![one_left]);
    assert_eq!(sync.reconciler.draining(), 1);
    assert_eq!(
        sync.reconciler.writer().backends.len(),
        3,
        "kept while draining"
    );
    assert!(
        due.scan <= before + Duration::from_secs(1),
        "no scan scheduled"
    );
    // The scan is due: it runs, and the drained backend goes (slot first:
    // the fake checks).
    due.scan = Instant::now();
    let writes = wake(&mut sync, &mut due, Vec::new());
    assert!(
        writes
            .iter()
            .any(|w| matches!(w, Write::Delete(EntryKey::Backend(_)))),
        "{writes:?}"
    );
    assert_eq!(sync.reconciler.writer().backends.len(), 2);
    assert_eq!(sync.reconciler.draining(), 0);
}

fn apply_service(svc: &Service) -> Update {
    Update::Services(Change::Apply(sources::service(svc).unwrap()))
}

fn apply_slice(slice: &EndpointSlice) -> Update {
    Update::Slices(Change::Apply(sources::slice(slice).unwrap()))
}

/// Every update of `objects` handed over with a full reconcile due, in
/// parts of one service: returns the sync task.
fn full_in_parts_of_one(
    sizes: &MapSizes,
    drain: Duration,
    before: Vec<Update>,
    changes: Vec<Update>,
) -> Sync<FakeMaps> {
    let (sync, mut due) = sync_sized(FakeMaps::new(), sizes, drain);
    let mut sync = sync.with_part_size(1);
    wake(&mut sync, &mut due, before);
    due.resync = Instant::now();
    wake(&mut sync, &mut due, changes);
    sync
}

/// The maps a fresh agent programs from `objects` in one reconcile.
fn from_scratch(sizes: &MapSizes, objects: Vec<Update>) -> crate::reconcile::fake::Canonical {
    let (mut sync, mut due) = sync_sized(FakeMaps::new(), sizes, Duration::from_secs(60));
    wake(&mut sync, &mut due, objects);
    assert!(sync.reconciler.refused().is_empty());
    sync.reconciler.writer().canonical()
}

#[test]
fn a_full_reconcile_in_parts_programs_what_one_in_one_part_does() {
    let names: Vec<String> = (0..7).map(|i| format!("s{i}")).collect();
    let svcs: Vec<Service> = names
        .iter()
        .enumerate()
        .map(|(i, n)| web(n, &format!("10.96.0.{}", 10 + i)))
        .collect();
    let sls: Vec<EndpointSlice> = names
        .iter()
        .enumerate()
        .map(|(i, n)| web_slice(n, &[&format!("10.1.0.{}", 1 + i), "10.1.1.1"]))
        .collect();
    let objects = || vec![services(&svcs), slices(&sls), node(), no_service_cidrs()];
    for part in [1, 2, 3, 7, 8] {
        let (sync, mut due) = sync_on(FakeMaps::new());
        let mut sync = sync.with_part_size(part);
        wake(&mut sync, &mut due, objects());
        assert!(sync.health.report().ready);
        assert!(sync.desired.state.services.is_empty(), "translations kept");
        assert_eq!(
            sync.reconciler.writer().canonical(),
            from_scratch(&MapSizes::default(), objects()),
            "parts of {part}"
        );
        // A resync in parts changes nothing.
        due.resync = Instant::now();
        assert!(wake(&mut sync, &mut due, Vec::new()).is_empty());
    }
}

#[test]
fn a_frontend_a_later_service_gives_up_goes_to_an_earlier_one_in_the_same_full_reconcile() {
    // "z" holds 10.96.0.10; then "z" moves to .11 and the new "a" takes
    // .10. In parts of one, "a" comes first and finds the frontend still
    // held: the sweep hands it over once "z" let it go.
    let before = vec![
        services(&[web("z", "10.96.0.10")]),
        slices(&[web_slice("z", &["10.1.0.1"])]),
        node(),
        no_service_cidrs(),
    ];
    let changes = vec![
        apply_service(&web("z", "10.96.0.11")),
        apply_service(&web("a", "10.96.0.10")),
        apply_slice(&web_slice("a", &["10.1.0.2"])),
    ];
    let sizes = MapSizes::default();
    let sync = full_in_parts_of_one(&sizes, Duration::from_secs(60), before, changes);
    assert!(
        sync.reconciler.refused().is_empty(),
        "{:?}",
        sync.reconciler.refused()
    );
    let after = vec![
        services(&[web("z", "10.96.0.11"), web("a", "10.96.0.10")]),
        slices(&[web_slice("z", &["10.1.0.1"]), web_slice("a", &["10.1.0.2"])]),
        node(),
        no_service_cidrs(),
    ];
    assert_eq!(
        sync.reconciler.writer().canonical(),
        from_scratch(&sizes, after)
    );
}

#[test]
fn room_a_later_service_frees_is_an_earlier_ones_in_the_same_full_reconcile() {
    // Five service entries: "z" holds four (a master, three slots), then
    // shrinks to two while the new "a" needs three. "a"'s part comes
    // first and does not fit; "z"'s leaves two backends draining (in
    // their slots); the sweep lets them go (no drain timeout) and then
    // retries "a".
    let sizes = MapSizes {
        services: 5,
        ..MapSizes::default()
    };
    let before = vec![
        services(&[web("z", "10.96.0.10")]),
        slices(&[web_slice("z", &["10.1.0.1", "10.1.0.2", "10.1.0.3"])]),
        node(),
        no_service_cidrs(),
    ];
    let changes = vec![
        apply_slice(&web_slice("z", &["10.1.0.1"])),
        apply_service(&web("a", "10.96.0.11")),
        apply_slice(&web_slice("a", &["10.1.0.4", "10.1.0.5"])),
    ];
    let sync = full_in_parts_of_one(&sizes, Duration::ZERO, before, changes);
    assert!(
        sync.reconciler.refused().is_empty(),
        "{:?}",
        sync.reconciler.refused()
    );
    assert!(sync.health.report().ready);
    let programmed = sync.reconciler.programmed();
    assert_eq!(programmed.service_entries(), 5);
}

#[test]
fn a_service_added_or_deleted_between_resyncs_moves_its_cluster_ip_in_the_address_space() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    wake(&mut sync, &mut due, two_services());
    let nets = |sync: &Sync<FakeMaps>| -> BTreeSet<std::net::IpAddr> {
        let (state, _) = sync.reconciler.writer().state().unwrap();
        state.service_nets.keys().map(|(addr, _)| *addr).collect()
    };
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    assert_eq!(nets(&sync), [ip("10.96.0.10"), ip("10.96.0.11")].into());
    // No resync comes: the change alone moves the address space.
    let deleted = Update::Services(Change::Delete(
        sources::service(&web("api", "10.96.0.11")).unwrap().key,
    ));
    wake(&mut sync, &mut due, vec![deleted]);
    assert_eq!(nets(&sync), [ip("10.96.0.10")].into());
    wake(
        &mut sync,
        &mut due,
        vec![apply_service(&web("db", "10.96.0.12"))],
    );
    assert_eq!(nets(&sync), [ip("10.96.0.10"), ip("10.96.0.12")].into());
    // A new cluster IP of an existing service replaces its old one.
    wake(
        &mut sync,
        &mut due,
        vec![apply_service(&web("db", "10.96.0.13"))],
    );
    assert_eq!(nets(&sync), [ip("10.96.0.10"), ip("10.96.0.13")].into());
    assert!(
        sync.desired.state.cluster_ips.is_empty(),
        "kept between reconciles"
    );
}

#[test]
fn a_services_port_names_take_sixteen_bytes() {
    assert_eq!(std::mem::size_of::<super::desired::PortNames>(), 16);
}

#[test]
fn a_full_reconcile_a_node_change_started_is_retried_whole_when_a_write_fails() {
    let np = mk_node_port_service(
        "default",
        "np",
        "10.96.0.20",
        &[node_port("http", "TCP", 80, 30080)],
    );
    let objects = vec![
        services(std::slice::from_ref(&np)),
        slices(&[web_slice("np", &["10.1.0.1"])]),
        node(),
        no_service_cidrs(),
    ];
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    wake(&mut sync, &mut due, objects);
    // The node's address moves (its NodePort frontend with it); the
    // first write of that full reconcile fails.
    let attempts = sync.reconciler.writer().attempts;
    sync.reconciler.writer_mut().fail_at = Some(attempts + 1);
    wake(&mut sync, &mut due, vec![node_at("192.0.2.2")]);
    // The retry needs no update and no resync.
    wake(&mut sync, &mut due, Vec::new());
    let after = vec![
        services(&[np]),
        slices(&[web_slice("np", &["10.1.0.1"])]),
        node_at("192.0.2.2"),
        no_service_cidrs(),
    ];
    let (mut clean, mut clean_due) = sync_on(FakeMaps::new());
    wake(&mut clean, &mut clean_due, after);
    let node_port = |sync: &Sync<FakeMaps>| {
        sync.reconciler
            .programmed()
            .frontends
            .keys()
            .filter(|k| k.port == 30080)
            .map(|k| k.addr)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        node_port(&clean),
        ["192.0.2.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(
        sync.reconciler.writer().canonical(),
        clean.reconciler.writer().canonical()
    );
}

/// A first list's pages, as the API source sends them.
pub(super) fn list_start() -> Vec<Update> {
    vec![
        Update::Services(Change::ListStart),
        Update::Slices(Change::ListStart),
    ]
}

pub(super) fn service_page(list: &[Service]) -> Update {
    Update::Services(Change::ListPage(
        list.iter().filter_map(sources::service).collect(),
    ))
}

pub(super) fn slice_page(list: &[EndpointSlice]) -> Update {
    Update::Slices(Change::ListPage(
        list.iter().filter_map(sources::slice).collect(),
    ))
}

pub(super) fn list_end() -> Vec<Update> {
    vec![
        Update::Services(Change::ListEnd),
        Update::Slices(Change::ListEnd),
    ]
}

#[test]
fn an_agent_on_empty_maps_programs_services_while_the_first_list_streams_in() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    let svcs = [web("web", "10.96.0.10"), web("api", "10.96.0.11")];
    let mut first = vec![node(), no_service_cidrs()];
    first.extend(list_start());
    first.push(service_page(&svcs));
    let writes = wake(&mut sync, &mut due, first);
    assert!(
        frontends(&writes).is_empty(),
        "no slice listed yet: {writes:?}"
    );
    let writes = wake(
        &mut sync,
        &mut due,
        vec![slice_page(&[web_slice("web", &["10.1.0.1", "10.1.0.2"])])],
    );
    assert_eq!(frontends(&writes), ["10.96.0.10".parse().unwrap()].into());
    assert_eq!(sync.reconciler.writer().backends.len(), 2);
    assert!(!sync.health.report().ready, "the list has not ended");
    let mut rest = vec![slice_page(&[web_slice("api", &["10.1.0.3"])])];
    rest.extend(list_end());
    let writes = wake(&mut sync, &mut due, rest);
    assert_eq!(
        frontends(&writes),
        ["10.96.0.11".parse().unwrap()].into(),
        "the list's end programs what was left, not web again: {writes:?}"
    );
    assert!(sync.health.report().ready);
    assert_eq!(
        sync.reconciler.writer().canonical(),
        from_scratch(&MapSizes::default(), two_services())
    );
}

#[test]
fn an_agent_on_adopted_maps_writes_nothing_before_every_kind_is_listed() {
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    wake(&mut sync, &mut due, two_services());
    let (mut again, mut due) = sync_on(sync.reconciler.writer().restarted());
    // While the agent was away web gained an endpoint; api's slice is
    // not listed yet, and must not lose its backend meanwhile.
    let svcs = [web("web", "10.96.0.10"), web("api", "10.96.0.11")];
    let web_now = web_slice("web", &["10.1.0.1", "10.1.0.2", "10.1.0.4"]);
    let mut first = vec![node(), no_service_cidrs()];
    first.extend(list_start());
    first.push(service_page(&svcs));
    first.push(slice_page(std::slice::from_ref(&web_now)));
    assert!(wake(&mut again, &mut due, first).is_empty());
    let api_slice = web_slice("api", &["10.1.0.3"]);
    let mut rest = vec![slice_page(std::slice::from_ref(&api_slice))];
    rest.extend(list_end());
    let writes = wake(&mut again, &mut due, rest);
    assert_eq!(frontends(&writes), ["10.96.0.10".parse().unwrap()].into());
    assert!(again.health.report().ready);
    let now = vec![
        services(&svcs),
        slices(&[web_now, api_slice]),
        node(),
        no_service_cidrs(),
    ];
    assert_eq!(
        again.reconciler.writer().canonical(),
        from_scratch(&MapSizes::default(), now)
    );
}

#[test]
fn a_node_change_while_the_first_list_streams_in_is_taken_by_every_service() {
    let np = |name: &str, ip: &str, node_port_: i32| {
        mk_node_port_service(
            "default",
            name,
            ip,
            &[node_port("http", "TCP", 80, node_port_)],
        )
    };
    let svcs = [np("a", "10.96.0.20", 30080), np("b", "10.96.0.21", 30081)];
    let sls = [web_slice("a", &["10.1.0.1"]), web_slice("b", &["10.1.0.2"])];
    let (mut sync, mut due) = sync_on(FakeMaps::new());
    let mut first = vec![node(), no_service_cidrs()];
    first.extend(list_start());
    first.push(service_page(&svcs));
    first.push(slice_page(&sls[..1]));
    let writes = wake(&mut sync, &mut due, first);
    assert!(
        frontends(&writes).contains(&"192.0.2.1".parse().unwrap()),
        "a's node port on the node's first address: {writes:?}"
    );
    // The node's address moves before the list ends.
    let mut rest = vec![node_at("192.0.2.2"), slice_page(&sls[1..])];
    rest.extend(list_end());
    wake(&mut sync, &mut due, rest);
    assert!(sync.health.report().ready);
    let after = vec![
        services(&svcs),
        slices(&sls),
        node_at("192.0.2.2"),
        no_service_cidrs(),
    ];
    assert_eq!(
        sync.reconciler.writer().canonical(),
        from_scratch(&MapSizes::default(), after)
    );
}
