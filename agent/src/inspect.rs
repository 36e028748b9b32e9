//! The operator commands: `sluice lb list`, `sluice ct list`,
//! `sluice status`. They read the pinned maps directly, so they work while
//! the agent is down (and never write).

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs},
    path::Path,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sluice_common::{
    conntrack::{CT_F_POD, CT_F_RST, CT_F_RX_CLOSING, CT_F_SEEN_REPLY, CT_F_SYN, CT_F_TX_CLOSING},
    service::{
        SVC_F_DRAINING, SVC_F_DROP_EMPTY, SVC_F_INTERNAL, SVC_F_MAGLEV, SVC_F_MASQ_OUTSIDE,
        SVC_F_NODE_DENIED,
    },
    BackendState, Ct4Key, Ct6Key, CtEntry, CtKind, FrontendKind, Stat,
};

use crate::{
    cli::{CtListArgs, ListArgs, StatusArgs},
    conntrack,
    datapath::{
        attached_devices, map_fill, migration_state, read_map_state, socket_lb_mode, xdp_devices,
        DatapathError, Maps,
    },
    model::Scope,
    reconcile::{endpoint_of, BackendId},
};

/// Opens the pinned maps with a message an operator can act on.
fn open(root: &Path) -> Result<Maps> {
    if !root.exists() {
        bail!(
            "no sluice datapath at {}: the agent has not run on this node, uses another --bpf-root, or bpffs is not mounted",
            root.display()
        );
    }
    Maps::open_pinned(root).map_err(|e| {
        let denied = matches!(&e, DatapathError::Map { source: aya::maps::MapError::SyscallError(s), .. }
            if s.io_error.kind() == std::io::ErrorKind::PermissionDenied);
        if denied {
            anyhow::anyhow!("reading BPF maps needs root (CAP_BPF and CAP_SYS_ADMIN): {e}")
        } else {
            anyhow::Error::new(e).context(format!("opening the maps under {}", root.display()))
        }
    })
}

fn kind_name(kind: FrontendKind) -> &'static str {
    match kind {
        FrontendKind::ClusterIp => "ClusterIP",
        FrontendKind::NodePort => "NodePort",
        FrontendKind::LoadBalancer => "LoadBalancer",
        FrontendKind::ExternalIp => "ExternalIP",
    }
}

#[derive(Serialize)]
struct BackendRow {
    slot: usize,
    id: u32,
    address: String,
    state: &'static str,
    /// Live flows at this moment (open connections, fresh UDP flows).
    flows: u32,
}

#[derive(Serialize)]
struct FrontendRow {
    frontend: String,
    protocol: &'static str,
    kind: &'static str,
    svc_id: u32,
    active: u16,
    fallback: u16,
    draining_service: bool,
    drop_when_empty: bool,
    /// New flows by the frontend's Maglev table (`sl_maglev4`/`6`).
    maglev: bool,
    /// `external` (every frontend) or `internal`: the entries that sources
    /// inside the cluster take at an externalTrafficPolicy Local frontend.
    scope: &'static str,
    /// An external frontend whose sources inside the cluster take its
    /// internal scope.
    has_internal_scope: bool,
    /// Flows from sources outside the cluster are SNATed to the node.
    masquerade_outside: bool,
    /// Its source ranges admit none of the node's addresses: the node's
    /// own sockets may not connect.
    node_denied: bool,
    backends: Vec<BackendRow>,
}

fn frontends(maps: &Maps) -> Result<Vec<FrontendRow>> {
    let (state, _) = read_map_state(maps)?;
    // Live flows: conntrack's and the node's own sockets'.
    let flows: HashMap<BackendId, u32> = conntrack::live_flows(maps, &state.backends)?;
    let mut keys: Vec<_> = state.frontends.keys().collect();
    keys.sort();
    Ok(keys
        .into_iter()
        .filter_map(|key| {
            let fe = state.frontends.get(&key)?;
            let backends = fe
                .slots
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let b = state.backends.get(id);
                    BackendRow {
                        slot: i + 1,
                        id: id.get(),
                        address: b
                            .map_or_else(|| "(missing)".into(), |b| endpoint_of(&b).to_string()),
                        state: b.map_or("missing", |b| BackendState::from_u8(b.state).as_str()),
                        flows: flows.get(id).copied().unwrap_or(0),
                    }
                })
                .collect();
            Some(FrontendRow {
                frontend: SocketAddr::new(key.addr, key.port).to_string(),
                protocol: key.proto.as_str(),
                kind: kind_name(fe.kind()),
                svc_id: fe.svc_id.get(),
                active: fe.active,
                fallback: fe.fallback,
                draining_service: fe.flags & SVC_F_DRAINING != 0,
                drop_when_empty: fe.flags & SVC_F_DROP_EMPTY != 0,
                maglev: fe.flags & SVC_F_MAGLEV != 0,
                scope: match key.scope {
                    Scope::External => "external",
                    Scope::Internal => "internal",
                },
                has_internal_scope: fe.flags & SVC_F_INTERNAL != 0,
                masquerade_outside: fe.flags & SVC_F_MASQ_OUTSIDE != 0,
                node_denied: fe.flags & SVC_F_NODE_DENIED != 0,
                backends,
            })
        })
        .collect())
}

/// `sluice lb list`.
pub fn lb_list(args: &ListArgs) -> Result<()> {
    let maps = open(&args.bpf.bpf_root)?;
    let rows = frontends(&maps)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    print!("{}", render_lb(&rows));
    Ok(())
}

fn render_lb(rows: &[FrontendRow]) -> String {
    // IPv6 addresses are long: the address columns grow to fit (the
    // backend column is indented 4 more, under the frontend's).
    let w = rows
        .iter()
        .flat_map(|r| {
            std::iter::once(r.frontend.len()).chain(r.backends.iter().map(|b| b.address.len() + 4))
        })
        .max()
        .map_or(26, |n| n.max(25) + 1);
    let wb = w - 1;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5}{:<w$}{:<14}{:<7}SELECTABLE",
        "PROT", "FRONTEND", "KIND", "SVC"
    );
    let _ = writeln!(
        out,
        "  -> {:<wb$}{:<21}{:>6}  ID",
        "BACKEND", "STATE", "FLOWS"
    );
    for r in rows {
        let mut notes = format!("{} active", r.active);
        if r.fallback > 0 {
            let _ = write!(notes, ", {} terminating-serving (fallback)", r.fallback);
        }
        if r.draining_service {
            notes.push_str(" [service gone, draining]");
        }
        if r.drop_when_empty {
            notes.push_str(" [drops when empty]");
        }
        if r.maglev {
            notes.push_str(" [maglev]");
        }
        if r.scope == "internal" {
            notes.push_str(" [pods and the node]");
        } else if r.has_internal_scope {
            notes.push_str(" [clients outside the cluster]");
        }
        if r.masquerade_outside {
            notes.push_str(" [masquerades outside clients]");
        }
        if r.node_denied {
            notes.push_str(" [source ranges deny the node]");
        }
        let _ = writeln!(
            out,
            "{:<5}{:<w$}{:<14}{:<7}{}",
            r.protocol, r.frontend, r.kind, r.svc_id, notes
        );
        for b in &r.backends {
            let _ = writeln!(
                out,
                "  -> {:<wb$}{:<21}{:>6}  {}",
                b.address, b.state, b.flows, b.id
            );
        }
    }
    out
}

#[derive(Serialize)]
struct CtRow {
    proto: &'static str,
    kind: &'static str,
    src: String,
    dst: String,
    /// The entry's NAT address: the frontend for replies, the SNAT
    /// source for forward entries of SNATed flows; none otherwise.
    nat: Option<String>,
    /// What the datapath rewrites, e.g. `dst 10.20.0.2:8080` on a forward
    /// entry, `src 10.96.0.10:80` on a reply.
    rewrite: String,
    backend_id: u32,
    svc_id: u32,
    flags: Vec<&'static str>,
    idle_seconds: f64,
}

fn flag_names(flags: u8) -> Vec<&'static str> {
    [
        (CT_F_SYN, "syn"),
        (CT_F_SEEN_REPLY, "replied"),
        (CT_F_TX_CLOSING, "client-fin"),
        (CT_F_RX_CLOSING, "backend-fin"),
        (CT_F_RST, "rst"),
        (CT_F_POD, "pod"),
    ]
    .into_iter()
    .filter(|(bit, _)| flags & bit != 0)
    .map(|(_, n)| n)
    .collect()
}

/// A conntrack key of either family, as socket addresses.
struct Tuple {
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
    v6: bool,
}

impl Tuple {
    fn v4(k: &Ct4Key) -> Self {
        Self {
            src: SocketAddr::new(IpAddr::from(k.src), k.sport),
            dst: SocketAddr::new(IpAddr::from(k.dst), k.dport),
            proto: k.proto,
            v6: false,
        }
    }

    fn v6(k: &Ct6Key) -> Self {
        Self {
            src: SocketAddr::new(IpAddr::from(k.src), k.sport),
            dst: SocketAddr::new(IpAddr::from(k.dst), k.dport),
            proto: k.proto,
            v6: true,
        }
    }

    /// A 16-byte value address in this tuple's family.
    fn addr_of(&self, a: &[u8; 16]) -> IpAddr {
        if self.v6 {
            IpAddr::from(*a)
        } else {
            IpAddr::from([a[0], a[1], a[2], a[3]])
        }
    }
}

/// `sluice ct list`.
pub fn ct_list(args: &CtListArgs) -> Result<()> {
    let maps = open(&args.bpf.bpf_root)?;
    let (state, _) = read_map_state(&maps)?;
    let backend_filter: Option<u32> = match &args.backend {
        None => None,
        Some(s) => Some(match s.parse::<u32>() {
            Ok(id) => id,
            Err(_) => {
                let addr: SocketAddr = s.parse().context("--backend takes an id or ADDR:PORT")?;
                state
                    .backends
                    .iter()
                    .find(|(_, b)| {
                        let ep = endpoint_of(b);
                        ep.addr == addr.ip() && ep.port == addr.port()
                    })
                    .map(|(id, _)| id.get())
                    .with_context(|| format!("no backend {addr} in the maps"))?
            }
        }),
    };
    let now = conntrack::monotonic_ns();
    let mut entries: Vec<(Tuple, CtEntry)> = conntrack::read_all(&maps)?
        .into_iter()
        .map(|(k, e)| (Tuple::v4(&k), e))
        .collect();
    entries.extend(
        conntrack::read_all6(&maps)?
            .into_iter()
            .map(|(k, e)| (Tuple::v6(&k), e)),
    );
    let mut rows = Vec::new();
    for (key, e) in entries {
        let forward = e.kind == CtKind::Forward as u8;
        let snat = e.flags & sluice_common::conntrack::CT_F_SNAT != 0;
        let nat = SocketAddr::new(key.addr_of(&e.nat_addr), e.nat_port);
        let peer = SocketAddr::new(key.addr_of(&e.peer_addr), e.peer_port);
        let backend = state.backends.get(&BackendId(e.backend_id)).map(|b| {
            let ep = endpoint_of(&b);
            SocketAddr::new(ep.addr, ep.port)
        });
        // What the datapath rewrites on the packets of this entry.
        let rewrite = match (forward, snat) {
            (true, _) => {
                let to = backend.map_or_else(
                    || format!("backend #{} (gone)", e.backend_id),
                    |b| b.to_string(),
                );
                if snat {
                    format!("dst {to} src {nat}")
                } else {
                    format!("dst {to}")
                }
            }
            (false, false) => format!("src {nat}"),
            (false, true) => format!("src {nat} dst {peer}"),
        };
        let (src, dst) = (key.src, key.dst);
        if let Some(svc) = args.service {
            let frontend = if forward { dst } else { nat };
            if frontend != svc {
                continue;
            }
        }
        if backend_filter.is_some_and(|id| id != e.backend_id) {
            continue;
        }
        rows.push(CtRow {
            proto: if key.proto == sluice_common::IPPROTO_TCP {
                "TCP"
            } else {
                "UDP"
            },
            kind: if forward { "forward" } else { "reply" },
            src: src.to_string(),
            dst: dst.to_string(),
            nat: (!forward || snat).then(|| nat.to_string()),
            rewrite,
            backend_id: e.backend_id,
            svc_id: e.svc_id,
            flags: flag_names(e.flags),
            idle_seconds: Duration::from_nanos(now.saturating_sub(e.last_seen_ns)).as_secs_f64(),
        });
    }
    rows.sort_by(|a, b| (a.kind, &a.src, &a.dst).cmp(&(b.kind, &b.src, &b.dst)));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    // IPv6 addresses are long: address columns grow to fit.
    let w = rows
        .iter()
        .flat_map(|r| [r.src.len(), r.dst.len()])
        .max()
        .map_or(23, |n| n.max(22) + 1);
    let rw = rows
        .iter()
        .map(|r| r.rewrite.len())
        .max()
        .map_or(24, |n| n.max(23) + 1);
    println!(
        "{:<5}{:<9}{:<w$}{:<w$}{:<rw$}{:>8}  {:<7}FLAGS",
        "PROT", "KIND", "SOURCE", "DESTINATION", "REWRITE", "BACKEND", "IDLE"
    );
    for r in &rows {
        println!(
            "{:<5}{:<9}{:<w$}{:<w$}{:<rw$}{:>8}  {:<7}{}",
            r.proto,
            r.kind,
            r.src,
            r.dst,
            r.rewrite,
            r.backend_id,
            format!("{:.0}s", r.idle_seconds),
            r.flags.join(",")
        );
    }
    println!("{} entries", rows.len());
    Ok(())
}

/// A tiny HTTP/1.1 GET for the agent's health endpoint.
fn http_get(url: &str) -> Result<(u16, String)> {
    let rest = url.strip_prefix("http://").context("only http:// URLs")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let addr = host
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("cannot resolve {host}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    stream.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("malformed HTTP response")?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// `sluice status`.
pub fn status(args: &StatusArgs) -> Result<()> {
    let root = &args.bpf.bpf_root;
    let maps = open(root)?;
    let (state, _) = read_map_state(&maps)?;
    let fill = map_fill(root)
        .with_context(|| format!("counting the entries of the maps under {}", root.display()))?;
    let config = maps.config().unwrap_or_default();
    let events_on = config.flags() & sluice_common::config::CFG_F_EVENTS_DROPS != 0;
    let tracing = config.flags() & sluice_common::config::CFG_F_EVENTS_TRACE != 0;
    let migration = migration_state(root);
    let counters: Vec<(&str, u64)> = Stat::ALL
        .iter()
        .map(|s| (s.name(), maps.stat(*s).unwrap_or(0)))
        .collect();
    let devices = attached_devices(root);
    let xdp = xdp_devices(root);
    let socket_lb = socket_lb_mode(root, &config);
    let host_routing = config.flags() & sluice_common::config::CFG_F_HOST_ROUTING != 0;
    // `sl_sockmark`: whether a never-balanced TCP socket's close skips the
    // `sl_sock` lookup, and how many slots count some socket (a slot that
    // counts one always looks; counts only come down at a close).
    let marks_valid = maps
        .sock_mark(sluice_common::socket::MARKS_VALID)
        .unwrap_or(0)
        == 1;
    let marks_counting = maps
        .sock_marks()
        .map(|m| m.iter().filter(|c| **c > 0).count())
        .unwrap_or(0);
    // `sl_socktab`: balanced TCP sockets held in their cookie's slot.
    let table_held = maps.sock_table.occupied();
    // `sl_sockfe4`/`sl_sockfe6`: frontends a connect answers in one lookup.
    let picks_on = config.flags() & sluice_common::config::CFG_F_SOCK_PICKS != 0;
    let picks =
        maps.sock_picks_v4.keys().flatten().count() + maps.sock_picks_v6.keys().flatten().count();
    let agent = http_get(&args.healthz_url);

    if args.json {
        let agent = match &agent {
            Ok((code, body)) => serde_json::json!({
                "http_status": code,
                "healthz": serde_json::from_str::<serde_json::Value>(body).unwrap_or(serde_json::Value::Null),
            }),
            Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
        };
        let counters: serde_json::Map<String, serde_json::Value> = counters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        let out = serde_json::json!({
            "agent": agent,
            "bpf_root": root,
            "abi": config.abi_version,
            "migration": migration,
            "maps": fill,
            "devices": devices,
            "xdp_devices": xdp,
            "socket_lb": socket_lb,
            "sock_marks": {
                "valid": marks_valid,
                "slots_counting": marks_counting,
                "slots": sluice_common::maps::SOCK_MARK_SLOTS,
            },
            "sock_table": {
                "sockets": table_held,
                "slots": sluice_common::maps::SOCK_TABLE_SLOTS,
                "in_use": marks_valid,
            },
            "sock_picks": {
                "frontends": picks,
                "on": picks_on,
            },
            "host_routing": host_routing,
            "datapath": counters,
            "events": match (events_on, tracing) {
                (true, true) => "all",
                (true, false) => "drops",
                _ => "off",
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    match &agent {
        Ok((200, body)) => {
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            println!(
                "agent:     healthy, last sync {}",
                v["lastUpdated"].as_str().unwrap_or("never")
            );
        }
        Ok((code, body)) => println!("agent:     UNHEALTHY (HTTP {code}) {}", body.trim()),
        Err(e) => println!(
            "agent:     not reachable at {} ({e:#}); the datapath runs on without it",
            args.healthz_url
        ),
    }
    println!("bpf root:  {}", root.display());
    println!("abi:       {} (migration: {migration})", config.abi_version);
    println!(
        "devices:   {}",
        if devices.is_empty() {
            "(none attached)".to_owned()
        } else {
            devices.join(", ")
        }
    );
    println!(
        "xdp:       {}",
        if xdp.is_empty() {
            "(none: every packet goes through TC)".to_owned()
        } else {
            format!(
                "{} (north-south traffic balanced at the driver)",
                xdp.join(", ")
            )
        }
    );
    for f in &fill {
        let pct = if f.capacity == 0 {
            0.0
        } else {
            100.0 * f.entries as f64 / f64::from(f.capacity)
        };
        println!(
            "map:       {:<12} {:>8} / {:<8} ({pct:.2}%){}",
            f.map,
            f.entries,
            f.capacity,
            if f.preallocated { " preallocated" } else { "" }
        );
    }
    println!(
        "frontends: {}  backends: {}",
        state.frontends.len(),
        state.backends.len()
    );
    if config.flags() & sluice_common::config::CFG_F_PODS_ON_SOCKETS != 0 {
        println!("socket lb: {socket_lb} (every pod's flow is the sockets': the pods' devices pass replies without a look)");
    } else {
        println!("socket lb: {socket_lb}");
    }
    if marks_valid {
        println!(
            "sock close: a TCP socket never balanced skips the sl_sock lookup ({marks_counting} of {} sl_sockmark slots count sockets)",
            sluice_common::maps::SOCK_MARK_SLOTS
        );
    } else {
        println!("sock close: every TCP socket is looked up in sl_sock (sl_sockmark's counts not trusted yet)");
    }
    println!(
        "sock table: {table_held} of {} sl_socktab slots hold a TCP socket ({})",
        sluice_common::maps::SOCK_TABLE_SLOTS,
        if marks_valid {
            "new sockets take their slot"
        } else {
            "new sockets go to sl_sock until the counts are trusted"
        }
    );
    if picks_on {
        println!("sock picks: {picks} frontends give a connect its backend in one lookup (sl_sockfe4/sl_sockfe6)");
    } else if socket_lb == "off" {
        println!("sock picks: off, no socket-level balancing ({picks} entries in sl_sockfe4/sl_sockfe6: an agent with --socket-lb=off keeps none)");
    } else {
        println!("sock picks: off, every connect takes the general lookups ({picks} entries in sl_sockfe4/sl_sockfe6 unread: the agent stopped, or could not turn them on)");
    }
    println!(
        "routing:   {}",
        if host_routing {
            "host (DNATed packets to local pods skip the node's IP stack)"
        } else {
            "stack"
        }
    );
    let line: Vec<String> = counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("datapath:  {}", line.join(" "));
    if events_on {
        println!(
            "events:    on: `sluice monitor` shows each drop and reject with its reason and packet"
        );
    } else {
        println!("events:    off (agent --monitor-events=off): `sluice monitor` shows nothing until they are on");
    }
    Ok(())
}
