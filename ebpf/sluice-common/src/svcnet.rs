//! `sl_svcnetsum4`: a summary of `sl_svcnet4` that lets a packet outside
//! the service address space skip its LPM lookup. Every IPv4 packet that
//! misses `sl_svc4` (all pod-to-pod traffic) would otherwise pay that
//! lookup for the cluster-IPs check.

use crate::{assert_size, user_pod};

/// Prefixes a summary holds at most.
pub const SVCNET_SUMMARY_MAX: usize = 8;

/// Value of `sl_svcnetsum4[0]`: up to `SVCNET_SUMMARY_MAX` prefixes that
/// together cover every entry of `sl_svcnet4` (the agent writes a wider
/// one when there would be more). Addresses and masks are the network-order
/// bytes read as a native `u32` (`u32::from_ne_bytes(octets)`), as the
/// programs hold addresses. `valid` 0 (the array before the agent first
/// writes it, e.g. during an upgrade from a release without it): every
/// address is looked up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SvcnetSummary4 {
    pub valid: u32,
    pub count: u32,
    pub addr: [u32; SVCNET_SUMMARY_MAX],
    pub mask: [u32; SVCNET_SUMMARY_MAX],
}
assert_size!(SvcnetSummary4, 72);

impl SvcnetSummary4 {
    /// Whether `dst` (as `from_ne_bytes` of its octets) may be in
    /// `sl_svcnet4`: inside one of the prefixes, or the summary is not
    /// written.
    #[inline(always)]
    pub fn may_hold(&self, dst: u32) -> bool {
        if self.valid == 0 {
            return true;
        }
        let mut i = 0;
        while i < SVCNET_SUMMARY_MAX {
            if (i as u32) < self.count && dst & self.mask[i] == self.addr[i] {
                return true;
            }
            i += 1;
        }
        false
    }

    /// The summary of `nets` (`(octets, prefix length)`, reordered): each
    /// prefix not inside a shorter one of the list, or, when those are
    /// more than `SVCNET_SUMMARY_MAX`, the longest prefix common to all.
    /// Linear in `nets` (after a sort): it runs over every cluster IP.
    pub fn of(nets: &mut [([u8; 4], u8)]) -> Self {
        let mask_of = |len: u8| -> u32 {
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len.min(32)))
            };
            u32::from_ne_bytes(m.to_be_bytes())
        };
        let mut out = Self {
            valid: 1,
            ..Self::default()
        };
        nets.sort_unstable_by_key(|(_, len)| *len);
        let mut overflow = false;
        for (a, len) in nets.iter() {
            let m = mask_of(*len);
            let addr = u32::from_ne_bytes(*a) & m;
            let kept = out.count as usize;
            if (0..kept).any(|i| addr & out.mask[i] == out.addr[i]) {
                continue;
            }
            if kept == SVCNET_SUMMARY_MAX {
                overflow = true;
                break;
            }
            out.addr[kept] = addr;
            out.mask[kept] = m;
            out.count += 1;
        }
        if overflow {
            // One prefix over them all: the leading bits every one shares.
            let first = u32::from_be_bytes(nets[0].0);
            let mut len = 32u8;
            for (a, l) in nets.iter() {
                let diff = first ^ u32::from_be_bytes(*a);
                len = len.min(*l).min(diff.leading_zeros() as u8);
            }
            let m = mask_of(len);
            out.count = 1;
            out.addr = [0; SVCNET_SUMMARY_MAX];
            out.mask = [0; SVCNET_SUMMARY_MAX];
            out.addr[0] = u32::from_ne_bytes(nets[0].0) & m;
            out.mask[0] = m;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8, c: u8, d: u8) -> u32 {
        u32::from_ne_bytes([a, b, c, d])
    }

    #[test]
    fn covers_every_net_and_little_else() {
        let mut nets = [
            ([10, 96, 0, 10], 32),
            ([10, 96, 0, 0], 12),
            ([10, 200, 0, 1], 32),
        ];
        let s = SvcnetSummary4::of(&mut nets);
        assert_eq!(s.count, 2);
        assert!(s.may_hold(ip(10, 96, 0, 10)));
        assert!(s.may_hold(ip(10, 111, 255, 1)));
        assert!(s.may_hold(ip(10, 200, 0, 1)));
        assert!(!s.may_hold(ip(10, 200, 0, 2)));
        assert!(!s.may_hold(ip(10, 10, 0, 2)));
        assert!(!SvcnetSummary4::of(&mut []).may_hold(ip(10, 96, 0, 1)));
        assert!(SvcnetSummary4::default().may_hold(ip(1, 2, 3, 4)));
    }

    #[test]
    fn too_many_become_their_common_prefix() {
        let mut nets: [([u8; 4], u8); 20] = core::array::from_fn(|i| ([10, 96, i as u8, 1], 32));
        let s = SvcnetSummary4::of(&mut nets);
        assert_eq!(s.count, 1);
        for i in 0..20 {
            assert!(s.may_hold(ip(10, 96, i, 1)));
        }
        assert!(!s.may_hold(ip(10, 20, 0, 2)));
    }
}

user_pod!(SvcnetSummary4);
