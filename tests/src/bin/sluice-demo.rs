//! `cargo xtask demo`: sluice's main job on an embedded default, with no
//! cluster. A node namespace with a client pod and three backend pods,
//! `sluice agent --source dir:` reading the manifests in deploy/demo/, and
//! every kind of frontend (ClusterIP, NodePort, LoadBalancer, external IP)
//! and a graceful termination shown live. Cleans up on exit and on Ctrl-C;
//! with `SLUICE_DEMO_HOLD=1` it waits for Enter before cleaning up, so the
//! pinned maps can be explored with `sluice` and `bpftool`.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use sluice_tests::{
    agent::{Agent, ManifestDir},
    clients::{self, Stream},
    lb::vip,
    servers, sweep, Topology,
};

const VIP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 10);
const EDGE_VIP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 20);
const EDGE_LB: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 200, 0, 20);
const EDGE_EXTERNAL: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 200, 0, 10);

fn step(n: u32, text: &str) {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        println!("\n\x1b[1m[{n}/6] {text}\x1b[0m");
    } else {
        println!("\n[{n}/6] {text}");
    }
}

fn show(agent: &Agent, args: &[&str]) -> Result<()> {
    println!("\n  $ sluice {}", args.join(" "));
    for line in agent.cli(args)?.lines() {
        println!("    {line}");
    }
    Ok(())
}

/// Blocks SIGINT/SIGTERM in every thread and handles them on one thread
/// that removes what this process created, then exits.
fn install_cleanup_on_signal() -> Result<()> {
    // SAFETY: plain signal-mask manipulation before any thread exists.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            bail!("cannot block signals");
        }
        std::thread::spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            eprintln!("\ninterrupted: removing the demo's namespaces, pins and files");
            sweep::sweep_own();
            std::process::exit(130);
        });
    }
    Ok(())
}

fn tally(outcomes: Vec<std::io::Result<String>>) -> BTreeMap<String, usize> {
    let mut hits = BTreeMap::new();
    for o in outcomes {
        *hits
            .entry(o.unwrap_or_else(|e| format!("error: {e}")))
            .or_default() += 1;
    }
    hits
}

fn print_tally(hits: &BTreeMap<String, usize>) {
    for (name, n) in hits {
        println!("      {name:<10} {:<50} {n}", "#".repeat(*n / 2));
    }
}

fn wait_for(mut f: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let start = Instant::now();
    while !f()? {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the agent did not apply the change within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(start.elapsed())
}

fn backend_state(agent: &Agent, addr: &str) -> Result<Option<String>> {
    let rows: serde_json::Value = serde_json::from_str(&agent.cli(&["lb", "list", "--json"])?)?;
    Ok(rows
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["backends"].as_array().cloned().unwrap_or_default())
        .find(|b| b["address"] == addr)
        .map(|b| b["state"].as_str().unwrap_or_default().to_owned()))
}

fn main() -> Result<()> {
    sluice_tests::require_root()?;
    install_cleanup_on_signal()?;
    let manifests = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/demo"));
    let read = |name: &str| {
        std::fs::read_to_string(manifests.join(name))
            .with_context(|| format!("reading {}", manifests.join(name).display()))
    };
    let web_yaml = read("web.yaml")?;
    let edge_yaml = read("edge.yaml")?;

    println!("sluice demo: one node, three backend pods, two services; no cluster needed.");
    step(
        1,
        "Building the node: network namespaces for the node, client-0, backend-0..2 and a host outside",
    );
    let mut topo = Topology::new(1, 3)?;
    topo.add_external()?;
    let _servers = topo
        .backends
        .iter()
        .map(|b| servers::tcp_greeter(&b.ns, 8080, &b.name))
        .collect::<Result<Vec<_>>>()?;
    for pod in topo
        .clients
        .iter()
        .chain(&topo.backends)
        .chain(&topo.externals)
    {
        println!(
            "      {:<10} {:<11} veth {} in the node",
            pod.name, pod.ip, pod.host_if
        );
    }

    step(
        2,
        "Starting the agent on the embedded manifests (deploy/demo/web.yaml, edge.yaml)",
    );
    let dir = ManifestDir::create()?;
    dir.write("web.yaml", &web_yaml)?;
    dir.write("edge.yaml", &edge_yaml)?;
    let started = Instant::now();
    let mut agent = Agent::start(&topo, &format!("dir:{}", dir.path().display()), &[])?;
    agent.wait_ready(Duration::from_secs(30))?;
    println!(
        "      sluice agent --source dir:{} --devices 'c*,b*,e*' ready in {:.0} ms",
        dir.path().display(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    show(&agent, &["lb", "list"])?;

    step(3, "100 requests from client-0 to 10.96.0.10:80");
    let client = &topo.clients[0].ns;
    print_tally(&tally(clients::tcp_hellos(client, vip(VIP, 80), 100)?));

    step(
        4,
        "Every kind of frontend of the LoadBalancer service `edge` (backends 0 and 2)",
    );
    let external = &topo.externals[0].ns;
    let node_ip = topo.node_address(0);
    for (who, ns, addr, kind) in [
        ("client-0", client, vip(EDGE_VIP, 80), "ClusterIP"),
        ("external-0", external, vip(node_ip, 30080), "NodePort"),
        ("external-0", external, vip(EDGE_LB, 80), "LoadBalancer"),
        (
            "external-0",
            external,
            vip(EDGE_EXTERNAL, 80),
            "external IP",
        ),
    ] {
        let hits = tally(clients::tcp_hellos(ns, addr, 20)?);
        let spread = hits
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!("      {who:<10} -> {kind:<12} {addr:<18} 20 requests: {spread}");
    }

    step(5, "Graceful termination of backend-1, live");
    let mut stream = (0..100)
        .map(|_| Stream::connect(client, vip(VIP, 80)))
        .find(|s| s.as_ref().map_or(true, |s| s.backend == "backend-1"))
        .context("no connection landed on backend-1")??;
    println!("      a long-lived connection from client-0 is served by {}; it echoes a line every 100 ms", stream.backend);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let pinger = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match stream.ping() {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                std::thread::sleep(Duration::from_millis(100));
            }
            stream
        })
    };

    let b1 = "10.20.1.2:8080";
    let terminating = web_yaml.replacen(
        "name: backend-1}\n  conditions: {ready: true, serving: true, terminating: false}",
        "name: backend-1}\n  conditions: {ready: false, serving: false, terminating: true}",
        1,
    );
    dir.write("web.yaml", &terminating)?;
    println!("      edited web.yaml: backend-1 conditions -> ready: false, terminating: true");
    let took = wait_for(|| Ok(backend_state(&agent, b1)?.as_deref() == Some("terminating")))?;
    println!(
        "      the agent programmed it {:.0} ms after the edit",
        took.as_secs_f64() * 1000.0
    );
    println!("      100 new requests (none may reach backend-1):");
    print_tally(&tally(clients::tcp_hellos(client, vip(VIP, 80), 100)?));
    println!(
        "      the long-lived connection: {} echoes, {} errors",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    show(&agent, &["lb", "list"])?;

    let gone: String = terminating
        .split("- addresses: [\"10.20.1.2\"]")
        .next()
        .unwrap_or_default()
        .to_owned()
        + &terminating
            .split_once("- addresses: [\"10.20.2.2\"]")
            .map(|(_, rest)| format!("- addresses: [\"10.20.2.2\"]{rest}"))
            .unwrap_or_default();
    dir.write("web.yaml", &gone)?;
    println!("\n      edited web.yaml: backend-1 removed from the EndpointSlice (its pod is gone)");
    wait_for(|| Ok(backend_state(&agent, b1)?.as_deref() == Some("draining")))?;
    // A few more echoes while it drains.
    let echoes = ok.load(Ordering::Relaxed) + 5;
    wait_for(|| Ok(ok.load(Ordering::Relaxed) >= echoes))?;
    println!(
        "      the long-lived connection: {} echoes, {} errors (it drains, it is not cut)",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    show(&agent, &["lb", "list"])?;

    step(6, "The connection closes; backend-1 leaves the maps");
    stop.store(true, Ordering::Relaxed);
    let stream = pinger
        .join()
        .map_err(|_| anyhow::anyhow!("pinger panicked"))?;
    println!(
        "      final: {} echoes, {} errors",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    drop(stream);
    let took = wait_for(|| Ok(backend_state(&agent, b1)?.is_none()))?;
    println!(
        "      backend-1 removed {:.0} ms after its last flow closed (IPVS re-checked every 60 s)",
        took.as_secs_f64() * 1000.0
    );
    show(&agent, &["lb", "list"])?;

    if std::env::var_os("SLUICE_DEMO_HOLD").is_some() {
        println!(
            "\nHolding (SLUICE_DEMO_HOLD): the node is namespace {}, the pins are under {}; press Enter to clean up.",
            topo.node.name(),
            topo.bpf.path().display()
        );
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    agent.stop()?;
    println!("\nDone. Removing the demo's namespaces, pins and files.");
    Ok(())
}
