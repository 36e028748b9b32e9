//! Property tests of decoding and translation on generated objects
//! (issue 18): whatever a Service, EndpointSlice or Node says, the
//! translation does not panic, every object either contributes to the
//! desired state or is reported, and no frontend or backend lands on an
//! address that is never a service's.

use k8s_openapi::{
    api::{
        core::v1::{
            ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec,
            NodeStatus, Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig,
        },
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
        },
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use proptest::{collection::vec, option, prelude::*};

use super::{forbidden::forbidden, objects::LABEL_SERVICE_NAME, *};
use crate::manifests;

/// Addresses as an attacker or a buggy controller writes them: good ones,
/// forbidden ones, other families' and garbage.
fn address() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..4, any::<u8>()).prop_map(|(c, d)| format!("10.96.{c}.{d}")),
        (0u8..4, any::<u8>()).prop_map(|(c, d)| format!("10.20.{c}.{d}")),
        any::<u16>().prop_map(|x| format!("fd00::{x:x}")),
        Just("127.0.0.1".to_owned()),
        Just("0.0.0.0".to_owned()),
        Just("255.255.255.255".to_owned()),
        Just("169.254.169.254".to_owned()),
        Just("224.0.0.1".to_owned()),
        Just("::1".to_owned()),
        Just("::".to_owned()),
        Just("fe80::1".to_owned()),
        Just("::ffff:127.0.0.1".to_owned()),
        Just("ff02::1".to_owned()),
        any::<u32>().prop_map(|x| std::net::Ipv4Addr::from(x).to_string()),
        "[0-9a-f:./ ]{0,20}",
        Just(String::new()),
        Just("None".to_owned()),
    ]
}

pub(crate) fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("TCP".to_owned()),
        Just("UDP".to_owned()),
        Just("SCTP".to_owned()),
        Just("tcp".to_owned()),
        Just("Local".to_owned()),
        Just("Cluster".to_owned()),
        Just("ClientIP".to_owned()),
        Just("None".to_owned()),
        Just("IPv4".to_owned()),
        Just("IPv6".to_owned()),
        Just("http".to_owned()),
        "[a-zA-Z0-9-]{0,8}",
    ]
}

fn port_number() -> impl Strategy<Value = i32> {
    prop_oneof![
        1i32..100,
        30000i32..30100,
        any::<i32>(),
        Just(0),
        Just(65535),
        Just(65536)
    ]
}

fn service_port() -> impl Strategy<Value = ServicePort> {
    (
        option::of(word()),
        option::of(word()),
        port_number(),
        option::of(port_number()),
        option::of(prop_oneof![
            port_number().prop_map(IntOrString::Int),
            word().prop_map(IntOrString::String)
        ]),
    )
        .prop_map(
            |(name, protocol, port, node_port, target_port)| ServicePort {
                name,
                protocol,
                port,
                node_port,
                target_port,
                ..Default::default()
            },
        )
}

fn meta(name: String, labels: Option<(String, String)>) -> ObjectMeta {
    ObjectMeta {
        namespace: Some("default".into()),
        name: Some(name),
        resource_version: Some("1".into()),
        labels: labels.map(|(k, v)| [(k, v)].into()),
        ..Default::default()
    }
}

pub(crate) fn service() -> impl Strategy<Value = Service> {
    (
        prop_oneof![Just("a".to_owned()), Just("b".to_owned()), "[a-z]{1,3}"],
        (
            option::of(prop_oneof![
                Just("ClusterIP".to_owned()),
                Just("NodePort".to_owned()),
                Just("LoadBalancer".to_owned()),
                Just("ExternalName".to_owned()),
                word()
            ]),
            option::of(address()),
            option::of(vec(address(), 0..3)),
            option::of(vec(word(), 0..3)),
            option::of(vec(address(), 0..4)),
        ),
        (
            option::of(vec(service_port(), 0..4)),
            option::of(word()),
            option::of(word()),
            option::of(word()),
            option::of(any::<i32>()),
            option::of(vec(
                (address(), 0u8..140).prop_map(|(a, l)| format!("{a}/{l}")),
                0..3,
            )),
        ),
        vec((address(), option::of(word())), 0..3),
    )
        .prop_map(
            |(
                name,
                (type_, cluster_ip, cluster_ips, ip_families, external_ips),
                (ports, etp, itp, affinity, timeout, ranges),
                ingress,
            )| Service {
                metadata: meta(name, None),
                spec: Some(ServiceSpec {
                    type_,
                    cluster_ip,
                    cluster_ips,
                    ip_families,
                    external_ips,
                    ports,
                    external_traffic_policy: etp,
                    internal_traffic_policy: itp,
                    session_affinity: affinity,
                    session_affinity_config: timeout.map(|t| SessionAffinityConfig {
                        client_ip: Some(ClientIPConfig {
                            timeout_seconds: Some(t),
                        }),
                    }),
                    load_balancer_source_ranges: ranges,
                    ..Default::default()
                }),
                status: Some(ServiceStatus {
                    load_balancer: Some(LoadBalancerStatus {
                        ingress: Some(
                            ingress
                                .into_iter()
                                .map(|(ip, ip_mode)| LoadBalancerIngress {
                                    ip: Some(ip),
                                    ip_mode,
                                    ..Default::default()
                                })
                                .collect(),
                        ),
                    }),
                    ..Default::default()
                }),
            },
        )
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    (
        vec(address(), 0..2),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        option::of(prop_oneof![Just("n1".to_owned()), word()]),
        option::of(vec(word(), 0..2)),
    )
        .prop_map(
            |(addresses, ready, serving, terminating, node_name, zones)| Endpoint {
                addresses,
                conditions: Some(EndpointConditions {
                    ready,
                    serving,
                    terminating,
                }),
                node_name,
                hints: zones.map(|z| EndpointHints {
                    for_zones: Some(z.into_iter().map(|name| ForZone { name }).collect()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
}

pub(crate) fn slice() -> impl Strategy<Value = EndpointSlice> {
    (
        prop_oneof![Just("a".to_owned()), Just("b".to_owned()), "[a-z]{1,3}"],
        "[a-z]{1,4}",
        prop_oneof![Just("IPv4".to_owned()), Just("IPv6".to_owned()), word()],
        vec(endpoint(), 0..4),
        option::of(vec(
            (
                option::of(word()),
                option::of(word()),
                option::of(port_number()),
            )
                .prop_map(|(name, protocol, port)| EndpointPort {
                    name,
                    protocol,
                    port,
                    ..Default::default()
                }),
            0..3,
        )),
    )
        .prop_map(
            |(service, suffix, address_type, endpoints, ports)| EndpointSlice {
                metadata: meta(
                    format!("{service}-{suffix}"),
                    Some((LABEL_SERVICE_NAME.to_owned(), service)),
                ),
                address_type,
                endpoints,
                ports,
            },
        )
}

fn node() -> impl Strategy<Value = Node> {
    (
        vec(
            (
                prop_oneof![Just("InternalIP".to_owned()), word()],
                address(),
            ),
            0..3,
        ),
        option::of(vec(
            (address(), 0u8..140).prop_map(|(a, l)| format!("{a}/{l}")),
            0..2,
        )),
    )
        .prop_map(|(addresses, pod_cidrs)| Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs,
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .into_iter()
                        .map(|(type_, address)| NodeAddress { address, type_ })
                        .collect(),
                ),
                ..Default::default()
            }),
        })
}

proptest! {
    // PROPTEST_CASES=100000 for a long run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn translation_never_panics_nor_programs_a_forbidden_address(
        services in vec(service(), 0..4),
        slices in vec(slice(), 0..5),
        node in option::of(node()),
        ipv6 in any::<bool>(),
    ) {
        let config = TranslateConfig {
            node_name: "n1".into(),
            ipv6,
            ..TranslateConfig::default()
        };
        let nodes: Vec<Node> = node.into_iter().collect();
        let stores = Stores::from_objects(&services, &slices, &nodes, &config.node_name);
        let t = translate(&stores.services, &stores.slices, stores.node.as_ref(), &config);
        for (name, svc) in &t.desired.services {
            for f in &svc.frontends {
                prop_assert!(forbidden(f.key.addr).is_none(), "{name}: frontend {}", f.key);
                for b in &f.backends {
                    prop_assert!(
                        forbidden(b.endpoint.addr).is_none(),
                        "{name}: backend {:?}", b.endpoint
                    );
                }
            }
        }
        // Every service either yields service ports or is reported (or is
        // one kube-proxy ignores: no spec ports, ExternalName, headless).
        for svc in &services {
            let Some(key) = ObjectKey::from_meta(&svc.metadata) else { continue };
            let contributes = t.desired.services.keys().any(|n| n.namespace == key.namespace && n.name == key.name);
            let reported = t.problems.iter().chain(&stores.problems).any(|p| p.to_string().contains(&*key.name));
            let ignored = svc.spec.as_ref().is_none_or(|s| {
                // Headless: the first cluster IP (clusterIPs, else
                // clusterIP) is "None".
                let first = s
                    .cluster_ips
                    .iter()
                    .flatten()
                    .find(|c| !c.is_empty())
                    .or(s.cluster_ip.as_ref().filter(|c| !c.is_empty()));
                s.type_.as_deref() == Some("ExternalName")
                    || first.map(String::as_str) == Some("None")
                    || s.ports.as_ref().is_none_or(Vec::is_empty)
            });
            prop_assert!(contributes || reported || ignored || services.iter().filter(|s| s.metadata.name == svc.metadata.name).count() > 1,
                "{key} neither contributes nor is reported");
        }
    }

    #[test]
    fn manifest_files_are_parsed_or_refused_in_bounded_time(
        text in prop_oneof![
            "\\PC{0,400}",
            vec(prop_oneof![Just("["), Just("{a: "), Just("]"), Just("}"), Just("'"), Just("\""), Just("#"), Just("\n  "), Just("- "), Just("x")], 0..2000)
                .prop_map(|parts| parts.concat()),
        ]
    ) {
        let started = std::time::Instant::now();
        let _ = manifests::parse_file(std::path::Path::new("fuzz.yaml"), &text, manifests::Limits::default());
        let _ = manifests::parse_file(std::path::Path::new("fuzz.json"), &text, manifests::Limits::default());
        prop_assert!(started.elapsed() < std::time::Duration::from_millis(500), "{:?}", started.elapsed());
    }
}
