//! sluice's control plane: programming from empty through the real agent
//! (fed from a manifest directory, and from the test Kubernetes API server
//! over the real list/watch protocol) and through the in-process
//! reconciler, endpoint-change latency, and the agent's memory.

use std::{
    fmt::Write as _,
    fs,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sluice::{
    datapath::{MapSizes, Maps},
    model::BackendState,
};
use sluice_common::{Svc4Key, IPPROTO_TCP};

use super::{
    services::{ServiceSet, ENDPOINTS, NAMESPACE, SERVICE_PORT, TARGET_PORT},
    stats::Latency,
    Config, Measure,
};
use crate::{
    agent::{metric_in, Agent, ManifestDir},
    apiserver::{ApiServer, ResourceKind},
    lb::Lb,
    topology::Topology,
};

/// Endpoint-change latency of one source.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Churn {
    pub latency: Option<Latency>,
    pub not_measured: Option<String>,
    /// How the change reached the datapath.
    pub path: String,
    /// Agent only: mean of `sluice_update_to_datapath_seconds` over the
    /// series (source hand-over to maps; the directory source hands over
    /// three updates per change).
    pub agent_update_to_datapath_mean_ms: Option<f64>,
    /// Agent via API only: the same per change (its histogram's sum read
    /// after each change, outside the timed window), so that a tail can
    /// be told apart: the agent's own, or the delivery of the watch event.
    #[serde(default)]
    pub agent_internal: Option<Latency>,
}

/// What the agent run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AgentRun {
    /// Process start to `/readyz` 200 (maps hold the first full sync).
    pub start_to_ready: Measure,
    /// The agent's own reconcile time for the first full sync
    /// (`sluice_sync_duration_seconds`).
    pub first_sync_reconcile: Measure,
    /// Peak resident set (VmHWM) at the end, after the change series.
    pub vm_hwm_kb: Option<u64>,
    /// Peak resident set right after the first sync (before any change).
    pub vm_hwm_ready_kb: Option<u64>,
    /// Resident set (VmRSS) right after the first sync, and at the end.
    pub vm_rss_ready_kb: Option<u64>,
    pub vm_rss_end_kb: Option<u64>,
    /// CPU time (user + system) the agent used from its start until ready:
    /// with `first_sync_reconcile`, what of start to ready is the agent's
    /// own work (decoding, translating, writing) and what is waiting.
    #[serde(default)]
    pub cpu_to_ready_s: Option<f64>,
    pub bytes_per_service: Option<f64>,
    pub churn: Churn,
    /// API source only: endpoint-change latency under background churn,
    /// by rate (`super::churn`).
    #[serde(default)]
    pub churn_rates: Vec<super::churn::RatePoint>,
    /// API source only: a relist of everything after the change series.
    #[serde(default)]
    pub relist: Option<Relist>,
}

/// A relist of both big kinds (the watches closed and answered 410 Gone
/// after a compaction, as after an API outage), nothing having changed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Relist {
    /// From the fault until both kinds relisted and every update reached
    /// the maps' side.
    pub seconds: f64,
    /// Map writes it caused (nothing changed: none expected).
    pub writes: f64,
    /// VmHWM before and after it: a relist that held more than the first
    /// list did would raise it.
    pub vm_hwm_before_kb: Option<u64>,
    pub vm_hwm_after_kb: Option<u64>,
}

const CHUNK: usize = 1000;
const TARGET_SLICE_FILE: &str = "target-slice.json";

/// A uid as the API server writes one (deterministic here).
fn uid(kind: u8, i: usize) -> String {
    format!("{kind:02x}{i:06x}-5e1c-4d2a-9b7f-0c3e8a{i:06x}")
}

/// Service `i` as a cluster's API server returns it: besides the spec
/// that sluice reads, what every real object carries (uid, timestamps,
/// kubectl's last-applied annotation, managed fields, defaulted spec
/// fields, an empty status), so that the agent decodes the bytes a
/// cluster sends, not a trimmed sample.
fn service_json(set: &ServiceSet, i: usize) -> serde_json::Value {
    let vip = set.vip(i).to_string();
    let name = set.name(i);
    let ports = json!([{"name": "http", "protocol": "TCP", "port": SERVICE_PORT, "targetPort": TARGET_PORT}]);
    let applied = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"annotations": {}, "labels": {"app": name}, "name": name, "namespace": NAMESPACE},
        "spec": {"ports": ports, "selector": {"app": name}},
    });
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid(1, i),
            "creationTimestamp": "2026-11-20T08:00:00Z",
            "labels": {"app": name},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": format!("{applied}\n"),
            },
            "managedFields": [{
                "manager": "kubectl-client-side-apply",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-20T08:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}, "f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}}, "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}},
                },
            }],
        },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": vip,
            "clusterIPs": [vip],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "sessionAffinity": "None",
            "selector": {"app": name},
            "ports": ports,
        },
        "status": {"loadBalancer": {}},
    })
}

/// The EndpointSlice of service `i` as kube-controller-manager writes it
/// (owner, managed fields, trigger-time annotation, and per endpoint the
/// pod reference, node and zone); endpoint `not_ready` (if any) has
/// `ready: false`.
pub(super) fn slice_json(
    set: &ServiceSet,
    i: usize,
    not_ready: Option<usize>,
) -> serde_json::Value {
    let name = set.name(i);
    let endpoints: Vec<serde_json::Value> = set
        .endpoints(i)
        .iter()
        .enumerate()
        .map(|(j, ip)| {
            json!({
                "addresses": [ip.to_string()],
                "conditions": {"ready": Some(j) != not_ready, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", (i + j) % 50),
                "zone": format!("zone-{}", (i + j) % 3),
                "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": format!("{name}-7d9f8c6b5-{j:05}"), "uid": uid(3, i * 16 + j)},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-1"),
            "generateName": format!("{name}-"),
            "namespace": NAMESPACE,
            "uid": uid(2, i),
            "generation": 1,
            "creationTimestamp": "2026-11-20T08:00:00Z",
            "labels": {
                "app": name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": name,
            },
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-20T08:00:00Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid(1, i), "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "discovery.k8s.io/v1",
                "time": "2026-11-20T08:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:addressType": {}, "f:endpoints": {}, "f:metadata": {"f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}}, "f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:endpointslice.kubernetes.io/managed-by": {}, "f:kubernetes.io/service-name": {}}, "f:ownerReferences": {".": {}, "k:{\"uid\":\"x\"}": {}}}, "f:ports": {}},
            }],
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": TARGET_PORT}],
        "endpoints": endpoints,
    })
}

/// Services and slices as JSON streams (what the API would hand over),
/// 1000 services per file; the churned slice has a file of its own.
fn write_manifests(dir: &ManifestDir, set: &ServiceSet, churned: usize) -> Result<()> {
    let mut file = String::new();
    for i in 0..set.n {
        let _ = writeln!(file, "{}", service_json(set, i));
        if i != churned {
            let _ = writeln!(file, "{}", slice_json(set, i, None));
        }
        if (i + 1) % CHUNK == 0 || i + 1 == set.n {
            dir.write(&format!("services-{:05}.json", i / CHUNK), &file)?;
            file.clear();
        }
    }
    dir.write(
        TARGET_SLICE_FILE,
        &format!("{}\n", slice_json(set, churned, None)),
    )
}

/// A `kB` field of /proc/<pid>/status (`VmHWM`, `VmRSS`).
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// User + system CPU seconds of process `pid` (/proc/<pid>/stat fields 14
/// and 15, in clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces: fields count from after its ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

fn master_active(maps: &Maps, key: &Svc4Key) -> Option<u16> {
    maps.services_v4.get(key, 0).ok().map(|v| v.active)
}

/// Where the agent of a run reads Services and EndpointSlices from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentSource {
    /// `--source dir:`, a manifest directory.
    Dir,
    /// `--source kube`: the test API server (`crate::apiserver`), list and
    /// watch over HTTP as from a real kube-apiserver.
    Kube,
    /// `Kube`, with `--preallocate-maps`.
    KubePrealloc,
}

/// The objects of a run, held where the agent reads them.
enum Feed {
    Dir(ManifestDir),
    Kube {
        server: ApiServer,
        kubeconfig: ManifestDir,
    },
}

impl Feed {
    fn create(
        source: AgentSource,
        topo: &Topology,
        set: &ServiceSet,
        churned: usize,
    ) -> Result<(Self, String)> {
        match source {
            AgentSource::Dir => {
                let dir = ManifestDir::create()?;
                write_manifests(&dir, set, churned)?;
                let arg = format!("dir:{}", dir.path().display());
                Ok((Feed::Dir(dir), arg))
            }
            AgentSource::Kube | AgentSource::KubePrealloc => {
                let server = ApiServer::start_in(&topo.node)?;
                for i in 0..set.n {
                    server.apply_json(service_json(set, i))?;
                    server.apply_json(slice_json(set, i, None))?;
                }
                // The agent lists from scratch; the history of the load is
                // only memory.
                server.compact();
                let dir = ManifestDir::create()?;
                server.write_kubeconfig(dir.path().join("kubeconfig"))?;
                Ok((
                    Feed::Kube {
                        server,
                        kubeconfig: dir,
                    },
                    "kube".into(),
                ))
            }
        }
    }

    fn extra_args(&self) -> Vec<String> {
        match self {
            // The directory source polls; 5 ms keeps polling out of the
            // endpoint-change figures as far as it can.
            Feed::Dir(_) => vec!["--dir-poll-interval".into(), "5ms".into()],
            Feed::Kube { kubeconfig, .. } => vec![
                "--kubeconfig".into(),
                kubeconfig.path().join("kubeconfig").display().to_string(),
            ],
        }
    }

    /// Publishes the churned service's slice with endpoint `not_ready`.
    /// Publishes `slice` (the churned service's); returns when the change
    /// counts as made: the API server's commit (its watch events sent),
    /// or, for the directory, `None` (the file is in place when this
    /// returns).
    fn change(&self, slice: serde_json::Value) -> Result<Option<Instant>> {
        match self {
            Feed::Dir(dir) => dir
                .write(TARGET_SLICE_FILE, &format!("{slice}\n"))
                .map(|_| None),
            Feed::Kube { server, .. } => server.apply_json_timed(slice).map(|(_, at)| at),
        }
    }

    fn path(&self) -> &'static str {
        match self {
            Feed::Dir(_) => {
                "agent, manifest-directory source (5 ms poll; each change re-reads every manifest)"
            }
            Feed::Kube { .. } => {
                "agent, Kubernetes API source (test API server, watch event per change)"
            }
        }
    }
}

/// Programs `set` from empty with the real agent binary reading `source`,
/// then changes one endpoint's readiness again and again and times each
/// change until the pinned map shows it.
pub fn agent_run(
    set: &ServiceSet,
    cfg: &Config,
    sizes: MapSizes,
    source: AgentSource,
) -> Result<AgentRun> {
    let mut out = AgentRun::default();
    let topo = Topology::new(1, 1)?;
    let churned = set.random;
    let (feed, source_arg) = Feed::create(source, &topo, set, churned)?;
    let mut args = vec![
        "--services-map-size".to_owned(),
        sizes.services.to_string(),
        "--backends-map-size".to_owned(),
        sizes.backends.to_string(),
    ];
    args.extend(feed.extra_args());
    if source == AgentSource::KubePrealloc {
        args.push("--preallocate-maps".to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Building the binary (a no-op when up to date) is not timed.
    crate::agent::binary()?;
    // The clock starts once the agent runs: spawning it forks this
    // process, which holds the test API server's objects, and at 100,000
    // services that fork alone took 3.5 s, none of it the agent's.
    let mut agent = Agent::start(&topo, &source_arg, &args)?;
    let start = Instant::now();
    loop {
        if agent.is_ready() {
            out.start_to_ready = Measure::done(start.elapsed());
            break;
        }
        if let Some(status) = agent.exited() {
            bail!(
                "agent exited ({status}) before it was ready:\n{}",
                agent.log_tail()
            );
        }
        if start.elapsed() > cfg.agent_budget {
            out.start_to_ready = Measure::skipped(format!(
                "not ready within the {:?} budget",
                cfg.agent_budget
            ));
            return Ok(out);
        }
        // Every readiness check is an HTTP request the agent answers:
        // 500 a second took a tenth of this 2-CPU machine from an agent
        // busy listing and programming. Fine-grained for the first
        // second (small N), then at most 20 ms late (under 2%).
        let pause = if start.elapsed() < Duration::from_secs(1) {
            2
        } else {
            20
        };
        std::thread::sleep(Duration::from_millis(pause));
    }
    let frontends = agent.metric("sluice_programmed_frontends")?;
    let programmed_backends = agent.metric("sluice_programmed_backends")?;
    if frontends as usize != set.n || programmed_backends as usize != set.n * ENDPOINTS {
        bail!(
            "agent ready with {frontends} frontends and {programmed_backends} backends, expected {} and {}:\n{}",
            set.n,
            set.n * ENDPOINTS,
            agent.log_tail()
        );
    }
    out.vm_rss_ready_kb = agent.pid().and_then(|p| status_kb(p, "VmRSS"));
    out.cpu_to_ready_s = agent.pid().and_then(cpu_seconds);
    out.vm_hwm_ready_kb = agent.pid().and_then(|p| status_kb(p, "VmHWM"));
    // The first sync's own figure: an average over the syncs so far
    // would halve it when a scan's sync came before the ready check.
    let first_sync = agent.metric("sluice_first_sync_duration_seconds")?;
    out.first_sync_reconcile = if first_sync > 0.0 {
        Measure::done(Duration::from_secs_f64(first_sync))
    } else {
        Measure::skipped("no sync observed".into())
    };

    out.churn = agent_churn(&agent, &feed, &topo, set, churned, cfg).unwrap_or_else(|e| Churn {
        not_measured: Some(format!("{e:#}")),
        ..Churn::default()
    });
    out.churn.path = feed.path().into();
    if let Feed::Kube { server, .. } = &feed {
        match relist(&agent, server) {
            Ok(r) => out.relist = Some(r),
            Err(e) => eprintln!("relist not measured: {e:#}"),
        }
    }
    if let Feed::Kube { server, .. } = &feed {
        if !cfg.churn_rates.is_empty() {
            let maps = Maps::open_pinned(topo.bpf.path())?;
            out.churn_rates = super::churn::rate_series(
                server,
                &maps,
                set,
                churned,
                &cfg.churn_rates,
                cfg.churn_rate_window,
            );
        }
    }

    if let Some(pid) = agent.pid() {
        out.vm_hwm_kb = status_kb(pid, "VmHWM");
        out.vm_rss_end_kb = status_kb(pid, "VmRSS");
        out.bytes_per_service = out.vm_hwm_kb.map(|kb| kb as f64 * 1024.0 / set.n as f64);
    }
    agent.stop()?;
    Ok(out)
}

/// Makes the agent relist Services and EndpointSlices (compaction, then
/// 410 Gone on the next watch of each, then the open watches closed) and
/// measures what it cost.
fn relist(agent: &Agent, server: &ApiServer) -> Result<Relist> {
    let relists =
        |kind: &str| agent.metric_sum("sluice_relists_total", &format!("kind=\"{kind}\""));
    let (services0, slices0) = (relists("Service")?, relists("EndpointSlice")?);
    let writes0 = agent.metric("sluice_map_writes_total")?;
    let updates0 = agent.metric("sluice_update_to_datapath_seconds_count")?;
    let pid = agent.pid();
    let vm_hwm_before_kb = pid.and_then(|p| status_kb(p, "VmHWM"));
    let start = Instant::now();
    server.expire_watches(&[ResourceKind::Service, ResourceKind::EndpointSlice]);
    let budget = Duration::from_secs(120);
    agent.wait_until("both kinds relisted", budget, |_| {
        Ok(relists("Service")? > services0 && relists("EndpointSlice")? > slices0)
    })?;
    // Each relist hands over a start, its pages and an end; settled when
    // no update waits for the maps.
    agent.wait_until("relisted objects synced", budget, |a| {
        let before = a.metric("sluice_update_to_datapath_seconds_count")?;
        std::thread::sleep(Duration::from_millis(300));
        let after = a.metric("sluice_update_to_datapath_seconds_count")?;
        Ok(after == before && after >= updates0 + 4.0)
    })?;
    // Less the last settle check's 300 ms.
    let seconds = start.elapsed().as_secs_f64() - 0.3;
    Ok(Relist {
        seconds,
        writes: agent.metric("sluice_map_writes_total")? - writes0,
        vm_hwm_before_kb,
        vm_hwm_after_kb: pid.and_then(|p| status_kb(p, "VmHWM")),
    })
}

/// `sluice_update_to_datapath_seconds`' sum and count, from one scrape.
fn update_latency(agent: &Agent) -> Result<(f64, f64)> {
    let text = agent.metrics()?;
    let value =
        |name: &str| metric_in(&text, name).with_context(|| format!("metric {name} not found"));
    Ok((
        value("sluice_update_to_datapath_seconds_sum")?,
        value("sluice_update_to_datapath_seconds_count")?,
    ))
}

fn agent_churn(
    agent: &Agent,
    feed: &Feed,
    topo: &Topology,
    set: &ServiceSet,
    churned: usize,
    cfg: &Config,
) -> Result<Churn> {
    let maps = Maps::open_pinned(topo.bpf.path())?;
    let key = Svc4Key::new(set.vip(churned).octets(), SERVICE_PORT, IPPROTO_TCP, 0);
    let full = ENDPOINTS as u16;
    if master_active(&maps, &key) != Some(full) {
        bail!("the churned service is not programmed with {full} active backends");
    }
    let (sum0, count0) = update_latency(agent)?;
    let series = Instant::now();
    let mut samples = Vec::new();
    let mut internal = Vec::new();
    let mut seen = (sum0, count0);
    // The directory source hands over three updates per change.
    let per_change = matches!(feed, Feed::Kube { .. });
    let mut ready = true;
    while samples.len() < cfg.churn_samples
        && (samples.len() < cfg.churn_min || series.elapsed() < cfg.churn_budget)
    {
        ready = !ready;
        let (not_ready, want) = if ready {
            (None, full)
        } else {
            (Some(ENDPOINTS - 1), full - 1)
        };
        // The clock starts when the change is made: the server's commit,
        // not the bench building the object or the test server's own work
        // on the request (about 0.1 and 0.3 ms, measured 2026-11-26).
        let slice = slice_json(set, churned, not_ready);
        let before = Instant::now();
        let start = feed.change(slice)?.unwrap_or(before);
        loop {
            if master_active(&maps, &key) == Some(want) {
                break;
            }
            if start.elapsed() > cfg.agent_budget {
                bail!(
                    "an endpoint change did not reach the maps within {:?}",
                    cfg.agent_budget
                );
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        samples.push(start.elapsed().as_nanos() as u64);
        if per_change {
            // The agent's own part of this change: one update handed over
            // (the API source sends the changed slice alone). A failed
            // scrape loses this figure only (the next delta spans two
            // updates and is skipped too).
            if let Ok(now) = update_latency(agent) {
                if now.1 == seen.1 + 1.0 {
                    internal.push(((now.0 - seen.0) * 1e9) as u64);
                }
                seen = now;
            }
        }
        // Let the agent finish the batch before the next change.
        std::thread::sleep(Duration::from_millis(20));
    }
    let (sum1, count1) = update_latency(agent)?;
    Ok(Churn {
        latency: Some(Latency::from_ns(samples)),
        agent_update_to_datapath_mean_ms: (count1 > count0)
            .then(|| (sum1 - sum0) / (count1 - count0) * 1e3),
        agent_internal: (!internal.is_empty()).then(|| Latency::from_ns(internal)),
        ..Churn::default()
    })
}

/// Toggles one endpoint of a non-target service between ready and not
/// ready through the in-process reconciler, timing each reconcile (which
/// writes the maps synchronously). Leaves the service as it found it.
pub fn reconciler_churn(lb: &mut Lb, set: &ServiceSet, cfg: &Config) -> Result<Churn> {
    let i = set.churn_service().unwrap_or(set.last);
    let name = set.churn_name(i);
    let changed = std::collections::BTreeSet::from([name.clone()]);
    let mut samples = Vec::new();
    let series = Instant::now();
    let mut toggles = 0usize;
    let mut result = Ok(());
    while samples.len() < cfg.churn_samples
        && (samples.len() < cfg.churn_min || series.elapsed() < cfg.churn_budget)
    {
        toggle(lb, &name)?;
        toggles += 1;
        let start = Instant::now();
        let report = lb.apply_changed(&changed);
        let took = start.elapsed();
        if !report.errors.is_empty() || report.writes == 0 {
            result = Err(anyhow::anyhow!(
                "reconcile after an endpoint change: {} writes, errors {:?}",
                report.writes,
                report.errors
            ));
            break;
        }
        samples.push(took.as_nanos() as u64);
    }
    if toggles % 2 == 1 {
        toggle(lb, &name)?;
        lb.apply();
    }
    result?;
    Ok(Churn {
        latency: Some(Latency::from_ns(samples)),
        path: "in-process reconciler, changed service only as for a watch event (target computation, diff and map writes)".into(),
        ..Churn::default()
    })
}

fn toggle(lb: &mut Lb, name: &sluice::model::ServicePortName) -> Result<()> {
    let backend = lb
        .desired
        .services
        .get_mut(name)
        .and_then(|s| s.frontends.first_mut())
        .and_then(|f| f.backends.last_mut())
        .context("churned service missing from the desired state")?;
    backend.state = if backend.state == BackendState::Active {
        BackendState::NotReady
    } else {
        BackendState::Active
    };
    Ok(())
}
