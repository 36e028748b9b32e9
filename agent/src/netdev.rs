//! The calling thread's network namespace: its devices and addresses
//! (through `if_nameindex`/`getifaddrs`, not /sys, which shows the
//! namespace that mounted it).

use std::{ffi::CStr, net::IpAddr};

mod links;
pub use links::{links, Link};

/// Every device: (name, ifindex).
pub fn devices() -> Vec<(String, u32)> {
    let mut out = Vec::new();
    // SAFETY: if_nameindex returns an array terminated by a zero entry,
    // freed with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return out;
        }
        let mut p = list;
        while (*p).if_index != 0 && !(*p).if_name.is_null() {
            let name = CStr::from_ptr((*p).if_name).to_string_lossy().into_owned();
            out.push((name, (*p).if_index));
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    out.sort();
    out
}

/// Every address assigned to a device.
pub fn addresses() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = device_addresses().into_iter().map(|(_, a)| a).collect();
    out.sort();
    out.dedup();
    out
}

/// Every address assigned to a device, with the device's name.
pub fn device_addresses() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs allocates a list freed with freeifaddrs; each
    // sockaddr is read according to its family, each name is a
    // NUL-terminated string.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let sa = (*p).ifa_addr;
            let name = (*p).ifa_name;
            if !sa.is_null() && !name.is_null() {
                let name = CStr::from_ptr(name).to_string_lossy().into_owned();
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = sa as *const libc::sockaddr_in;
                        out.push((
                            name,
                            IpAddr::from(u32::from_be((*sin).sin_addr.s_addr).to_be_bytes()),
                        ));
                    }
                    libc::AF_INET6 => {
                        let sin6 = sa as *const libc::sockaddr_in6;
                        out.push((name, IpAddr::from((*sin6).sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// The driver of device `name` (`ETHTOOL_GDRVINFO`, in the calling
/// thread's network namespace), e.g. `veth`, `mlx5_core`.
pub fn driver(name: &str) -> Option<String> {
    const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 160],
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 160],
    };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: &mut info,
        _pad: [0; 16],
    };
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: a datagram socket for the ioctl, closed below; the request
    // points at `info`, which outlives the call and is as large as the
    // kernel's `struct ethtool_drvinfo`.
    let ok = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let r = libc::ioctl(fd, libc::SIOCETHTOOL, &mut req as *mut IfReq);
        libc::close(fd);
        r == 0
    };
    if !ok {
        return None;
    }
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(32);
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// Shell-style match with `*` and `?`.
pub fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs() {
        assert!(glob("eth0", "eth0"));
        assert!(!glob("eth0", "eth1"));
        assert!(glob("lxc*", "lxc12ab"));
        assert!(glob("veth?", "veth1"));
        assert!(!glob("veth?", "veth12"));
        assert!(glob("*", "anything"));
    }

    #[test]
    fn loopback_has_no_ethtool_driver_and_a_missing_device_none() {
        assert_eq!(super::driver("no-such-dev0"), None);
    }

    #[test]
    fn loopback_is_listed() {
        assert!(super::devices().iter().any(|(n, _)| n == "lo"));
        assert!(super::addresses().contains(&"127.0.0.1".parse().unwrap()));
    }
}
