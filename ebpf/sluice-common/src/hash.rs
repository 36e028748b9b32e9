//! The flow hash that picks a backend slot for a new flow.
//!
//! Bob Jenkins' `jhash_3words` (lookup3 final mix), as the kernel uses for
//! its own flow hashing: cheap enough for every new flow, verifier-friendly
//! (no loops) and well mixed for sequential source ports. Selection is
//! `slot = first + hash % n`, so the same 5-tuple keeps landing on the same
//! backend while the backend set is unchanged: a flow whose conntrack entry
//! was lost (LRU eviction, agent-side GC race) is re-assigned to the backend
//! it already talks to. The seed is random per node (kept in `sl_config`)
//! so that clients cannot aim at one backend.

const JHASH_INITVAL: u32 = 0xdead_beef;

/// `jhash_3words(a, b, c, initval)` as in the kernel's `<linux/jhash.h>`.
#[inline(always)]
pub const fn jhash_3words(a: u32, b: u32, c: u32, initval: u32) -> u32 {
    let iv = initval.wrapping_add(JHASH_INITVAL).wrapping_add(3 << 2);
    let mut a = a.wrapping_add(iv);
    let mut b = b.wrapping_add(iv);
    let mut c = c.wrapping_add(iv);
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(24));
    c
}

/// Hash of an IPv4 5-tuple as the client sent it (ports host order).
#[inline(always)]
pub const fn flow_hash_v4(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    proto: u8,
    seed: u32,
) -> u32 {
    jhash_3words(
        u32::from_ne_bytes(src),
        u32::from_ne_bytes(dst),
        ((sport as u32) << 16) | dport as u32,
        seed ^ proto as u32,
    )
}

/// Word `i/4` of an IPv6 address, native order (as `flow_hash_v4` reads).
#[inline(always)]
const fn w(a: &[u8; 16], i: usize) -> u32 {
    u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]])
}

/// Hash of an IPv6 5-tuple as the client sent it (ports host order): three
/// chained `jhash_3words` rounds over the eight address words and the
/// ports, each seeded with the previous result (no loop, so the verifier
/// sees straight-line code).
#[inline(always)]
pub const fn flow_hash_v6(
    src: &[u8; 16],
    dst: &[u8; 16],
    sport: u16,
    dport: u16,
    proto: u8,
    seed: u32,
) -> u32 {
    let h = jhash_3words(w(src, 0), w(src, 4), w(src, 8), seed ^ proto as u32);
    let h = jhash_3words(w(src, 12), w(dst, 0), w(dst, 4), h);
    jhash_3words(
        w(dst, 8),
        w(dst, 12),
        ((sport as u32) << 16) | dport as u32,
        h,
    )
}

/// The slot (1-based) a hash selects among `n` slots starting at `first`.
/// `n` must not be 0.
#[inline(always)]
pub const fn pick_slot(hash: u32, first: u16, n: u16) -> u16 {
    first + (hash % n as u32) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_tuple_same_hash_and_seed_changes_it() {
        let a = flow_hash_v4([10, 0, 0, 1], [10, 96, 0, 1], 40000, 80, 6, 7);
        assert_eq!(
            a,
            flow_hash_v4([10, 0, 0, 1], [10, 96, 0, 1], 40000, 80, 6, 7)
        );
        assert_ne!(
            a,
            flow_hash_v4([10, 0, 0, 1], [10, 96, 0, 1], 40000, 80, 6, 8)
        );
        assert_ne!(
            a,
            flow_hash_v4([10, 0, 0, 1], [10, 96, 0, 1], 40000, 80, 17, 7)
        );
    }

    #[test]
    fn v6_hash_depends_on_every_part() {
        let (s, d) = (
            [0xfd, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            [0xfd, 0, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10],
        );
        let a = flow_hash_v6(&s, &d, 40000, 80, 6, 7);
        assert_eq!(a, flow_hash_v6(&s, &d, 40000, 80, 6, 7));
        let mut s2 = s;
        s2[15] = 3;
        let mut d2 = d;
        d2[0] = 0xfe;
        assert_ne!(a, flow_hash_v6(&s2, &d, 40000, 80, 6, 7));
        assert_ne!(a, flow_hash_v6(&s, &d2, 40000, 80, 6, 7));
        assert_ne!(a, flow_hash_v6(&s, &d, 40001, 80, 6, 7));
        assert_ne!(a, flow_hash_v6(&s, &d, 40000, 80, 17, 7));
        assert_ne!(a, flow_hash_v6(&s, &d, 40000, 80, 6, 8));
    }

    #[test]
    fn v6_sequential_source_ports_spread_evenly() {
        let (s, d) = (
            [0xfd, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            [0xfd, 0, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10],
        );
        let mut hits = [0u32; 3];
        for port in 20_000u16..50_000 {
            let h = flow_hash_v6(&s, &d, port, 80, 6, 0x1234_5678);
            hits[(pick_slot(h, 1, 3) - 1) as usize] += 1;
        }
        for h in hits {
            assert!((9_700..=10_300).contains(&h), "uneven spread: {hits:?}");
        }
    }

    #[test]
    fn sequential_source_ports_spread_evenly() {
        // 30,000 sequential ports over 3 slots: each gets within 3% of 1/3.
        let mut hits = [0u32; 3];
        for port in 20_000u16..50_000 {
            let h = flow_hash_v4([10, 1, 0, 2], [10, 96, 0, 10], port, 80, 6, 0x1234_5678);
            hits[(pick_slot(h, 1, 3) - 1) as usize] += 1;
        }
        for h in hits {
            assert!((9_700..=10_300).contains(&h), "uneven spread: {hits:?}");
        }
    }
}
