//! Small builders of Kubernetes objects for tests.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{
            LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeStatus, Service,
            ServicePort, ServiceSpec, ServiceStatus,
        },
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode,
            ForZone,
        },
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

use super::objects::{LABEL_SERVICE_NAME, LABEL_TOPOLOGY_ZONE};

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        resource_version: Some("1".into()),
        ..Default::default()
    }
}

pub fn add_label(meta: &mut ObjectMeta, key: &str, value: &str) {
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
}

/// A ClusterIP service; `cluster_ip` "" leaves it unset.
pub fn mk_service(ns: &str, name: &str, cluster_ip: &str, ports: &[ServicePort]) -> Service {
    Service {
        metadata: meta(ns, name),
        spec: Some(ServiceSpec {
            cluster_ip: (!cluster_ip.is_empty()).then(|| cluster_ip.into()),
            cluster_ips: (!cluster_ip.is_empty()).then(|| vec![cluster_ip.into()]),
            ports: Some(ports.to_vec()),
            selector: Some(BTreeMap::from([("app".into(), name.into())])),
            ..Default::default()
        }),
        status: None,
    }
}

/// A NodePort service (`mk_service`, of type NodePort).
pub fn mk_node_port_service(
    ns: &str,
    name: &str,
    cluster_ip: &str,
    ports: &[ServicePort],
) -> Service {
    let mut svc = mk_service(ns, name, cluster_ip, ports);
    spec_mut(&mut svc).type_ = Some("NodePort".into());
    svc
}

pub fn spec_mut(svc: &mut Service) -> &mut ServiceSpec {
    svc.spec.as_mut().unwrap()
}

pub fn port(name: &str, proto: &str, port: i32) -> ServicePort {
    ServicePort {
        name: (!name.is_empty()).then(|| name.into()),
        protocol: Some(proto.into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        ..Default::default()
    }
}

pub fn node_port(name: &str, proto: &str, p: i32, node_port: i32) -> ServicePort {
    ServicePort {
        node_port: Some(node_port),
        ..port(name, proto, p)
    }
}

pub fn set_lb_ingress(svc: &mut Service, ingress: &[(&str, Option<&str>)]) {
    svc.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(
                ingress
                    .iter()
                    .map(|(ip, mode)| LoadBalancerIngress {
                        ip: Some((*ip).into()),
                        ip_mode: mode.map(Into::into),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
        ..Default::default()
    });
}

pub fn mk_slice(
    ns: &str,
    name: &str,
    service: &str,
    ports: &[EndpointPort],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let family = match endpoints.first().and_then(|e| e.addresses.first()) {
        Some(a) if a.contains(':') => "IPv6",
        _ => "IPv4",
    };
    let mut metadata = meta(ns, name);
    add_label(&mut metadata, LABEL_SERVICE_NAME, service);
    EndpointSlice {
        metadata,
        address_type: family.into(),
        endpoints,
        ports: Some(ports.to_vec()),
    }
}

pub fn slice_port(name: &str, proto: &str, port: i32) -> EndpointPort {
    EndpointPort {
        name: Some(name.into()),
        protocol: Some(proto.into()),
        port: Some(port),
        ..Default::default()
    }
}

/// An unnamed port as a hand-written slice would have it (no `name`).
pub fn slice_port_unnamed(proto: &str, port: i32) -> EndpointPort {
    EndpointPort {
        name: None,
        ..slice_port("", proto, port)
    }
}

pub fn slice_port_none(name: &str) -> EndpointPort {
    EndpointPort {
        port: None,
        ..slice_port(name, "TCP", 0)
    }
}

/// A ready endpoint with no conditions set (nil means ready).
pub fn ep(addr: &str) -> Endpoint {
    Endpoint {
        addresses: vec![addr.into()],
        ..Default::default()
    }
}

pub fn ep_on(addr: &str, node: &str) -> Endpoint {
    Endpoint {
        node_name: Some(node.into()),
        ..ep(addr)
    }
}

pub fn with_conditions(
    mut e: Endpoint,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
) -> Endpoint {
    e.conditions = Some(EndpointConditions {
        ready,
        serving,
        terminating,
    });
    e
}

/// Sets `hints.forZones`, keeping node hints.
pub fn set_zone_hints(e: &mut Endpoint, zones: &[&str]) {
    e.hints.get_or_insert_with(EndpointHints::default).for_zones = Some(
        zones
            .iter()
            .map(|z| ForZone { name: (*z).into() })
            .collect(),
    );
}

/// Sets `hints.forNodes`, keeping zone hints.
pub fn set_node_hints(e: &mut Endpoint, nodes: &[&str]) {
    e.hints.get_or_insert_with(EndpointHints::default).for_nodes = Some(
        nodes
            .iter()
            .map(|n| ForNode { name: (*n).into() })
            .collect(),
    );
}

pub fn node_hinted(mut e: Endpoint, nodes: &[&str]) -> Endpoint {
    set_node_hints(&mut e, nodes);
    e
}

/// Sets `spec.ipFamilies` (and, when several, `ipFamilyPolicy`
/// RequireDualStack).
pub fn set_ip_families(svc: &mut Service, families: &[&str]) {
    let spec = spec_mut(svc);
    spec.ip_families = Some(families.iter().map(|f| (*f).into()).collect());
    spec.ip_family_policy = Some(
        if families.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        }
        .into(),
    );
}

pub fn hinted(mut e: Endpoint, zones: &[&str]) -> Endpoint {
    set_zone_hints(&mut e, zones);
    e
}

pub fn mk_node(name: &str, zone: Option<&str>, addresses: &[(&str, &str)]) -> Node {
    let mut metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    if let Some(z) = zone {
        add_label(&mut metadata, LABEL_TOPOLOGY_ZONE, z);
    }
    Node {
        metadata,
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: (*t).into(),
                        address: (*a).into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}
