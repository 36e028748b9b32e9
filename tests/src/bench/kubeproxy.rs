//! kube-proxy's rule layouts for the same services, reproduced from the
//! shapes its proxiers write (kubernetes/kubernetes pkg/proxy/iptables and
//! pkg/proxy/nftables), for a node with ClusterIP services only:
//!
//! - iptables (`iptables-restore` input, same for the legacy and nft
//!   backends): `nat` PREROUTING/OUTPUT -> `KUBE-SERVICES`, one rule per
//!   service port (`-m comment "<ns>/<svc>:<port> cluster IP" -m tcp -p tcp
//!   -d VIP --dport P`) jumping to `KUBE-SVC-<hash>`, which marks
//!   off-cluster sources for masquerade and picks an endpoint with a chain
//!   of `-m statistic --mode random --probability 1/(n-i)` rules, each
//!   jumping to `KUBE-SEP-<hash>` (hairpin masquerade mark, then DNAT).
//!   `KUBE-POSTROUTING` masquerades marked packets, `KUBE-MARK-MASQ` sets
//!   the mark. The `filter` table gets kube-proxy's KUBE-FORWARD,
//!   KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS,
//!   KUBE-PROXY-FIREWALL and kubelet's KUBE-FIREWALL chains and their jump
//!   rules. Above 1000 endpoints kube-proxy's "large cluster mode" drops the
//!   comments of the SVC->SEP and SEP rules; so does this.
//! - nftables: table `ip kube-proxy` with the `service-ips` verdict map
//!   (`ip daddr . meta l4proto . th dport vmap @service-ips`) jumping to a
//!   `service-<hash>-<ns>/<svc>/tcp/<port>` chain per service port, which
//!   marks off-cluster sources and picks an endpoint with `numgen random mod
//!   n vmap { i : goto endpoint-... }`; each endpoint chain marks hairpin
//!   traffic and DNATs. The base chains, sets and maps are kube-proxy's.
//!
//! Chain-name hashes use a different hash function than kube-proxy's
//! SHA-256 (same length and alphabet), which changes nothing at run time.
//!
//! A *collapsed* ruleset keeps what a packet to a target service walks
//! (the whole `KUBE-SERVICES` chain with one rule per service, or the whole
//! `service-ips` map with one element per service) but points every
//! non-target service at one shared service chain. It exists for sizes
//! whose full ruleset cannot be loaded in the time budget; the data path of
//! a connection to a target is the same.

use std::{
    fmt::Write as _,
    hash::{Hash, Hasher},
};

use super::services::{ServiceSet, CLUSTER_CIDR, SERVICE_CIDR, SERVICE_PORT, TARGET_PORT};

/// kube-proxy's `largeClusterEndpointsThreshold`.
const LARGE_CLUSTER_ENDPOINTS: usize = 1000;
const MASQ_MARK: &str = "0x4000";

/// Whether every service gets its own chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Full,
    Collapsed,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Full => "full",
            Layout::Collapsed => "collapsed",
        }
    }
}

/// `len` base32 characters of a hash of `parts`.
fn hash32(parts: &[&str], len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(len);
    let mut round = 0u64;
    while out.len() < len {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        round.hash(&mut h);
        parts.hash(&mut h);
        let mut v = h.finish();
        for _ in 0..12 {
            if out.len() == len {
                break;
            }
            out.push(ALPHABET[(v & 31) as usize] as char);
            v >>= 5;
        }
        round += 1;
    }
    out
}

fn svc_chain(port_name: &str) -> String {
    format!("KUBE-SVC-{}", hash32(&[port_name, "tcp"], 16))
}

fn sep_chain(port_name: &str, endpoint: &str) -> String {
    format!("KUBE-SEP-{}", hash32(&[port_name, "tcp", endpoint], 16))
}

/// kube-proxy's probability format.
fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// One service port's `KUBE-SVC` chain and its `KUBE-SEP` chains.
struct Svc<'a> {
    chain: &'a str,
    port_name: &'a str,
    vip: &'a str,
    endpoints: &'a [std::net::Ipv4Addr],
}

impl Svc<'_> {
    fn write(&self, large: bool, nat_chains: &mut String, nat_rules: &mut String) {
        let (chain, port_name, vip) = (self.chain, self.port_name, self.vip);
        let _ = writeln!(nat_chains, ":{chain} - [0:0]");
        let _ = writeln!(
            nat_rules,
            "-A {chain} -m comment --comment \"{port_name} cluster IP\" -m tcp -p tcp -d {vip} --dport {SERVICE_PORT} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ"
        );
        let n = self.endpoints.len();
        for (j, ip) in self.endpoints.iter().enumerate() {
            let endpoint = format!("{ip}:{TARGET_PORT}");
            let sep = sep_chain(port_name, &endpoint);
            let comment = if large {
                String::new()
            } else {
                format!("-m comment --comment \"{port_name} -> {endpoint}\" ")
            };
            let stat = if j + 1 < n {
                format!(
                    "-m statistic --mode random --probability {} ",
                    probability(n - j)
                )
            } else {
                String::new()
            };
            let _ = writeln!(nat_rules, "-A {chain} {comment}{stat}-j {sep}");
            let _ = writeln!(nat_chains, ":{sep} - [0:0]");
            let sep_comment = if large {
                String::new()
            } else {
                format!("-m comment --comment {port_name} ")
            };
            let _ = writeln!(nat_rules, "-A {sep} {sep_comment}-s {ip} -j KUBE-MARK-MASQ");
            let _ = writeln!(
                nat_rules,
                "-A {sep} {sep_comment}-m tcp -p tcp -j DNAT --to-destination {endpoint}"
            );
        }
    }
}

/// The `iptables-restore` input for `set`.
pub fn iptables_restore(set: &ServiceSet, layout: Layout) -> String {
    let large = set.n * set.backends.len() > LARGE_CLUSTER_ENDPOINTS;
    let mut filter_chains = String::new();
    let mut filter_rules = String::new();
    let mut nat_chains = String::new();
    let mut nat_rules = String::new();

    for chain in [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
        "KUBE-FIREWALL",
    ] {
        let _ = writeln!(filter_chains, ":{chain} - [0:0]");
    }
    // The jump rules kube-proxy (and kubelet, for KUBE-FIREWALL) ensure in
    // the built-in chains.
    for (chain, extra, comment, target) in [
        (
            "INPUT",
            "-m conntrack --ctstate NEW ",
            "kubernetes load balancer firewall",
            "KUBE-PROXY-FIREWALL",
        ),
        (
            "INPUT",
            "",
            "kubernetes health check service ports",
            "KUBE-NODEPORTS",
        ),
        (
            "INPUT",
            "-m conntrack --ctstate NEW ",
            "kubernetes externally-visible service portals",
            "KUBE-EXTERNAL-SERVICES",
        ),
        ("INPUT", "", "", "KUBE-FIREWALL"),
        (
            "FORWARD",
            "-m conntrack --ctstate NEW ",
            "kubernetes load balancer firewall",
            "KUBE-PROXY-FIREWALL",
        ),
        ("FORWARD", "", "kubernetes forwarding rules", "KUBE-FORWARD"),
        (
            "FORWARD",
            "-m conntrack --ctstate NEW ",
            "kubernetes service portals",
            "KUBE-SERVICES",
        ),
        (
            "FORWARD",
            "-m conntrack --ctstate NEW ",
            "kubernetes externally-visible service portals",
            "KUBE-EXTERNAL-SERVICES",
        ),
        (
            "OUTPUT",
            "-m conntrack --ctstate NEW ",
            "kubernetes load balancer firewall",
            "KUBE-PROXY-FIREWALL",
        ),
        (
            "OUTPUT",
            "-m conntrack --ctstate NEW ",
            "kubernetes service portals",
            "KUBE-SERVICES",
        ),
        ("OUTPUT", "", "", "KUBE-FIREWALL"),
    ] {
        let comment = if comment.is_empty() {
            String::new()
        } else {
            format!("-m comment --comment \"{comment}\" ")
        };
        let _ = writeln!(filter_rules, "-A {chain} {extra}{comment}-j {target}");
    }
    filter_rules.push_str(
        "-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n",
    );
    filter_rules.push_str("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n");
    let _ = writeln!(
        filter_rules,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
    );
    filter_rules.push_str(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n",
    );

    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        let _ = writeln!(nat_chains, ":{chain} - [0:0]");
    }
    for (chain, comment, target) in [
        ("PREROUTING", "kubernetes service portals", "KUBE-SERVICES"),
        ("OUTPUT", "kubernetes service portals", "KUBE-SERVICES"),
        (
            "POSTROUTING",
            "kubernetes postrouting rules",
            "KUBE-POSTROUTING",
        ),
    ] {
        let _ = writeln!(
            nat_rules,
            "-A {chain} -m comment --comment \"{comment}\" -j {target}"
        );
    }
    let _ = writeln!(
        nat_rules,
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"
    );
    let _ = writeln!(
        nat_rules,
        "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}"
    );
    nat_rules.push_str(
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    let _ = writeln!(nat_rules, "-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}");

    let shared = "KUBE-SVC-SHAREDFAKESERVCE";
    if layout == Layout::Collapsed {
        if let Some(k) = (0..set.n).find(|i| !set.is_target(*i)) {
            let pn = format!("{}/shared-fake:http", super::services::NAMESPACE);
            let svc = Svc {
                chain: shared,
                port_name: &pn,
                vip: &set.vip(k).to_string(),
                endpoints: &set.endpoints(k),
            };
            svc.write(large, &mut nat_chains, &mut nat_rules);
        }
    }
    for i in 0..set.n {
        let port_name = set.port_name(i);
        let vip = set.vip(i).to_string();
        let own = layout == Layout::Full || set.is_target(i);
        let chain = if own {
            svc_chain(&port_name)
        } else {
            shared.to_owned()
        };
        let _ = writeln!(
            nat_rules,
            "-A KUBE-SERVICES -m comment --comment \"{port_name} cluster IP\" -m tcp -p tcp -d {vip} --dport {SERVICE_PORT} -j {chain}"
        );
        if own {
            let svc = Svc {
                chain: &chain,
                port_name: &port_name,
                vip: &vip,
                endpoints: &set.endpoints(i),
            };
            svc.write(large, &mut nat_chains, &mut nat_rules);
        }
    }
    nat_rules.push_str(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n",
    );

    let mut out = String::with_capacity(
        filter_chains.len() + filter_rules.len() + nat_chains.len() + nat_rules.len() + 64,
    );
    out.push_str("*filter\n");
    out.push_str(&filter_chains);
    out.push_str(&filter_rules);
    out.push_str("COMMIT\n*nat\n");
    out.push_str(&nat_chains);
    out.push_str(&nat_rules);
    out.push_str("COMMIT\n");
    out
}

/// Nodes' addresses that accept NodePorts (the node's gateway addresses).
const NODEPORT_IP: &str = "10.10.0.1";

/// The `nft -f` input for `set`: one transaction, as kube-proxy's full sync.
pub fn nftables(set: &ServiceSet, layout: Layout) -> String {
    let mut out = String::new();
    let t = "ip kube-proxy";
    let _ = writeln!(
        out,
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
    );
    for line in [
        "add set ip kube-proxy cluster-ips { type ipv4_addr ; comment \"Active ClusterIPs\" ; }",
        "add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }",
        "add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }",
        "add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }",
        "add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }",
        "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }",
        "add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }",
        "add chain ip kube-proxy cluster-ips-check",
        "add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }",
        "add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }",
        "add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }",
        "add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }",
        "add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }",
        "add chain ip kube-proxy firewall-check",
        "add chain ip kube-proxy mark-for-masquerade",
        "add chain ip kube-proxy masquerading",
        "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }",
        "add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }",
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
        "add chain ip kube-proxy nodeport-endpoints-check",
        "add chain ip kube-proxy reject-chain { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }",
        "add chain ip kube-proxy services",
        "add chain ip kube-proxy service-endpoints-check",
        "add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
    ] {
        out.push_str(line);
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "add rule {t} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop comment \"Drop traffic to unallocated ClusterIPs\""
    );
    for line in [
        "add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check",
        "add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check",
        "add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check",
        "add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check",
        "add rule ip kube-proxy filter-input ct state new jump service-endpoints-check",
        "add rule ip kube-proxy filter-output ct state new jump service-endpoints-check",
        "add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check",
        "add rule ip kube-proxy filter-output ct state new jump cluster-ips-check",
        "add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips",
        "add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000",
        "add rule ip kube-proxy masquerading mark and 0x4000 == 0 return",
        "add rule ip kube-proxy masquerading mark set mark xor 0x4000",
        "add rule ip kube-proxy masquerading masquerade fully-random",
        "add rule ip kube-proxy nat-output jump services",
        "add rule ip kube-proxy nat-postrouting jump masquerading",
        "add rule ip kube-proxy nat-prerouting jump services",
        "add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
        "add rule ip kube-proxy reject-chain reject",
        "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
        "add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        "add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
    ] {
        out.push_str(line);
        out.push('\n');
    }
    let _ = writeln!(out, "add element {t} nodeport-ips {{ {NODEPORT_IP} }}");

    let service_chain = |port_name: &str| {
        // kube-proxy: service-<hash>-<namespace>/<name>/<proto>/<port name>
        let (ns_name, port) = port_name.split_once(':').unwrap_or((port_name, ""));
        let id = format!("{ns_name}/tcp/{port}");
        (format!("service-{}-{id}", hash32(&[&id], 8)), id)
    };
    let write_service = |out: &mut String,
                         chain: &str,
                         id: &str,
                         vip: &str,
                         eps: &[std::net::Ipv4Addr]| {
        let _ = writeln!(out, "add chain {t} {chain}");
        let _ = writeln!(
            out,
            "add rule {t} {chain} ip daddr {vip} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade"
        );
        let mut vmap = Vec::with_capacity(eps.len());
        for (j, ip) in eps.iter().enumerate() {
            let ep_id = format!("{id}__{ip}/{TARGET_PORT}");
            let ep_chain = format!("endpoint-{}-{ep_id}", hash32(&[&ep_id], 8));
            let _ = writeln!(out, "add chain {t} {ep_chain}");
            let _ = writeln!(
                out,
                "add rule {t} {ep_chain} ip saddr {ip} jump mark-for-masquerade"
            );
            let _ = writeln!(
                out,
                "add rule {t} {ep_chain} meta l4proto tcp dnat to {ip}:{TARGET_PORT}"
            );
            vmap.push(format!("{j} : goto {ep_chain}"));
        }
        let _ = writeln!(
            out,
            "add rule {t} {chain} numgen random mod {} vmap {{ {} }}",
            eps.len(),
            vmap.join(" , ")
        );
    };

    let shared = if layout == Layout::Collapsed {
        (0..set.n).find(|i| !set.is_target(*i)).map(|k| {
            let (chain, id) =
                service_chain(&format!("{}/shared-fake:http", super::services::NAMESPACE));
            write_service(
                &mut out,
                &chain,
                &id,
                &set.vip(k).to_string(),
                &set.endpoints(k),
            );
            chain
        })
    } else {
        None
    };
    // Elements in batches, as one `add element` command per service would
    // be (kube-proxy's knftables batches per object too; this only keeps
    // the file short).
    let mut cluster_ips = Vec::new();
    let mut service_ips = Vec::new();
    for i in 0..set.n {
        let vip = set.vip(i).to_string();
        let chain = match (&shared, set.is_target(i)) {
            (Some(shared), false) => shared.clone(),
            _ => {
                let (chain, id) = service_chain(&set.port_name(i));
                write_service(&mut out, &chain, &id, &vip, &set.endpoints(i));
                chain
            }
        };
        cluster_ips.push(vip.clone());
        service_ips.push(format!("{vip} . tcp . {SERVICE_PORT} : goto {chain}"));
    }
    for chunk in cluster_ips.chunks(1000) {
        let _ = writeln!(
            out,
            "add element {t} cluster-ips {{ {} }}",
            chunk.join(" , ")
        );
    }
    for chunk in service_ips.chunks(1000) {
        let _ = writeln!(
            out,
            "add element {t} service-ips {{ {} }}",
            chunk.join(" , ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn set(n: usize) -> ServiceSet {
        ServiceSet::new(n, (0..10).map(|k| Ipv4Addr::new(10, 20, k, 2)).collect(), 7)
    }

    #[test]
    fn iptables_layout_has_kube_proxy_shapes() {
        let s = set(3);
        let text = iptables_restore(&s, Layout::Full);
        let last = s.port_name(s.last);
        let svc = svc_chain(&last);
        assert!(text.contains(&format!(
            "-A KUBE-SERVICES -m comment --comment \"{last} cluster IP\" -m tcp -p tcp -d 10.96.0.3 --dport 80 -j {svc}"
        )));
        assert!(text.contains(&format!(
            "-A {svc} -m comment --comment \"{last} -> 10.20.0.2:8080\" -m statistic --mode random --probability 0.1000000000 -j "
        )));
        assert!(text.contains("-j DNAT --to-destination 10.20.9.2:8080"));
        // 3 x 10 endpoints: not yet large-cluster mode.
        assert!(text.contains(&format!(
            "-m comment --comment {last} -s 10.20.0.2 -j KUBE-MARK-MASQ"
        )));
        // The last service's rule is the last before the nodeports rule.
        let services: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES"))
            .collect();
        assert!(services[services.len() - 2].contains("10.96.0.3 "));
        assert_eq!(text.matches(":KUBE-SEP-").count(), 30);
    }

    #[test]
    fn large_clusters_drop_endpoint_comments_and_collapse_keeps_the_walk() {
        let s = set(200);
        let full = iptables_restore(&s, Layout::Full);
        assert!(!full.contains("-> 10.20.0.2:8080"));
        let collapsed = iptables_restore(&s, Layout::Collapsed);
        let walk = |t: &str| {
            t.lines()
                .filter(|l| l.starts_with("-A KUBE-SERVICES"))
                .count()
        };
        assert_eq!(walk(&full), walk(&collapsed));
        assert_eq!(collapsed.matches(":KUBE-SVC-").count(), 3);
    }

    #[test]
    fn nftables_layout_has_kube_proxy_shapes() {
        let s = set(2);
        let text = nftables(&s, Layout::Full);
        assert!(text.contains(
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips"
        ));
        assert!(text.contains("numgen random mod 10 vmap { 0 : goto endpoint-"));
        assert!(text.contains("meta l4proto tcp dnat to 10.20.3.2:8080"));
        assert!(text.contains("10.96.0.2 . tcp . 80 : goto service-"));
        let collapsed = nftables(&set(50), Layout::Collapsed);
        assert_eq!(collapsed.matches("numgen random").count(), 3);
        assert!(collapsed.contains("10.96.0.50 . tcp . 80"));
    }
}
