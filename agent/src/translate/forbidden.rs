//! Addresses that are never a service's or a backend's. A frontend on one
//! of them would capture traffic that is not service traffic: with socket
//! balancing, a Service whose cluster IP is `127.0.0.1` would send the
//! node's own `connect("127.0.0.1:80")` to a pod. The API server refuses
//! most of them in a Service's cluster IPs and in EndpointSlices; external
//! IPs, load-balancer ingress IPs and a manifest directory are not
//! validated that well, so the translation refuses them everywhere.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why `addr` can never be a frontend or a backend, if it cannot. IPv4
/// forms embedded in IPv6 (`::ffff:a.b.c.d`) are judged as IPv4.
pub fn forbidden(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) => forbidden_v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => forbidden_v4(v4),
            None => forbidden_v6(a),
        },
    }
}

fn forbidden_v4(a: Ipv4Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        Some("unspecified")
    } else if a.is_loopback() {
        Some("loopback")
    } else if a.is_broadcast() {
        Some("broadcast")
    } else if a.is_multicast() {
        Some("multicast")
    } else if a.is_link_local() {
        Some("link-local")
    } else if a.octets()[0] == 0 {
        // 0.0.0.0/8: "this network", never a destination.
        Some("unspecified")
    } else {
        None
    }
}

fn forbidden_v6(a: Ipv6Addr) -> Option<&'static str> {
    let first = a.segments()[0];
    if a.is_unspecified() {
        Some("unspecified")
    } else if a.is_loopback() {
        Some("loopback")
    } else if a.is_multicast() {
        Some("multicast")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Option<&'static str> {
        forbidden(s.parse().unwrap())
    }

    #[test]
    fn every_kind_of_address_that_is_never_a_service() {
        for (addr, why) in [
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("255.255.255.255", "broadcast"),
            ("224.0.0.1", "multicast"),
            ("239.1.2.3", "multicast"),
            ("169.254.169.254", "link-local"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("ff02::1", "multicast"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:0.0.0.0", "unspecified"),
            ("::ffff:169.254.1.1", "link-local"),
            ("::ffff:255.255.255.255", "broadcast"),
        ] {
            assert_eq!(f(addr), Some(why), "{addr}");
        }
    }

    #[test]
    fn ordinary_addresses_are_allowed() {
        for addr in [
            "10.96.0.1",
            "192.168.1.1",
            "203.0.113.10",
            "100.64.0.1",
            "172.16.0.1",
            "fd00::1",
            "2001:db8::10",
            "fec0::1",
            "::ffff:10.96.0.1",
        ] {
            assert_eq!(f(addr), None, "{addr}");
        }
    }
}
