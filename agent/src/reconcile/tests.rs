//! The reconciler through the fake maps (`fake.rs`), which checks the
//! write ordering on every write: plans, drains, adoption after a
//! restart, refusal when full, Maglev, and retries after a failed write.

use std::time::{Duration, Instant};

use sluice_common::{
    service::SVC_F_MAGLEV, BackendState, CtEntry, CtKind, FrontendKind, IPPROTO_TCP,
};

use super::{
    fake::{FakeMaps, Limits, Write},
    Reconciler, Refusal, Scope,
};
use crate::{
    datapath::{EntryKey, MapSizes, MapWrites, PicksEntry, ServiceKey},
    model::{
        DesiredBackend, DesiredService, DesiredState, Endpoint, Frontend, FrontendKey, Proto,
        ServicePortName, WhenEmpty,
    },
};

pub(crate) fn name(n: &str) -> ServicePortName {
    ServicePortName::new("default", n, "http", Proto::Tcp)
}

pub(crate) fn key(addr: &str, port: u16) -> FrontendKey {
    FrontendKey::new(addr.parse().unwrap(), port, Proto::Tcp)
}

pub(crate) fn endpoint(addr: &str) -> Endpoint {
    Endpoint {
        addr: addr.parse().unwrap(),
        port: 8080,
    }
}

fn backend(addr: &str, state: BackendState) -> DesiredBackend {
    DesiredBackend {
        endpoint: endpoint(addr),
        state,
    }
}

fn active(addrs: &[&str]) -> Vec<DesiredBackend> {
    addrs
        .iter()
        .map(|a| backend(a, BackendState::Active))
        .collect()
}

fn service(fe: FrontendKey, backends: Vec<DesiredBackend>) -> DesiredService {
    DesiredService {
        frontends: vec![Frontend::new(
            fe,
            FrontendKind::ClusterIp,
            backends,
            WhenEmpty::Reject,
        )],
    }
}

fn desired(services: Vec<(&str, DesiredService)>) -> DesiredState {
    DesiredState {
        services: services.into_iter().map(|(n, s)| (name(n), s)).collect(),
        ..DesiredState::default()
    }
}

const DRAIN: Duration = Duration::from_secs(60);

fn sizes(services: u32, backends: u32, maglev: u32) -> MapSizes {
    MapSizes {
        services,
        backends,
        maglev,
        ..MapSizes::default()
    }
}

/// A reconciler on `maps` as the agent starts one: adopted, then its
/// socket entries turned on as the sync task starts.
fn start(maps: FakeMaps) -> Reconciler<FakeMaps> {
    let mut r = Reconciler::new(maps, &MapSizes::default(), DRAIN).unwrap();
    r.start_picks().unwrap();
    r
}

/// Reconciles everything and asserts no write failed and the record of
/// what is programmed equals what the maps hold.
fn sync_all(r: &mut Reconciler<FakeMaps>, d: &DesiredState, now: Instant) -> super::Report {
    let report = r.reconcile(d, Scope::All, now);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_programmed_is_exact(r);
    if let Err(e) = r.writer().picks_match_services(r.sock_picks()) {
        panic!("{e}");
    }
    report
}

/// The record equals the maps, but for frontends a failed write left
/// marked unknown (`svc_id` 0, nothing recorded: rewritten next time).
fn assert_programmed_is_exact(r: &Reconciler<FakeMaps>) {
    let held = adopted(r.writer());
    let mut record = r.programmed().clone();
    record
        .frontends
        .retain(|k, f| held.frontends.contains_key(k) || *f != super::FrontendState::default());
    assert_eq!(record, held, "the record differs from the maps");
}

/// What an agent starting on `maps` adopts.
fn adopted(maps: &FakeMaps) -> super::MapState {
    super::adopted_state(maps).unwrap()
}

fn position(log: &[Write], pred: impl Fn(&Write) -> bool) -> Vec<usize> {
    log.iter()
        .enumerate()
        .filter(|(_, w)| pred(w))
        .map(|(i, _)| i)
        .collect()
}

fn is_slot(w: &Write) -> bool {
    matches!(w, Write::Put(EntryKey::Service(k)) if k.frontend().is_some_and(|(_, s)| s > 0))
}

fn is_master(w: &Write) -> bool {
    matches!(w, Write::Put(EntryKey::Service(k)) if k.frontend().is_some_and(|(_, s)| s == 0))
}

#[test]
fn a_new_service_writes_backends_then_slots_then_the_master() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let d = desired(vec![(
        "web",
        service(fe, active(&["10.1.0.1", "10.1.0.2"])),
    )]);
    let report = sync_all(&mut r, &d, Instant::now());
    let log = r.writer().map_writes();
    let backends = position(&log, |w| matches!(w, Write::Put(EntryKey::Backend(_))));
    let slots = position(&log, is_slot);
    let masters = position(&log, is_master);
    assert_eq!((backends.len(), slots.len(), masters.len()), (2, 2, 1));
    assert!(backends.iter().max() < slots.iter().min());
    assert!(slots.iter().max() < masters.iter().min());
    assert_eq!(report.writes, log.len() as u64);
    let master = r.writer().services[&(fe, 0)];
    assert_eq!((master.total, master.active), (2, 2));
}

#[test]
fn an_unchanged_desired_state_writes_nothing() {
    let mut r = start(FakeMaps::new());
    let d = desired(vec![(
        "web",
        service(key("10.96.0.10", 80), active(&["10.1.0.1", "10.1.0.2"])),
    )]);
    let now = Instant::now();
    sync_all(&mut r, &d, now);
    let before = r.writer().log.len();
    assert_eq!(sync_all(&mut r, &d, now).writes, 0);
    let changed = [name("web")].into();
    assert_eq!(r.reconcile(&d, Scope::Changed(&changed), now).writes, 0);
    assert_eq!(r.writer().log.len(), before);
}

#[test]
fn a_removed_endpoint_drains_until_its_flows_end_then_goes() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let t0 = Instant::now();
    sync_all(
        &mut r,
        &desired(vec![(
            "web",
            service(fe, active(&["10.1.0.1", "10.1.0.2"])),
        )]),
        t0,
    );
    let gone = r
        .writer()
        .backends
        .iter()
        .find(|(_, b)| b.addr[3] == 2)
        .map(|(id, _)| *id)
        .unwrap();
    let d = desired(vec![("web", service(fe, active(&["10.1.0.1"])))]);
    sync_all(&mut r, &d, t0);
    // Still in the maps, not selectable: behind the one active slot.
    let b = r.writer().backends[&gone];
    assert_eq!(BackendState::from_u8(b.state), BackendState::Draining);
    let master = r.writer().services[&(fe, 0)];
    assert_eq!((master.total, master.active), (2, 1));
    assert_eq!(r.draining(), 1);

    // A scan finds a live flow on it: it stays.
    let flow = CtEntry {
        last_seen_ns: crate::conntrack::monotonic_ns(),
        backend_id: gone.get(),
        svc_id: b.svc_id,
        kind: CtKind::Forward as u8,
        ..CtEntry::default()
    };
    let ct_key = sluice_common::Ct4Key {
        proto: IPPROTO_TCP,
        ..Default::default()
    };
    r.writer_mut().conntrack4.push((ct_key, flow));
    let t1 = t0 + super::drain::SETTLE;
    r.scan_conntrack(t1).unwrap();
    sync_all(&mut r, &d, t1);
    assert!(r.writer().backends.contains_key(&gone));

    // The flow ended: the next scan lets it go, slot first.
    r.writer_mut().conntrack4.clear();
    let t2 = t1 + Duration::from_millis(1);
    r.scan_conntrack(t2).unwrap();
    let report = sync_all(&mut r, &d, t2);
    assert_eq!(report.backends_removed, 1);
    assert!(!r.writer().backends.contains_key(&gone));
    assert_eq!(r.writer().services[&(fe, 0)].total, 1);
    assert!(!r.writer().services.contains_key(&(fe, 2)));
    assert_eq!(r.draining(), 0);
}

#[test]
fn a_removed_service_drains_then_leaves_nothing_behind() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let t0 = Instant::now();
    sync_all(
        &mut r,
        &desired(vec![(
            "web",
            service(fe, active(&["10.1.0.1", "10.1.0.2"])),
        )]),
        t0,
    );
    let empty = DesiredState::default();
    sync_all(&mut r, &empty, t0);
    // The frontend stays with nothing selectable while flows drain.
    let master = r.writer().services[&(fe, 0)];
    assert_eq!((master.total, master.active, master.fallback), (2, 0, 0));
    assert_eq!(r.writer().backends.len(), 2);
    // After the drain timeout everything goes, in reverse order (the fake
    // panics otherwise).
    sync_all(&mut r, &empty, t0 + DRAIN);
    assert!(r.writer().services.is_empty());
    assert!(r.writer().backends.is_empty());
    // Nothing left but the summary of no service net.
    let nothing = super::MapState {
        svcnet_summary_v4: sluice_common::SvcnetSummary4::of(&mut []),
        ..super::MapState::default()
    };
    assert_eq!(r.programmed(), &nothing);
}

fn rich_desired() -> DesiredState {
    let mut web = service(key("10.96.0.10", 80), active(&["10.1.0.1", "10.1.0.2"]));
    web.frontends[0].maglev = true;
    let mut lb = service(key("192.0.2.10", 443), active(&["10.1.0.3"]));
    lb.frontends[0].kind = FrontendKind::LoadBalancer;
    lb.frontends[0].source_ranges = vec![("198.51.100.0".parse().unwrap(), 24)];
    lb.frontends[0].affinity_timeout = Some(30);
    let v6 = service(key("fd00:96::10", 80), active(&["fd00:1::1"]));
    let mut d = desired(vec![("web", web), ("lb", lb), ("v6", v6)]);
    d.local_sources = [("10.1.0.0".parse().unwrap(), 16)].into();
    d.local_ifaces = [7].into();
    d.service_cidrs = [("10.96.0.0".parse().unwrap(), 16)].into();
    d.cluster_ips = ["10.96.0.10".parse().unwrap()].into();
    d
}

#[test]
fn a_restarted_agent_adopts_the_maps_without_writing() {
    let mut r = start(FakeMaps::new());
    let d = rich_desired();
    let now = Instant::now();
    sync_all(&mut r, &d, now);
    assert!(!r.writer().maglev.is_empty());
    assert!(!r.writer().source_ranges.is_empty());
    // A clean stop: the socket programs' bit goes, the one thing written.
    r.stop_picks().unwrap();
    let held = r.writer().restarted();

    let mut again = start(held.clone());
    assert_eq!(again.programmed(), r.programmed());
    let report = sync_all(&mut again, &d, now);
    assert_eq!(report.writes, 0);
    assert_eq!(
        again.writer().log,
        vec![Write::Config],
        "only the socket programs' bit, set again"
    );
    assert_eq!(again.writer().services, held.services);
    assert_eq!(again.writer().backends, held.backends);
}

#[test]
fn socket_picks_that_disagree_with_the_adopted_maps_go_before_the_programs_read_them() {
    use sluice_common::config::CFG_F_SOCK_PICKS;
    let mut r = start(FakeMaps::new());
    let d = rich_desired();
    let now = Instant::now();
    sync_all(&mut r, &d, now);
    assert_ne!(r.writer().config.flags() & CFG_F_SOCK_PICKS, 0);
    let (fe, entry) = r
        .writer()
        .picks
        .iter()
        .next()
        .map(|(k, e)| (*k, *e))
        .expect("the plain frontend has an entry");
    r.stop_picks().unwrap();
    assert_eq!(
        r.writer().config.flags() & CFG_F_SOCK_PICKS,
        0,
        "a stopping agent turns them off"
    );
    // A release that does not keep them changed the frontend under its
    // entry, and removed another frontend whose entry stayed.
    let mut held = r.writer().restarted();
    let (stale, orphan) = match entry {
        PicksEntry::V4(k, v) => {
            let (mut wrong, mut gone) = (v, k);
            wrong.svc_id += 100;
            gone.port += 1;
            (PicksEntry::V4(k, wrong), PicksEntry::V4(gone, v))
        }
        PicksEntry::V6(k, v) => {
            let (mut wrong, mut gone) = (v, k);
            wrong.svc_id += 100;
            gone.port += 1;
            (PicksEntry::V6(k, wrong), PicksEntry::V6(gone, v))
        }
    };
    let orphan_fe = orphan.key().frontend().unwrap().0;
    held.picks.insert(fe, stale);
    held.picks.insert(orphan_fe, orphan);

    let mut again = start(held);
    let log = again.writer().log.clone();
    let deleted = position(&log, |w| matches!(w, Write::Delete(EntryKey::SockPicks(_))));
    let on = position(&log, |w| *w == Write::Config);
    assert_eq!(deleted.len(), 2, "{log:?}");
    assert!(
        on.len() == 1 && deleted.iter().all(|d| *d < on[0]),
        "the stale entries go before the bit is set: {log:?}"
    );
    assert_ne!(again.writer().config.flags() & CFG_F_SOCK_PICKS, 0);
    assert!(!again.programmed().frontends.get(&fe).unwrap().sock_picks);
    // The next reconcile writes the frontend's entry back, and only that.
    let report = sync_all(&mut again, &d, now);
    assert_eq!(report.writes, 1);
    assert_eq!(again.writer().picks.get(&fe), Some(&entry));

    // An agent that died without stopping left the bit set: it goes before
    // the stale entry, and comes back after it.
    let mut crashed = again.writer().restarted();
    assert_ne!(crashed.config.flags() & CFG_F_SOCK_PICKS, 0);
    crashed.picks.insert(fe, stale);
    let after = start(crashed);
    let log = after.writer().log.clone();
    let config = position(&log, |w| *w == Write::Config);
    let deleted = position(&log, |w| matches!(w, Write::Delete(EntryKey::SockPicks(_))));
    assert!(
        config.len() == 2 && deleted.len() == 1 && config[0] < deleted[0] && deleted[0] < config[1],
        "off, delete, on: {log:?}"
    );
    assert_ne!(after.writer().config.flags() & CFG_F_SOCK_PICKS, 0);
}

/// A live forward conntrack entry of the TC path to the one backend of
/// frontend 10.96.0.10:80 (`web`), and its key.
fn web_tc_flow(r: &Reconciler<FakeMaps>) -> (sluice_common::Ct4Key, CtEntry) {
    let backend_id = r.programmed().backends.iter().next().unwrap().0.get();
    let flow = CtEntry {
        last_seen_ns: crate::conntrack::monotonic_ns(),
        backend_id,
        svc_id: r.programmed().frontends[&key("10.96.0.10", 80)]
            .svc_id
            .get(),
        kind: CtKind::Forward as u8,
        ..CtEntry::default()
    };
    let ct_key = sluice_common::Ct4Key {
        proto: IPPROTO_TCP,
        sport: 40000,
        ..Default::default()
    };
    (ct_key, flow)
}

#[test]
fn the_socket_programs_bit_waits_for_the_sync_task_and_its_writes_lose_no_pod_flow() {
    use sluice_common::config::{CFG_F_PODS_ON_SOCKETS, CFG_F_SOCK_PICKS};
    let now = Instant::now();
    let web = desired(vec![(
        "web",
        service(key("10.96.0.10", 80), active(&["10.1.0.1"])),
    )]);
    let mut r = start(FakeMaps::new());
    sync_all(&mut r, &web, now);
    assert_ne!(r.writer().config.flags() & CFG_F_SOCK_PICKS, 0);

    // An agent that did not stop cleanly left the bit set; the next one
    // clears it as it adopts the maps, and sets it only as its sync task
    // starts: one that fails before leaves it clear.
    let crashed = r.writer().restarted();
    let mut next = Reconciler::new(crashed, &MapSizes::default(), DRAIN).unwrap();
    assert_eq!(next.writer().config.flags() & CFG_F_SOCK_PICKS, 0);
    next.start_picks().unwrap();
    assert_ne!(next.writer().config.flags() & CFG_F_SOCK_PICKS, 0);

    // The pods' bit is set, and a pod's flow begins on the TC path while the
    // stopping agent writes the word: the datapath's clearing is lost under
    // that write. The stop finds the pod's flow and takes the bit away.
    next.allow_pods_on_sockets(true, true).unwrap();
    next.scan_conntrack(now).unwrap();
    next.scan_conntrack(now).unwrap();
    assert_ne!(next.writer().config.flags() & CFG_F_PODS_ON_SOCKETS, 0);
    let (ct_key, flow) = web_tc_flow(&next);
    let pod_flow = CtEntry {
        flags: sluice_common::conntrack::CT_F_POD,
        ..flow
    };
    next.writer_mut().conntrack4.push((ct_key, pod_flow));
    // And that flow's store, which read the word before the stop's write,
    // lands after it with the socket bit still set: the stop writes again.
    let stale_word = next.writer().config.flags() & !CFG_F_PODS_ON_SOCKETS;
    next.writer_mut().racing_stores = vec![stale_word];
    next.stop_picks().unwrap();
    let flags = next.writer().config.flags();
    assert_eq!(
        flags & CFG_F_SOCK_PICKS,
        0,
        "the stop clears the socket bit"
    );
    assert_eq!(
        flags & CFG_F_PODS_ON_SOCKETS,
        0,
        "the pod's flow on the TC path takes the pods' bit away"
    );
}

#[test]
fn without_socket_balancing_no_frontend_has_a_socket_entry_and_earlier_ones_go() {
    use sluice_common::config::CFG_F_SOCK_PICKS;
    let d = rich_desired();
    let now = Instant::now();
    let mut on = start(FakeMaps::new());
    sync_all(&mut on, &d, now);
    let written = on.writer().picks.len();
    assert!(written > 0, "the plain frontends have entries while on");

    // An agent restarted with --socket-lb=off (after a crash: the bit is
    // still set): the bit goes before the entries, and none comes back.
    let held = on.writer().restarted();
    assert_ne!(held.config.flags() & CFG_F_SOCK_PICKS, 0);
    let mut off = Reconciler::with_sock_picks(held, &MapSizes::default(), DRAIN, false).unwrap();
    off.start_picks().unwrap();
    let log = off.writer().log.clone();
    let config = position(&log, |w| *w == Write::Config);
    let deleted = position(&log, |w| matches!(w, Write::Delete(EntryKey::SockPicks(_))));
    assert_eq!(deleted.len(), written, "{log:?}");
    assert!(
        config.len() == 1 && deleted.iter().all(|d| config[0] < *d),
        "the bit is cleared before the entries go: {log:?}"
    );
    assert_eq!(off.writer().config.flags() & CFG_F_SOCK_PICKS, 0);
    assert!(off.writer().picks.is_empty());
    // Nothing else changes, and later changes write no entry either.
    let report = sync_all(&mut off, &d, now);
    assert_eq!(report.writes, 0, "{:?}", off.writer().log);
    let mut fewer = d.clone();
    let name = fewer.services.keys().next().cloned().unwrap();
    fewer.services.remove(&name);
    sync_all(&mut off, &fewer, now);
    sync_all(&mut off, &d, now);
    assert!(off.writer().picks.is_empty());
    assert!(off
        .programmed()
        .frontends
        .iter()
        .all(|(_, f)| !f.sock_picks));

    // Back on: the entries are written again and the programs may read them.
    let mut again = start(off.writer().restarted());
    assert_ne!(again.writer().config.flags() & CFG_F_SOCK_PICKS, 0);
    sync_all(&mut again, &d, now);
    assert_eq!(again.writer().picks.len(), written);
}

#[test]
fn a_frontend_that_gains_affinity_loses_its_socket_entry_before_its_master_says_so() {
    let fe = key("10.96.0.10", 80);
    let plain = desired(vec![(
        "web",
        service(fe, active(&["10.1.0.1", "10.1.0.2"])),
    )]);
    let mut sticky = plain.clone();
    for svc in sticky.services.values_mut() {
        svc.frontends[0].affinity_timeout = Some(30);
    }
    let now = Instant::now();
    let mut r = start(FakeMaps::new());
    sync_all(&mut r, &plain, now);
    assert!(
        r.writer().picks.contains_key(&fe),
        "a plain frontend has one"
    );
    let before = r.writer().log.len();

    // The fake checks at every write that an entry sits only beside a
    // master that takes one: the entry goes first, the flag comes after.
    sync_all(&mut r, &sticky, now);
    let log = r.writer().log[before..].to_vec();
    let gone = position(&log, |w| matches!(w, Write::Delete(EntryKey::SockPicks(_))));
    let master = position(&log, is_master);
    assert!(
        gone.len() == 1 && !master.is_empty() && gone[0] < master[0],
        "{log:?}"
    );
    assert!(!r.writer().picks.contains_key(&fe));
    r.writer().picks_match_services(true).unwrap();

    // Without affinity again, the entry comes back after the master.
    sync_all(&mut r, &plain, now);
    assert!(r.writer().picks.contains_key(&fe));
    r.writer().picks_match_services(true).unwrap();
    assert_programmed_is_exact(&r);
}

/// Whether frontend `fe`'s slots and its unit's backends are one list.
fn slots_shared(r: &Reconciler<FakeMaps>, fe: &FrontendKey) -> bool {
    let f = &r.programmed().frontends.get(fe).unwrap();
    !f.slots.is_empty() && std::ptr::eq(f.slots.as_ptr(), r.units.backends(f.svc_id).as_ptr())
}

#[test]
fn a_frontends_slots_and_its_units_backends_are_kept_once() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let three = active(&["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    let now = Instant::now();
    sync_all(
        &mut r,
        &desired(vec![("web", service(fe, three.clone()))]),
        now,
    );
    assert!(
        slots_shared(&r, &fe),
        "a first sync's slots are its unit's backends"
    );
    // A backend more: both change, and are one list again.
    let mut four = three.clone();
    four.push(backend("10.1.0.4", BackendState::Active));
    sync_all(
        &mut r,
        &desired(vec![("web", service(fe, four.clone()))]),
        now,
    );
    assert_eq!(r.programmed().frontends.get(&fe).unwrap().slots.len(), 4);
    assert!(slots_shared(&r, &fe));
    // A restarted agent reads the two back apart and keeps them once.
    let again = start(r.writer().restarted());
    assert_eq!(again.programmed(), r.programmed());
    assert!(slots_shared(&again, &fe));
    // Slots in another order than the ids: each keeps its own, and
    // changing the slots leaves the unit's list as it was.
    let mut first_last = four;
    first_last[0].state = BackendState::TerminatingServing;
    sync_all(
        &mut r,
        &desired(vec![("web", service(fe, first_last))]),
        now,
    );
    assert!(!slots_shared(&r, &fe));
    let f = r.programmed().frontends.get(&fe).unwrap();
    let mut ids = f.slots.to_vec();
    ids.sort();
    assert_eq!(
        ids,
        r.units.backends(f.svc_id),
        "the same ids, in another order"
    );
}

/// Maps with room for one service of two backends (3 service entries),
/// backends going as soon as they drain.
fn room_for_one_service() -> Reconciler<FakeMaps> {
    let maps = FakeMaps {
        limits: Limits {
            services: 3,
            backends: 2,
            maglev: 0,
        },
        ..FakeMaps::new()
    };
    Reconciler::new(maps, &sizes(3, 2, 0), Duration::ZERO).unwrap()
}

#[test]
fn a_service_is_refused_when_the_maps_are_full_and_programmed_once_room_frees() {
    let mut r = room_for_one_service();
    let a = service(key("10.96.0.10", 80), active(&["10.1.0.1", "10.1.0.2"]));
    let b = service(key("10.96.0.11", 80), active(&["10.1.0.3"]));
    let now = Instant::now();
    let report = sync_all(&mut r, &desired(vec![("a", a), ("b", b.clone())]), now);
    assert_eq!(report.refused, vec![(name("b"), Refusal::MapsFull)]);
    assert_eq!(r.refused().get(&name("b")), Some(&Refusal::MapsFull));
    assert!(!r
        .writer()
        .services
        .contains_key(&(key("10.96.0.11", 80), 0)));
    assert_eq!(r.writer().backends.len(), 2);

    // `a` goes: once its backends drained, `b` gets the room.
    let only_b = desired(vec![("b", b)]);
    for _ in 0..3 {
        sync_all(&mut r, &only_b, now);
    }
    assert!(r.refused().is_empty());
    assert!(r
        .writer()
        .services
        .contains_key(&(key("10.96.0.11", 80), 0)));
    assert!(!r
        .writer()
        .services
        .contains_key(&(key("10.96.0.10", 80), 0)));
}

#[test]
fn a_frontend_taken_by_another_service_port_is_refused() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let d = desired(vec![
        ("a", service(fe, active(&["10.1.0.1"]))),
        ("b", service(fe, active(&["10.1.0.2"]))),
    ]);
    let report = sync_all(&mut r, &d, Instant::now());
    assert_eq!(report.refused.len(), 1);
    assert_eq!(report.refused[0].0, name("b"));
    assert!(matches!(
        &report.refused[0].1,
        Refusal::FrontendTaken { owner, .. } if *owner == name("a")
    ));
    assert_eq!(r.writer().backends.len(), 1);
}

#[test]
fn a_maglev_table_exists_before_its_master_flags_it_and_goes_after() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let mut svc = service(fe, active(&["10.1.0.1", "10.1.0.2"]));
    svc.frontends[0].maglev = true;
    let now = Instant::now();
    sync_all(&mut r, &desired(vec![("web", svc.clone())]), now);
    let log = r.writer().map_writes();
    let table = position(&log, |w| matches!(w, Write::Put(EntryKey::Maglev(_))));
    let masters = position(&log, is_master);
    assert_eq!(table.len(), 1);
    assert!(table[0] < masters[0]);
    assert_ne!(r.writer().services[&(fe, 0)].flags & SVC_F_MAGLEV, 0);
    let ids: std::collections::BTreeSet<super::BackendId> =
        r.writer().maglev[&fe].iter().copied().collect();
    let backends: std::collections::BTreeSet<super::BackendId> =
        r.writer().backends.keys().copied().collect();
    assert_eq!(ids, backends, "the table spreads over both backends");

    // Off again: the master stops flagging the table, then it goes.
    svc.frontends[0].maglev = false;
    sync_all(&mut r, &desired(vec![("web", svc)]), now);
    assert!(r.writer().maglev.is_empty());
    assert_eq!(r.writer().services[&(fe, 0)].flags & SVC_F_MAGLEV, 0);
}

#[test]
fn without_room_for_tables_maglev_falls_back_to_the_flow_hash() {
    let mut r = Reconciler::new(FakeMaps::new(), &sizes(1024, 1024, 0), DRAIN).unwrap();
    let fe = key("10.96.0.10", 80);
    let mut svc = service(fe, active(&["10.1.0.1"]));
    svc.frontends[0].maglev = true;
    let report = sync_all(&mut r, &desired(vec![("web", svc)]), Instant::now());
    assert_eq!(report.maglev_fallback, vec![name("web")]);
    assert!(r.writer().maglev.is_empty());
    assert_eq!(r.writer().services[&(fe, 0)].flags & SVC_F_MAGLEV, 0);
    assert!(r.maglev_fallback().contains(&name("web")));
    // Deleted, it is no longer counted as falling back.
    sync_all(&mut r, &desired(vec![]), Instant::now());
    assert!(r.maglev_fallback().is_empty());
}

#[test]
fn a_failed_write_leaves_an_exact_record_and_the_next_reconcile_repairs_it() {
    let d = rich_desired();
    let now = Instant::now();
    let mut clean = start(FakeMaps::new());
    sync_all(&mut clean, &d, now);
    // The writes of the reconcile, after those of the start-up.
    let started = start(FakeMaps::new()).writer().attempts;
    let total = clean.writer().log.len();
    for fail_at in started..total {
        let mut r = start(FakeMaps::new());
        r.writer_mut().fail_at = Some(fail_at);
        let report = r.reconcile(&d, Scope::All, now);
        // A full sl_svcnet4/6 leaves a cluster IP out instead of failing.
        let failed = report.errors.len() + report.service_nets_left_out;
        assert_eq!(failed, 1, "write {fail_at}");
        assert_programmed_is_exact(&r);
        sync_all(&mut r, &d, now);
        // The same, up to the ids handed out after the failure.
        assert_eq!(
            r.writer().canonical(),
            clean.writer().canonical(),
            "write {fail_at}"
        );
    }
}

/// A reconciler that programmed one service: web, 10.96.0.10:80 on
/// 10.1.0.1.
fn one_web_service(now: Instant) -> Reconciler<FakeMaps> {
    let mut r = start(FakeMaps::new());
    sync_all(
        &mut r,
        &desired(vec![(
            "web",
            service(key("10.96.0.10", 80), active(&["10.1.0.1"])),
        )]),
        now,
    );
    r
}

#[test]
fn stale_conntrack_entries_of_removed_backends_are_deleted() {
    let now = Instant::now();
    let mut r = one_web_service(now);
    let entry = CtEntry {
        last_seen_ns: crate::conntrack::monotonic_ns(),
        backend_id: 4242,
        svc_id: 1,
        kind: CtKind::Forward as u8,
        ..CtEntry::default()
    };
    let ct_key = sluice_common::Ct4Key {
        proto: IPPROTO_TCP,
        ..Default::default()
    };
    r.writer_mut().conntrack4.push((ct_key, entry));
    let scan = r.scan_conntrack(now).unwrap();
    assert_eq!((scan.entries, scan.deleted), (1, 1));
    assert!(r.writer().conntrack4.is_empty());
    assert_eq!(
        r.writer().map_writes().last(),
        Some(&Write::Delete(EntryKey::Conntrack4(ct_key)))
    );
}

#[test]
fn the_socket_marks_are_declared_valid_once_every_tcp_socket_is_counted() {
    use sluice_common::{socket::mark_slot, SockEntry, IPPROTO_TCP};
    let now = Instant::now();
    let mut r = one_web_service(now);
    let (id, backend) = r
        .writer()
        .backends
        .iter()
        .next()
        .map(|(id, b)| (*id, *b))
        .expect("a backend");
    // A TCP socket 0.1.0 balanced (its entry uncounted) and one this
    // agent's programs counted, both on the live backend.
    let legacy = SockEntry {
        proto: IPPROTO_TCP,
        backend_id: id.get(),
        svc_id: backend.svc_id,
        backend: backend.addr,
        backend_port: backend.port,
        ..SockEntry::default()
    };
    let mut counted = legacy;
    counted.set_counted();
    r.writer_mut().sockets = vec![(5, legacy), (6, counted)];
    let mut marks = vec![0; sluice_common::maps::SOCK_MARK_SLOTS as usize];
    marks[mark_slot(6) as usize] = 1;
    r.writer_mut().sock_marks = marks.clone();
    r.scan_conntrack(now).unwrap();
    assert!(!r.writer().sock_marks_valid, "an uncounted socket lives");
    assert_eq!(r.writer().sockets.len(), 2, "both sockets are live flows");
    // A slot counting fewer sockets than it holds (a copy that lost an
    // update) is not trusted either.
    r.writer_mut().sockets.retain(|(c, _)| *c != 5);
    r.writer_mut().sock_marks[mark_slot(6) as usize] = 0;
    r.scan_conntrack(now).unwrap();
    assert!(!r.writer().sock_marks_valid, "a count too low");
    // Counted as it should be: trusted.
    r.writer_mut().sock_marks = marks;
    r.scan_conntrack(now).unwrap();
    assert!(r.writer().sock_marks_valid);
    assert_eq!(r.writer().sockets, vec![(6, counted)]);
    // Written once: later scans do not write it again.
    let writes = r.writer().log.len();
    r.scan_conntrack(now).unwrap();
    assert_eq!(r.writer().log.len(), writes);
    // Stopping takes the validity away for the next agent.
    r.distrust_sock_marks().unwrap();
    assert!(!r.writer().sock_marks_valid);
}

#[test]
fn the_fake_catches_a_slot_written_before_its_backend() {
    let result = std::panic::catch_unwind(|| {
        let mut maps = FakeMaps::new();
        let fe = key("10.96.0.10", 80);
        let value = sluice_common::SvcValue {
            svc_id: 1,
            backend_id: 9,
            ..Default::default()
        };
        let _ = maps.put(crate::datapath::Entry::Service(
            ServiceKey::of(&fe, 1),
            &value,
        ));
    });
    assert!(result.is_err());
}

#[test]
fn a_slot_that_changes_no_count_still_grows_the_master() {
    // A not-ready endpoint joins: neither `active` nor `fallback` moves,
    // but the master must cover the new slot.
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let now = Instant::now();
    sync_all(
        &mut r,
        &desired(vec![("web", service(fe, active(&["10.1.0.1"])))]),
        now,
    );
    let mut backends = active(&["10.1.0.1"]);
    backends.push(backend("10.1.0.2", BackendState::NotReady));
    sync_all(&mut r, &desired(vec![("web", service(fe, backends))]), now);
    let master = r.writer().services[&(fe, 0)];
    assert_eq!((master.total, master.active, master.fallback), (2, 1, 0));
}

#[test]
fn a_service_port_with_more_backends_than_slots_is_refused_and_its_old_state_stays() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let now = Instant::now();
    sync_all(
        &mut r,
        &desired(vec![("web", service(fe, active(&["10.1.0.1"])))]),
        now,
    );
    let before = r.writer().canonical();
    let many: Vec<String> = (0..=sluice_common::maps::MAX_SLOTS)
        .map(|i| std::net::Ipv4Addr::from(0x0a02_0000 + i).to_string())
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let report = sync_all(
        &mut r,
        &desired(vec![("web", service(fe, active(&many)))]),
        now,
    );
    assert!(matches!(
        report.refused.as_slice(),
        [(n, Refusal::TooManyBackends(_))] if *n == name("web")
    ));
    assert_eq!(r.writer().canonical(), before, "nothing of it was written");
}

#[test]
fn service_nets_are_compared_only_when_their_version_changes() {
    let fe = key("10.96.0.10", 80);
    let mut d = desired(vec![("web", service(fe, active(&["10.1.0.1"])))]);
    d.cluster_ips.insert(fe.addr);
    d.nets_version = 1;
    let mut r = start(FakeMaps::new());
    sync_all(&mut r, &d, Instant::now());
    assert_eq!(r.writer().service_nets.len(), 1);
    // The same version: a change-scoped reconcile does not look.
    let mut other = d.clone();
    other.cluster_ips.clear();
    let none = std::collections::BTreeSet::new();
    r.reconcile(&other, Scope::Changed(&none), Instant::now());
    assert_eq!(r.writer().service_nets.len(), 1, "skipped: same version");
    // A new version (or a full reconcile) brings the maps to it.
    other.nets_version = 2;
    r.reconcile(&other, Scope::Changed(&none), Instant::now());
    assert!(r.writer().service_nets.is_empty());
    // Unversioned states (0) are always compared.
    d.nets_version = 0;
    r.reconcile(&d, Scope::Changed(&none), Instant::now());
    assert_eq!(r.writer().service_nets.len(), 1);
}

/// `addr` of a test, parsed.
fn ip(addr: &str) -> std::net::IpAddr {
    addr.parse().unwrap()
}

#[test]
fn the_filters_pass_what_is_programmed_and_a_full_reconcile_clears_what_went() {
    let mut r = start(FakeMaps::new());
    // Filled at adoption: every word written, nothing passes yet.
    assert_eq!(
        r.writer().fe_filter.len(),
        sluice_common::filter::FE_FILTER_WORDS as usize
    );
    assert!(!r.writer().filter_passes_addr(ip("10.96.0.10")));
    assert!(!r.writer().filter_passes_port(8080));
    let t0 = Instant::now();
    let web = key("10.96.0.10", 80);
    let v6 = key("fd00::10", 80);
    let mut svc = service(web, active(&["10.1.0.1"]));
    svc.frontends.push(Frontend::new(
        v6,
        FrontendKind::ClusterIp,
        active(&["fd00:1::1"]),
        WhenEmpty::Reject,
    ));
    sync_all(&mut r, &desired(vec![("web", svc)]), t0);
    let maps = r.writer();
    assert!(maps.filter_passes_addr(ip("10.96.0.10")));
    assert!(maps.filter_passes_addr(ip("fd00::10")));
    assert!(maps.filter_passes_port(8080));
    // Pods' addresses and ports stay out (these happen not to share a bit).
    assert!(!maps.filter_passes_addr(ip("10.1.0.1")));
    assert!(!maps.filter_passes_addr(ip("10.1.0.2")));
    assert!(!maps.filter_passes_port(8081));
    assert!(!maps.filter_passes_port(40_000));
    // Gone after the drain: the next full reconcile clears their bits.
    let empty = DesiredState::default();
    sync_all(&mut r, &empty, t0);
    sync_all(&mut r, &empty, t0 + DRAIN);
    assert!(r.writer().services.is_empty());
    assert!(!r.writer().filter_passes_addr(ip("10.96.0.10")));
    assert!(!r.writer().filter_passes_addr(ip("fd00::10")));
    assert!(!r.writer().filter_passes_port(8080));
}

#[test]
fn a_restarted_agent_fills_its_programs_filters_from_the_maps_it_adopts() {
    let mut r = start(FakeMaps::new());
    sync_all(&mut r, &rich_desired(), Instant::now());
    r.stop_picks().unwrap();
    let maps = r.writer().restarted();
    assert!(maps.fe_filter.is_empty());
    let r = start(maps);
    let maps = r.writer();
    assert_eq!(
        maps.log,
        vec![Write::Config],
        "the socket programs' bit only"
    );
    for (fe, _) in maps.services.keys() {
        assert!(maps.filter_passes_addr(fe.addr), "{fe}");
    }
    for b in maps.backends.values() {
        assert!(maps.filter_passes_port(b.port), "{}", b.port);
    }
    assert!(!maps.filter_passes_port(1));
}

#[test]
fn a_filter_that_cannot_be_written_holds_its_unit_back_until_it_can() {
    let mut r = start(FakeMaps::new());
    r.writer_mut().fail_filters = true;
    let d = desired(vec![(
        "web",
        service(key("10.96.0.10", 80), active(&["10.1.0.1"])),
    )]);
    let report = r.reconcile(&d, Scope::All, Instant::now());
    assert!(!report.errors.is_empty());
    // Nothing of the unit went in: the datapath would not have seen it.
    assert!(r.writer().services.is_empty());
    assert!(r.writer().backends.is_empty());
    assert_programmed_is_exact(&r);
    r.writer_mut().fail_filters = false;
    sync_all(&mut r, &d, Instant::now());
    assert_eq!(r.writer().services.len(), 2);
}

#[test]
fn the_fake_catches_a_frontend_written_before_its_filter_passes_it() {
    let result = std::panic::catch_unwind(|| {
        let mut maps = FakeMaps::new();
        let fe = key("10.96.0.10", 80);
        // A written filter word that lacks the frontend's bit.
        let (w, _) = sluice_common::filter::addr4_slot(u32::from_ne_bytes([10, 96, 0, 10]));
        let _ = maps.put_filter(
            crate::datapath::Filter::Frontends,
            &[(w, sluice_common::filter::WORD_WRITTEN)],
        );
        let _ = maps.put(crate::datapath::Entry::Service(
            ServiceKey::of(&fe, 0),
            &sluice_common::SvcValue::default(),
        ));
    });
    assert!(result.is_err());
}

/// The id of the backend whose IPv4 address ends in `last`.
fn id_ending(r: &Reconciler<FakeMaps>, last: u8) -> super::BackendId {
    r.writer()
        .backends
        .iter()
        .find(|(_, b)| b.addr[3] == last)
        .map(|(id, _)| *id)
        .unwrap()
}

/// A live forward conntrack entry naming backend `id`.
fn flow_on(id: super::BackendId, sport: u16) -> (sluice_common::Ct4Key, CtEntry) {
    let key = sluice_common::Ct4Key {
        proto: IPPROTO_TCP,
        sport,
        ..Default::default()
    };
    let entry = CtEntry {
        last_seen_ns: crate::conntrack::monotonic_ns(),
        backend_id: id.get(),
        svc_id: 1,
        kind: CtKind::Forward as u8,
        ..CtEntry::default()
    };
    (key, entry)
}

/// `web` at 10.96.0.10:80 with the endpoints `addrs`.
fn web_with(addrs: &[&str]) -> DesiredState {
    desired(vec![("web", service(key("10.96.0.10", 80), active(addrs)))])
}

/// A reconciler that programmed `web` with `before`, then `after`, and
/// waited out the drain: the backend ending in `.last` is gone. Its id.
fn gone_after_drain(
    r: &mut Reconciler<FakeMaps>,
    before: &[&str],
    after: &[&str],
    last: u8,
    t0: Instant,
) -> super::BackendId {
    sync_all(r, &web_with(before), t0);
    let gone = id_ending(r, last);
    sync_all(r, &web_with(after), t0);
    sync_all(r, &web_with(after), t0 + DRAIN);
    assert!(!r.writer().backends.contains_key(&gone));
    gone
}

#[test]
fn a_drained_backend_gone_leaves_the_slots_and_the_units_backends_one_list_again() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let t0 = Instant::now();
    sync_all(&mut r, &web_with(&["10.1.0.1", "10.1.0.2", "10.1.0.3"]), t0);
    sync_all(&mut r, &web_with(&["10.1.0.1", "10.1.0.3"]), t0);
    assert!(
        !slots_shared(&r, &fe),
        "the unit still holds the draining one"
    );
    gone_after_drain(
        &mut r,
        &["10.1.0.1", "10.1.0.2", "10.1.0.3"],
        &["10.1.0.1", "10.1.0.3"],
        2,
        t0,
    );
    assert!(slots_shared(&r, &fe));
}

#[test]
fn a_freed_backend_id_is_reused_only_after_a_scan_that_began_after_it_went() {
    let mut r = start(FakeMaps::new());
    let with = web_with;
    let t0 = Instant::now();
    let gone = gone_after_drain(&mut r, &["10.1.0.1", "10.1.0.2"], &["10.1.0.1"], 2, t0);
    // An entry may still name it: a new backend gets another id.
    r.writer_mut().conntrack4.push(flow_on(gone, 1));
    sync_all(&mut r, &with(&["10.1.0.1", "10.1.0.3"]), t0 + DRAIN);
    assert_ne!(id_ending(&r, 3), gone);
    // A scan deletes that entry; the next new backend takes the id, and
    // the table stays as dense as the backends are.
    r.scan_conntrack(t0 + DRAIN).unwrap();
    assert!(r.writer().conntrack4.is_empty());
    sync_all(
        &mut r,
        &with(&["10.1.0.1", "10.1.0.3", "10.1.0.4"]),
        t0 + DRAIN,
    );
    assert_eq!(id_ending(&r, 4), gone);
    let max = r.writer().backends.keys().max().unwrap().get();
    assert_eq!(max, 3);
}

#[test]
fn a_restarted_agent_reuses_the_ids_missing_from_the_maps_after_its_first_scan() {
    let mut r = start(FakeMaps::new());
    let with = web_with;
    let t0 = Instant::now();
    let all = ["10.1.0.1", "10.1.0.2", "10.1.0.3"];
    let gap = gone_after_drain(&mut r, &all, &["10.1.0.1", "10.1.0.3"], 2, t0);
    // The agent stops before any scan; an entry still names the id.
    let mut maps = r.writer().restarted();
    maps.conntrack4.push(flow_on(gap, 2));
    let mut r = start(maps);
    sync_all(&mut r, &with(&["10.1.0.1", "10.1.0.3", "10.1.0.5"]), t0);
    assert_ne!(id_ending(&r, 5), gap);
    r.scan_conntrack(t0).unwrap();
    assert!(r.writer().conntrack4.is_empty());
    sync_all(
        &mut r,
        &with(&["10.1.0.1", "10.1.0.3", "10.1.0.5", "10.1.0.6"]),
        t0,
    );
    assert_eq!(id_ending(&r, 6), gap);
}

#[test]
fn a_scan_that_could_not_delete_everything_clears_no_id() {
    let mut r = start(FakeMaps::new());
    let with = web_with;
    let t0 = Instant::now();
    let gone = gone_after_drain(&mut r, &["10.1.0.1", "10.1.0.2"], &["10.1.0.1"], 2, t0);
    r.writer_mut().conntrack4.push(flow_on(gone, 1));
    // The scan's delete of that entry fails.
    let next = r.writer().attempts;
    r.writer_mut().fail_at = Some(next);
    let report = r.scan_conntrack(t0 + DRAIN).unwrap();
    assert_eq!(report.errors.len(), 1);
    sync_all(&mut r, &with(&["10.1.0.1", "10.1.0.3"]), t0 + DRAIN);
    assert_ne!(id_ending(&r, 3), gone);
    // The next scan deletes it and clears the id.
    r.scan_conntrack(t0 + DRAIN).unwrap();
    sync_all(
        &mut r,
        &with(&["10.1.0.1", "10.1.0.3", "10.1.0.4"]),
        t0 + DRAIN,
    );
    assert_eq!(id_ending(&r, 4), gone);
}

#[test]
fn a_refused_service_port_gives_back_the_ids_it_was_handed() {
    let mut r = room_for_one_service();
    let a = service(key("10.96.0.10", 80), active(&["10.1.0.1", "10.1.0.2"]));
    let b = service(key("10.96.0.11", 80), active(&["10.1.0.3"]));
    let now = Instant::now();
    let both = desired(vec![("a", a), ("b", b.clone())]);
    // Refused again and again while `a` holds the room.
    for _ in 0..20 {
        r.reconcile(&both, Scope::All, now);
    }
    assert_eq!(r.refused().get(&name("b")), Some(&Refusal::MapsFull));
    // `a` goes; `b` is programmed with the id its refusals kept handing
    // back, not one past twenty refusals.
    let only_b = desired(vec![("b", b)]);
    for _ in 0..3 {
        sync_all(&mut r, &only_b, now);
    }
    assert!(r.refused().is_empty());
    assert_eq!(id_ending(&r, 3).get(), 3);
}

/// Empty maps; a backend goes as soon as it drained.
fn draining_at_once() -> Reconciler<FakeMaps> {
    Reconciler::new(FakeMaps::new(), &MapSizes::default(), Duration::ZERO).unwrap()
}

#[test]
fn a_failed_delete_of_slots_leaves_an_exact_record_and_the_next_reconcile_repairs_it() {
    // Backends go as soon as they drained: the removed service's slots
    // and master are deleted within a few reconciles.
    let now = Instant::now();
    // `web` balances with a Maglev table: its table's writes fail too.
    let mut web = service(
        key("10.96.0.10", 80),
        active(&["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]),
    );
    web.frontends[0].maglev = true;
    let big = desired(vec![
        ("web", web),
        (
            "lb",
            service(key("10.96.0.11", 443), active(&["10.1.0.5", "10.1.0.6"])),
        ),
    ]);
    let mut web = service(key("10.96.0.10", 80), active(&["10.1.0.1"]));
    web.frontends[0].maglev = true;
    let small = desired(vec![("web", web)]);
    let mut clean = draining_at_once();
    sync_all(&mut clean, &big, now);
    let before = clean.writer().log.len();
    for _ in 0..4 {
        sync_all(&mut clean, &small, now);
    }
    let deletes = clean
        .writer()
        .log
        .iter()
        .skip(before)
        .filter(|w| matches!(w, Write::Delete(EntryKey::Service(_))))
        .count();
    assert!(
        deletes >= 6,
        "slots and a master go: {:?}",
        &clean.writer().log[before..]
    );
    let writes = clean.writer().log.len() - before;
    for fail_at in 0..writes {
        let mut r = draining_at_once();
        sync_all(&mut r, &big, now);
        let attempts = r.writer().attempts;
        r.writer_mut().fail_at = Some(attempts + fail_at);
        for _ in 0..4 {
            r.reconcile(&small, Scope::All, now);
            // The slots recorded are the slots held (none left behind
            // unrecorded, none recorded gone); a frontend whose write
            // failed may be marked unknown (`svc_id` 0), rewritten next
            // time.
            let held = adopted(r.writer());
            for (k, f) in r.programmed().frontends.iter() {
                let h = held.frontends.get(&k).cloned().unwrap_or_default();
                assert_eq!(f.slots, h.slots, "write {fail_at}: {k:?}");
                if f.svc_id != super::ids::SvcId(0) {
                    assert_eq!(*f, h, "write {fail_at}: {k:?}");
                }
            }
            for k in held.frontends.keys() {
                assert!(
                    r.programmed().frontends.contains_key(&k),
                    "write {fail_at}: {k:?}"
                );
            }
        }
        for _ in 0..4 {
            sync_all(&mut r, &small, now);
        }
        assert_eq!(
            r.writer().canonical(),
            clean.writer().canonical(),
            "write {fail_at}"
        );
    }
}

#[test]
fn a_frontend_record_is_small() {
    // Boxed slices, not vectors: 100,000 frontends.
    assert!(std::mem::size_of::<super::FrontendState>() <= 48);
}

#[test]
fn a_backend_replaced_while_table_writes_fail_goes_only_once_no_table_names_it() {
    // A backend is replaced in a Maglev service while every table write
    // fails (an I/O error, not a full map), and drains meanwhile: no
    // table left in the maps may name it when it goes (the fake panics
    // if one does), and the repaired maps equal a clean run's.
    let now = Instant::now();
    let maglev = |eps: &[&str]| {
        let mut web = service(key("10.96.0.10", 80), active(eps));
        web.frontends[0].maglev = true;
        desired(vec![("web", web)])
    };
    let before = maglev(&["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]);
    let after = maglev(&["10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5"]);
    let mut clean = draining_at_once();
    sync_all(&mut clean, &before, now);
    for _ in 0..4 {
        // A scan finds no flow: the backend that went may go.
        clean.scan_conntrack(now).unwrap();
        sync_all(&mut clean, &after, now);
    }
    let mut r = draining_at_once();
    sync_all(&mut r, &before, now);
    r.writer_mut().fail_tables = true;
    for _ in 0..4 {
        r.scan_conntrack(now).unwrap();
        assert!(!r.reconcile(&after, Scope::All, now).errors.is_empty());
    }
    r.writer_mut().fail_tables = false;
    for _ in 0..4 {
        r.scan_conntrack(now).unwrap();
        sync_all(&mut r, &after, now);
    }
    assert_eq!(r.writer().canonical(), clean.writer().canonical());
    assert_eq!(r.writer().backends.len(), 4, "the replaced backend went");
}

fn pods_bit(r: &Reconciler<FakeMaps>) -> bool {
    r.writer().config.flags() & sluice_common::config::CFG_F_PODS_ON_SOCKETS != 0
}

#[test]
fn the_pods_bit_waits_for_tc_flows_and_clears_before_a_frontend_left_to_tc() {
    let mut r = start(FakeMaps::new());
    let now = Instant::now();
    let web = desired(vec![(
        "web",
        service(key("10.96.0.10", 80), active(&["10.1.0.1"])),
    )]);
    sync_all(&mut r, &web, now);
    r.allow_pods_on_sockets(true, true).unwrap();
    // A flow of the TC path, begun before: the bit waits for it.
    let (ct_key, flow) = web_tc_flow(&r);
    r.writer_mut().conntrack4.push((ct_key, flow));
    r.scan_conntrack(now).unwrap();
    assert!(!pods_bit(&r), "set while a flow of the TC path lives");
    r.writer_mut().conntrack4.clear();
    r.scan_conntrack(now).unwrap();
    assert!(pods_bit(&r) && r.pods_on_sockets());
    // A pod's flow the datapath marked (one that began between a scan's
    // read and its write): the next scan clears the bit until it ends.
    let marked = CtEntry {
        flags: sluice_common::conntrack::CT_F_POD,
        ..flow
    };
    r.writer_mut().conntrack4.push((ct_key, marked));
    r.scan_conntrack(now).unwrap();
    assert!(!pods_bit(&r), "set while a pod's flow of the TC path lives");
    r.writer_mut().conntrack4.clear();
    r.scan_conntrack(now).unwrap();
    assert!(pods_bit(&r));
    // The datapath takes it away: the scan that finds it gone does not
    // set it again, the next one does.
    let mut config = r.writer().config;
    config.set_flags(config.flags() & !sluice_common::config::CFG_F_PODS_ON_SOCKETS);
    r.writer_mut().config = config;
    r.scan_conntrack(now).unwrap();
    assert!(!pods_bit(&r) && !r.pods_on_sockets());
    r.scan_conntrack(now).unwrap();
    assert!(pods_bit(&r));

    // An SCTP service: the bit is cleared before its master is written.
    let mut both = web.clone();
    let sctp = FrontendKey::new("10.96.0.11".parse().unwrap(), 80, Proto::Sctp);
    both.services.insert(
        ServicePortName::new("default", "sig", "sctp", Proto::Sctp),
        service(sctp, active(&["10.1.0.2"])),
    );
    r.writer_mut().log.clear();
    sync_all(&mut r, &both, now);
    assert!(!pods_bit(&r));
    let log = &r.writer().log;
    let config = position(log, |w| *w == Write::Config);
    let master = position(log, is_master);
    assert_eq!(config.len(), 1, "{log:?}");
    assert!(config[0] < master[0], "cleared before the master: {log:?}");
    // While it is programmed, scans leave the bit clear.
    r.scan_conntrack(now).unwrap();
    assert!(!pods_bit(&r));
    // Removed, it drains (its frontend stays for the flows it has): the
    // bit stays clear; gone, the next scan sets it (no flow to wait for).
    sync_all(&mut r, &web, now);
    r.scan_conntrack(now).unwrap();
    assert!(!pods_bit(&r));
    sync_all(&mut r, &web, now + DRAIN);
    assert_eq!(r.left_to_tc, 0);
    r.scan_conntrack(now + DRAIN).unwrap();
    assert!(pods_bit(&r));
    // Not allowed any more (another --socket-lb): cleared at once.
    r.allow_pods_on_sockets(false, true).unwrap();
    assert!(!pods_bit(&r));
    r.scan_conntrack(now).unwrap();
    assert!(!pods_bit(&r));
}

#[test]
fn claims_set_aside_by_a_first_reconcile_give_their_room_back() {
    let mut r = start(FakeMaps::new());
    let names: Vec<String> = (0..3000).map(|i| format!("svc-{i}")).collect();
    let d = desired(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let addr = format!("10.96.{}.{}", i / 250, i % 250 + 1);
                (n.as_str(), service(key(&addr, 80), active(&["10.1.0.1"])))
            })
            .collect(),
    );
    sync_all(&mut r, &d, Instant::now());
    assert!(r.claims_aside.is_empty(), "every claim is recorded");
    assert!(
        r.claims_aside.capacity() < 1024,
        "the room of 3000 claims went: {}",
        r.claims_aside.capacity()
    );
}

#[test]
fn a_service_port_listing_one_frontend_twice_keeps_its_claim() {
    let mut r = start(FakeMaps::new());
    let fe = key("10.96.0.10", 80);
    let mut svc = service(fe, active(&["10.1.0.1"]));
    svc.frontends.push(svc.frontends[0].clone());
    let d = desired(vec![("a", svc), ("b", service(fe, active(&["10.1.0.2"])))]);
    let report = sync_all(&mut r, &d, Instant::now());
    assert!(matches!(
        &report.refused[..],
        [(n, Refusal::FrontendTaken { owner, .. })] if *n == name("b") && *owner == name("a")
    ));
    // Again, with nothing changed: the same answer, read from the record.
    let report = sync_all(&mut r, &d, Instant::now());
    assert!(matches!(
        &report.refused[..],
        [(n, Refusal::FrontendTaken { owner, .. })] if *n == name("b") && *owner == name("a")
    ));
}
