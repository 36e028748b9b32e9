//! The real agent binary fed from a manifest directory: graceful
//! termination end to end, restart safety, bad input.

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use sluice_tests::{
    agent::{
        yaml::{self, READY, TERMINATING},
        Agent, ManifestDir,
    },
    clients::{self, Stream},
    lb::vip,
    servers, Topology,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 60);
const READY_TIMEOUT: Duration = Duration::from_secs(20);

fn setup(backends: usize) -> Result<(Topology, Vec<servers::Server>, ManifestDir)> {
    let topo = Topology::new(1, backends)?;
    let servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    let dir = ManifestDir::create()?;
    dir.write("web-svc.yaml", &yaml::service("web", VIP, 80, 8080))?;
    let ready: Vec<_> = topo.backends.iter().map(|b| (b.ip, READY)).collect();
    dir.write("web-slice.yaml", &yaml::slice("web-1", "web", 8080, &ready))?;
    Ok((topo, servers, dir))
}

/// The backends `sluice lb list --json` shows for the VIP, with states.
fn lb_backends(agent: &Agent) -> Result<Vec<(String, String, u64)>> {
    let out = agent.cli(&["lb", "list", "--json"])?;
    let rows: serde_json::Value = serde_json::from_str(&out)?;
    let frontend = format!("{VIP}:80");
    let Some(fe) = rows
        .as_array()
        .and_then(|a| a.iter().find(|r| r["frontend"] == frontend.as_str()))
    else {
        return Ok(Vec::new());
    };
    Ok(fe["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            (
                b["address"].as_str().unwrap_or_default().to_owned(),
                b["state"].as_str().unwrap_or_default().to_owned(),
                b["flows"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

fn wait_for(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn manifest_change_drains_a_terminating_then_removed_backend_gracefully() -> Result<()> {
    let (topo, _servers, dir) = setup(3)?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(READY_TIMEOUT)?;
    let client = &topo.clients[0].ns;
    let seen: HashSet<String> = clients::tcp_hellos(client, vip(VIP, 80), 60)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert_eq!(seen.len(), 3, "all backends serve: {seen:?}");

    let a = &topo.backends[0];
    let a_addr = format!("{}:8080", a.ip);
    let mut stream = (0..100)
        .map(|_| Stream::connect(client, vip(VIP, 80)))
        .find(|s| s.as_ref().map_or(true, |s| s.backend == a.name))
        .context("no stream to backend-0")??;

    // backend-0 turns terminating in the manifest.
    let eps = |a_cond| -> Vec<_> {
        topo.backends
            .iter()
            .map(|b| (b.ip, if b.ip == a.ip { a_cond } else { READY }))
            .collect()
    };
    dir.write(
        "web-slice.yaml",
        &yaml::slice("web-1", "web", 8080, &eps(TERMINATING)),
    )?;
    wait_for("backend-0 terminating", Duration::from_secs(5), || {
        Ok(lb_backends(&agent)?
            .iter()
            .any(|(addr, state, _)| *addr == a_addr && state == "terminating"))
    })?;
    stream.ping()?;
    let hits: Vec<String> = clients::tcp_hellos(client, vip(VIP, 80), 200)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert!(
        !hits.contains(&a.name),
        "a terminating backend got a new flow"
    );

    // Then it vanishes from the slice: it drains while its stream lives.
    let others: Vec<_> = topo.backends[1..].iter().map(|b| (b.ip, READY)).collect();
    dir.write(
        "web-slice.yaml",
        &yaml::slice("web-1", "web", 8080, &others),
    )?;
    wait_for("backend-0 draining", Duration::from_secs(5), || {
        Ok(lb_backends(&agent)?
            .iter()
            .any(|(addr, state, flows)| *addr == a_addr && state == "draining" && *flows == 1))
    })?;
    for _ in 0..10 {
        stream.ping().context("the draining stream keeps working")?;
        std::thread::sleep(Duration::from_millis(100));
    }

    // Its last flow closes: it leaves the maps shortly after.
    drop(stream);
    let took = wait_for("backend-0 removed", Duration::from_secs(5), || {
        Ok(!lb_backends(&agent)?
            .iter()
            .any(|(addr, _, _)| *addr == a_addr))
    })?;
    eprintln!("last flow closed -> backend removed: {took:?}");
    let hits: HashSet<String> = clients::tcp_hellos(client, vip(VIP, 80), 40)?
        .into_iter()
        .collect::<std::io::Result<_>>()?;
    assert_eq!(hits.len(), 2);
    Ok(())
}

#[test]
fn killed_agent_leaves_flows_running_and_its_successor_writes_nothing() -> Result<()> {
    let (topo, _servers, dir) = setup(2)?;
    let source = format!("dir:{}", dir.path().display());
    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(READY_TIMEOUT)?;
    let writes_first = agent.metric("sluice_map_writes_total")?;
    assert!(writes_first > 0.0);

    let client = &topo.clients[0].ns;
    let mut stream = Stream::connect(client, vip(VIP, 80))?;
    let stop = Arc::new(AtomicBool::new(false));
    let pings = Arc::new(AtomicU32::new(0));
    let (stop2, pings2) = (stop.clone(), pings.clone());
    let pinger = std::thread::spawn(move || -> Result<()> {
        while !stop2.load(Ordering::Relaxed) {
            stream.ping()?;
            pings2.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    });

    // Waits until the stream made `n` more round trips.
    let talked = |n: u32| -> Result<()> {
        let target = pings.load(Ordering::Relaxed) + n;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pings.load(Ordering::Relaxed) < target {
            ensure!(
                std::time::Instant::now() < deadline && !pinger.is_finished(),
                "the stream stopped talking"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    };

    agent.kill9();
    talked(10)?;
    assert_eq!(
        clients::tcp_hello(client, vip(VIP, 80)).map(|_| ()).ok(),
        Some(()),
        "new flows work with no agent"
    );
    agent.restart(&topo.node)?;
    agent.wait_ready(READY_TIMEOUT)?;
    assert_eq!(
        agent.metric("sluice_map_writes_total")?,
        0.0,
        "a restarted agent with nothing changed writes nothing"
    );
    assert!(agent.log().contains("adopted what the maps hold"));

    // A graceful stop (rolling update) likewise.
    agent.stop()?;
    agent.restart(&topo.node)?;
    agent.wait_ready(READY_TIMEOUT)?;
    assert_eq!(agent.metric("sluice_map_writes_total")?, 0.0);

    talked(5)?;
    stop.store(true, Ordering::Relaxed);
    pinger
        .join()
        .map_err(|_| anyhow::anyhow!("pinger panicked"))??;
    assert!(
        pings.load(Ordering::Relaxed) > 20,
        "the stream kept talking throughout"
    );
    Ok(())
}

#[test]
fn bad_manifests_are_reported_and_do_not_disturb_good_services() -> Result<()> {
    let (topo, _servers, dir) = setup(1)?;
    dir.write("garbage.yaml", "this: [is not: a manifest")?;
    dir.write(
        "bad-svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\n  namespace: default\nspec:\n  clusterIP: 10.96.0.999\n  ports:\n  - port: 80\n",
    )?;
    // A protocol the API would refuse (SCTP is served since issue 13).
    dir.write(
        "quic-svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: quic\n  namespace: default\nspec:\n  clusterIP: 10.96.0.61\n  ports:\n  - port: 80\n    protocol: QUIC\n",
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(READY_TIMEOUT)?;
    assert_eq!(
        clients::tcp_hello(&topo.clients[0].ns, vip(VIP, 80))?,
        "backend-0"
    );
    let (code, body) = agent.healthz()?;
    assert_eq!(code, 200, "{body}");
    let metrics = agent.metrics()?;
    for reason in ["invalid_address", "unsupported_protocol"] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with("sluice_rejected_objects") && l.contains(reason))
            .with_context(|| format!("no rejected_objects{{reason={reason}}} in\n{metrics}"))?;
        assert!(!line.ends_with(" 0"), "{line}");
    }
    Ok(())
}
