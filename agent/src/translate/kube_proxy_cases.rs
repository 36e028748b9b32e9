//! kube-proxy's endpoint categorisation, case by case, against ours.
//!
//! Each row is one service with its endpoints, seen from one node (`n1`,
//! zone `zone-a` unless the row says otherwise), one class of source and
//! one kind of destination, with the verdict kube-proxy gives a new
//! connection: which endpoints it spreads over, DROP, REJECT, or no rule
//! at all. The rows were written from kube-proxy's behaviour
//! (pkg/proxy/topology.go and the nftables proxier's chains), as kube-proxy
//! 1.34+ runs by default: nftables mode, `PreferSameTrafficDistribution`
//! on, and `--detect-local-mode=ClusterCIDR` with a `--cluster-cidr` that
//! holds every pod (so a pod on any node is "local" traffic).
//!
//! Every row runs through the real translation; what a connection then
//! gets follows the datapath's one selection (`select.rs`, used by TC
//! ingress for pods and outside clients and by the socket programs for the
//! node's own processes): the frontend's internal scope for sources inside
//! the cluster when it has one, then active backends, else
//! terminating-serving ones, else the frontend's DROP or REJECT.
//! Packets in namespaces are the integration tests' job, not this table's.
//!
//! Every row gives kube-proxy's verdict. (Differences that remain are
//! outside this table's reach, in docs/service-features.md's
//! "Differences from kube-proxy".)

use std::net::IpAddr;

use k8s_openapi::api::{core::v1::Service, discovery::v1::Endpoint as K8sEndpoint};

use super::{builders::*, *};
use crate::model::{BackendState, Frontend, WhenEmpty};

#[allow(dead_code)] // what only the wire test reads
mod table {
    include!("kube_proxy_table.rs");
}
use table::*;

fn k8s_endpoint(e: &Ep) -> K8sEndpoint {
    let mut out = ep_on(&format!("10.0.0.{}", e.last), e.node);
    out = match e.cond {
        Cond::Ready => out,
        Cond::ServingTerminating => with_conditions(out, Some(false), Some(true), Some(true)),
        Cond::Terminating => with_conditions(out, Some(false), Some(false), Some(true)),
        Cond::NotReady => with_conditions(out, Some(false), Some(false), Some(false)),
    };
    if !e.zones.is_empty() {
        set_zone_hints(&mut out, e.zones);
    }
    if !e.nodes.is_empty() {
        set_node_hints(&mut out, e.nodes);
    }
    out
}

fn k8s_service(s: &Svc) -> Service {
    let mut svc = mk_service(
        "default",
        "web",
        CLUSTER_IP,
        &[node_port("http", "TCP", 80, NODE_PORT)],
    );
    set_ip_families(&mut svc, &["IPv4"]);
    let spec = spec_mut(&mut svc);
    spec.external_ips = Some(vec![EXTERNAL_IP.into()]);
    if s.internal_local {
        spec.internal_traffic_policy = Some("Local".into());
    }
    if s.external_local {
        spec.external_traffic_policy = Some("Local".into());
    }
    spec.traffic_distribution = s.traffic_distribution.map(Into::into);
    if s.load_balancer {
        spec.type_ = Some("LoadBalancer".into());
        set_lb_ingress(&mut svc, &[(LB_IP, None)]);
    } else {
        spec.ports
            .iter_mut()
            .flatten()
            .for_each(|p| p.node_port = None);
    }
    svc
}

fn translate_case(c: &Case) -> Translation {
    let endpoints: Vec<K8sEndpoint> = c.endpoints.iter().map(k8s_endpoint).collect();
    let slice = mk_slice(
        "default",
        "web-1",
        "web",
        &[slice_port("http", "TCP", 8080)],
        endpoints,
    );
    let node = mk_node(
        HERE,
        c.zone,
        &[("InternalIP", NODE_V4), ("InternalIP", NODE_V6)],
    );
    let config = TranslateConfig {
        node_name: HERE.into(),
        node_addresses: vec![],
        ipv6: true,
        masquerade_all: false,
        local: LocalDetector::ClusterCidr(vec![IpNet::parse(CLUSTER_CIDR).unwrap()]),
        service_cidrs: vec![],
    };
    let stores = Stores::from_objects(&[k8s_service(&c.svc)], &[slice], &[node], HERE);
    let mut t = translate(
        &stores.services,
        &stores.slices,
        stores.node.as_ref(),
        &config,
    );
    t.problems.extend(stores.problems);
    t
}

/// The frontend entry a new connection from `source` to `key` uses: the
/// internal scope (when the frontend has one) for sources inside the
/// cluster, which the TC path recognises by `sl_local4` (`--cluster-cidr`
/// here) and the socket programs by being the node's.
fn frontend<'a>(frontends: &'a [Frontend], key: &str, source: Source) -> Option<&'a Frontend> {
    let find = |k: &str| frontends.iter().find(|f| f.key.to_string() == k);
    let internal = format!("{key} (internal)");
    match source {
        PodHere | PodElsewhere | Node => find(&internal).or_else(|| find(key)),
        Outside => find(key),
    }
}

/// What sluice's datapath gives a new connection to `f` (`select.rs`,
/// shared by the TC path and the socket programs: active backends, else
/// terminating-serving ones, else the frontend's DROP or REJECT; a node
/// process sees DROP as a connect() that fails with ETIMEDOUT at once).
fn pick(f: Option<&Frontend>) -> Result<Vec<u8>, Verdict> {
    let Some(f) = f else { return Err(Pass) };
    let with = |state: BackendState| -> Vec<u8> {
        let mut out: Vec<u8> = f
            .backends
            .iter()
            .filter(|b| b.state == state)
            .filter_map(|b| match b.endpoint.addr {
                IpAddr::V4(a) => Some(a.octets()[3]),
                IpAddr::V6(_) => None,
            })
            .collect();
        out.sort_unstable();
        out
    };
    let active = with(BackendState::Active);
    if !active.is_empty() {
        return Ok(active);
    }
    let fallback = with(BackendState::TerminatingServing);
    if !fallback.is_empty() {
        return Ok(fallback);
    }
    Err(match f.when_empty {
        WhenEmpty::Drop => Drop,
        WhenEmpty::Reject => Reject,
    })
}

/// Compares sluice's pick with a verdict; `Err` says how they differ.
fn check(got: &Result<Vec<u8>, Verdict>, want: &Verdict) -> Result<(), String> {
    let same = match (got, want) {
        (Ok(eps), To(w)) => eps.as_slice() == *w,
        (Err(v), w) => v == w,
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(format!("sluice gives {got:?}, the row says {want:?}"))
    }
}

#[test]
fn every_case_gives_its_verdict() {
    let mut failures = Vec::new();
    for c in CASES {
        let t = translate_case(c);
        if !t.problems.is_empty() {
            failures.push(format!("{}: problems {:?}", c.name, t.problems));
            continue;
        }
        let name = ServicePortName::new("default", "web", "http", crate::model::Proto::Tcp);
        let key = c.dest.key();
        let f = t
            .desired
            .services
            .get(&name)
            .and_then(|s| frontend(&s.frontends, &key, c.source));
        let got = pick(f);
        if let Err(e) = check(&got, &c.kube_proxy) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

#[test]
fn cases_are_well_formed() {
    let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "case names must be unique");
    for c in CASES {
        // Another node's pods reach a cluster IP through their own node.
        assert!(
            !(c.source == PodElsewhere && c.dest == ClusterIp),
            "{}: not this node's decision",
            c.name
        );
        if let To(eps) = c.kube_proxy {
            assert!(eps.windows(2).all(|w| w[0] < w[1]), "{}: sort", c.name);
        }
    }
}
