//! `sluice agent`: wires the datapath, the device manager, the admin
//! server, a source and the sync task together, and shuts down on
//! SIGTERM/SIGINT leaving the pinned datapath running (a second signal
//! exits at once).

use std::{collections::BTreeSet, path::Path, sync::Arc, time::Duration};

use anyhow::{anyhow, Context, Result};
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};
use sluice_common::config::{CFG_F_SOCK_PODS, CFG_F_SOCK_PODS_LOCAL};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::{mpsc, watch},
    task::JoinSet,
};
use tracing::{info, warn};

use crate::{
    admin::{self, Admin},
    cli::{AgentArgs, DetectLocalMode, SocketLb, Source},
    datapath::{Datapath, MapSizes, MapWriter, XdpMode},
    devices::{Devices, Xdp},
    health::Health,
    metrics::Metrics,
    netdev,
    reconcile::Reconciler,
    sources,
    sync::{Sync, SyncConfig},
    translate::{IpNet, LocalDetector, TranslateConfig},
};

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

async fn kube_client(path: Option<&Path>) -> Result<Client> {
    let config = match path {
        Some(p) => {
            let kubeconfig = Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => Config::infer()
            .await
            .context("no in-cluster config and no kubeconfig")?,
    };
    Ok(Client::try_from(config)?)
}

/// This node's addresses within `--nodeport-addresses`.
fn nodeport_addresses(cidrs: &[String]) -> Result<Vec<std::net::IpAddr>> {
    let nets: Vec<IpNet> = cidrs
        .iter()
        .map(|c| IpNet::parse(c).ok_or_else(|| anyhow!("invalid --nodeport-addresses entry `{c}`")))
        .collect::<Result<_>>()?;
    Ok(netdev::addresses()
        .into_iter()
        .filter(|a| nets.iter().any(|n| n.contains(*a)))
        .collect())
}

fn nonempty(flag: &Option<String>) -> Option<&str> {
    flag.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// Local-traffic detection from kube-proxy's flags.
fn local_detector(args: &AgentArgs) -> Result<LocalDetector> {
    match args.detect_local_mode {
        DetectLocalMode::ClusterCidr => {
            let nets: Vec<IpNet> = args
                .cluster_cidr
                .iter()
                .filter(|c| !c.trim().is_empty())
                .map(|c| {
                    IpNet::parse(c).ok_or_else(|| anyhow!("invalid --cluster-cidr entry `{c}`"))
                })
                .collect::<Result<_>>()?;
            if nets.is_empty() {
                warn!("--detect-local-mode ClusterCIDR without --cluster-cidr: pods are not told from other sources (no masquerade for outside traffic to cluster IPs, no externalTrafficPolicy Local short-circuit for pods)");
                return Ok(LocalDetector::Off);
            }
            info!(cidrs = ?args.cluster_cidr, "local traffic: sources in --cluster-cidr");
            Ok(LocalDetector::ClusterCidr(nets))
        }
        DetectLocalMode::NodeCidr => {
            info!("local traffic: sources in this node's spec.podCIDRs");
            Ok(LocalDetector::NodeCidr)
        }
        DetectLocalMode::BridgeInterface => {
            let bridge = nonempty(&args.pod_bridge_interface).ok_or_else(|| {
                anyhow!("--detect-local-mode BridgeInterface needs --pod-bridge-interface")
            })?;
            info!(
                bridge,
                "local traffic: packets entering through the pods' bridge"
            );
            Ok(LocalDetector::BridgeInterface(bridge.to_owned()))
        }
        DetectLocalMode::InterfaceNamePrefix => {
            let prefix = nonempty(&args.pod_interface_name_prefix).ok_or_else(|| {
                anyhow!("--detect-local-mode InterfaceNamePrefix needs --pod-interface-name-prefix")
            })?;
            info!(
                prefix,
                "local traffic: packets entering through the pods' devices"
            );
            Ok(LocalDetector::InterfaceNamePrefix(prefix.to_owned()))
        }
    }
}

/// The globs of `--pod-devices`, blank ones left out.
fn named_pod_devices(args: &AgentArgs) -> Vec<String> {
    args.pod_devices
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The devices host routing takes packets from and hands them to
/// (`--host-routing`): `--pod-devices`, or the pods' devices of
/// `--detect-local-mode InterfaceNamePrefix`, whatever `--socket-lb` is.
fn host_routing_devices(args: &AgentArgs, local: &LocalDetector) -> Vec<String> {
    if !args.host_routing {
        return Vec::new();
    }
    let mut patterns = named_pod_devices(args);
    if let LocalDetector::InterfaceNamePrefix(prefix) = local {
        patterns.push(format!("{prefix}*"));
    }
    if patterns.is_empty() {
        warn!("--host-routing without --pod-devices (or --detect-local-mode InterfaceNamePrefix): no device is known as a pod's, every packet takes the node's stack");
    } else {
        info!(devices = ?patterns, "host routing: DNATed packets between these devices skip the node's IP stack");
    }
    patterns
}

/// The pods' devices: `--pod-devices`, or else those of interface-based
/// local-traffic detection. An upgrade swaps them first, whatever runs at
/// their egress.
fn known_pod_devices(args: &AgentArgs, local: &LocalDetector) -> Vec<String> {
    let mut patterns = named_pod_devices(args);
    if patterns.is_empty() {
        match local {
            LocalDetector::InterfaceNamePrefix(prefix) => patterns.push(format!("{prefix}*")),
            LocalDetector::BridgeInterface(bridge) => patterns.push(bridge.clone()),
            _ => {}
        }
    }
    patterns
}

/// Whether the egress of the pods' devices (`patterns`, from
/// `known_pod_devices`) runs `sl_egress_pod`: not unless the socket
/// programs serve every pod (`--socket-lb=all`; for devices not named,
/// also on the cgroup2 mount's root).
fn pod_egress(
    args: &AgentArgs,
    local: &LocalDetector,
    patterns: &[String],
    cgroup: Option<&std::path::Path>,
) -> bool {
    // Named by the operator: its pods' processes are under --cgroup-root.
    let named = !named_pod_devices(args).is_empty();
    if patterns.is_empty() {
        return false;
    }
    let whole_node = match cgroup {
        Some(path) => crate::datapath::cgroup2_mount().is_some_and(|root| {
            let same = std::fs::canonicalize(path).ok();
            same.is_some() && same == std::fs::canonicalize(root).ok()
        }),
        None => false,
    };
    if args.ipv6
        && matches!(local, LocalDetector::ClusterCidr(nets) if !nets.iter().any(|n| n.addr.is_ipv6()))
    {
        info!(
            devices = ?patterns,
            "pods' devices keep sl_egress: --cluster-cidr names no IPv6 network, so the datapath cannot tell an IPv6 pod's flow on the TC path (give one, or --ipv6=false)"
        );
        return false;
    }
    if matches!(local, LocalDetector::Off) {
        info!(
            devices = ?patterns,
            "pods' devices keep sl_egress: without local-traffic detection (--cluster-cidr or another --detect-local-mode) the datapath cannot tell a pod's flow on the TC path"
        );
        return false;
    }
    if args.socket_lb.mode != SocketLb::All || !(named || whole_node) {
        info!(
            devices = ?patterns,
            "pods' devices keep sl_egress: the socket programs do not serve every pod (--socket-lb=all, on the cgroup2 root unless --pod-devices names them)"
        );
        return false;
    }
    info!(devices = ?patterns, "pods' devices run sl_egress_pod");
    true
}

/// Whether every pinned link of a device `patterns` match runs
/// `sl_egress_pod` at egress (and there is one).
fn pod_egress_kept(root: &std::path::Path, patterns: &[String]) -> bool {
    let mut pods = crate::datapath::attached_devices(root)
        .into_iter()
        .filter(|d| patterns.iter().any(|p| crate::netdev::glob(p, d)))
        .peekable();
    pods.peek().is_some()
        && pods.all(|d| {
            crate::datapath::pinned_program(root, &d, crate::datapath::Hook::Egress).as_deref()
                == Some(crate::datapath::EGRESS_POD_PROGRAM)
        })
}

/// A parent may have left SIGTERM/SIGINT blocked; the agent must see them.
fn unblock_termination_signals() {
    // SAFETY: plain signal-mask manipulation on the calling thread, done
    // before the runtime spawns tasks that rely on it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

async fn next_signal() -> Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Runs the sync task (the one writer of the maps) on a thread of its
/// own, in a single-threaded runtime: its reconciles block as long as
/// they write, and on the shared runtime each one moved that worker's
/// other tasks elsewhere (`block_in_place`), so the reconciler's
/// allocations went to a new thread's heap each time. On one thread
/// they stay in one heap (docs/performance.md, issue 17). The receiver
/// says when it ended: `Ok` when it returned, an error when it could
/// not start or panicked.
fn spawn_sync(
    sync: Sync,
    rx: mpsc::Receiver<sources::Envelope>,
    shutdown: watch::Receiver<bool>,
) -> Result<tokio::sync::oneshot::Receiver<()>> {
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sluice-sync".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(sync.run(rx, shutdown)),
                // `ended_tx` dropped unsent: not started.
                Err(e) => return tracing::error!(error = %e, "no runtime for the sync task"),
            }
            let _ = ended_tx.send(());
        })
        .context("starting the sync thread")?;
    Ok(ended_rx)
}

pub async fn agent(args: AgentArgs) -> Result<()> {
    unblock_termination_signals();
    let node_name = args.hostname_override.clone().unwrap_or_else(hostname);
    let sizes = MapSizes {
        services: args.services_map_size,
        backends: args.backends_map_size,
        conntrack: args.conntrack_map_size,
        affinity: args.affinity_map_size,
        maglev: args.maglev_map_size,
        preallocate: args.preallocate_maps,
    };
    let root = &args.bpf.bpf_root;
    let health = Arc::new(Health::new(
        args.healthz_max_pending.0,
        args.healthz_max_api_down.0,
    ));
    let metrics = Arc::new(Metrics::new());

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // The source starts first: its lists stream in (decoded, queued for
    // the sync task) while the programs load and the verifier checks
    // them, about 0.6 s of one CPU (docs/performance.md, issue 17).
    let (tx, rx) = mpsc::channel(1024);
    match &args.source {
        Source::Kube => {
            let client = kube_client(args.kubeconfig.as_deref()).await?;
            tasks.spawn(sources::kube::run(
                client,
                node_name.clone(),
                tx,
                health.clone(),
                metrics.clone(),
            ));
        }
        Source::Dir(dir) => {
            info!(dir = %dir.display(), "reading manifests from a directory");
            tasks.spawn(sources::dir::run(
                dir.clone(),
                args.dir_poll_interval.0,
                tx,
                health.clone(),
                metrics.clone(),
                shutdown_rx.clone(),
            ));
        }
    }

    // On `main`'s own thread (not a runtime worker): the workers decode
    // the lists meanwhile.
    let (mut datapath, maps) = Datapath::load_logging(root, &sizes, args.datapath_log_level)
        .context("loading the datapath")?;
    let datapath_logger = datapath.take_logger();
    // Without socket-level balancing no program reads the frontends'
    // one-lookup entries (`sl_sockfe4`/`sl_sockfe6`): none is kept.
    let mut reconciler = Reconciler::with_sock_picks(
        MapWriter::new(maps),
        &sizes,
        args.drain_timeout.0,
        args.socket_lb.mode != SocketLb::Off,
    )
    .context("adopting the pinned maps")?;
    reconciler.set_config_flags(
        sluice_common::config::CFG_F_EVENTS_MASK,
        args.monitor_events.flags(args.monitor_trace_sample),
    )?;
    let host_routing = sluice_common::config::CFG_F_HOST_ROUTING;
    reconciler.set_config_flags(
        host_routing,
        if args.host_routing { host_routing } else { 0 },
    )?;
    let socket_lb = args.socket_lb.mode;
    if args.socket_lb.legacy {
        warn!(
            mode = socket_lb.name(),
            "--socket-lb=true|false is deprecated: use --socket-lb=all|host|off (true means host, false off)"
        );
    }
    let local = local_detector(&args)?;
    // Before the socket programs change what they serve and before the
    // device scan swaps this agent's programs into the links: a bit the
    // previous agent set holds only if it was one that runs `sl_egress_pod`
    // on the pods' devices (not 0.1.0, not `host` mode), and it goes now
    // if this agent will not keep every pod on its sockets.
    let cgroup_path = match (&args.cgroup_root, socket_lb) {
        (_, SocketLb::Off) => None,
        (Some(path), _) => Some(path.clone()),
        (None, _) => crate::datapath::cgroup2_mount(),
    };
    let pod_devices = known_pod_devices(&args, &local);
    let pod_egress = pod_egress(&args, &local, &pod_devices, cgroup_path.as_deref());
    let kept = pod_egress && pod_egress_kept(root, &pod_devices);
    reconciler
        .allow_pods_on_sockets(pod_egress, kept)
        .context("writing the pods' socket-balancing bit")?;
    let cgroup = if socket_lb == SocketLb::Off {
        // Links a previous agent pinned go, and the programs (if a
        // previous generation's still run) act on no socket.
        reconciler.set_socket_lb(0, 0)?;
        datapath
            .detach_cgroup()
            .context("detaching socket-level balancing")?;
        None
    } else {
        let cgroup = cgroup_path.clone().context(
            "no cgroup2 mount found for socket-level balancing (use --cgroup-root or --socket-lb=off)",
        )?;
        let mut flags = 0;
        if socket_lb == SocketLb::All {
            flags |= CFG_F_SOCK_PODS;
            if !matches!(local, LocalDetector::Off) {
                flags |= CFG_F_SOCK_PODS_LOCAL;
            }
        }
        reconciler.set_socket_lb(crate::datapath::netns_cookie()?, flags)?;
        Some(cgroup)
    };
    info!(
        node = %node_name,
        bpf_root = %root.display(),
        ipv6 = args.ipv6,
        frontends = reconciler.programmed().frontends.len(),
        backends = reconciler.programmed().backends.len(),
        "datapath loaded; adopted what the maps hold"
    );

    let admin = Admin {
        health: health.clone(),
        metrics: metrics.clone(),
    };
    let healthz = admin::bind(args.healthz_bind_address)
        .await
        .with_context(|| {
            format!(
                "binding --healthz-bind-address {}",
                args.healthz_bind_address
            )
        })?;
    if let Some(logger) = datapath_logger {
        info!(level = ?args.datapath_log_level, "forwarding the datapath's logs");
        tasks.spawn(crate::datapath::log::forward(logger, shutdown_rx.clone()));
    }
    info!(addr = %healthz.local_addr()?, "serving /healthz");
    tasks.spawn(admin.clone().serve(healthz, shutdown_rx.clone()));
    if args.metrics_bind_address != args.healthz_bind_address {
        let listener = admin::bind(args.metrics_bind_address)
            .await
            .with_context(|| {
                format!(
                    "binding --metrics-bind-address {}",
                    args.metrics_bind_address
                )
            })?;
        info!(addr = %listener.local_addr()?, "serving /metrics");
        tasks.spawn(admin.serve(listener, shutdown_rx.clone()));
    }

    // Attach before anything can report ready. The cgroup links and the
    // device links are swapped back to back, so that two program
    // generations run side by side for as short a time as possible.
    if let Some(cgroup) = &cgroup {
        datapath
            .attach_cgroup(cgroup)
            .with_context(|| format!("attaching socket-level balancing to {}", cgroup.display()))?;
        info!(cgroup = %cgroup.display(), mode = socket_lb.name(), "socket-level balancing attached");
    }
    let (ifaces_tx, ifaces_rx) = watch::channel(BTreeSet::new());
    let mut devices = Devices::new(datapath, args.devices.clone())
        .with_pod_devices(pod_devices, pod_egress)
        .with_host_routing(host_routing_devices(&args, &local));
    if local.by_interface() {
        devices = devices.with_local_interfaces(local.clone(), ifaces_tx);
    }
    let (node_addrs_tx, node_addrs_rx) = watch::channel(Vec::new());
    if args.xdp_mode == XdpMode::Off {
        info!("XDP off (--xdp-mode off): every packet goes through TC");
    }
    devices = devices.with_xdp(Xdp::new(
        args.xdp_mode,
        args.xdp_devices
            .iter()
            .filter(|p| !p.trim().is_empty())
            .cloned()
            .collect(),
        node_addrs_rx,
        metrics.clone(),
    ));
    let attached = devices.scan();
    metrics.devices.set(attached as i64);
    // Every pinned link now runs this agent's programs: a migration of the
    // pins (upgrade, rollback, resize) can end.
    devices
        .datapath_mut()
        .finish_migration()
        .context("finishing the migration of the pinned maps")?;
    if attached == 0 {
        warn!(patterns = ?args.devices, "no device matches --devices yet; will keep looking");
    }
    tasks.spawn(devices.run(
        args.device_scan_interval.0,
        metrics.clone(),
        shutdown_rx.clone(),
    ));

    let translate = TranslateConfig {
        node_name: node_name.clone(),
        node_addresses: nodeport_addresses(&args.nodeport_addresses)?,
        ipv6: args.ipv6,
        masquerade_all: args.masquerade_all,
        local,
        service_cidrs: args
            .service_cluster_ip_range
            .iter()
            .filter(|c| !c.trim().is_empty())
            .map(|c| {
                IpNet::parse(c)
                    .ok_or_else(|| anyhow!("invalid --service-cluster-ip-range entry `{c}`"))
            })
            .collect::<Result<_>>()?,
    };
    let (checks_tx, checks_rx) = watch::channel(Default::default());
    tasks.spawn(crate::healthcheck::run(
        checks_rx,
        health.clone(),
        shutdown_rx.clone(),
    ));
    let sync = Sync::new(
        SyncConfig {
            translate,
            sizes,
            gc_interval: args.conntrack_gc_interval.0,
            drain_interval: args.drain_scan_interval.0,
            resync_interval: args.sync_period.0,
        },
        reconciler,
        health.clone(),
        metrics.clone(),
        checks_tx,
    )
    .with_local_interfaces(ifaces_rx)
    .with_node_addresses(node_addrs_tx);
    let mut sync_task = spawn_sync(sync, rx, shutdown_rx.clone())?;

    tokio::select! {
        r = next_signal() => r?,
        ended = &mut sync_task => {
            tasks.abort_all();
            let how = if ended.is_ok() {
                "returned"
            } else {
                "panicked or could not start; see above"
            };
            return Err(anyhow!("the sync task ended unexpectedly (it {how})"));
        }
    }
    info!("shutting down; the datapath stays attached and keeps forwarding");
    let _ = shutdown_tx.send(true);
    tokio::select! {
        _ = &mut sync_task => {}
        _ = next_signal() => warn!("second signal: exiting now"),
        _ = tokio::time::sleep(Duration::from_secs(10)) => {
            // It stops between steps: exiting now would cut a reconcile
            // between two writes (the write order keeps the maps usable,
            // as after a SIGKILL, but the step is worth finishing).
            warn!("sync task did not stop in 10s: waiting for its current step (a second signal exits now)");
            tokio::select! {
                _ = &mut sync_task => {}
                _ = next_signal() => warn!("second signal: exiting now"),
            }
        }
    }
    tasks.abort_all();
    Ok(())
}
