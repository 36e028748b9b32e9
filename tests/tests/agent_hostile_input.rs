//! Hostile input through the real agent (issue 18): a Service on an
//! address that is never a service's (loopback, unspecified, broadcast,
//! link-local) must not capture the node's own traffic to that address.

use std::{net::Ipv4Addr, time::Duration};

use anyhow::{ensure, Result};
use sluice_tests::{
    agent::{Agent, ManifestDir},
    host::HostClient,
    servers, Topology,
};

fn service(name: &str, cluster_ip: &str, external: &str, backend: Ipv4Addr) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterIP: {cluster_ip}\n  clusterIPs: [{cluster_ip}]\n  externalIPs: [{external}]\n  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8080\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8080\nendpoints:\n- addresses: [\"{backend}\"]\n  conditions: {{ready: true}}\n"
    )
}

/// A Service whose cluster IP is 127.0.0.1 and one whose external IPs are
/// 0.0.0.0, 255.255.255.255 and 169.254.169.254: none of them is
/// programmed, each is reported `forbidden_address`, the node's own
/// connection to 127.0.0.1:80 reaches the node's own listener (not a pod),
/// and a good service beside them works.
#[test]
fn services_on_forbidden_addresses_cannot_capture_the_nodes_traffic() -> Result<()> {
    let topo = Topology::new(0, 1)?;
    let _backend = servers::tcp_greeter(&topo.backends[0].ns, 8080, "backend-0")?;
    // The node's own service on its loopback, port 80.
    let _local = servers::tcp_greeter(&topo.node, 80, "node-local")?;
    let b0 = topo.backends[0].ip;
    let dir = ManifestDir::create()?;
    dir.write("lo.yaml", &service("lo", "127.0.0.1", "10.96.0.81", b0))?;
    dir.write(
        "ext.yaml",
        &service(
            "ext",
            "10.96.0.82",
            "0.0.0.0, 255.255.255.255, 169.254.169.254, \"::ffff:127.0.0.1\"",
            b0,
        ),
    )?;
    dir.write(
        "good.yaml",
        &service("good", "10.96.0.80", "10.96.0.83", b0),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let list = agent.cli(&["lb", "list"])?;
    for addr in ["127.0.0.1", "0.0.0.0", "255.255.255.255", "169.254.169.254"] {
        ensure!(
            !list.contains(&format!("{addr}:80")),
            "{addr} programmed:\n{list}"
        );
    }
    ensure!(
        list.contains("10.96.0.80:80"),
        "good service missing:\n{list}"
    );
    for _ in 0..3 {
        let out = HostClient::once(&topo, "tcp", "127.0.0.1", 80)?;
        ensure!(
            out.get(1).map(String::as_str) == Some("node-local"),
            "the node's loopback was captured: {out:?}"
        );
    }
    let out = HostClient::once(&topo, "tcp", "10.96.0.80", 80)?;
    ensure!(
        out.get(1).map(String::as_str) == Some("backend-0"),
        "{out:?}"
    );
    let text = agent.metrics()?;
    let refused: f64 = text
        .lines()
        .filter(|l| l.starts_with("sluice_rejected_objects") && l.contains("forbidden_address"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    ensure!(refused >= 2.0, "forbidden addresses not counted:\n{text}");
    Ok(())
}

/// A manifest file nested 50,000 levels deep (200 KB, which kept a YAML
/// parser busy for 16 s) is refused before it is parsed, /healthz keeps
/// answering at once, and a second file defining the live service again
/// with another address is reported as a duplicate without disturbing
/// it: a client connecting all along never fails.
#[test]
fn hostile_manifests_cannot_stall_the_agent_or_flap_a_live_service() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let _backend = servers::tcp_greeter(&topo.backends[0].ns, 8080, "backend-0")?;
    let b0 = topo.backends[0].ip;
    let dir = ManifestDir::create()?;
    dir.write(
        "good.yaml",
        &service("good", "10.96.0.80", "10.96.0.83", b0),
    )?;
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(20))?;

    let stop = std::sync::atomic::AtomicBool::new(false);
    let client = &topo.clients[0].ns;
    let (ok, failed, slowest) = std::thread::scope(|scope| -> Result<_> {
        let looping = scope.spawn(|| {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match sluice_tests::clients::tcp_hello(
                    client,
                    std::net::SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 80), 80),
                ) {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(format!("{e:#}")),
                }
            }
            (ok, failed)
        });
        // The same Service again, in a file that sorts first, elsewhere.
        let wrote = dir
            .write(
                "a-dup.yaml",
                &service("good", "10.96.0.84", "10.96.0.85", b0),
            )
            // 200 KB of flow nesting.
            .and_then(|()| dir.write("deep.yaml", &"{a: ".repeat(50_000)));
        let mut slowest = Duration::ZERO;
        let started = std::time::Instant::now();
        let mut health = Ok(());
        while wrote.is_ok() && started.elapsed() < Duration::from_secs(3) {
            let t = std::time::Instant::now();
            match agent.healthz() {
                Ok((200, _)) => {}
                other => {
                    health = Err(anyhow::anyhow!("/healthz: {other:?}"));
                    break;
                }
            }
            slowest = slowest.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (ok, failed) = looping
            .join()
            .map_err(|_| anyhow::anyhow!("client loop panicked"))?;
        wrote?;
        health?;
        Ok((ok, failed, slowest))
    })?;
    ensure!(
        failed.is_empty(),
        "{} of {} connections failed: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    ensure!(ok > 10, "only {ok} connections");
    ensure!(
        slowest < Duration::from_millis(500),
        "/healthz took {slowest:?}"
    );
    let list = agent.cli(&["lb", "list"])?;
    ensure!(
        list.contains("10.96.0.80:80") && !list.contains("10.96.0.84:80"),
        "the live service was displaced:\n{list}"
    );
    let text = agent.metrics()?;
    let problems = |reason: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("sluice_manifest_problems") && l.contains(reason))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // The Service and its EndpointSlice.
    ensure!(problems("\"duplicate\"") == 2.0, "{text}");
    ensure!(problems("\"unparseable\"") >= 1.0, "{text}");
    Ok(())
}

/// A ClusterIP service `name` at `vip` on two endpoints, `b` and one that
/// is not ready (kept in a slot, never picked): three entries of
/// `sl_svc4`. With `annotations` under `metadata:`.
fn small(name: &str, vip: &str, annotations: &str, b: Ipv4Addr) -> String {
    service(name, vip, "10.96.9.9", b)
        .replace("  externalIPs: [10.96.9.9]\n", "")
        .replace(
            &format!("  name: {name}\n  namespace: default\nspec:"),
            &format!("  name: {name}\n  namespace: default\n{annotations}spec:"),
        )
        .replace(
            &format!("- addresses: [\"{b}\"]\n  conditions: {{ready: true}}\n"),
            &format!("- addresses: [\"{b}\"]\n  conditions: {{ready: true}}\n- addresses: [\"10.20.9.9\"]\n  conditions: {{ready: false}}\n"),
        )
}

/// Issue 18, refusals: a service refused because the service map is full
/// is programmed in the very reconcile that frees room (not at the next
/// periodic resync), and a Maglev service that finds the table map full is
/// balanced by flow hash, reported, and gets its table as soon as one
/// frees.
#[test]
fn refused_services_take_freed_room_at_once_and_maglev_falls_back_cleanly() -> Result<()> {
    let topo = Topology::new(1, 1)?;
    let _backend = servers::tcp_greeter(&topo.backends[0].ns, 8080, "backend-0")?;
    let b0 = topo.backends[0].ip;
    let dir = ManifestDir::create()?;
    dir.write("a.yaml", &small("a", "10.96.1.1", "", b0))?;
    dir.write("b.yaml", &small("b", "10.96.1.2", "", b0))?;
    dir.write("z.yaml", &small("z", "10.96.1.3", "", b0))?;
    let maglev = "  annotations:\n    service.sluice.dev/lb-algorithm: maglev\n";
    dir.write("m1.yaml", &small("m1", "10.96.2.1", maglev, b0))?;
    dir.write("m2.yaml", &small("m2", "10.96.2.2", maglev, b0))?;
    // Three entries each, placed in name order (a, b, m1, m2, z): 14
    // entries hold all but z.
    let mut agent = Agent::start(
        &topo,
        &format!("dir:{}", dir.path().display()),
        &[
            "--services-map-size",
            "14",
            "--maglev-map-size",
            "2",
            "--sync-period",
            "1h",
        ],
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    let list = agent.cli(&["lb", "list"])?;
    ensure!(
        list.contains("10.96.1.1:80")
            && list.contains("10.96.1.2:80")
            && !list.contains("10.96.1.3:80"),
        "expected z refused:\n{list}"
    );
    agent.wait_metric(
        "sluice_refused_service_ports{reason=\"maps_full\"}",
        1.0,
        Duration::from_secs(5),
    )?;
    // A third Maglev service finds the table map full.
    dir.write("m3.yaml", &small("m3", "10.96.2.3", maglev, b0))?;
    // (m3 needs 3 entries too: remove b to make room for it.)
    dir.remove("b.yaml")?;
    let client = &topo.clients[0].ns;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let list = agent.cli(&["lb", "list"])?;
        let maglev_rows = list.lines().filter(|l| l.contains("[maglev]")).count();
        if list.contains("10.96.2.3:80") {
            ensure!(maglev_rows == 2, "three tables in a map of two:\n{list}");
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "m3 not programmed:\n{list}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.wait_metric(
        "sluice_maglev_fallback_service_ports",
        1.0,
        Duration::from_secs(5),
    )?;
    let greeting = sluice_tests::clients::tcp_hello(
        client,
        std::net::SocketAddrV4::new(Ipv4Addr::new(10, 96, 2, 3), 80),
    )?;
    ensure!(greeting.starts_with("backend-0"), "{greeting}");
    // z is still refused (m3 took b's room). Removing a frees room for z,
    // and removing m1 frees a table for m3: both at once, not at the
    // next resync (an hour away).
    dir.remove("a.yaml")?;
    dir.remove("m1.yaml")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let list = agent.cli(&["lb", "list"])?;
        let m3_maglev = list
            .lines()
            .any(|l| l.contains("10.96.2.3:80") && l.contains("[maglev]"));
        if list.contains("10.96.1.3:80") && m3_maglev {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "room freed but not taken:\n{list}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.wait_metric(
        "sluice_maglev_fallback_service_ports",
        0.0,
        Duration::from_secs(5),
    )?;
    agent.wait_metric(
        "sluice_refused_service_ports{reason=\"maps_full\"}",
        0.0,
        Duration::from_secs(5),
    )?;
    let log = agent.log();
    ensure!(
        log.matches("Maglev table maps full").count() == 1,
        "the fallback must be reported once:\n{log}"
    );
    Ok(())
}
