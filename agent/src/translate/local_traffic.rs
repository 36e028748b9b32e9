//! Local-traffic detection, as kube-proxy's `--detect-local-mode`: which
//! sources are the cluster's own (pods). kube-proxy masquerades traffic
//! from anywhere else to a cluster IP, and lets pods "short-circuit"
//! externalTrafficPolicy Local. The datapath matches sources against the
//! networks this yields (`sl_local4`/`sl_local6`).

use std::{collections::BTreeSet, net::IpAddr};

use super::objects::{IpNet, NodeInfo};

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
            LocalDetector::Off => &[],
            LocalDetector::ClusterCidr(nets) => nets,
            LocalDetector::NodeCidr => node.map_or(&[][..], |n| &n.pod_cidrs[..]),
        };
        nets.iter().map(|n| (n.addr, n.prefix_len)).collect()
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
        }
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
