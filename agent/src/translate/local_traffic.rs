//! Local-traffic detection, as kube-proxy's `--detect-local-mode`: which
//! sources are the cluster's own (pods). kube-proxy masquerades traffic
//! from anywhere else to a cluster IP, and lets pods "short-circuit"
//! externalTrafficPolicy Local. The datapath matches sources against the
//! networks this yields (`sl_local4`/`sl_local6`), and the device a packet
//! entered through against the devices it yields (`sl_localif`).

use std::{collections::BTreeSet, net::IpAddr};

use super::objects::{IpNet, NodeInfo};
use crate::netdev::Link;

/// How pods are recognised.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalDetector {
    /// Not at all: kube-proxy's `ClusterCIDR` mode without `--cluster-cidr`.
    /// Every source counts as outside the cluster, nothing is masqueraded
    /// for it, and only the node itself short-circuits.
    #[default]
    Off,
    /// `ClusterCIDR`: sources in these networks (`--cluster-cidr`, one per
    /// family).
    ClusterCidr(Vec<IpNet>),
    /// `NodeCIDR`: sources in this node's `spec.podCIDRs`.
    NodeCidr,
    /// `BridgeInterface`: packets that enter through this bridge
    /// (`--pod-bridge-interface`), or through one of its ports when the
    /// programs run on the pods' veths.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: packets that enter through a device whose
    /// name starts with this (`--pod-interface-name-prefix`).
    InterfaceNamePrefix(String),
}

impl LocalDetector {
    /// Whether pods can be told from other sources at all.
    pub fn implemented(&self) -> bool {
        !matches!(self, LocalDetector::Off)
    }

    /// The networks whose sources are pods, as (network, prefix length).
    /// `node` is this node's Node object, if known (NodeCIDR mode detects
    /// nothing until it is).
    pub fn sources(&self, node: Option<&NodeInfo>) -> BTreeSet<(IpAddr, u8)> {
        let nets: &[IpNet] = match self {
            LocalDetector::Off
            | LocalDetector::BridgeInterface(_)
            | LocalDetector::InterfaceNamePrefix(_) => &[],
            LocalDetector::ClusterCidr(nets) => nets,
            LocalDetector::NodeCidr => node.map_or(&[][..], |n| &n.pod_cidrs[..]),
        };
        nets.iter().map(|n| (n.addr, n.prefix_len)).collect()
    }

    /// Whether the detector goes by device rather than by address.
    pub fn by_interface(&self) -> bool {
        matches!(
            self,
            LocalDetector::BridgeInterface(_) | LocalDetector::InterfaceNamePrefix(_)
        )
    }

    /// The devices (ifindexes) whose packets come from pods, out of this
    /// namespace's `links`.
    pub fn interfaces(&self, links: &[Link]) -> BTreeSet<u32> {
        match self {
            LocalDetector::BridgeInterface(bridge) => {
                let Some(br) = links.iter().find(|l| &l.name == bridge) else {
                    return BTreeSet::new();
                };
                links
                    .iter()
                    .filter(|l| l.index == br.index || l.master == Some(br.index))
                    .map(|l| l.index)
                    .collect()
            }
            LocalDetector::InterfaceNamePrefix(prefix) => links
                .iter()
                .filter(|l| l.name.starts_with(prefix.as_str()))
                .map(|l| l.index)
                .collect(),
            _ => BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        IpNet::parse(s).unwrap()
    }

    fn node(cidrs: &[&str]) -> NodeInfo {
        NodeInfo {
            name: "n1".into(),
            zone: None,
            addresses: Vec::new(),
            pod_cidrs: cidrs.iter().map(|c| net(c)).collect(),
            problems: Vec::new(),
            listed: Default::default(),
        }
    }

    fn link(name: &str, index: u32, master: Option<u32>) -> Link {
        Link {
            name: name.into(),
            index,
            master,
        }
    }

    fn links() -> Vec<Link> {
        vec![
            link("lo", 1, None),
            link("eth0", 2, None),
            link("cbr0", 3, None),
            link("veth1a", 4, Some(3)),
            link("veth2b", 5, Some(3)),
            link("vethx", 6, None),
            link("br-other", 7, None),
            link("cali12", 8, Some(7)),
        ]
    }

    #[test]
    fn bridge_interface_takes_the_bridge_and_its_ports_only() {
        let d = LocalDetector::BridgeInterface("cbr0".into());
        assert!(d.implemented() && d.by_interface());
        assert!(d.sources(None).is_empty());
        assert_eq!(d.interfaces(&links()), [3, 4, 5].into());
        // A bridge that does not exist (yet) detects nothing.
        let d = LocalDetector::BridgeInterface("nope".into());
        assert!(d.interfaces(&links()).is_empty());
    }

    #[test]
    fn interface_name_prefix_takes_matching_names_only() {
        let d = LocalDetector::InterfaceNamePrefix("veth".into());
        assert!(d.implemented() && d.by_interface());
        assert_eq!(d.interfaces(&links()), [4, 5, 6].into());
        assert!(LocalDetector::InterfaceNamePrefix("tap".into())
            .interfaces(&links())
            .is_empty());
        // Address-based detectors name no device.
        assert!(LocalDetector::NodeCidr.interfaces(&links()).is_empty());
        assert!(!LocalDetector::NodeCidr.by_interface());
    }

    #[test]
    fn off_detects_nothing() {
        assert!(!LocalDetector::Off.implemented());
        assert!(LocalDetector::Off
            .sources(Some(&node(&["10.1.0.0/24"])))
            .is_empty());
    }

    #[test]
    fn cluster_cidr_takes_the_flag_whatever_the_node() {
        let d = LocalDetector::ClusterCidr(vec![net("10.0.0.0/8"), net("fd00::/48")]);
        assert!(d.implemented());
        let want: BTreeSet<(IpAddr, u8)> = [
            ("10.0.0.0".parse().unwrap(), 8),
            ("fd00::".parse().unwrap(), 48),
        ]
        .into();
        assert_eq!(d.sources(None), want);
        assert_eq!(d.sources(Some(&node(&["10.1.0.0/24"]))), want);
    }

    #[test]
    fn node_cidr_follows_the_node_object() {
        let d = LocalDetector::NodeCidr;
        assert!(d.implemented());
        assert!(d.sources(None).is_empty());
        let got = d.sources(Some(&node(&["10.1.2.0/24", "fd00:1::/64"])));
        let want: BTreeSet<(IpAddr, u8)> = [
            ("10.1.2.0".parse().unwrap(), 24),
            ("fd00:1::".parse().unwrap(), 64),
        ]
        .into();
        assert_eq!(got, want);
    }
}
