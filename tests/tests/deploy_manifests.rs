//! `deploy/` (apart from the demo's manifests) against the agent it
//! deploys: every manifest parses into its Kubernetes type with no field
//! left over, the DaemonSet's arguments parse with the agent's own CLI, its
//! probes hit the agent's health endpoints, RBAC grants exactly what the
//! agent asks the API for, and the mounts and capabilities are the ones
//! docs/install.md explains. No cluster needed: this reads files.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::{CommandFactory, Parser};
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Container, PodSpec, ServiceAccount, Volume, VolumeMount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sluice::{
    admin,
    cli::{AgentArgs, Cli, Command},
    datapath::DEFAULT_BPF_ROOT,
    sources::kube::API_ACCESS,
};

/// The capabilities the DaemonSet adds after dropping ALL, each explained
/// in docs/install.md (which this test checks mentions them).
const DOCUMENTED_CAPABILITIES: [&str; 3] = ["BPF", "NET_ADMIN", "PERFMON"];

/// Where socket-level balancing must attach: the host's cgroup2 root, so
/// that it covers every process of the node.
const HOST_CGROUP2_ROOT: &str = "/sys/fs/cgroup";

/// Where the agent's in-cluster config (kube's `Config::incluster_env`)
/// finds the API server. The DaemonSet must set them: their default is the
/// `kubernetes` Service's ClusterIP, which only sluice routes.
const API_SERVER_ENV: [&str; 2] = ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"];

/// Environment variables the agent reads that are not CLI flags.
const OTHER_AGENT_ENV: [&str; 3] = ["RUST_LOG", API_SERVER_ENV[0], API_SERVER_ENV[1]];

/// Stands in for `spec.nodeName`, which the kubelet fills in.
const NODE_NAME_STAND_IN: &str = "node-a";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

#[derive(Default)]
struct Manifests {
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    daemon_sets: Vec<DaemonSet>,
}

/// `*.yaml` under `dir`, recursively, except `deploy/demo/` (the demo's
/// manifest directory, which the demo agent reads with `--source dir:`).
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if path != repo().join("deploy/demo") {
                yaml_files(&path, out)?;
            }
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

/// Deserializes `value` as `T` and checks that serializing it back gives
/// `value` again: k8s-openapi ignores unknown fields, so a misspelt field
/// would otherwise vanish without a word.
fn typed<T: DeserializeOwned + Serialize>(value: serde_yaml::Value, what: &str) -> Result<T> {
    let typed: T = serde_yaml::from_value(value.clone()).with_context(|| what.to_owned())?;
    let original = serde_json::to_value(&value)?;
    let round_trip = serde_json::to_value(&typed)?;
    let mut lost = Vec::new();
    differences("", &original, &round_trip, &mut lost);
    ensure!(
        lost.is_empty(),
        "{what}: fields lost in a round trip through the Kubernetes type \
         (misspelt, misplaced or of the wrong type?): {}",
        lost.join(", ")
    );
    Ok(typed)
}

/// JSON paths where `a` and `b` differ.
fn differences(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value::{Array, Object};
    match (a, b) {
        (Object(a), Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let null = serde_json::Value::Null;
                let (x, y) = (a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null));
                differences(&format!("{path}.{k}"), x, y, out);
            }
        }
        (Array(a), Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if a == b => {}
        _ => out.push(if path.is_empty() {
            ".".into()
        } else {
            path.into()
        }),
    }
}

fn load() -> Result<Manifests> {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files)?;
    files.sort();
    ensure!(!files.is_empty(), "no *.yaml under deploy/ (besides demo/)");
    let mut m = Manifests::default();
    for file in files {
        let text = fs::read_to_string(&file)?;
        let name = file
            .strip_prefix(repo())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let what = format!("{name}, document {}", i + 1);
            let value =
                serde_yaml::Value::deserialize(doc).with_context(|| format!("{what}: not YAML"))?;
            if value.is_null() {
                continue; // only comments
            }
            let kind = value
                .get("kind")
                .and_then(serde_yaml::Value::as_str)
                .ok_or_else(|| anyhow!("{what}: no `kind`"))?
                .to_owned();
            let what = format!("{what} ({kind})");
            match kind.as_str() {
                "ServiceAccount" => m.service_accounts.push(typed(value, &what)?),
                "ClusterRole" => m.cluster_roles.push(typed(value, &what)?),
                "ClusterRoleBinding" => m.bindings.push(typed(value, &what)?),
                "DaemonSet" => m.daemon_sets.push(typed(value, &what)?),
                other => bail!(
                    "{what}: kind `{other}` is not expected in deploy/ (add it to this test if it belongs)"
                ),
            }
        }
    }
    Ok(m)
}

/// The one DaemonSet, its pod spec and its (one) container.
fn agent_pod(m: &Manifests) -> Result<(&DaemonSet, &PodSpec, &Container)> {
    let [ds] = m.daemon_sets.as_slice() else {
        bail!(
            "expected exactly one DaemonSet in deploy/, found {}",
            m.daemon_sets.len()
        );
    };
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or_else(|| anyhow!("the DaemonSet has no pod spec"))?;
    let [container] = pod.containers.as_slice() else {
        bail!(
            "expected one container in the DaemonSet, found {}",
            pod.containers.len()
        );
    };
    Ok((ds, pod, container))
}

/// The container's command line as the agent would see it, with each
/// environment variable the agent reads turned into its flag.
fn agent_argv(container: &Container) -> Result<Vec<String>> {
    let command = container.command.clone().unwrap_or_default();
    ensure!(
        command == ["sluice", "agent"],
        "the container command is {command:?}, expected [\"sluice\", \"agent\"]"
    );
    let mut argv = command;
    argv.extend(container.args.clone().unwrap_or_default());

    let cli = Cli::command();
    let agent = cli
        .find_subcommand("agent")
        .ok_or_else(|| anyhow!("the CLI has no `agent` subcommand"))?;
    for var in container.env.iter().flatten() {
        if OTHER_AGENT_ENV.contains(&var.name.as_str()) {
            continue;
        }
        let flag = agent
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == var.name.as_str()))
            .and_then(|a| a.get_long())
            .ok_or_else(|| anyhow!("env {} is read by no agent flag (misspelt?)", var.name))?;
        let value = match (&var.value, &var.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("spec.nodeName") => NODE_NAME_STAND_IN.into(),
                other => bail!("env {}: this test has no stand-in for {other:?}", var.name),
            },
            _ => bail!("env {} has no value or valueFrom", var.name),
        };
        argv.push(format!("--{flag}={value}"));
    }
    Ok(argv)
}

fn agent_args(container: &Container) -> Result<AgentArgs> {
    let argv = agent_argv(container)?;
    let cli = Cli::try_parse_from(&argv)
        .map_err(|e| anyhow!("the agent rejects the DaemonSet's command line {argv:?}:\n{e}"))?;
    match cli.command {
        Command::Agent(args) => Ok(*args),
        other => bail!("{argv:?} parses as {other:?}, not the agent"),
    }
}

/// The hostPath volume mounted at or above `path` (the deepest such mount):
/// the mount, and where `path` is on the host.
fn host_location<'a>(
    pod: &'a PodSpec,
    container: &'a Container,
    path: &Path,
) -> Result<(&'a VolumeMount, PathBuf)> {
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .ok_or_else(|| anyhow!("no volume is mounted at or above {}", path.display()))?;
    let volume: &Volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .ok_or_else(|| anyhow!("volumeMount {} names no volume", mount.name))?;
    let host = volume.host_path.as_ref().ok_or_else(|| {
        anyhow!(
            "{} is on volume {}, which is not a hostPath: it would not be the node's",
            path.display(),
            volume.name
        )
    })?;
    let rest = path.strip_prefix(&mount.mount_path)?;
    Ok((mount, Path::new(&host.path).join(rest)))
}

fn port_of(container: &Container, port: &IntOrString) -> Result<i32> {
    match port {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| anyhow!("probe port {name} names no container port")),
    }
}

#[test]
fn every_manifest_parses_into_its_kind_with_nothing_left_over() -> Result<()> {
    let m = load()?;
    ensure!(
        !m.service_accounts.is_empty(),
        "no ServiceAccount in deploy/"
    );
    ensure!(!m.cluster_roles.is_empty(), "no ClusterRole in deploy/");
    ensure!(!m.bindings.is_empty(), "no ClusterRoleBinding in deploy/");
    agent_pod(&m)?;
    Ok(())
}

#[test]
fn daemonset_command_line_parses_with_the_agent_cli() -> Result<()> {
    let m = load()?;
    let (_, _, container) = agent_pod(&m)?;
    let args = agent_args(container)?;
    assert_eq!(
        args.hostname_override.as_deref(),
        Some(NODE_NAME_STAND_IN),
        "the agent must learn its node's name from the pod (env NODE_NAME from spec.nodeName)"
    );
    Ok(())
}

#[test]
fn agent_reaches_the_api_server_without_service_routing() -> Result<()> {
    let m = load()?;
    let (_, _, container) = agent_pod(&m)?;
    for name in API_SERVER_ENV {
        let var = container
            .env
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .ok_or_else(|| {
                anyhow!(
                    "env {name} is not set: the agent would reach the API server through the \
                     `kubernetes` ClusterIP, which no one routes on a node that boots without \
                     kube-proxy or sluice's pins"
                )
            })?;
        let value = var
            .value
            .as_deref()
            .ok_or_else(|| anyhow!("env {name} needs a literal value"))?;
        ensure!(!value.is_empty(), "env {name} is empty");
        if name == "KUBERNETES_SERVICE_PORT" {
            value
                .parse::<u16>()
                .with_context(|| format!("env {name}={value} is not a port"))?;
        }
    }
    Ok(())
}

#[test]
fn probes_hit_the_agent_health_endpoints() -> Result<()> {
    let m = load()?;
    let (ds, _, container) = agent_pod(&m)?;
    let args = agent_args(container)?;
    let healthz = args.healthz_bind_address;
    ensure!(
        healthz.ip().is_unspecified(),
        "--healthz-bind-address {healthz}: the kubelet probes the node's address, so bind all"
    );
    let probes = [
        (
            "livenessProbe",
            &container.liveness_probe,
            admin::HEALTHZ_PATH,
        ),
        (
            "readinessProbe",
            &container.readiness_probe,
            admin::READYZ_PATH,
        ),
    ];
    for (name, probe, path) in probes {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .ok_or_else(|| anyhow!("the container has no {name} httpGet"))?;
        assert_eq!(
            get.path.as_deref(),
            Some(path),
            "{name} path is not the agent's"
        );
        assert_eq!(
            port_of(container, &get.port)?,
            i32::from(healthz.port()),
            "{name} port is not --healthz-bind-address's"
        );
    }
    let annotations = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|md| md.annotations.clone())
        .unwrap_or_default();
    if let Some(port) = annotations.get("prometheus.io/port") {
        assert_eq!(
            port,
            &args.metrics_bind_address.port().to_string(),
            "prometheus.io/port is not --metrics-bind-address's port"
        );
    }
    Ok(())
}

#[test]
fn cluster_role_grants_exactly_what_the_agent_uses() -> Result<()> {
    let m = load()?;
    let [role] = m.cluster_roles.as_slice() else {
        bail!("expected one ClusterRole, found {}", m.cluster_roles.len());
    };
    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        ensure!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "ClusterRole rule {rule:?}: resourceNames or nonResourceURLs are not what the agent needs"
        );
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    let used: BTreeSet<(String, String, String)> = API_ACCESS
        .iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.into(), a.resource.into(), (*v).into()))
        })
        .collect();
    let extra: Vec<_> = granted.difference(&used).collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    ensure!(
        extra.is_empty() && missing.is_empty(),
        "ClusterRole {} does not match sluice::sources::kube::API_ACCESS: \
         granted but unused (group, resource, verb): {extra:?}; used but not granted: {missing:?}",
        role.metadata.name.as_deref().unwrap_or("(unnamed)")
    );
    Ok(())
}

#[test]
fn binding_ties_the_role_to_the_daemonset_service_account() -> Result<()> {
    let m = load()?;
    let (ds, pod, _) = agent_pod(&m)?;
    let namespace = ds.metadata.namespace.as_deref().unwrap_or("default");
    assert_eq!(
        namespace, "kube-system",
        "the DaemonSet must run in kube-system (system-node-critical pods are limited to it)"
    );
    let account = pod
        .service_account_name
        .as_deref()
        .ok_or_else(|| anyhow!("the DaemonSet names no serviceAccountName"))?;
    ensure!(
        pod.automount_service_account_token != Some(false),
        "the pod must mount its token: the agent uses the in-cluster config"
    );
    let sa = m
        .service_accounts
        .iter()
        .find(|sa| {
            sa.metadata.name.as_deref() == Some(account)
                && sa.metadata.namespace.as_deref() == Some(namespace)
        })
        .ok_or_else(|| anyhow!("no ServiceAccount {namespace}/{account} in deploy/"))?;
    ensure!(
        sa.automount_service_account_token != Some(false),
        "ServiceAccount {account} must not disable token mounting"
    );
    let role = m
        .cluster_roles
        .first()
        .and_then(|r| r.metadata.name.as_deref())
        .ok_or_else(|| anyhow!("no named ClusterRole in deploy/"))?;
    let bound = m.bindings.iter().any(|b| {
        b.role_ref.kind == "ClusterRole"
            && b.role_ref.api_group == "rbac.authorization.k8s.io"
            && b.role_ref.name == role
            && b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == account
                    && s.namespace.as_deref() == Some(namespace)
            })
    });
    ensure!(
        bound,
        "no ClusterRoleBinding binds ClusterRole {role} to ServiceAccount {namespace}/{account}"
    );
    Ok(())
}

#[test]
fn pins_and_cgroup_are_the_nodes() -> Result<()> {
    let m = load()?;
    let (_, pod, container) = agent_pod(&m)?;
    let args = agent_args(container)?;
    ensure!(
        pod.host_network == Some(true),
        "hostNetwork must be true: the programs attach to the node's devices"
    );
    assert_eq!(
        pod.dns_policy.as_deref(),
        Some("Default"),
        "dnsPolicy: the agent must not depend on cluster DNS, a Service it routes itself"
    );

    let root = &args.bpf.bpf_root;
    assert_eq!(
        root,
        Path::new(DEFAULT_BPF_ROOT),
        "--bpf-root: keep the default, so that `sluice status`, `lb list` and `ct list` \
         in the pod need no flag"
    );
    let (mount, on_host) = host_location(pod, container, root)?;
    assert_eq!(
        on_host,
        Path::new(DEFAULT_BPF_ROOT),
        "--bpf-root's hostPath: the pins must be where docs/install.md says they are on the node"
    );
    ensure!(
        mount.read_only != Some(true),
        "the bpffs mount must be writable: the agent pins maps and links"
    );
    ensure!(
        mount.mount_propagation.as_deref() != Some("Bidirectional"),
        "bpffs mount: Bidirectional propagation needs a privileged container"
    );

    if args.socket_lb.mode != sluice::cli::SocketLb::Off {
        let cgroup = args.cgroup_root.as_ref().ok_or_else(|| {
            anyhow!(
                "socket-level balancing is on but --cgroup-root is unset: in a container the \
                 agent would find its own cgroup namespace's root, i.e. only this pod"
            )
        })?;
        let (_, on_host) = host_location(pod, container, cgroup)?;
        assert_eq!(
            on_host,
            Path::new(HOST_CGROUP2_ROOT),
            "--cgroup-root must be the host's cgroup2 root, to balance every process of the node"
        );
    }
    Ok(())
}

#[test]
fn security_context_adds_only_the_documented_capabilities() -> Result<()> {
    let m = load()?;
    let (_, _, container) = agent_pod(&m)?;
    let sc = container
        .security_context
        .as_ref()
        .ok_or_else(|| anyhow!("the container has no securityContext"))?;
    ensure!(
        sc.privileged != Some(true),
        "the container must not be privileged"
    );
    ensure!(
        sc.read_only_root_filesystem == Some(true),
        "readOnlyRootFilesystem must be true"
    );
    assert_eq!(
        sc.run_as_user,
        Some(0),
        "runAsUser must be 0: bpffs and cgroupfs are root's"
    );
    let caps = sc
        .capabilities
        .as_ref()
        .ok_or_else(|| anyhow!("securityContext.capabilities is missing"))?;
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_string()][..]),
        "capabilities.drop must be [ALL]"
    );
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    let documented: BTreeSet<&str> = DOCUMENTED_CAPABILITIES.into_iter().collect();
    assert_eq!(
        added, documented,
        "capabilities.add differs from the documented set (update docs/install.md and this test together)"
    );
    let docs = fs::read_to_string(repo().join("docs/install.md")).context("docs/install.md")?;
    for cap in DOCUMENTED_CAPABILITIES {
        ensure!(
            docs.contains(&format!("CAP_{cap}")),
            "docs/install.md does not explain CAP_{cap}"
        );
    }
    Ok(())
}

#[test]
fn rolling_update_never_runs_two_agents_on_a_node() -> Result<()> {
    let m = load()?;
    let (ds, pod, _) = agent_pod(&m)?;
    let update = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .ok_or_else(|| anyhow!("the DaemonSet has no updateStrategy"))?;
    assert_eq!(
        update.type_.as_deref(),
        Some("RollingUpdate"),
        "updateStrategy.type"
    );
    let surge = update
        .rolling_update
        .as_ref()
        .and_then(|r| r.max_surge.as_ref());
    ensure!(
        matches!(surge, None | Some(IntOrString::Int(0))),
        "maxSurge {surge:?}: two agents on one node would both write the same pinned maps"
    );
    ensure!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "the DaemonSet must tolerate every taint (`- operator: Exists`): every node needs an agent"
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical"),
        "priorityClassName"
    );
    Ok(())
}

#[test]
fn containerfile_builds_the_ebpf_object_into_the_agent() -> Result<()> {
    let path = repo().join("deploy/Containerfile");
    let text = fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    for needle in [
        "cargo xtask build-ebpf",
        "cargo build --release",
        "-p sluice",
        "/usr/local/bin/sluice",
    ] {
        ensure!(
            text.contains(needle),
            "deploy/Containerfile does not contain `{needle}`"
        );
    }
    let build_ebpf = text.find("cargo xtask build-ebpf").unwrap_or(usize::MAX);
    let build_agent = text.find("cargo build --release").unwrap_or(0);
    ensure!(
        build_ebpf < build_agent,
        "deploy/Containerfile must build the eBPF object before the agent, which embeds it"
    );
    Ok(())
}
