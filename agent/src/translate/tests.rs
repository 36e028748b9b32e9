//! Translation tests: Kubernetes objects built small, translated whole.

use k8s_openapi::{
    api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::{builders::*, *};
use crate::model::{Frontend, FrontendKind, Proto, Scope, ServicePortName, WhenEmpty};

const NODE: &str = "n1";

fn cfg() -> TranslateConfig {
    TranslateConfig {
        node_name: NODE.into(),
        node_addresses: vec![],
        ipv6: false,
        ..TranslateConfig::default()
    }
}

fn run_with(
    services: &[Service],
    slices: &[EndpointSlice],
    node: Option<&Node>,
    config: &TranslateConfig,
) -> Translation {
    let nodes: Vec<Node> = node.cloned().into_iter().collect();
    let stores = Stores::from_objects(services, slices, &nodes, &config.node_name);
    let mut t = translate(
        &stores.services,
        &stores.slices,
        stores.node.as_ref(),
        config,
    );
    t.problems.extend(stores.problems);
    t.problems.sort();
    t
}

fn run(services: &[Service], slices: &[EndpointSlice]) -> Translation {
    run_with(services, slices, None, &cfg())
}

fn spn(name: &str, port: &str, proto: Proto) -> ServicePortName {
    ServicePortName::new("default", name, port, proto)
}

fn tcp(name: &str, port: &str) -> ServicePortName {
    spn(name, port, Proto::Tcp)
}

fn frontends<'a>(t: &'a Translation, name: &ServicePortName) -> &'a [Frontend] {
    &t.desired
        .services
        .get(name)
        .unwrap_or_else(|| {
            panic!(
                "no service port {name}; have {:?}",
                t.desired.services.keys()
            )
        })
        .frontends
}

fn frontend<'a>(t: &'a Translation, name: &ServicePortName, key: &str) -> &'a Frontend {
    frontends(t, name)
        .iter()
        .find(|f| f.key.to_string() == key)
        .unwrap_or_else(|| panic!("no frontend {key} in {name}: {:?}", frontends(t, name)))
}

fn keys(t: &Translation, name: &ServicePortName) -> Vec<(String, FrontendKind)> {
    frontends(t, name)
        .iter()
        .map(|f| (f.key.to_string(), f.kind))
        .collect()
}

fn backends(f: &Frontend) -> Vec<String> {
    f.backends
        .iter()
        .map(|b| format!("{}={}", b.endpoint, b.state.as_str()))
        .collect()
}

fn reasons(t: &Translation) -> Vec<(String, ProblemReason)> {
    t.problems
        .iter()
        .map(|p| (p.object.clone(), p.reason))
        .collect()
}

fn web() -> Service {
    mk_service("default", "web", "10.96.0.10", &[port("http", "TCP", 80)])
}

fn web_slice(
    name: &str,
    endpoints: Vec<k8s_openapi::api::discovery::v1::Endpoint>,
) -> EndpointSlice {
    mk_slice(
        "default",
        name,
        "web",
        &[slice_port("http", "TCP", 8080)],
        endpoints,
    )
}

#[test]
fn cluster_ip_service() {
    let t = run(
        &[web()],
        &[web_slice("web-1", vec![ep("10.0.0.1"), ep("10.0.0.2")])],
    );
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(t.desired.services.len(), 1);
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(f.kind, FrontendKind::ClusterIp);
    assert_eq!(f.when_empty, WhenEmpty::Reject);
    assert_eq!(
        backends(f),
        vec!["10.0.0.1:8080=active", "10.0.0.2:8080=active"]
    );
}

#[test]
fn every_state_is_emitted() {
    let t = run(
        &[web()],
        &[web_slice(
            "web-1",
            vec![
                ep("10.0.0.1"),
                with_conditions(ep("10.0.0.2"), Some(false), Some(true), Some(true)),
                with_conditions(ep("10.0.0.3"), Some(false), Some(false), Some(true)),
                with_conditions(ep("10.0.0.4"), Some(false), Some(false), Some(false)),
                with_conditions(ep("10.0.0.5"), Some(false), None, Some(true)),
            ],
        )],
    );
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(
        backends(f),
        vec![
            "10.0.0.1:8080=active",
            "10.0.0.2:8080=terminating-serving",
            "10.0.0.3:8080=terminating",
            "10.0.0.4:8080=not-ready",
            "10.0.0.5:8080=terminating-serving",
        ]
    );
}

#[test]
fn several_slices_and_an_endpoint_in_two() {
    let t = run(
        &[web()],
        &[
            web_slice("web-b", vec![ep("10.0.0.3"), ep("10.0.0.2")]),
            web_slice(
                "web-a",
                vec![
                    ep("10.0.0.1"),
                    with_conditions(ep("10.0.0.2"), Some(false), Some(false), Some(true)),
                ],
            ),
        ],
    );
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    // 10.0.0.2 is terminating in web-a, ready in web-b: the ready listing wins.
    assert_eq!(
        backends(f),
        vec![
            "10.0.0.1:8080=active",
            "10.0.0.2:8080=active",
            "10.0.0.3:8080=active"
        ]
    );
}

#[test]
fn named_target_port() {
    let mut p = port("http", "TCP", 80);
    p.target_port = Some(IntOrString::String("web".into()));
    let svc = mk_service("default", "web", "10.96.0.10", &[p]);
    let t = run(&[svc], &[web_slice("web-1", vec![ep("10.0.0.1")])]);
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(backends(f), vec!["10.0.0.1:8080=active"]);
}

#[test]
fn unnamed_port_is_named_by_number() {
    let svc = mk_service("default", "one", "10.96.0.11", &[port("", "TCP", 80)]);
    let slices = [
        mk_slice(
            "default",
            "one-a",
            "one",
            &[slice_port("", "TCP", 8080)],
            vec![ep("10.0.0.1")],
        ),
        mk_slice(
            "default",
            "one-b",
            "one",
            &[slice_port_unnamed("TCP", 8080)],
            vec![ep("10.0.0.2")],
        ),
    ];
    let t = run(&[svc], &slices);
    let f = frontend(&t, &tcp("one", "80"), "10.96.0.11:80/TCP");
    assert_eq!(
        backends(f),
        vec!["10.0.0.1:8080=active", "10.0.0.2:8080=active"]
    );
}

#[test]
fn tcp_udp_sctp() {
    let svc = mk_service(
        "default",
        "dns",
        "10.96.0.53",
        &[
            port("dns", "UDP", 53),
            port("dns-tcp", "TCP", 53),
            port("sig", "SCTP", 3868),
        ],
    );
    let slice = mk_slice(
        "default",
        "dns-1",
        "dns",
        &[
            slice_port("dns", "UDP", 5353),
            slice_port("dns-tcp", "TCP", 5354),
            slice_port("sig", "SCTP", 3868),
        ],
        vec![ep("10.0.0.1")],
    );
    let t = run(&[svc], &[slice]);
    // SCTP is served like TCP and UDP (kube-proxy serves it too).
    assert_eq!(
        t.desired.services.keys().cloned().collect::<Vec<_>>(),
        vec![
            spn("dns", "dns", Proto::Udp),
            spn("dns", "dns-tcp", Proto::Tcp),
            spn("dns", "sig", Proto::Sctp)
        ]
    );
    let f = frontend(&t, &spn("dns", "dns", Proto::Udp), "10.96.0.53:53/UDP");
    assert_eq!(backends(f), vec!["10.0.0.1:5353=active"]);
    let f = frontend(&t, &spn("dns", "dns-tcp", Proto::Tcp), "10.96.0.53:53/TCP");
    assert_eq!(backends(f), vec!["10.0.0.1:5354=active"]);
    let f = frontend(&t, &spn("dns", "sig", Proto::Sctp), "10.96.0.53:3868/SCTP");
    assert_eq!(backends(f), vec!["10.0.0.1:3868=active"]);
    assert!(reasons(&t).is_empty(), "{:?}", reasons(&t));
}

#[test]
fn an_unknown_protocol_is_reported_and_skipped() {
    let svc = mk_service(
        "default",
        "odd",
        "10.96.0.54",
        &[port("dns", "UDP", 53), port("quic", "QUIC", 443)],
    );
    let slice = mk_slice(
        "default",
        "odd-1",
        "odd",
        &[slice_port("dns", "UDP", 5353)],
        vec![ep("10.0.0.1")],
    );
    let t = run(&[svc], &[slice]);
    assert_eq!(
        t.desired.services.keys().cloned().collect::<Vec<_>>(),
        vec![spn("odd", "dns", Proto::Udp)]
    );
    assert_eq!(
        reasons(&t),
        vec![(
            "Service default/odd".into(),
            ProblemReason::UnsupportedProtocol
        )]
    );
}

#[test]
fn skipped_services() {
    let mut ext = mk_service("default", "ext", "", &[port("", "TCP", 80)]);
    spec_mut(&mut ext).type_ = Some("ExternalName".into());
    let headless = mk_service("default", "hl", "None", &[port("", "TCP", 80)]);
    let mut other = mk_service("default", "other", "10.96.0.20", &[port("", "TCP", 80)]);
    add_label(
        &mut other.metadata,
        LABEL_SERVICE_PROXY_NAME,
        "someone-else",
    );
    let slices: Vec<EndpointSlice> = ["ext", "hl", "other"]
        .iter()
        .map(|s| {
            mk_slice(
                "default",
                &format!("{s}-1"),
                s,
                &[slice_port("", "TCP", 80)],
                vec![ep("10.0.0.1")],
            )
        })
        .collect();
    let t = run(&[ext, headless, other], &slices);
    assert!(t.desired.services.is_empty());
    assert!(t.problems.is_empty(), "{:?}", t.problems);
}

#[test]
fn dual_stack_keeps_ipv4_and_reports_ipv6() {
    let mut svc = web();
    spec_mut(&mut svc).cluster_ips = Some(vec!["10.96.0.10".into(), "fd00:96::10".into()]);
    let t = run(
        &[svc],
        &[
            web_slice("web-v4", vec![ep("10.0.0.1")]),
            web_slice("web-v6", vec![ep("fd00::1")]),
        ],
    );
    assert_eq!(
        keys(&t, &tcp("web", "http")),
        vec![("10.96.0.10:80/TCP".into(), FrontendKind::ClusterIp)]
    );
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(backends(f), vec!["10.0.0.1:8080=active"]);
    assert_eq!(
        reasons(&t),
        vec![
            (
                "EndpointSlice default/web-v6".into(),
                ProblemReason::Ipv6Unsupported
            ),
            ("Service default/web".into(), ProblemReason::Ipv6Unsupported),
        ]
    );
}

#[test]
fn ipv6_enabled_keeps_families_apart() {
    let mut svc = web();
    spec_mut(&mut svc).cluster_ips = Some(vec!["10.96.0.10".into(), "fd00:96::10".into()]);
    let config = TranslateConfig {
        ipv6: true,
        ..cfg()
    };
    let t = run_with(
        &[svc],
        &[
            web_slice("web-v4", vec![ep("10.0.0.1")]),
            web_slice("web-v6", vec![ep("fd00::1")]),
        ],
        None,
        &config,
    );
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let v4 = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(backends(v4), vec!["10.0.0.1:8080=active"]);
    let v6 = frontend(&t, &tcp("web", "http"), "[fd00:96::10]:80/TCP");
    assert_eq!(backends(v6), vec!["[fd00::1]:8080=active"]);
}

#[test]
fn ipv6_frontends_get_snat_affinity_and_their_own_source_ranges() {
    let config = TranslateConfig {
        ipv6: true,
        node_addresses: vec![
            "192.0.2.1".parse().expect("ip"),
            "fd00::1".parse().expect("ip"),
        ],
        ..cfg()
    };
    // A dual-stack LoadBalancer with externalTrafficPolicy Cluster, session
    // affinity and source ranges of both families.
    let mut svc = mk_service(
        "default",
        "np",
        "10.96.0.50",
        &[node_port("http", "TCP", 80, 30080)],
    );
    let spec = spec_mut(&mut svc);
    spec.type_ = Some("LoadBalancer".into());
    spec.cluster_ips = Some(vec!["10.96.0.50".into(), "fd00:96::50".into()]);
    spec.session_affinity = Some("ClientIP".into());
    spec.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into(), "fd00:c::/64".into()]);
    set_lb_ingress(&mut svc, &[("203.0.113.10", None), ("2001:db8::10", None)]);
    let slices = [
        mk_slice(
            "default",
            "np-v4",
            "np",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.1")],
        ),
        mk_slice(
            "default",
            "np-v6",
            "np",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("fd00::a")],
        ),
    ];
    let t = run_with(&[svc.clone()], &slices, None, &config);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let all = frontends(&t, &tcp("np", "http"));
    let keys: Vec<String> = all.iter().map(|f| f.key.to_string()).collect();
    assert_eq!(
        keys,
        vec![
            "10.96.0.50:80/TCP",
            "192.0.2.1:30080/TCP",
            "203.0.113.10:80/TCP",
            "[2001:db8::10]:80/TCP",
            "[fd00::1]:30080/TCP",
            "[fd00:96::50]:80/TCP",
        ],
        "every frontend of both families"
    );
    for f in all {
        let external = f.kind != FrontendKind::ClusterIp;
        assert_eq!(f.snat, external, "{}: SNAT for external kinds", f.key);
        assert_eq!(f.affinity_timeout, Some(10_800), "{}: affinity", f.key);
        let ranges: Vec<String> = f
            .source_ranges
            .iter()
            .map(|(a, l)| format!("{a}/{l}"))
            .collect();
        let want: Vec<&str> = match (f.kind, f.key.addr.is_ipv6()) {
            (FrontendKind::LoadBalancer, false) => vec!["192.0.2.0/24"],
            (FrontendKind::LoadBalancer, true) => vec!["fd00:c::/64"],
            _ => vec![],
        };
        assert_eq!(ranges, want, "{}: each family its own ranges", f.key);
        // The node's own connections come from a node address: 192.0.2.1
        // is in the IPv4 ranges, fd00::1 in none of the IPv6 ones.
        assert_eq!(
            f.node_denied,
            f.kind == FrontendKind::LoadBalancer && f.key.addr.is_ipv6(),
            "{}: the node's own connections",
            f.key
        );
    }

    // Ranges of one family only: kube-proxy filters that family and leaves
    // the other open.
    spec_mut(&mut svc).load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
    let t = run_with(&[svc], &slices, None, &config);
    let v6_lb = frontend(&t, &tcp("np", "http"), "[2001:db8::10]:80/TCP");
    assert!(v6_lb.source_ranges.is_empty());
    assert!(!v6_lb.node_denied, "a family without ranges is open");
    let v4_lb = frontend(&t, &tcp("np", "http"), "203.0.113.10:80/TCP");
    assert_eq!(v4_lb.source_ranges.len(), 1);
    assert!(!v4_lb.node_denied);
}

#[test]
fn service_without_selector_uses_manual_slices() {
    let mut svc = mk_service(
        "default",
        "legacy",
        "10.96.0.30",
        &[port("pg", "TCP", 5432)],
    );
    spec_mut(&mut svc).selector = None;
    let slice = mk_slice(
        "default",
        "legacy-manual",
        "legacy",
        &[slice_port("pg", "TCP", 5432)],
        vec![ep("192.168.50.5")],
    );
    let t = run(&[svc], &[slice]);
    let f = frontend(&t, &tcp("legacy", "pg"), "10.96.0.30:5432/TCP");
    assert_eq!(backends(f), vec!["192.168.50.5:5432=active"]);
}

#[test]
fn slices_of_other_namespace_or_service_are_not_used() {
    let slices = [
        mk_slice(
            "other",
            "web-1",
            "web",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.9")],
        ),
        mk_slice(
            "default",
            "api-1",
            "api",
            &[slice_port("http", "TCP", 8080)],
            vec![ep("10.0.0.8")],
        ),
    ];
    let t = run(&[web()], &slices);
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert!(f.backends.is_empty());
    assert_eq!(f.when_empty, WhenEmpty::Reject);
}

fn lb_service() -> Service {
    let mut svc = mk_service(
        "default",
        "shop",
        "10.96.0.40",
        &[
            node_port("https", "TCP", 443, 30443),
            port("admin", "TCP", 9000),
        ],
    );
    let spec = spec_mut(&mut svc);
    spec.type_ = Some("LoadBalancer".into());
    spec.external_ips = Some(vec!["198.51.100.1".into()]);
    set_lb_ingress(
        &mut svc,
        &[
            ("203.0.113.10", None),
            ("203.0.113.11", Some("VIP")),
            ("203.0.113.12", Some("Proxy")),
        ],
    );
    svc
}

fn shop_slice() -> EndpointSlice {
    mk_slice(
        "default",
        "shop-1",
        "shop",
        &[
            slice_port("https", "TCP", 8443),
            slice_port("admin", "TCP", 9000),
        ],
        vec![ep_on("10.0.0.1", NODE), ep_on("10.0.0.2", "n2")],
    )
}

#[test]
fn node_port_load_balancer_and_external_ip_frontends() {
    let node = mk_node(
        NODE,
        None,
        &[
            ("InternalIP", "192.168.1.10"),
            ("ExternalIP", "203.0.113.1"),
        ],
    );
    let t = run_with(&[lb_service()], &[shop_slice()], Some(&node), &cfg());
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(
        keys(&t, &tcp("shop", "https")),
        vec![
            ("10.96.0.40:443/TCP".into(), FrontendKind::ClusterIp),
            ("192.168.1.10:30443/TCP".into(), FrontendKind::NodePort),
            ("198.51.100.1:443/TCP".into(), FrontendKind::ExternalIp),
            ("203.0.113.1:30443/TCP".into(), FrontendKind::NodePort),
            ("203.0.113.10:443/TCP".into(), FrontendKind::LoadBalancer),
            ("203.0.113.11:443/TCP".into(), FrontendKind::LoadBalancer),
        ]
    );
    for f in frontends(&t, &tcp("shop", "https")) {
        assert_eq!(
            backends(f),
            vec!["10.0.0.1:8443=active", "10.0.0.2:8443=active"]
        );
        assert_eq!(f.when_empty, WhenEmpty::Reject);
    }
    // The port without a node port has no NodePort frontend.
    assert!(keys(&t, &tcp("shop", "admin"))
        .iter()
        .all(|(_, kind)| *kind != FrontendKind::NodePort));
    assert_eq!(keys(&t, &tcp("shop", "admin")).len(), 4);
}

#[test]
fn configured_node_addresses_override_the_node_object() {
    let node = mk_node(NODE, None, &[("InternalIP", "192.168.1.10")]);
    let config = TranslateConfig {
        node_addresses: vec![ip("10.1.1.1"), ip("fd00::1")],
        ..cfg()
    };
    let t = run_with(&[lb_service()], &[shop_slice()], Some(&node), &config);
    let node_ports: Vec<String> = keys(&t, &tcp("shop", "https"))
        .into_iter()
        .filter(|(_, k)| *k == FrontendKind::NodePort)
        .map(|(key, _)| key)
        .collect();
    assert_eq!(node_ports, vec!["10.1.1.1:30443/TCP"]);
    assert_eq!(
        reasons(&t),
        vec![("Node n1".into(), ProblemReason::Ipv6Unsupported)]
    );
}

#[test]
fn node_port_without_node_addresses_is_reported() {
    let t = run(&[lb_service()], &[shop_slice()]);
    assert!(keys(&t, &tcp("shop", "https"))
        .iter()
        .all(|(_, kind)| *kind != FrontendKind::NodePort));
    assert_eq!(
        reasons(&t),
        vec![("Node n1".into(), ProblemReason::MissingField)]
    );
}

#[test]
fn cluster_ip_type_gets_no_node_port() {
    let svc = mk_service(
        "default",
        "web",
        "10.96.0.10",
        &[node_port("http", "TCP", 80, 30080)],
    );
    let node = mk_node(NODE, None, &[("InternalIP", "192.168.1.10")]);
    let t = run_with(
        &[svc],
        &[web_slice("web-1", vec![ep("10.0.0.1")])],
        Some(&node),
        &cfg(),
    );
    assert_eq!(keys(&t, &tcp("web", "http")).len(), 1);
}

#[test]
fn node_port_type() {
    let svc = mk_node_port_service(
        "default",
        "web",
        "10.96.0.10",
        &[node_port("http", "TCP", 80, 30080)],
    );
    let node = mk_node(NODE, None, &[("InternalIP", "192.168.1.10")]);
    let t = run_with(
        &[svc],
        &[web_slice("web-1", vec![ep("10.0.0.1")])],
        Some(&node),
        &cfg(),
    );
    let f = frontend(&t, &tcp("web", "http"), "192.168.1.10:30080/TCP");
    assert_eq!(f.kind, FrontendKind::NodePort);
    assert_eq!(backends(f), vec!["10.0.0.1:8080=active"]);
}

#[test]
fn internal_traffic_policy_local() {
    let mut svc = web();
    spec_mut(&mut svc).internal_traffic_policy = Some("Local".into());
    let key = "10.96.0.10:80/TCP";

    // With a local endpoint: only it.
    let t = run(
        &[svc.clone()],
        &[web_slice(
            "web-1",
            vec![ep_on("10.0.0.1", NODE), ep_on("10.0.0.2", "n2")],
        )],
    );
    let f = frontend(&t, &tcp("web", "http"), key);
    assert_eq!(backends(f), vec!["10.0.0.1:8080=active"]);
    assert_eq!(f.when_empty, WhenEmpty::Reject);

    // Endpoints elsewhere only: empty, dropped.
    let t = run(
        &[svc.clone()],
        &[web_slice("web-1", vec![ep_on("10.0.0.2", "n2")])],
    );
    let f = frontend(&t, &tcp("web", "http"), key);
    assert!(f.backends.is_empty());
    assert_eq!(f.when_empty, WhenEmpty::Drop);

    // No endpoints at all: rejected.
    let t = run(&[svc.clone()], &[]);
    let f = frontend(&t, &tcp("web", "http"), key);
    assert!(f.backends.is_empty());
    assert_eq!(f.when_empty, WhenEmpty::Reject);

    // A local terminating endpoint is kept (to drain), remote ones still
    // make it a drop.
    let t = run(
        &[svc],
        &[web_slice(
            "web-1",
            vec![
                with_conditions(
                    ep_on("10.0.0.1", NODE),
                    Some(false),
                    Some(false),
                    Some(true),
                ),
                ep_on("10.0.0.2", "n2"),
            ],
        )],
    );
    let f = frontend(&t, &tcp("web", "http"), key);
    assert_eq!(backends(f), vec!["10.0.0.1:8080=terminating"]);
    assert_eq!(f.when_empty, WhenEmpty::Drop);
}

#[test]
fn external_traffic_policy_local() {
    let mut svc = lb_service();
    spec_mut(&mut svc).external_traffic_policy = Some("Local".into());
    let node = mk_node(NODE, None, &[("InternalIP", "192.168.1.10")]);
    let https = tcp("shop", "https");

    let t = run_with(&[svc.clone()], &[shop_slice()], Some(&node), &cfg());
    let (mut internal, mut external) = (0, 0);
    for f in frontends(&t, &https) {
        // Outside clients get this node's endpoints; sources inside the
        // cluster get every endpoint from the internal scope, which only
        // external kinds have ("short-circuit").
        let all = f.kind == FrontendKind::ClusterIp || f.key.scope == Scope::Internal;
        let want: &[&str] = if all {
            &["10.0.0.1:8443=active", "10.0.0.2:8443=active"]
        } else {
            &["10.0.0.1:8443=active"]
        };
        assert_eq!(backends(f), want, "{}", f.key);
        assert_eq!(f.when_empty, WhenEmpty::Reject);
        assert!(!f.snat, "{}: policy Local keeps the client address", f.key);
        if f.key.scope == Scope::Internal {
            assert_ne!(f.kind, FrontendKind::ClusterIp);
            internal += 1;
        } else if f.kind != FrontendKind::ClusterIp {
            external += 1;
        }
    }
    assert!(external > 0);
    assert_eq!(
        internal, external,
        "every external frontend has an internal scope"
    );

    // No local endpoint: external frontends drop, the cluster IP still works.
    let remote_only = mk_slice(
        "default",
        "shop-1",
        "shop",
        &[slice_port("https", "TCP", 8443)],
        vec![ep_on("10.0.0.2", "n2")],
    );
    let t = run_with(&[svc.clone()], &[remote_only], Some(&node), &cfg());
    for f in frontends(&t, &https) {
        if f.kind == FrontendKind::ClusterIp || f.key.scope == Scope::Internal {
            assert_eq!(backends(f), vec!["10.0.0.2:8443=active"]);
            assert_eq!(f.when_empty, WhenEmpty::Reject);
        } else {
            assert!(f.backends.is_empty(), "{}", f.key);
            assert_eq!(f.when_empty, WhenEmpty::Drop, "{}", f.key);
        }
    }

    // No endpoints at all: everything rejects.
    let t = run_with(&[svc], &[], Some(&node), &cfg());
    for f in frontends(&t, &https) {
        assert!(f.backends.is_empty());
        assert_eq!(f.when_empty, WhenEmpty::Reject, "{}", f.key);
    }
}

fn zoned_node(zone: Option<&str>) -> Node {
    mk_node(NODE, zone, &[("InternalIP", "192.168.1.10")])
}

#[test]
fn topology_hints_used() {
    let slice = web_slice(
        "web-1",
        vec![
            hinted(ep("10.0.0.1"), &["zone-a"]),
            hinted(ep("10.0.0.2"), &["zone-b"]),
            hinted(ep("10.0.0.3"), &["zone-a", "zone-c"]),
            // Terminating: never selected while a ready endpoint exists,
            // kept to drain.
            with_conditions(ep("10.0.0.4"), Some(false), Some(true), Some(true)),
        ],
    );
    let t = run_with(
        &[web()],
        &[slice],
        Some(&zoned_node(Some("zone-a"))),
        &cfg(),
    );
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(
        backends(f),
        vec![
            "10.0.0.1:8080=active",
            "10.0.0.3:8080=active",
            "10.0.0.4:8080=terminating-serving"
        ]
    );
}

#[test]
fn topology_hints_not_used() {
    let all = vec!["10.0.0.1:8080=active", "10.0.0.2:8080=active"];
    // One ready endpoint without hints.
    let slice = web_slice(
        "web-1",
        vec![hinted(ep("10.0.0.1"), &["zone-a"]), ep("10.0.0.2")],
    );
    let t = run_with(
        &[web()],
        &[slice],
        Some(&zoned_node(Some("zone-a"))),
        &cfg(),
    );
    assert_eq!(
        backends(frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP")),
        all
    );

    // This node's zone is in no hint.
    let hinted_slice = web_slice(
        "web-1",
        vec![
            hinted(ep("10.0.0.1"), &["zone-a"]),
            hinted(ep("10.0.0.2"), &["zone-b"]),
        ],
    );
    let t = run_with(
        &[web()],
        std::slice::from_ref(&hinted_slice),
        Some(&zoned_node(Some("zone-z"))),
        &cfg(),
    );
    assert_eq!(
        backends(frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP")),
        all
    );

    // The node has no zone label, or no Node object is known.
    let t = run_with(
        &[web()],
        std::slice::from_ref(&hinted_slice),
        Some(&zoned_node(None)),
        &cfg(),
    );
    assert_eq!(
        backends(frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP")),
        all
    );
    let t = run(&[web()], &[hinted_slice]);
    assert_eq!(
        backends(frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP")),
        all
    );
}

#[test]
fn topology_hints_do_not_apply_to_local_policy() {
    let mut svc = web();
    spec_mut(&mut svc).internal_traffic_policy = Some("Local".into());
    let slice = web_slice(
        "web-1",
        vec![
            hinted(ep_on("10.0.0.1", NODE), &["zone-b"]),
            hinted(ep_on("10.0.0.2", "n2"), &["zone-a"]),
        ],
    );
    let t = run_with(&[svc], &[slice], Some(&zoned_node(Some("zone-a"))), &cfg());
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(backends(f), vec!["10.0.0.1:8080=active"]);
}

#[test]
fn malformed_inputs_do_not_disturb_others() {
    let bad_ip = mk_service("default", "bad-ip", "10.96.0.300", &[port("", "TCP", 80)]);
    let bad_ports = mk_service(
        "default",
        "bad-ports",
        "10.96.0.51",
        &[
            port("zero", "TCP", 0),
            port("big", "TCP", 70000),
            port("ok", "TCP", 81),
        ],
    );
    let no_spec = Service {
        metadata: meta("default", "no-spec"),
        ..Default::default()
    };
    let bad_slice = mk_slice(
        "default",
        "web-bad",
        "web",
        &[slice_port("http", "TCP", 8080)],
        vec![ep("not-an-ip"), ep("10.0.0.7")],
    );
    let t = run(
        &[bad_ip, bad_ports, no_spec, web()],
        &[web_slice("web-1", vec![ep("10.0.0.1")]), bad_slice],
    );
    // web is whole, plus the good endpoint of the bad slice.
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(
        backends(f),
        vec!["10.0.0.1:8080=active", "10.0.0.7:8080=active"]
    );
    // bad-ports keeps its good port.
    assert_eq!(keys(&t, &tcp("bad-ports", "ok")).len(), 1);
    // bad-ip has no frontend at all.
    assert!(!t.desired.services.contains_key(&tcp("bad-ip", "80")));
    assert_eq!(
        reasons(&t),
        vec![
            (
                "EndpointSlice default/web-bad".into(),
                ProblemReason::InvalidAddress
            ),
            (
                "Service default/bad-ip".into(),
                ProblemReason::InvalidAddress
            ),
            (
                "Service default/bad-ports".into(),
                ProblemReason::InvalidPort
            ),
            (
                "Service default/bad-ports".into(),
                ProblemReason::InvalidPort
            ),
            (
                "Service default/no-spec".into(),
                ProblemReason::MissingField
            ),
        ]
    );
}

fn world() -> (Vec<Service>, Vec<EndpointSlice>, Node) {
    let mut local = web();
    local.metadata = meta("default", "local");
    spec_mut(&mut local).internal_traffic_policy = Some("Local".into());
    spec_mut(&mut local).cluster_ips = Some(vec!["10.96.0.12".into(), "fd00::12".into()]);
    let services = vec![
        web(),
        lb_service(),
        local,
        mk_service(
            "default",
            "dns",
            "10.96.0.53",
            &[port("dns", "UDP", 53), port("sig", "SCTP", 9)],
        ),
    ];
    let slices = vec![
        web_slice(
            "web-2",
            vec![ep_on("10.0.0.3", NODE), hinted(ep("10.0.0.4"), &["a"])],
        ),
        web_slice("web-1", vec![ep("10.0.0.1"), ep("10.0.0.2"), ep("bogus")]),
        shop_slice(),
        mk_slice(
            "default",
            "local-1",
            "local",
            &[slice_port("http", "TCP", 80)],
            vec![ep_on("10.0.1.1", NODE)],
        ),
        mk_slice(
            "default",
            "local-2",
            "local",
            &[slice_port("http", "TCP", 80)],
            vec![ep_on("fd00::1:1", NODE)],
        ),
        mk_slice(
            "default",
            "dns-1",
            "dns",
            &[slice_port("dns", "UDP", 53)],
            vec![ep("10.0.2.1")],
        ),
    ];
    let node = mk_node(
        NODE,
        Some("a"),
        &[("InternalIP", "192.168.1.10"), ("InternalIP", "fd00::10")],
    );
    (services, slices, node)
}

#[test]
fn deterministic() {
    let (services, slices, node) = world();
    let a = run_with(&services, &slices, Some(&node), &cfg());
    let b = run_with(&services, &slices, Some(&node), &cfg());
    assert_eq!(a, b);
    assert!(!a.desired.services.is_empty());
    assert!(!a.problems.is_empty());

    // Input order does not matter.
    let mut rs = services.clone();
    rs.reverse();
    let mut rsl = slices.clone();
    rsl.reverse();
    rsl.rotate_left(2);
    let c = run_with(&rs, &rsl, Some(&node), &cfg());
    assert_eq!(a, c);

    // Neither does the order of the stores' own construction.
    let stores = Stores::from_objects(&services, &slices, std::slice::from_ref(&node), NODE);
    let rev = Stores::from_objects(&rs, &rsl, std::slice::from_ref(&node), NODE);
    assert_eq!(stores, rev);

    // Frontends and backends come sorted.
    for svc in a.desired.services.values() {
        assert!(svc.frontends.windows(2).all(|w| w[0].key < w[1].key));
        for f in &svc.frontends {
            assert!(f.backends.windows(2).all(|w| w[0].endpoint < w[1].endpoint));
        }
    }
}

#[test]
fn resource_version_changes_nothing() {
    let svc = web();
    let mut bumped = svc.clone();
    bumped.metadata.resource_version = Some("999".into());
    assert_eq!(
        ServiceInfo::from_service(&svc).unwrap(),
        ServiceInfo::from_service(&bumped).unwrap()
    );
}

#[test]
fn node_object_of_another_node_is_ignored() {
    let node = mk_node("n2", Some("a"), &[("InternalIP", "192.168.1.20")]);
    let info = NodeInfo::from_node(&node).unwrap();
    let t = translate(&BTreeMap::new(), &BTreeMap::new(), Some(&info), &cfg());
    assert_eq!(
        reasons(&t),
        vec![("Node n2".into(), ProblemReason::InvalidValue)]
    );
}

#[test]
fn duplicate_objects_keep_the_first() {
    let mut second = web();
    spec_mut(&mut second).cluster_ips = Some(vec!["10.96.9.9".into()]);
    let t = run(&[web(), second], &[]);
    assert_eq!(keys(&t, &tcp("web", "http")).len(), 1);
    frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(
        reasons(&t),
        vec![("Service default/web".into(), ProblemReason::Duplicate)]
    );
}

#[test]
fn trimmed_objects_are_small() {
    // The memory goal: well under 1 kB per service with a few endpoints.
    let svc = ServiceInfo::from_service(&lb_service()).unwrap().unwrap();
    let slice = SliceInfo::from_slice(&shop_slice()).unwrap().unwrap();
    // Inline in the stores' B-tree nodes: one port and one cluster IP in
    // place (more on the heap), the list mark in the padding, and what
    // most services leave empty behind one pointer.
    assert!(std::mem::size_of::<ServiceInfo>() <= 72);
    let plain = ServiceInfo::from_service(&mk_service(
        "default",
        "plain",
        "10.96.0.10",
        &[port("http", "TCP", 80)],
    ))
    .unwrap()
    .unwrap();
    assert!(plain.extras.is_none(), "{plain:?}");
    assert!(
        !plain.ports.spilled() && !plain.cluster_ips.spilled(),
        "one port and one cluster IP are held in place: {plain:?}"
    );
    assert!(std::mem::size_of::<SliceInfo>() <= 64);
    let heap = |s: &ServiceInfo| {
        usize::from(s.cluster_ips.spilled()) * std::mem::size_of_val::<[IpAddr]>(&s.cluster_ips)
            + s.extras
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<ServiceExtras>())
            + std::mem::size_of_val::<[IpAddr]>(s.external_ips())
            + std::mem::size_of_val::<[IpAddr]>(s.load_balancer_ips())
            // Port names are interned: shared, not per object.
            + usize::from(s.ports.spilled()) * std::mem::size_of_val::<[PortInfo]>(&s.ports)
    };
    // Each endpoint, and once each place (node and hints) they share.
    let places: std::collections::HashSet<*const crate::translate::objects::Place> = slice
        .endpoints
        .iter()
        .filter_map(|e| e.place.map(|p| p as *const _))
        .collect();
    // An IPv4 endpoint is 8 bytes: its address, its conditions and its
    // place's id in one word.
    assert_eq!(slice.endpoints.heap_bytes(), 8 * slice.endpoints.len());
    let slice_heap = slice.endpoints.heap_bytes()
        + places.len() * std::mem::size_of::<crate::translate::objects::Place>()
        + usize::from(slice.ports.spilled()) * std::mem::size_of_val::<[SlicePort]>(&slice.ports);
    let total = std::mem::size_of::<ServiceInfo>()
        + heap(&svc)
        + std::mem::size_of::<SliceInfo>()
        + slice_heap;
    assert!(total < 1024, "{total} bytes");
}

/// A NodePort service on a dual-stack node, IPv6 on.
fn family_world(families: Option<&[&str]>, cluster_ips: &[&str]) -> Translation {
    let mut svc = mk_node_port_service(
        "default",
        "web",
        cluster_ips[0],
        &[node_port("http", "TCP", 80, 30080)],
    );
    spec_mut(&mut svc).cluster_ips = Some(cluster_ips.iter().map(|s| (*s).into()).collect());
    if let Some(f) = families {
        set_ip_families(&mut svc, f);
    }
    let node = mk_node(
        NODE,
        None,
        &[("InternalIP", "192.168.1.10"), ("InternalIP", "fd00::10")],
    );
    let config = TranslateConfig {
        ipv6: true,
        ..cfg()
    };
    run_with(
        &[svc],
        &[
            web_slice("web-v4", vec![ep("10.0.0.1")]),
            web_slice("web-v6", vec![ep("fd00::a")]),
        ],
        Some(&node),
        &config,
    )
}

fn frontend_keys(t: &Translation) -> Vec<String> {
    keys(t, &tcp("web", "http"))
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[test]
fn single_stack_ipv4_gets_no_ipv6_node_port() {
    let t = family_world(Some(&["IPv4"]), &["10.96.0.10"]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(
        frontend_keys(&t),
        vec!["10.96.0.10:80/TCP", "192.168.1.10:30080/TCP"]
    );
}

#[test]
fn single_stack_ipv6_gets_no_ipv4_node_port() {
    let t = family_world(Some(&["IPv6"]), &["fd00:96::10"]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(
        frontend_keys(&t),
        vec!["[fd00::10]:30080/TCP", "[fd00:96::10]:80/TCP"]
    );
    let np = frontend(&t, &tcp("web", "http"), "[fd00::10]:30080/TCP");
    assert_eq!(backends(np), vec!["[fd00::a]:8080=active"]);
}

#[test]
fn dual_stack_gets_node_ports_of_both_families() {
    let t = family_world(Some(&["IPv6", "IPv4"]), &["fd00:96::10", "10.96.0.10"]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(
        frontend_keys(&t),
        vec![
            "10.96.0.10:80/TCP",
            "192.168.1.10:30080/TCP",
            "[fd00::10]:30080/TCP",
            "[fd00:96::10]:80/TCP"
        ]
    );
    for f in frontends(&t, &tcp("web", "http")) {
        let want = if f.key.addr.is_ipv4() {
            "10.0.0.1:8080=active"
        } else {
            "[fd00::a]:8080=active"
        };
        assert_eq!(backends(f), vec![want], "{}", f.key);
    }
}

#[test]
fn without_ip_families_the_cluster_ips_decide() {
    let t = family_world(None, &["10.96.0.10"]);
    assert_eq!(
        frontend_keys(&t),
        vec!["10.96.0.10:80/TCP", "192.168.1.10:30080/TCP"]
    );
    let t = family_world(None, &["fd00:96::10"]);
    assert_eq!(
        frontend_keys(&t),
        vec!["[fd00::10]:30080/TCP", "[fd00:96::10]:80/TCP"]
    );
    let t = family_world(None, &["10.96.0.10", "fd00:96::10"]);
    assert_eq!(frontend_keys(&t).len(), 4);
}

#[test]
fn addresses_of_a_family_the_service_lacks_get_no_frontend() {
    let mut svc = mk_service(
        "default",
        "web",
        "10.96.0.10",
        &[node_port("http", "TCP", 80, 30080)],
    );
    spec_mut(&mut svc).type_ = Some("LoadBalancer".into());
    spec_mut(&mut svc).external_ips = Some(vec!["198.51.100.1".into(), "2001:db8::1".into()]);
    set_ip_families(&mut svc, &["IPv4"]);
    set_lb_ingress(&mut svc, &[("203.0.113.10", None), ("2001:db8::10", None)]);
    let config = TranslateConfig {
        ipv6: true,
        node_addresses: vec![ip("192.168.1.10"), ip("fd00::10")],
        ..cfg()
    };
    let t = run_with(
        &[svc],
        &[web_slice("web-v4", vec![ep("10.0.0.1")])],
        None,
        &config,
    );
    assert_eq!(
        frontend_keys(&t),
        vec![
            "10.96.0.10:80/TCP",
            "192.168.1.10:30080/TCP",
            "198.51.100.1:80/TCP",
            "203.0.113.10:80/TCP"
        ]
    );
    assert_eq!(
        reasons(&t),
        vec![
            ("Service default/web".into(), ProblemReason::InvalidAddress),
            ("Service default/web".into(), ProblemReason::InvalidAddress),
        ]
    );
    assert!(t.problems.iter().any(|p| p.detail.contains("2001:db8::1")));
    assert!(t.problems.iter().any(|p| p.detail.contains("2001:db8::10")));
}

#[test]
fn node_hints_keep_cluster_traffic_on_this_node() {
    let slice = web_slice(
        "web-1",
        vec![
            hinted(node_hinted(ep_on("10.0.0.1", NODE), &[NODE]), &["zone-a"]),
            hinted(node_hinted(ep_on("10.0.0.2", "n2"), &["n2"]), &["zone-a"]),
            hinted(node_hinted(ep_on("10.0.0.3", "n3"), &["n3"]), &["zone-b"]),
        ],
    );
    let mut svc = web();
    spec_mut(&mut svc).traffic_distribution = Some("PreferSameNode".into());
    let t = run_with(
        &[svc.clone()],
        std::slice::from_ref(&slice),
        Some(&zoned_node(Some("zone-a"))),
        &cfg(),
    );
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(backends(f), vec!["10.0.0.1:8080=active"]);

    // Another node with no endpoint hinted for it: the zone hints decide.
    let elsewhere = TranslateConfig {
        node_name: "n9".into(),
        ..cfg()
    };
    let node = mk_node("n9", Some("zone-a"), &[("InternalIP", "192.168.1.19")]);
    let t = run_with(&[svc], &[slice], Some(&node), &elsewhere);
    let f = frontend(&t, &tcp("web", "http"), "10.96.0.10:80/TCP");
    assert_eq!(
        backends(f),
        vec!["10.0.0.1:8080=active", "10.0.0.2:8080=active"]
    );
}

#[test]
fn masquerade_follows_kube_proxy_flags() {
    let node = mk_node(NODE, None, &[("InternalIP", "192.168.1.10")]);
    let https = tcp("shop", "https");
    let mut local_svc = lb_service();
    spec_mut(&mut local_svc).external_traffic_policy = Some("Local".into());
    let detection = LocalDetector::ClusterCidr(vec![IpNet::parse("10.0.0.0/16").unwrap()]);
    // (masquerade_all, local detection) -> (cluster IP: snat,
    // masquerade_outside) and external kinds by their traffic policy.
    let cases = [
        (false, LocalDetector::Off, false, false),
        (false, detection.clone(), false, true),
        (true, LocalDetector::Off, true, false),
        (true, detection.clone(), true, false),
    ];
    for (masquerade_all, local, cluster_snat, cluster_outside) in cases {
        let config = TranslateConfig {
            masquerade_all,
            local: local.clone(),
            ..cfg()
        };
        for (svc, external_snat) in [(lb_service(), true), (local_svc.clone(), false)] {
            let t = run_with(&[svc], &[shop_slice()], Some(&node), &config);
            for f in frontends(&t, &https) {
                let ctx = format!("{} with --masquerade-all={masquerade_all} {local:?}", f.key);
                if f.kind == FrontendKind::ClusterIp {
                    assert_eq!(f.snat, cluster_snat, "{ctx}");
                    assert_eq!(f.masquerade_outside, cluster_outside, "{ctx}");
                } else {
                    // kube-proxy masquerades external traffic with policy
                    // Cluster whatever the flags, never with Local, and
                    // short-circuited pods not at all.
                    let want = external_snat && f.key.scope == Scope::External;
                    assert_eq!(f.snat, want, "{ctx}");
                    assert!(!f.masquerade_outside, "{ctx}");
                }
            }
        }
    }
}

#[test]
fn node_cidr_detection_takes_the_nodes_pod_cidrs() {
    let mut node = mk_node(NODE, None, &[("InternalIP", "192.168.1.10")]);
    node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        pod_cidrs: Some(vec!["10.244.1.0/24".into(), "bogus".into()]),
        ..Default::default()
    });
    let config = TranslateConfig {
        local: LocalDetector::NodeCidr,
        ..cfg()
    };
    let t = run_with(&[web()], &[], Some(&node), &config);
    let want: std::collections::BTreeSet<(std::net::IpAddr, u8)> =
        [("10.244.1.0".parse().unwrap(), 24)].into();
    assert_eq!(t.desired.local_sources, want);
    assert!(
        t.problems
            .iter()
            .any(|p| p.reason == ProblemReason::InvalidAddress && p.detail.contains("bogus")),
        "{:?}",
        t.problems
    );
    // Without detection the set is empty, whatever the node says.
    let t = run_with(&[web()], &[], Some(&node), &cfg());
    assert!(t.desired.local_sources.is_empty());
}

/// Issue 18: addresses that are never a service's are refused for every
/// frontend kind and for backends, reported `forbidden_address`, and the
/// rest of the service works.
#[test]
fn frontends_and_backends_on_forbidden_addresses_are_refused() {
    let config = TranslateConfig {
        ipv6: true,
        ..cfg()
    };
    let node = mk_node(
        NODE,
        None,
        &[("InternalIP", "127.0.0.1"), ("InternalIP", "192.168.1.10")],
    );
    // The cluster IP itself on loopback: no cluster-IP frontend.
    let loopback = mk_service("default", "lo", "127.0.0.1", &[port("http", "TCP", 80)]);
    // A LoadBalancer whose other addresses are all dangerous but one.
    let mut svc = lb_service();
    let spec = spec_mut(&mut svc);
    spec.external_ips = Some(vec![
        "0.0.0.0".into(),
        "255.255.255.255".into(),
        "224.0.0.5".into(),
        "198.51.100.1".into(),
    ]);
    set_lb_ingress(
        &mut svc,
        &[
            ("169.254.169.254", None),
            ("203.0.113.10", None),
            ("::ffff:127.0.0.1", None),
        ],
    );
    let mut slice = shop_slice();
    slice.endpoints.push(ep("127.0.0.1"));
    slice.endpoints.push(ep("169.254.0.9"));
    let lo_slice = mk_slice(
        "default",
        "lo-1",
        "lo",
        &[slice_port("http", "TCP", 8080)],
        vec![ep("10.0.0.9")],
    );
    let t = run_with(&[loopback, svc], &[slice, lo_slice], Some(&node), &config);
    assert!(!t.desired.services.contains_key(&tcp("lo", "http")));
    assert_eq!(
        keys(&t, &tcp("shop", "https")),
        vec![
            ("10.96.0.40:443/TCP".into(), FrontendKind::ClusterIp),
            ("192.168.1.10:30443/TCP".into(), FrontendKind::NodePort),
            ("198.51.100.1:443/TCP".into(), FrontendKind::ExternalIp),
            ("203.0.113.10:443/TCP".into(), FrontendKind::LoadBalancer),
        ]
    );
    for f in frontends(&t, &tcp("shop", "https")) {
        assert_eq!(
            backends(f),
            vec!["10.0.0.1:8443=active", "10.0.0.2:8443=active"]
        );
    }
    let forbidden: Vec<String> = t
        .problems
        .iter()
        .filter(|p| p.reason == ProblemReason::ForbiddenAddress)
        .map(|p| p.to_string())
        .collect();
    assert_eq!(forbidden.len(), 5, "{forbidden:#?}");
    for what in [
        "127.0.0.1 (loopback)",
        "0.0.0.0 (unspecified)",
        "255.255.255.255 (broadcast)",
        "224.0.0.5 (multicast)",
        "169.254.169.254 (link-local)",
        "::ffff:127.0.0.1 (loopback)",
        "169.254.0.9 (link-local)",
    ] {
        assert!(
            forbidden.iter().any(|p| p.contains(what)),
            "{what} not reported: {forbidden:#?}"
        );
    }
}

#[test]
fn cluster_ips_of_services_with_ports_form_the_rejected_set() {
    // kube-proxy's `cluster-ips` set: every cluster IP of a service it
    // proxies, served ports or not (an SCTP-only port still counts), and
    // none of a service labelled for another proxy or without ports.
    let mut sctp = mk_service("default", "sctp", "10.96.0.11", &[port("s", "SCTP", 9)]);
    spec_mut(&mut sctp).ports = Some(vec![port("s", "SCTP", 9)]);
    let mut other = mk_service("default", "other", "10.96.0.12", &[port("http", "TCP", 80)]);
    add_label(
        &mut other.metadata,
        "service.kubernetes.io/service-proxy-name",
        "elsewhere",
    );
    let portless = mk_service("default", "portless", "10.96.0.13", &[]);
    let mut dual = mk_service("default", "dual", "10.96.0.14", &[port("http", "TCP", 80)]);
    spec_mut(&mut dual).cluster_ips = Some(vec!["10.96.0.14".into(), "fd00:96::14".into()]);
    set_ip_families(&mut dual, &["IPv4", "IPv6"]);
    let services = [web(), sctp, other, portless, dual];

    let t = run_with(&services, &[], None, &cfg());
    let want: crate::model::ClusterIps =
        [ip("10.96.0.10"), ip("10.96.0.11"), ip("10.96.0.14")].into();
    assert_eq!(
        t.desired.cluster_ips, want,
        "IPv6 is off: no IPv6 cluster IP"
    );

    let v6 = TranslateConfig {
        ipv6: true,
        ..cfg()
    };
    let t = run_with(&services, &[], None, &v6);
    assert!(t.desired.cluster_ips.contains(&ip("fd00:96::14")));
    assert_eq!(t.desired.cluster_ips.len(), 4);
}

#[test]
fn service_cidrs_join_the_flag_and_the_objects_of_balanced_families() {
    let config = TranslateConfig {
        service_cidrs: vec![
            IpNet::parse("10.96.0.0/16").unwrap(),
            IpNet::parse("fd00:96::/108").unwrap(),
        ],
        ..cfg()
    };
    let objects = [
        IpNet::parse("10.97.0.0/24").unwrap(),
        IpNet::parse("10.96.0.0/16").unwrap(),
    ];
    let nodes: Vec<Node> = Vec::new();
    let stores = Stores::from_objects(&[web()], &[], &nodes, NODE);
    let t = translate_with_cidrs(&stores.services, &stores.slices, None, &objects, &config);
    let want: std::collections::BTreeSet<(IpAddr, u8)> =
        [(ip("10.96.0.0"), 16), (ip("10.97.0.0"), 24)].into();
    assert_eq!(t.desired.service_cidrs, want, "IPv6 is off");
    let v6 = TranslateConfig {
        ipv6: true,
        ..config
    };
    let t = translate_with_cidrs(&stores.services, &stores.slices, None, &objects, &v6);
    assert!(t.desired.service_cidrs.contains(&(ip("fd00:96::"), 108)));
    // Without either source nothing is dropped.
    assert!(run(&[web()], &[]).desired.service_cidrs.is_empty());
}

#[test]
fn service_cidr_objects_are_trimmed_to_their_cidrs() {
    use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
    let obj = ServiceCIDR {
        metadata: meta("", "extra"),
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(vec!["10.100.0.5/16".into(), "nonsense".into()]),
        }),
        status: None,
    };
    let info = ServiceCidrInfo::from_service_cidr(&obj).unwrap();
    assert_eq!(info.cidrs, vec![IpNet::parse("10.100.0.0/16").unwrap()]);
    assert_eq!(info.problems.len(), 1);
    assert_eq!(info.problems[0].reason, ProblemReason::InvalidAddress);
}

#[test]
fn stored_endpoints_keep_every_condition_and_their_place() {
    use crate::translate::{
        objects::{Place, SliceEndpoints},
        places,
    };
    let place = places::intern(Place {
        node_name: Some(crate::model::Name::from("node-stored")),
        zones: vec![crate::model::Name::from("zone-a")].into(),
        nodes: Box::default(),
    });
    assert!(place.is_some());
    for bits in 0..8u8 {
        let conditions = Conditions {
            ready: bits & 1 != 0,
            serving: bits & 2 != 0,
            terminating: bits & 4 != 0,
        };
        for place in [None, place] {
            for (family, addr) in [
                (AddressFamily::V4, "10.0.0.7"),
                (AddressFamily::V6, "fd00::7"),
            ] {
                let e = SliceEndpoint {
                    addr: addr.parse().unwrap(),
                    conditions,
                    place,
                };
                let stored = SliceEndpoints::new(family, vec![e.clone()]);
                assert_eq!(stored.get(0), Some(e.as_ref()), "{e:?}");
                assert_eq!(
                    stored.get(0).and_then(|r| r.node_name()),
                    place.map(|_| "node-stored")
                );
            }
        }
    }
}
