//! Command-line interface: `sluice agent` and the operator commands.
//! Agent flags follow kube-proxy's names where one exists, and every flag
//! can also come from the environment.

use std::{net::SocketAddr, path::PathBuf, str::FromStr, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::datapath::{log::LogLevel, XdpMode, DEFAULT_BPF_ROOT};

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "eBPF service load balancing for Kubernetes, replacing kube-proxy's IPVS mode"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: watch Services and EndpointSlices, program the datapath.
    Agent(Box<AgentArgs>),
    /// Service frontends and their backends, read from the pinned maps.
    #[command(subcommand)]
    Lb(LbCommand),
    /// Connection tracking entries, read from the pinned maps.
    #[command(subcommand)]
    Ct(CtCommand),
    /// Agent health, last sync, map fill and datapath counters.
    Status(StatusArgs),
    /// Why packets were dropped or rejected: the datapath's events, live.
    ///
    /// Reads the pinned ring buffer `sl_events` (works whether the agent
    /// runs or not) and prints one line per event: every drop, reject and
    /// packet passed unbalanced, with its reason (the counter it counts in
    /// `sluice status`), hook, 5-tuple, frontend and backend. The agent
    /// emits events while `--monitor-events` is `drops` (the default).
    /// Ctrl-C (or SIGTERM) prints the count per reason. Events older than
    /// the start of the command are skipped.
    Monitor(MonitorArgs),
    /// Remove every trace of sluice from this node, for an uninstall.
    ///
    /// Detaches sluice's programs from the devices of this network namespace
    /// and from the cgroup (`sl_ingress`, `sl_egress`, the socket programs),
    /// pinned or not, and removes everything under --bpf-root (map and link
    /// pins), which frees the maps and programs. Programs of other tools,
    /// other network namespaces and other cgroups are left alone. Run as root
    /// in the node's network namespace, after the agent has stopped (it
    /// refuses while a process holds the datapath's maps, unless --force).
    /// Idempotent: with nothing left it says so and exits 0. Without it, an
    /// uninstalled node keeps forwarding on the last state it was given.
    Cleanup(CleanupArgs),
}

/// Where Services and EndpointSlices come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The Kubernetes API (in-cluster config, or a kubeconfig).
    Kube,
    /// A directory of manifests, re-read when it changes.
    Dir(PathBuf),
}

impl FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kube" => Ok(Source::Kube),
            _ => match s.strip_prefix("dir:") {
                Some(path) if !path.is_empty() => Ok(Source::Dir(PathBuf::from(path))),
                _ => Err(format!("expected `kube` or `dir:PATH`, got `{s}`")),
            },
        }
    }
}

/// A duration such as `500ms`, `30s`, `5m` or `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num.parse().map_err(|_| format!("invalid duration `{s}`"))?;
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" | "" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => {
                return Err(format!(
                    "invalid duration unit in `{s}` (use ms, s, m or h)"
                ))
            }
        };
        Ok(HumanDuration(d))
    }
}

#[derive(Debug, Args)]
pub struct BpfRootArg {
    /// bpffs directory holding this instance's pinned maps and links.
    #[arg(long, env = "SLUICE_BPF_ROOT", default_value = DEFAULT_BPF_ROOT)]
    pub bpf_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// `kube` (in-cluster or kubeconfig) or `dir:PATH` (a directory of
    /// Service and EndpointSlice manifests).
    #[arg(long, env = "SLUICE_SOURCE", default_value = "kube")]
    pub source: Source,

    /// Path to a kubeconfig (default: in-cluster config, then $KUBECONFIG,
    /// then ~/.kube/config).
    #[arg(long, env = "SLUICE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// This node's name (default: the hostname).
    #[arg(long, env = "NODE_NAME")]
    pub hostname_override: Option<String>,

    /// Address of /healthz (and /readyz).
    #[arg(
        long,
        env = "SLUICE_HEALTHZ_BIND_ADDRESS",
        default_value = "0.0.0.0:10256"
    )]
    pub healthz_bind_address: SocketAddr,

    /// Address of /metrics.
    #[arg(
        long,
        env = "SLUICE_METRICS_BIND_ADDRESS",
        default_value = "127.0.0.1:10249"
    )]
    pub metrics_bind_address: SocketAddr,

    /// Devices to attach to: names or globs (`eth0,lxc*`), comma separated.
    #[arg(long, env = "SLUICE_DEVICES", value_delimiter = ',', required = true)]
    pub devices: Vec<String>,

    /// Where north-south service traffic is balanced at the driver
    /// (`sl_xdp` on the `--xdp-devices`): `native` in the driver (falls
    /// back to off on a device whose driver refuses it, with a log line
    /// and `sluice_xdp_attach_failures`), `generic` after the driver (any
    /// device, slower), `off` (TC only).
    #[arg(long, env = "SLUICE_XDP_MODE", value_enum, default_value = "native")]
    pub xdp_mode: XdpMode,

    /// Devices that get `sl_xdp`, among those `--devices` matches: names or
    /// globs, comma separated (default: the devices holding this node's
    /// addresses, the NodePort addresses).
    #[arg(long, env = "SLUICE_XDP_DEVICES", value_delimiter = ',')]
    pub xdp_devices: Vec<String>,

    /// The devices that face this node's pods (their host-side veths or
    /// their bridge), among those `--devices` matches: names or globs,
    /// comma separated. With `--socket-lb=all` their egress runs
    /// `sl_egress_pod`, which lets packets towards the pods pass without a
    /// look while every pod's socket is balanced at `connect()` (no reply
    /// towards a pod needs reverse NAT then). Needs local-traffic
    /// detection (`--cluster-cidr` or another `--detect-local-mode`), by
    /// which the datapath tells a pod's flow that still takes the TC path.
    /// Name them only if every pod's processes are under `--cgroup-root`,
    /// and never an uplink or a tunnel. Default: with `--cgroup-root` the
    /// cgroup2 root, the pods' devices of `--detect-local-mode
    /// InterfaceNamePrefix` (`<prefix>*`) or `BridgeInterface` (the
    /// bridge), else none. Whatever their egress runs, an upgrade swaps
    /// the programs of these devices before the others'.
    #[arg(long, env = "SLUICE_POD_DEVICES", value_delimiter = ',')]
    pub pod_devices: Vec<String>,

    #[command(flatten)]
    pub bpf: BpfRootArg,

    /// Socket-level balancing (cgroup socket programs pick the backend at
    /// connect()/sendmsg(), so no packet of the flow is translated):
    /// `all` for every socket under --cgroup-root (the node's processes and
    /// every pod), `host` for the node's own processes only (pods go
    /// through the TC path and see the service address on the wire, as a
    /// service mesh's sidecar needs: Cilium's bpf-lb-sock-hostns-only),
    /// `off`. `true` and `false` (the earlier boolean) mean `host` and
    /// `off`.
    #[arg(long, env = "SLUICE_SOCKET_LB", default_value = "all")]
    pub socket_lb: SocketLbArg,

    /// Datapath events for `sluice monitor`: `drops` makes the programs
    /// write an event for every drop, reject and packet passed unbalanced
    /// (rate limited per CPU; nothing is done for forwarded packets);
    /// `all` also one for new flows (the backend picked), sampled by
    /// `--monitor-trace-sample`; `off` writes none.
    #[arg(long, env = "SLUICE_MONITOR_EVENTS", value_enum, default_value_t = MonitorEvents::Drops)]
    pub monitor_events: MonitorEvents,

    /// With `--monitor-events all`: trace one new flow in this many (a
    /// power of two, 1 to 32768).
    #[arg(long, env = "SLUICE_MONITOR_TRACE_SAMPLE", default_value_t = 1, value_parser = parse_sample)]
    pub monitor_trace_sample: u32,

    /// Developer logs of the kernel programs (aya-log), forwarded into the
    /// agent's output under the target `sluice_ebpf`: `off` (the default),
    /// `error`, `warn`, `info`, `debug`, `trace`. They sit on rare paths
    /// only (a missing tail-call target, SNAT port exhaustion, a dangling
    /// socket pick); for operators, `sluice monitor` is the tool.
    #[arg(long, env = "SLUICE_DATAPATH_LOG_LEVEL", value_enum, default_value_t = LogLevel::Off)]
    pub datapath_log_level: LogLevel,

    /// Balance IPv6 frontends too (`sl_svc6`). Off: IPv6 addresses and
    /// endpoints are skipped and reported as `ipv6_unsupported`; the IPv4
    /// side of dual-stack services works either way.
    #[arg(long, env = "SLUICE_IPV6", default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6: bool,

    /// cgroup (v2) whose processes get socket-level balancing (default: the
    /// cgroup2 mount's root, i.e. the whole node).
    #[arg(long, env = "SLUICE_CGROUP_ROOT")]
    pub cgroup_root: Option<PathBuf>,

    /// How long a terminating or removed backend may keep its flows before
    /// it is removed anyway.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT", default_value = "1h")]
    pub drain_timeout: HumanDuration,

    /// CIDRs selecting this node's addresses that serve NodePorts (default:
    /// the Node object's InternalIP and ExternalIP addresses).
    #[arg(long, env = "SLUICE_NODEPORT_ADDRESSES", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,

    /// Capacity of sl_svc4 and of sl_svc6, each (frontends plus backend
    /// slots).
    #[arg(long, env = "SLUICE_SERVICES_MAP_SIZE", default_value_t = sluice_common::maps::DEFAULT_SERVICES_MAX)]
    pub services_map_size: u32,

    /// Capacity of sl_backends.
    #[arg(long, env = "SLUICE_BACKENDS_MAP_SIZE", default_value_t = sluice_common::maps::DEFAULT_BACKENDS_MAX)]
    pub backends_map_size: u32,

    /// Capacity of sl_ct4 and of sl_ct6, each (two entries per flow).
    #[arg(long, env = "SLUICE_CONNTRACK_MAP_SIZE", default_value_t = sluice_common::maps::DEFAULT_CONNTRACK_MAX)]
    pub conntrack_map_size: u32,

    /// Capacity of sl_aff4 and of sl_aff6 (client, frontend) session affinity
    /// entries.
    #[arg(long, env = "SLUICE_AFFINITY_MAP_SIZE", default_value_t = sluice_common::maps::DEFAULT_AFFINITY_MAX)]
    pub affinity_map_size: u32,

    /// Capacity of sl_maglev4 and of sl_maglev6 (one 64 KiB table per
    /// frontend of a Maglev service); a service that finds no room is
    /// balanced by flow hash until room frees, and reported.
    #[arg(long, env = "SLUICE_MAGLEV_MAP_SIZE", default_value_t = sluice_common::maps::MAGLEV_MAX)]
    pub maglev_map_size: u32,

    /// Preallocate sl_svc4, sl_svc6 and sl_backends: their kernel memory
    /// is taken whole when they are created (at the default sizes 27, 29
    /// and 13 MB, 69 MB in all, where the unpreallocated maps take 10 MB
    /// empty and grow with their entries), and a write no longer
    /// allocates: programming from empty is about 40% faster. As Cilium's
    /// --preallocate-bpf-maps. Changing it on a running node migrates the
    /// three maps without losing a flow.
    #[arg(long, env = "SLUICE_PREALLOCATE_MAPS")]
    pub preallocate_maps: bool,

    /// Host routing, as Cilium's BPF host routing: a service flow between
    /// two pods of this node (their devices named by `--pod-devices`, or
    /// by `--detect-local-mode InterfaceNamePrefix`; veth or netkit) skips
    /// the node's IP stack both ways: the DNATed packets and the backend's
    /// replies (reverse-NATed at the backend's device) go straight into
    /// the other pod's network namespace (`bpf_redirect_peer`). Faster, but
    /// the node's netfilter (iptables FORWARD and POSTROUTING rules,
    /// nf_conntrack) and any program on the pods' devices' egress never
    /// see those packets. Leave it off where iptables rules on the node
    /// filter or count pod traffic (a CNI's NetworkPolicy in iptables, a
    /// `ctstate INVALID` drop) or a CNI's eBPF policy runs there. Clients
    /// outside the cluster and SNATed flows always take the stack.
    #[arg(long, env = "SLUICE_HOST_ROUTING")]
    pub host_routing: bool,

    /// /healthz fails when a change has waited this long to reach the maps.
    #[arg(long, env = "SLUICE_HEALTHZ_MAX_PENDING", default_value = "30s")]
    pub healthz_max_pending: HumanDuration,

    /// /healthz fails when the Kubernetes API has failed this long.
    #[arg(long, env = "SLUICE_HEALTHZ_MAX_API_DOWN", default_value = "2m")]
    pub healthz_max_api_down: HumanDuration,

    /// How often the whole desired state is reconciled against the maps, as a
    /// safety net on top of the per-change updates.
    #[arg(long, env = "SLUICE_SYNC_PERIOD", default_value = "1m")]
    pub sync_period: HumanDuration,

    /// How often conntrack is scanned for expired entries.
    #[arg(long, env = "SLUICE_CONNTRACK_GC_INTERVAL", default_value = "10s")]
    pub conntrack_gc_interval: HumanDuration,

    /// How often conntrack is scanned while backends drain.
    #[arg(long, env = "SLUICE_DRAIN_SCAN_INTERVAL", default_value = "250ms")]
    pub drain_scan_interval: HumanDuration,

    /// How often devices are checked (new pods, vanished devices).
    #[arg(long, env = "SLUICE_DEVICE_SCAN_INTERVAL", default_value = "1s")]
    pub device_scan_interval: HumanDuration,

    /// How often a `dir:` source checks its directory.
    #[arg(long, env = "SLUICE_DIR_POLL_INTERVAL", default_value = "200ms")]
    pub dir_poll_interval: HumanDuration,

    /// kube-proxy's `--cluster-cidr`: the networks of the cluster's pods
    /// (comma separated, one per family), for `--detect-local-mode
    /// ClusterCIDR`.
    #[arg(long, env = "SLUICE_CLUSTER_CIDR", value_delimiter = ',')]
    pub cluster_cidr: Vec<String>,

    /// The service CIDRs (`--service-cluster-ip-range`, the API server's
    /// flag; comma separated, one per family), added to those of the
    /// `networking.k8s.io/v1` ServiceCIDR objects, from which kube-proxy
    /// learns them. A new flow to a cluster IP on a port its service does
    /// not serve is rejected; one to an address of these ranges that no
    /// service holds is dropped.
    #[arg(long, env = "SLUICE_SERVICE_CLUSTER_IP_RANGE", value_delimiter = ',')]
    pub service_cluster_ip_range: Vec<String>,

    /// kube-proxy's `--detect-local-mode`: how pods are told from other
    /// sources. Traffic to a cluster IP from a source that is not a pod is
    /// masqueraded, and pods reach every endpoint of an
    /// externalTrafficPolicy Local service's node port, load-balancer IP
    /// or external IP. `ClusterCIDR` without `--cluster-cidr` detects
    /// nothing (as kube-proxy).
    #[arg(
        long,
        env = "SLUICE_DETECT_LOCAL_MODE",
        value_enum,
        default_value = "ClusterCIDR"
    )]
    pub detect_local_mode: DetectLocalMode,

    /// kube-proxy's `--pod-bridge-interface`: the bridge the pods are
    /// behind, for `--detect-local-mode BridgeInterface`.
    #[arg(long, env = "SLUICE_POD_BRIDGE_INTERFACE")]
    pub pod_bridge_interface: Option<String>,

    /// kube-proxy's `--pod-interface-name-prefix`: the name prefix of the
    /// pods' host-side interfaces, for `--detect-local-mode
    /// InterfaceNamePrefix`.
    #[arg(long, env = "SLUICE_POD_INTERFACE_NAME_PREFIX")]
    pub pod_interface_name_prefix: Option<String>,

    /// kube-proxy's `--masquerade-all`: SNAT every new flow to a cluster IP
    /// to the node, pods' included (external kinds are masqueraded by
    /// their traffic policy either way).
    #[arg(
        long,
        env = "SLUICE_MASQUERADE_ALL",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub masquerade_all: bool,
}

/// What the datapath reports to `sluice monitor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MonitorEvents {
    /// No events.
    Off,
    /// An event for every verdict that is not a plain forward.
    Drops,
    /// `drops`, and an event for new flows (sampled).
    All,
}

impl MonitorEvents {
    /// Its bits of `Config::flags` (`CFG_F_EVENTS_*`), tracing one new flow
    /// in `sample` (a power of two) with `All`.
    pub fn flags(self, sample: u32) -> u32 {
        use sluice_common::config::{
            CFG_EVENTS_SAMPLE_MASK, CFG_EVENTS_SAMPLE_SHIFT, CFG_F_EVENTS_DROPS, CFG_F_EVENTS_TRACE,
        };
        match self {
            MonitorEvents::Off => 0,
            MonitorEvents::Drops => CFG_F_EVENTS_DROPS,
            MonitorEvents::All => {
                let shift = sample.max(1).trailing_zeros() << CFG_EVENTS_SAMPLE_SHIFT;
                CFG_F_EVENTS_DROPS | CFG_F_EVENTS_TRACE | (shift & CFG_EVENTS_SAMPLE_MASK)
            }
        }
    }
}

/// `--socket-lb`: which sockets the socket-level programs balance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketLb {
    /// Every network namespace under the cgroup: the node's and the pods'.
    All,
    /// The node's own network namespace only.
    Host,
    /// None: the programs are not attached.
    Off,
}

impl SocketLb {
    pub fn name(self) -> &'static str {
        match self {
            SocketLb::All => "all",
            SocketLb::Host => "host",
            SocketLb::Off => "off",
        }
    }
}

fn parse_sample(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if n.is_power_of_two() && n <= 32_768 {
        Ok(n)
    } else {
        Err(format!("{n} is not a power of two from 1 to 32768"))
    }
}

/// `--socket-lb`'s value, and whether it was given in the deprecated
/// boolean spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketLbArg {
    pub mode: SocketLb,
    /// `true` or `false`, as before `all|host|off`.
    pub legacy: bool,
}

impl FromStr for SocketLbArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mode, legacy) = match s {
            "all" => (SocketLb::All, false),
            "host" => (SocketLb::Host, false),
            "off" => (SocketLb::Off, false),
            "true" => (SocketLb::Host, true),
            "false" => (SocketLb::Off, true),
            _ => return Err(format!("`{s}`: expected all, host or off")),
        };
        Ok(Self { mode, legacy })
    }
}

/// kube-proxy's `--detect-local-mode` values, spelled as kube-proxy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DetectLocalMode {
    /// Sources in `--cluster-cidr`.
    #[value(name = "ClusterCIDR")]
    ClusterCidr,
    /// Sources in this node's `spec.podCIDRs`.
    #[value(name = "NodeCIDR")]
    NodeCidr,
    /// Packets that enter through `--pod-bridge-interface`.
    #[value(name = "BridgeInterface")]
    BridgeInterface,
    /// Packets that enter through an interface named
    /// `--pod-interface-name-prefix`*.
    #[value(name = "InterfaceNamePrefix")]
    InterfaceNamePrefix,
}

#[derive(Debug, Subcommand)]
pub enum LbCommand {
    /// Every frontend with its backends, their state and live flows.
    List(ListArgs),
}

#[derive(Debug, Subcommand)]
pub enum CtCommand {
    /// Conntrack entries.
    List(CtListArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub bpf: BpfRootArg,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CtListArgs {
    #[command(flatten)]
    pub bpf: BpfRootArg,
    /// Only flows of this frontend (`VIP:PORT`).
    #[arg(long)]
    pub service: Option<SocketAddr>,
    /// Only flows on this backend (id, or `ADDR:PORT`).
    #[arg(long)]
    pub backend: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub bpf: BpfRootArg,
    /// Only events of these reasons (counter names such as `no_backend`,
    /// `source_denied`; repeat or separate with commas).
    #[arg(long, value_delimiter = ',')]
    pub reason: Vec<String>,
    /// Only events for this frontend (`ADDR:PORT`, `[ADDR6]:PORT`, or an
    /// address alone).
    #[arg(long)]
    pub frontend: Option<String>,
    /// Only events whose source, destination or backend is this address.
    #[arg(long)]
    pub addr: Option<std::net::IpAddr>,
    /// Only events whose source, destination or backend port is this one.
    #[arg(long)]
    pub port: Option<u16>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit after this many events (that pass the filters).
    #[arg(long)]
    pub count: Option<u64>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub bpf: BpfRootArg,
    /// The agent's health endpoint.
    #[arg(
        long,
        env = "SLUICE_HEALTHZ_URL",
        default_value = "http://127.0.0.1:10256/healthz"
    )]
    pub healthz_url: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub bpf: BpfRootArg,
    /// The cgroup (v2) the agent attached socket-level balancing to, as its
    /// --cgroup-root (default: the cgroup2 mount's root).
    #[arg(long, env = "SLUICE_CGROUP_ROOT")]
    pub cgroup_root: Option<PathBuf>,
    /// Clean up even while a process (a running agent) holds the
    /// datapath's maps; its programs are detached at once, and freed when
    /// it exits.
    #[arg(long)]
    pub force: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod monitor_flag_tests {
    use super::*;
    use sluice_common::config::{CFG_EVENTS_SAMPLE_MASK, CFG_F_EVENTS_DROPS, CFG_F_EVENTS_TRACE};

    #[test]
    fn monitor_events_become_config_bits() {
        assert_eq!(MonitorEvents::Off.flags(1), 0);
        assert_eq!(MonitorEvents::Drops.flags(16), CFG_F_EVENTS_DROPS);
        let all = MonitorEvents::All.flags(16);
        assert_eq!(
            all & !CFG_EVENTS_SAMPLE_MASK,
            CFG_F_EVENTS_DROPS | CFG_F_EVENTS_TRACE
        );
        assert_eq!((all & CFG_EVENTS_SAMPLE_MASK) >> 2, 4);
        assert_eq!(
            MonitorEvents::All.flags(32_768) & CFG_EVENTS_SAMPLE_MASK,
            15 << 2
        );
        assert!(parse_sample("3").is_err() && parse_sample("65536").is_err());
        assert_eq!(parse_sample("8"), Ok(8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sources_and_durations() {
        assert_eq!("kube".parse::<Source>(), Ok(Source::Kube));
        assert_eq!(
            "dir:/etc/x".parse::<Source>(),
            Ok(Source::Dir("/etc/x".into()))
        );
        assert!("dir:".parse::<Source>().is_err());
        assert!("file:/x".parse::<Source>().is_err());
        assert_eq!(
            "250ms".parse::<HumanDuration>().map(|d| d.0),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(
            "1h".parse::<HumanDuration>().map(|d| d.0),
            Ok(Duration::from_secs(3600))
        );
        assert!("5 m".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn socket_lb_takes_modes_and_the_old_booleans() {
        let parse = |s: &str| s.parse::<SocketLbArg>().map(|a| (a.mode, a.legacy));
        assert_eq!(parse("all"), Ok((SocketLb::All, false)));
        assert_eq!(parse("host"), Ok((SocketLb::Host, false)));
        assert_eq!(parse("off"), Ok((SocketLb::Off, false)));
        assert_eq!(parse("true"), Ok((SocketLb::Host, true)));
        assert_eq!(parse("false"), Ok((SocketLb::Off, true)));
        assert!(parse("yes").is_err());
        let cli = Cli::try_parse_from(["sluice", "agent", "--source", "kube", "--devices", "eth0"]);
        match cli.map(|c| c.command) {
            Ok(Command::Agent(a)) => assert_eq!(a.socket_lb.mode, SocketLb::All),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
