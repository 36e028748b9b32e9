//! The real agent binary against a test Kubernetes API server speaking the
//! real list/watch protocol, through a kubeconfig: relists after 410,
//! dropped watches, stale and duplicated events (incident 4), an API
//! outage, churn with agent restarts. A client keeps connecting to a
//! stable service throughout and must see zero failures; the maps must end
//! equal to what the final objects ask for.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use serde_json::json;
use sluice_tests::{
    agent::{
        yaml::{self, READY, TERMINATING},
        Agent, ManifestDir,
    },
    apiserver::{ApiServer, Fault, Outage, ResourceKind, Verb},
    clients::{self, Prober, Stream},
    servers, Topology,
};

const STABLE: Ipv4Addr = Ipv4Addr::new(10, 96, 1, 1);
const READY_TIMEOUT: Duration = Duration::from_secs(20);

struct Cluster {
    agent: Agent,
    server: ApiServer,
    _dir: ManifestDir,
    _servers: Vec<servers::Server>,
    topo: Topology,
}

/// A node with `backends` backend pods, a test API server inside the node
/// namespace holding the stable service (backed by backends 0 and 1), and
/// the agent watching it.
fn cluster(backends: usize, extra_args: &[&str]) -> Result<Cluster> {
    let topo = Topology::new(1, backends)?;
    let servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let server = ApiServer::start_in(&topo.node)?;
    server.apply_yaml(&yaml::service("stable", STABLE, 80, 8080))?;
    let eps: Vec<_> = topo.backends[..2].iter().map(|b| (b.ip, READY)).collect();
    server.apply_yaml(&yaml::slice("stable-1", "stable", 8080, &eps))?;
    let dir = ManifestDir::create()?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = vec!["--kubeconfig", kubeconfig.as_str()];
    args.extend_from_slice(extra_args);
    let mut agent = Agent::start(&topo, "kube", &args)?;
    agent.wait_ready(READY_TIMEOUT)?;
    Ok(Cluster {
        agent,
        server,
        _dir: dir,
        _servers: servers,
        topo,
    })
}

fn stable() -> SocketAddrV4 {
    SocketAddrV4::new(STABLE, 80)
}

#[test]
fn follows_services_and_endpoint_slices_and_drains_through_the_api() -> Result<()> {
    let c = cluster(3, &[])?;
    let client = &c.topo.clients[0].ns;
    let (b0, b1, b2) = (
        &c.topo.backends[0],
        &c.topo.backends[1],
        &c.topo.backends[2],
    );
    let eps = |list: &[(Ipv4Addr, yaml::Cond)]| yaml::slice("stable-1", "stable", 8080, list);

    c.server
        .apply_yaml(&eps(&[(b0.ip, READY), (b1.ip, READY), (b2.ip, READY)]))?;
    c.agent
        .wait_until("three backends", Duration::from_secs(5), |a| {
            Ok(a.frontends()?
                .get(&stable().to_string())
                .is_some_and(|b| b.len() == 3))
        })?;
    let mut stream = (0..100)
        .map(|_| Stream::connect(client, stable()))
        .find(|s| s.as_ref().map_or(true, |s| s.backend == b2.name))
        .context("no stream to backend-2")??;

    // backend-2 turns terminating, then disappears: its stream lives on.
    c.server.apply_yaml(&eps(&[
        (b0.ip, READY),
        (b1.ip, READY),
        (b2.ip, TERMINATING),
    ]))?;
    let addr2 = format!("{}:8080", b2.ip);
    c.agent
        .wait_until("backend-2 terminating", Duration::from_secs(5), |a| {
            Ok(a.frontends()?[&stable().to_string()]
                .contains(&(addr2.clone(), "terminating".into())))
        })?;
    stream.ping()?;
    let hits: Vec<String> = clients::tcp_hellos(client, stable(), 100)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    ensure!(
        !hits.contains(&b2.name),
        "a terminating backend got a new flow"
    );
    c.server
        .apply_yaml(&eps(&[(b0.ip, READY), (b1.ip, READY)]))?;
    c.agent
        .wait_until("backend-2 draining", Duration::from_secs(5), |a| {
            Ok(a.frontends()?[&stable().to_string()].contains(&(addr2.clone(), "draining".into())))
        })?;
    stream.ping()?;
    drop(stream);
    let took = c
        .agent
        .wait_until("backend-2 removed", Duration::from_secs(5), |a| {
            Ok(a.frontends()?[&stable().to_string()].len() == 2)
        })?;
    eprintln!("last flow closed -> backend removed: {took:?}");

    // A deleted service leaves the maps (its backends have no flows).
    c.server.apply_yaml(&yaml::service(
        "gone",
        Ipv4Addr::new(10, 96, 1, 2),
        80,
        8080,
    ))?;
    c.server
        .apply_yaml(&yaml::slice("gone-1", "gone", 8080, &[(b0.ip, READY)]))?;
    c.agent
        .wait_until("service gone programmed", Duration::from_secs(5), |a| {
            Ok(a.frontends()?.len() == 2)
        })?;
    c.server.delete_service("default", "gone");
    c.server.delete_endpoint_slice("default", "gone-1");
    c.agent
        .wait_until("service gone removed", Duration::from_secs(5), |a| {
            Ok(a.frontends()?.len() == 1)
        })?;
    Ok(())
}

#[test]
fn stable_service_survives_relists_dropped_watches_stale_events_and_an_outage() -> Result<()> {
    let c = cluster(2, &["--healthz-max-api-down", "2s"])?;
    let prober = Prober::start(&c.topo.clients[0].ns, stable(), Duration::from_millis(10));
    let expected = c.agent.frontends()?;
    let relists = |kind: &str| {
        c.agent
            .metric_sum("sluice_relists_total", &format!("kind=\"{kind}\""))
    };

    // 410 Gone: history compacted, the next watch expires -> relist.
    let before = relists("EndpointSlice")?;
    c.server.expire_watches(&[ResourceKind::EndpointSlice]);
    c.agent
        .wait_until("relist after 410", Duration::from_secs(10), |_| {
            Ok(relists("EndpointSlice")? > before)
        })?;

    // A dropped connection: resumed, nothing changes.
    let (open, watches) = (
        c.server.open_watches(None),
        c.server.request_count(Verb::Watch),
    );
    c.server.abort_watches();
    c.agent
        .wait_until("watches resumed", Duration::from_secs(10), |_| {
            Ok(c.server.request_count(Verb::Watch) >= watches + open
                && c.server.open_watches(None) >= open)
        })?;

    // Incident 4: a stale event for the stable slice (an old version that
    // says it was deleted), a duplicate, then the connection drops. kube-rs
    // would resume from the stale version and replay history; the guard
    // relists instead and never applies the stale delete.
    c.agent
        .wait_until("slice watch open", Duration::from_secs(5), |_| {
            Ok(c.server.open_watches(Some(ResourceKind::EndpointSlice)) > 0)
        })?;
    let mut slice = c
        .server
        .get_kind(ResourceKind::EndpointSlice, "default", "stable-1")
        .context("slice")?;
    let current = slice["metadata"]["resourceVersion"].clone();
    c.server
        .inject_event(ResourceKind::EndpointSlice, "MODIFIED", slice.clone());
    slice["metadata"]["resourceVersion"] = json!("1");
    c.server
        .inject_event(ResourceKind::EndpointSlice, "DELETED", slice);
    c.server.close_watches();
    c.agent
        .wait_until("stale event seen", Duration::from_secs(5), |a| {
            Ok(a.metric_sum("sluice_stale_events_total", "EndpointSlice")? >= 1.0)
        })?;
    ensure!(
        c.agent
            .metric_sum("sluice_duplicate_events_total", "EndpointSlice")?
            >= 1.0
    );
    let resumed: Vec<Option<String>> = c
        .server
        .watch_resource_versions(ResourceKind::EndpointSlice);
    ensure!(
        !resumed.iter().any(|rv| rv.as_deref() == Some("1")),
        "never resumed from the stale version: {resumed:?} (current {current})"
    );

    // The API goes away for a while; a service created meanwhile is
    // programmed once it is back; /healthz reports the outage.
    c.server.set_outage(Outage::CloseConnections);
    c.agent.wait_until(
        "healthz red during the outage",
        Duration::from_secs(10),
        |a| Ok(a.healthz()?.0 == 503),
    )?;
    let b0 = &c.topo.backends[0];
    c.server.apply_yaml(&yaml::service(
        "later",
        Ipv4Addr::new(10, 96, 1, 3),
        80,
        8080,
    ))?;
    c.server
        .apply_yaml(&yaml::slice("later-1", "later", 8080, &[(b0.ip, READY)]))?;
    // The agent keeps trying against the outage meanwhile.
    let refused = c.server.refused_connections();
    c.agent
        .wait_until("retries during the outage", Duration::from_secs(10), |_| {
            Ok(c.server.refused_connections() >= refused + 2)
        })?;
    c.server.set_outage(Outage::Off);
    c.agent.wait_until(
        "service created during the outage",
        Duration::from_secs(20),
        |a| Ok(a.frontends()?.len() == 2),
    )?;
    c.agent
        .wait_until("healthz green again", Duration::from_secs(10), |a| {
            Ok(a.healthz()?.0 == 200)
        })?;
    ensure!(c.agent.metric_sum("sluice_api_errors_total", "")? >= 1.0);

    let (ok, failures) = prober.finish()?;
    ensure!(
        failures.is_empty(),
        "{} of {} connections failed: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(5)]
    );
    ensure!(ok > 100, "the prober kept connecting ({ok})");
    let now = c.agent.frontends()?;
    ensure!(
        now[&stable().to_string()] == expected[&stable().to_string()],
        "stable service unchanged: {now:?}"
    );
    Ok(())
}

/// A small deterministic random number generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn churn_with_agent_restarts_ends_with_exactly_the_final_state() -> Result<()> {
    let mut c = cluster(2, &[])?;
    let prober = Prober::start(&c.topo.clients[0].ns, stable(), Duration::from_millis(10));
    let mut rng = Rng(0x5eed_1234_abcd);
    // Final objects, as the test knows them: service -> (vip, endpoints).
    let mut expected: BTreeMap<String, (Ipv4Addr, Vec<Ipv4Addr>)> = BTreeMap::new();
    let ops = 3000;
    for op in 0..ops {
        let i = rng.below(60);
        let name = format!("churn-{i}");
        let vip = Ipv4Addr::new(10, 96, 2, i as u8 + 1);
        match rng.below(10) {
            // Create or update: a service with 0..6 endpoints.
            0..=6 => {
                let n = rng.below(7) as u8;
                let eps: Vec<Ipv4Addr> = (0..n)
                    .map(|k| Ipv4Addr::new(10, 77, i as u8, k + 1 + rng.below(3) as u8 * 10))
                    .collect();
                let mut eps_sorted = eps.clone();
                eps_sorted.sort();
                eps_sorted.dedup();
                c.server.apply_yaml(&yaml::service(&name, vip, 80, 8080))?;
                let conds: Vec<_> = eps_sorted.iter().map(|ip| (*ip, READY)).collect();
                c.server
                    .apply_yaml(&yaml::slice(&format!("{name}-1"), &name, 8080, &conds))?;
                expected.insert(name, (vip, eps_sorted));
            }
            // Delete the service and its slice.
            _ => {
                c.server.delete_service("default", &name);
                c.server
                    .delete_endpoint_slice("default", &format!("{name}-1"));
                expected.remove(&name);
            }
        }
        if op % 1000 == 500 {
            c.agent.kill9();
            c.agent.restart(&c.topo.node)?;
            c.agent.wait_ready(READY_TIMEOUT)?;
        }
    }
    let mut want: BTreeMap<String, Vec<(String, String)>> = expected
        .values()
        .map(|(vip, eps)| {
            let mut backends: Vec<(String, String)> = eps
                .iter()
                .map(|ip| (format!("{ip}:8080"), "active".to_owned()))
                .collect();
            backends.sort();
            (format!("{vip}:80"), backends)
        })
        .collect();
    let stable_backends: Vec<(String, String)> = c.topo.backends[..2]
        .iter()
        .map(|b| (format!("{}:8080", b.ip), "active".to_owned()))
        .collect();
    want.insert(stable().to_string(), stable_backends);
    c.agent.wait_until(
        "maps equal the final objects",
        Duration::from_secs(30),
        |a| Ok(a.frontends()? == want),
    )?;
    // Entry counts, straight from the maps: nothing leaked.
    let status: serde_json::Value = serde_json::from_str(&c.agent.cli(&[
        "status",
        "--json",
        "--healthz-url",
        "http://127.0.0.1:10256/healthz",
    ])?)?;
    let entries = |map: &str| -> u64 {
        status["maps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["map"] == map)
            .and_then(|m| m["entries"].as_u64())
            .unwrap_or(u64::MAX)
    };
    let backends: u64 = want.values().map(|b| b.len() as u64).sum();
    ensure!(
        entries("sl_svc4") == want.len() as u64 + backends,
        "sl_svc4 holds {} entries, want {}",
        entries("sl_svc4"),
        want.len() as u64 + backends
    );
    ensure!(
        entries("sl_backends") == backends,
        "sl_backends holds {}, want {backends}",
        entries("sl_backends")
    );
    let (ok, failures) = prober.finish()?;
    ensure!(
        failures.is_empty(),
        "{} of {} connections to the stable service failed: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(5)]
    );
    eprintln!(
        "{ops} operations, {} services at the end, {ok} probe connections, 0 failures",
        want.len()
    );
    Ok(())
}

/// Whether a new TCP connection from `ns` to `to` is dropped by the
/// service-CIDR check (it times out and `unallocated_ip` grows).
fn dropped_as_unallocated(
    topo: &Topology,
    ns: &sluice_tests::Netns,
    to: SocketAddrV4,
) -> Result<bool> {
    let count = || -> Result<u64> {
        Ok(sluice::datapath::Maps::open_pinned(topo.bpf.path())?
            .stat(sluice_common::Stat::UnallocatedIp)?)
    };
    let before = count()?;
    let _ = clients::tcp_hello(ns, to);
    Ok(count()? > before)
}

const SERVICE_CIDR: &str = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: extra\nspec:\n  cidrs: [\"10.96.1.0/24\"]\n";

#[test]
fn service_cidr_objects_change_what_is_dropped_and_a_missing_resource_is_no_cidrs() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let _server0 = servers::tcp_greeter(&topo.backends[0].ns, 8080, "backend-0")?;
    let server = ApiServer::start_in(&topo.node)?;
    server.apply_yaml(&yaml::service("stable", STABLE, 80, 8080))?;
    server.apply_yaml(&yaml::slice(
        "stable-1",
        "stable",
        8080,
        &[(topo.backends[0].ip, READY)],
    ))?;
    // An API server without the v1 ServiceCIDR resource (before 1.33)
    // answers 404, every time: the agent must still sync, with no CIDRs.
    server.inject_fault(
        Verb::List,
        Some(ResourceKind::ServiceCidr),
        10_000,
        Fault::Status(404),
    );
    let dir = ManifestDir::create()?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let kubeconfig = kubeconfig.display().to_string();
    let mut agent = Agent::start(&topo, "kube", &["--kubeconfig", kubeconfig.as_str()])?;
    agent.wait_ready(READY_TIMEOUT)?;
    let client = &topo.clients[0].ns;
    let free = SocketAddrV4::new(Ipv4Addr::new(10, 96, 1, 99), 80);
    ensure!(
        clients::tcp_hello(client, stable())? == "backend-0",
        "served port"
    );
    ensure!(
        !dropped_as_unallocated(&topo, client, free)?,
        "dropped without any service CIDR"
    );
    // The cluster IP still rejects an unserved port without CIDRs.
    let refused = clients::tcp_hello(client, SocketAddrV4::new(STABLE, 81))
        .expect_err("unserved port")
        .chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    ensure!(
        refused == Some(std::io::ErrorKind::ConnectionRefused),
        "{refused:?}"
    );

    ensure!(
        agent.log().contains("not served by the API server"),
        "the 404 was not what let the agent sync"
    );

    // The resource appears (the API server upgraded): the watcher,
    // retrying with backoff, finds the object and its range is dropped.
    server.clear_faults();
    server.apply_yaml(SERVICE_CIDR)?;
    agent.wait_until(
        "the ServiceCIDR in sl_svcnet4",
        Duration::from_secs(40),
        |_| {
            let maps = sluice::datapath::Maps::open_pinned(topo.bpf.path())?;
            let (state, _) = sluice::datapath::read_map_state(&maps)?;
            Ok(state
                .service_nets
                .contains_key(&(Ipv4Addr::new(10, 96, 1, 0).into(), 24)))
        },
    )?;
    ensure!(
        dropped_as_unallocated(&topo, client, free)?,
        "not dropped inside the ServiceCIDR"
    );
    ensure!(
        clients::tcp_hello(client, stable())? == "backend-0",
        "served port inside the CIDR"
    );

    // Deleted: routed again.
    server.delete_kind(ResourceKind::ServiceCidr, "", "extra");
    agent.wait_until("the ServiceCIDR gone", READY_TIMEOUT, |_| {
        let maps = sluice::datapath::Maps::open_pinned(topo.bpf.path())?;
        let (state, _) = sluice::datapath::read_map_state(&maps)?;
        Ok(state.service_nets.len() == 1)
    })?;
    ensure!(
        !dropped_as_unallocated(&topo, client, free)?,
        "dropped after the ServiceCIDR went"
    );
    agent.stop()?;
    Ok(())
}

/// A relist of everything (410 Gone on both kinds) that finds every object
/// as it was writes nothing to the maps: the pages are applied as they come
/// and an unchanged object changes nothing; the agent stays ready.
#[test]
fn a_relist_that_finds_nothing_changed_writes_nothing() -> Result<()> {
    let c = cluster(2, &[])?;
    let b0 = &c.topo.backends[0];
    // Enough services for several list pages (the watcher asks for 500).
    for i in 0..1200u32 {
        let vip = Ipv4Addr::new(10, 96, 10 + (i / 250) as u8, (i % 250) as u8 + 1);
        let name = format!("bulk-{i}");
        c.server.apply_yaml(&yaml::service(&name, vip, 80, 8080))?;
        c.server.apply_yaml(&yaml::slice(
            &format!("{name}-1"),
            &name,
            8080,
            &[(b0.ip, READY)],
        ))?;
    }
    c.agent
        .wait_until("every service programmed", Duration::from_secs(30), |a| {
            Ok(a.metric("sluice_programmed_frontends")? >= 1201.0)
        })?;
    let synced = |a: &Agent| a.metric("sluice_update_to_datapath_seconds_count");
    // Settled: no update waits for the maps.
    c.agent
        .wait_until("updates settled", Duration::from_secs(10), |a| {
            let before = synced(a)?;
            std::thread::sleep(Duration::from_millis(300));
            Ok(synced(a)? == before)
        })?;
    // The first sync was timed (the bench reads this figure).
    ensure!(c.agent.metric("sluice_first_sync_duration_seconds")? > 0.0);
    let writes = c.agent.metric("sluice_map_writes_total")?;
    let relists = |kind: &str| {
        c.agent
            .metric_sum("sluice_relists_total", &format!("kind=\"{kind}\""))
    };
    let (services0, slices0) = (relists("Service")?, relists("EndpointSlice")?);
    let updates0 = synced(&c.agent)?;
    // The page sizes the agent asked for: 500 for its first list (few
    // round trips), 50 for a relist (less in flight beside full stores).
    let limits = || -> Vec<String> {
        c.server
            .requests()
            .into_iter()
            .filter(|r| r.verb == Verb::List && r.resource == Some(ResourceKind::EndpointSlice))
            .filter_map(|r| {
                r.params
                    .iter()
                    .find(|(k, _)| k == "limit")
                    .map(|(_, v)| v.clone())
            })
            .collect()
    };
    let first = limits();
    ensure!(
        !first.is_empty() && first.iter().all(|l| l == "500"),
        "first list pages: {first:?}"
    );
    c.server.clear_requests();

    // A slow API server (a relist of each kind takes over a second), so
    // that relists running side by side would overlap.
    c.server.set_list_delay(Duration::from_millis(100));
    c.server
        .expire_watches(&[ResourceKind::Service, ResourceKind::EndpointSlice]);
    c.agent
        .wait_until("both kinds relisted", Duration::from_secs(20), |_| {
            Ok(relists("Service")? > services0 && relists("EndpointSlice")? > slices0)
        })?;
    // Each relist hands over a start, its pages (24 of 50 objects or
    // more) and an end: all of them reached the maps' side (synced), and
    // nothing more comes, before the writes are compared.
    c.agent
        .wait_until("relisted objects synced", Duration::from_secs(20), |a| {
            if synced(a)? < updates0 + 2.0 * 26.0 {
                return Ok(false);
            }
            let before = synced(a)?;
            std::thread::sleep(Duration::from_millis(300));
            Ok(synced(a)? == before)
        })?;
    let after = c.agent.metric("sluice_map_writes_total")?;
    ensure!(
        after == writes,
        "a relist that changed nothing wrote {} map entries",
        after - writes
    );
    ensure!(c.agent.healthz()?.0 == 200, "still healthy");
    ensure!(c.agent.metric("sluice_programmed_frontends")? >= 1201.0);
    let relisted = limits();
    ensure!(
        relisted.len() >= 24 && relisted.iter().all(|l| l == "50"),
        "relist pages: {relisted:?}"
    );
    // The two kinds relisted one after the other, not side by side (each
    // page in flight is memory beside the full stores): their list
    // requests, in order of arrival, switch kind once.
    let order: Vec<ResourceKind> = c
        .server
        .requests()
        .into_iter()
        .filter(|r| r.verb == Verb::List)
        .filter_map(|r| r.resource)
        .filter(|k| matches!(k, ResourceKind::Service | ResourceKind::EndpointSlice))
        .collect();
    let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
    ensure!(
        order.len() >= 48 && switches == 1,
        "relist pages of the two kinds interleaved: {order:?}"
    );
    Ok(())
}
