//! The real agent binary on a dual-stack Service with an IPv4 and an IPv6
//! EndpointSlice: both families programmed, carrying traffic, shown by
//! `sluice lb list` / `ct list`, drained gracefully, adopted after a
//! restart without a write.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use sluice_tests::{
    agent::{
        yaml::{self, READY, TERMINATING},
        Agent, ManifestDir,
    },
    clients::{self, Stream},
    lb::{vip, vip6},
    servers, Topology,
};

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 62);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x62);
const MAGLEV_VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 63);
const MAGLEV_VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x63);
const READY_TIMEOUT: Duration = Duration::from_secs(20);

fn hellos(ns: &sluice_tests::Netns, addr: SocketAddr, n: usize) -> Result<HashSet<String>> {
    Ok(clients::tcp_hellos(ns, addr, n)?
        .into_iter()
        .collect::<std::io::Result<_>>()?)
}

#[test]
fn dual_stack_service_is_programmed_in_both_families_and_drains_an_ipv6_backend() -> Result<()> {
    let topo = Topology::new(1, 2)?;
    topo.strict_checksums()?;
    topo.wait_ipv6_ready()?;
    let servers = servers::tcp_greeters_dual(&topo.backends, 8080)?;
    let dir = ManifestDir::create()?;
    dir.write(
        "dual-svc.yaml",
        &yaml::dual_stack_service("dual", VIP4, VIP6, 80, 8080),
    )?;
    let v4: Vec<_> = topo.backends.iter().map(|b| (b.ip, READY)).collect();
    let v6: Vec<_> = topo.backends.iter().map(|b| (b.ip6, READY)).collect();
    dir.write("dual-v4.yaml", &yaml::slice("dual-v4", "dual", 8080, &v4))?;
    dir.write("dual-v6.yaml", &yaml::slice6("dual-v6", "dual", 8080, &v6))?;
    // The same backends behind a Maglev service (both families): its
    // tables must survive the restart below without a write too.
    let maglev = yaml::dual_stack_service("dual-maglev", MAGLEV_VIP4, MAGLEV_VIP6, 80, 8080)
        .replace(
            "  namespace: default\n",
            "  namespace: default\n  annotations:\n    service.sluice.dev/lb-algorithm: maglev\n",
        );
    dir.write("maglev-svc.yaml", &maglev)?;
    dir.write(
        "maglev-v4.yaml",
        &yaml::slice("dual-maglev-v4", "dual-maglev", 8080, &v4),
    )?;
    dir.write(
        "maglev-v6.yaml",
        &yaml::slice6("dual-maglev-v6", "dual-maglev", 8080, &v6),
    )?;

    let source = format!("dir:{}", dir.path().display());
    let mut agent = Agent::start(&topo, &source, &[])?;
    agent.wait_ready(READY_TIMEOUT)?;

    // `sluice lb list`: one frontend per family, each with its own
    // family's backends.
    let fe4 = format!("{VIP4}:80");
    let fe6 = format!("[{VIP6}]:80");
    let listed = agent.frontends()?;
    let want = |v6: bool| -> Vec<(String, String)> {
        let mut list: Vec<_> = topo
            .backends
            .iter()
            .map(|b| {
                (
                    SocketAddr::new(b.addr(v6), 8080).to_string(),
                    "active".to_owned(),
                )
            })
            .collect();
        list.sort();
        list
    };
    assert_eq!(listed.get(&fe4), Some(&want(false)), "{listed:?}");
    assert_eq!(listed.get(&fe6), Some(&want(true)), "{listed:?}");
    // Each family's service map fills under its own name.
    // (Gauges lag the maps by up to a second.)
    let fill = |a: &Agent, map: &str| a.metric(&format!("sluice_map_fill_ratio{{map=\"{map}\"}}"));
    agent.wait_until("both families' fill ratios", Duration::from_secs(5), |a| {
        Ok(fill(a, "sl_svc4")? > 0.0 && fill(a, "sl_svc6")? > 0.0)
    })?;
    let problems = agent.metrics()?;
    let ipv6_rejected = problems
        .lines()
        .find(|l| l.starts_with("sluice_rejected_objects") && l.contains("ipv6_unsupported"));
    assert!(
        ipv6_rejected.is_none_or(|l| l.ends_with(" 0")),
        "nothing IPv6 is left out: {ipv6_rejected:?}"
    );

    // Both carry traffic to both backends.
    let client = &topo.clients[0].ns;
    let names: HashSet<String> = topo.backends.iter().map(|b| b.name.clone()).collect();
    assert_eq!(hellos(client, vip(VIP4, 80).into(), 40)?, names);
    assert_eq!(hellos(client, vip6(VIP6, 80).into(), 40)?, names);

    // `sluice ct list` shows the IPv6 flows in [addr]:port form.
    let a = &topo.backends[0];
    let mut stream = (0..100)
        .map(|_| Stream::connect(client, vip6(VIP6, 80)))
        .find(|s| s.as_ref().map_or(true, |s| s.backend == a.name))
        .context("no IPv6 stream to backend-0")??;
    stream.ping()?;
    let rows: serde_json::Value =
        serde_json::from_str(&agent.cli(&["ct", "list", "--json", "--service", &fe6])?)?;
    let a6 = SocketAddr::new(IpAddr::V6(a.ip6), 8080).to_string();
    let client6 = topo.clients[0].ip6;
    let ours = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["kind"] == "forward"
                && r["rewrite"] == format!("dst {a6}").as_str()
                && r["src"]
                    .as_str()
                    .is_some_and(|s| s.starts_with(&format!("[{client6}]:")))
        })
        .count();
    ensure!(ours >= 1, "the stream's forward entry is listed: {rows:#}");

    // backend-0's IPv6 endpoint turns terminating: its stream lives on,
    // new IPv6 flows avoid it, and once the stream closes it is removed.
    let v6_term: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip6, if b.ip6 == a.ip6 { TERMINATING } else { READY }))
        .collect();
    dir.write(
        "dual-v6.yaml",
        &yaml::slice6("dual-v6", "dual", 8080, &v6_term),
    )?;
    agent.wait_until(
        "backend-0 (IPv6) terminating",
        Duration::from_secs(5),
        |ag| {
            Ok(ag.frontends()?.get(&fe6).is_some_and(|list| {
                list.iter()
                    .any(|(addr, state)| *addr == a6 && state == "terminating")
            }))
        },
    )?;
    stream.ping().context("the terminating backend's stream")?;
    let hits = hellos(client, vip6(VIP6, 80).into(), 60)?;
    assert!(
        !hits.contains(&a.name),
        "a terminating backend got a new flow"
    );
    assert_eq!(
        hellos(client, vip(VIP4, 80).into(), 40)?,
        names,
        "the IPv4 side is untouched"
    );
    // Its live IPv6 flow is counted: it stays through the scans.
    agent.wait_syncs(3, Duration::from_secs(5))?;
    assert!(agent.frontends()?[&fe6].iter().any(|(addr, _)| *addr == a6));
    stream.ping()?;
    drop(stream);
    agent.wait_until("backend-0 (IPv6) removed", Duration::from_secs(5), |ag| {
        Ok(!ag.frontends()?[&fe6].iter().any(|(addr, _)| *addr == a6))
    })?;

    let list = agent.cli(&["lb", "list"])?;
    assert_eq!(
        list.matches("[maglev]").count(),
        2,
        "one Maglev frontend per family:\n{list}"
    );
    assert_eq!(hellos(client, vip(MAGLEV_VIP4, 80).into(), 40)?, names);
    assert_eq!(hellos(client, vip6(MAGLEV_VIP6, 80).into(), 40)?, names);

    // A restarted agent adopts both families and writes nothing.
    agent.kill9();
    assert_eq!(
        hellos(client, vip6(VIP6, 80).into(), 10)?.len(),
        1,
        "IPv6 flows work with no agent"
    );
    agent.restart(&topo.node)?;
    agent.wait_ready(READY_TIMEOUT)?;
    assert_eq!(
        agent.metric("sluice_map_writes_total")?,
        0.0,
        "a restarted agent with nothing changed writes nothing"
    );
    drop(servers);
    Ok(())
}
