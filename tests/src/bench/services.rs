//! The benchmark's service population: `n` ClusterIP services with 10
//! endpoints each. Two of them are targets, whose endpoints are the real
//! backend pods: the last one (the worst case for kube-proxy's linear
//! `KUBE-SERVICES` chain) and one picked at random. All other endpoints are
//! addresses nothing answers on; they only have to exist in the rules.

use std::net::{IpAddr, Ipv4Addr};

use sluice::model::{
    BackendState, DesiredBackend, DesiredService, DesiredState, Endpoint, Frontend, FrontendKey,
    FrontendKind, Proto, ServicePortName, WhenEmpty,
};

/// Service port every service listens on.
pub const SERVICE_PORT: u16 = 80;
/// Port every endpoint (real or not) serves on.
pub const TARGET_PORT: u16 = 8080;
/// Endpoints per service.
pub const ENDPOINTS: usize = 10;
/// Kubernetes namespace of every benchmark service.
pub const NAMESPACE: &str = "bench";
/// The service CIDR the VIPs come from.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The pod (cluster) CIDR: clients and backends are inside it, so neither
/// kube-proxy layout masquerades their traffic (as sluice does not).
pub const CLUSTER_CIDR: &str = "10.0.0.0/8";

/// A small deterministic generator (splitmix64): the random target must
/// be the same for every variant and reproducible from `--seed`.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub struct ServiceSet {
    pub n: usize,
    /// Index of the last service (the last rule of `KUBE-SERVICES`).
    pub last: usize,
    /// Index of a service picked at random (not the last one when n > 1).
    pub random: usize,
    /// The real backend pods' addresses.
    pub backends: Vec<Ipv4Addr>,
}

fn offset(base: Ipv4Addr, k: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base).wrapping_add(k as u32))
}

impl ServiceSet {
    pub fn new(n: usize, backends: Vec<Ipv4Addr>, seed: u64) -> Self {
        assert!((1..1_000_000).contains(&n), "1 to 999,999 services");
        assert_eq!(
            backends.len(),
            ENDPOINTS,
            "one real endpoint per backend pod"
        );
        let last = n - 1;
        let random = if n == 1 {
            0
        } else {
            Rng::new(seed ^ n as u64).below(n - 1)
        };
        Self {
            n,
            last,
            random,
            backends,
        }
    }

    pub fn is_target(&self, i: usize) -> bool {
        i == self.last || i == self.random
    }

    /// The ClusterIP of service `i` (10.96.0.1 onwards).
    pub fn vip(&self, i: usize) -> Ipv4Addr {
        offset(Ipv4Addr::new(10, 96, 0, 0), i + 1)
    }

    /// Endpoint addresses of service `i`: the real pods for a target,
    /// otherwise addresses in 10.128.0.0/9 that no pod has.
    pub fn endpoints(&self, i: usize) -> Vec<Ipv4Addr> {
        if self.is_target(i) {
            self.backends.clone()
        } else {
            (0..ENDPOINTS)
                .map(|j| offset(Ipv4Addr::new(10, 128, 0, 0), i * ENDPOINTS + j))
                .collect()
        }
    }

    pub fn name(&self, i: usize) -> String {
        format!("svc-{i}")
    }

    /// kube-proxy's service port name: `namespace/name:port`.
    pub fn port_name(&self, i: usize) -> String {
        format!("{NAMESPACE}/{}:http", self.name(i))
    }

    fn service_port_name(&self, i: usize) -> ServicePortName {
        ServicePortName::new(NAMESPACE, self.name(i), "http", Proto::Tcp)
    }

    fn desired_service(&self, i: usize) -> DesiredService {
        DesiredService {
            frontends: vec![Frontend {
                key: FrontendKey::new(IpAddr::V4(self.vip(i)), SERVICE_PORT, Proto::Tcp),
                kind: FrontendKind::ClusterIp,
                backends: self
                    .endpoints(i)
                    .into_iter()
                    .map(|ip| DesiredBackend {
                        endpoint: Endpoint {
                            addr: IpAddr::V4(ip),
                            port: TARGET_PORT,
                        },
                        state: BackendState::Active,
                    })
                    .collect(),
                when_empty: WhenEmpty::Reject,
                snat: false,
                affinity_timeout: None,
                source_ranges: Vec::new(),
                maglev: false,
                masquerade_outside: false,
                node_denied: false,
            }],
        }
    }

    /// The desired state sluice's reconciler gets (what translation makes
    /// of the same Services and EndpointSlices).
    pub fn desired(&self) -> DesiredState {
        let mut state = DesiredState::default();
        for i in 0..self.n {
            state
                .services
                .insert(self.service_port_name(i), self.desired_service(i));
            // Translation lists every cluster IP for the cluster-IPs check
            // (`sl_svcnet4`), as the agent programs it.
            state.cluster_ips.insert(self.vip(i).into());
        }
        // As the agent's sync task does when cluster IPs or service CIDRs
        // change: a reconcile that sees the same version (an endpoint
        // change) leaves `sl_svcnet4/6` alone. At 0 every reconcile
        // compared every cluster IP (23.7 ms per endpoint change at
        // 100,000 services in the 2026-11-25 run).
        state.nets_version = 1;
        state
    }

    /// A service that is not a target (for endpoint churn that must not
    /// disturb the measured services); `None` when every service is one.
    pub fn churn_service(&self) -> Option<usize> {
        (0..self.n).find(|i| !self.is_target(*i))
    }

    pub fn churn_name(&self, i: usize) -> ServicePortName {
        self.service_port_name(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> Vec<Ipv4Addr> {
        (0..10).map(|k| Ipv4Addr::new(10, 20, k, 2)).collect()
    }

    #[test]
    fn addresses_stay_in_their_ranges() {
        let set = ServiceSet::new(100_000, pods(), 1);
        assert_eq!(set.vip(0), Ipv4Addr::new(10, 96, 0, 1));
        assert!(u32::from(set.vip(99_999)) < u32::from(Ipv4Addr::new(10, 112, 0, 0)));
        assert!(set.random < set.last);
        let fake = set
            .churn_service()
            .map(|i| set.endpoints(i))
            .unwrap_or_default();
        assert!(fake.iter().all(|ip| ip.octets()[1] >= 128));
        assert_eq!(set.endpoints(set.last), pods());
        assert_eq!(
            ServiceSet::new(1000, pods(), 1).desired().services.len(),
            1000
        );
    }
}
