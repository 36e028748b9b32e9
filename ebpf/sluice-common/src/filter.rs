//! `sl_fe_filter` and `sl_port_filter`: what lets a packet that has
//! nothing to do with a service leave the TC programs before any hash
//! lookup. A pod's packet to another pod would otherwise pay a miss in
//! `sl_svc4` on the way in and a miss in `sl_ct4` on the way out, each a
//! few cache misses in tables of millions of entries.
//!
//! - `sl_fe_filter`: a hashed bitmap of every frontend address (both
//!   families). `sl_ingress` looks a destination up in `sl_svc4`/`sl_svc6`
//!   only when its bit is set (or the address may be in the service
//!   address space, `sl_svcnetsum4`).
//! - `sl_port_filter`: a bitmap of every backend port. Reverse NAT only
//!   ever applies to a packet from a backend's port, so `sl_egress` looks
//!   up conntrack only when the source port's bit is set.
//!
//! Both are arrays of `u64` words holding 63 bits each; bit 63 says the
//! agent wrote the word. A word it never wrote (a program generation the
//! agent has not filled yet, or a test that loads programs without an
//! agent) passes every address and port, so an unfilled filter only
//! costs the lookups it would have saved. The agent sets a bit before it
//! writes the frontend or backend that needs it, and clears bits only in
//! a full reconcile, from what is programmed. The maps are not pinned:
//! each program generation has its own, filled from the adopted maps
//! before its programs are attached, so a rollback or an older release
//! never leaves a stale filter behind.

/// Words of `sl_fe_filter` (65,536 x 63 bits: with 200,000 frontend
/// addresses about 5% of other addresses still take the lookup).
pub const FE_FILTER_WORDS: u32 = 65_536;
/// Words of `sl_port_filter` (one bit per port).
pub const PORT_FILTER_WORDS: u32 = 65_536 / BITS_PER_WORD + 1;
/// Filter bits per word.
pub const BITS_PER_WORD: u32 = 63;
/// Bit 63 of a word: the agent wrote it (its bits are exact).
pub const WORD_WRITTEN: u64 = 1 << 63;

/// A 32-bit finaliser (MurmurHash3's `fmix32`): every input bit moves
/// every output bit.
#[inline(always)]
const fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Word index and bit of a hash.
#[inline(always)]
const fn slot_of_hash(h: u32) -> (u32, u32) {
    ((h >> 16) % FE_FILTER_WORDS, (h & 0xffff) % BITS_PER_WORD)
}

/// Where IPv4 address `addr` (network-order bytes read as a native `u32`,
/// as the programs hold addresses) sits in `sl_fe_filter`.
#[inline(always)]
pub const fn addr4_slot(addr: u32) -> (u32, u32) {
    slot_of_hash(fmix32(addr))
}

/// Where IPv6 address `addr` (network order) sits in `sl_fe_filter`.
#[inline(always)]
pub fn addr6_slot(addr: &[u8; 16]) -> (u32, u32) {
    let w = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    // Seeded apart from IPv4's hash so that ::a.b.c.d and a.b.c.d differ.
    let h = fmix32(w(0) ^ 0x9e37_79b9);
    let h = fmix32(h ^ w(4));
    let h = fmix32(h ^ w(8));
    slot_of_hash(fmix32(h ^ w(12)))
}

/// Where port `port` (host order) sits in `sl_port_filter`.
#[inline(always)]
pub const fn port_slot(port: u16) -> (u32, u32) {
    (port as u32 / BITS_PER_WORD, port as u32 % BITS_PER_WORD)
}

/// Whether `word` passes `bit`: set, or a word the agent never wrote.
#[inline(always)]
pub const fn passes(word: u64, bit: u32) -> bool {
    word & WORD_WRITTEN == 0 || word & (1 << bit) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_in_range() {
        for port in [0u16, 1, 62, 63, 8080, 65_535] {
            let (w, b) = port_slot(port);
            assert!(w < PORT_FILTER_WORDS && b < BITS_PER_WORD, "{port}");
        }
        let mut seen = [false; 64];
        for a in 0..100_000u32 {
            let (w, b) = addr4_slot(a);
            assert!(w < FE_FILTER_WORDS && b < BITS_PER_WORD);
            seen[b as usize] = true;
            let mut v6 = [0u8; 16];
            v6[12..].copy_from_slice(&a.to_be_bytes());
            let (w, b) = addr6_slot(&v6);
            assert!(w < FE_FILTER_WORDS && b < BITS_PER_WORD);
        }
        assert!(seen[..63].iter().all(|s| *s) && !seen[63]);
    }

    #[test]
    fn ports_have_a_bit_each() {
        let mut slots = [(0u32, 0u32); 65_536];
        for port in 0..=u16::MAX {
            slots[port as usize] = port_slot(port);
        }
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 65_536);
    }

    #[test]
    fn an_unwritten_word_passes_everything_and_a_written_one_its_bits() {
        assert!(passes(0, 5));
        assert!(!passes(WORD_WRITTEN, 5));
        assert!(passes(WORD_WRITTEN | 1 << 5, 5));
        assert!(!passes(WORD_WRITTEN | 1 << 5, 6));
    }

    #[test]
    fn consecutive_cluster_ips_spread_over_the_words() {
        // 10.96.0.0/16: 65,536 cluster IPs should touch most words, not
        // pile up in a few.
        let mut words = [0u8; FE_FILTER_WORDS as usize];
        for i in 0..65_536u32 {
            let addr = u32::from_ne_bytes([10, 96, (i >> 8) as u8, i as u8]);
            words[addr4_slot(addr).0 as usize] = 1;
        }
        let used: usize = words.iter().map(|w| *w as usize).sum();
        assert!(used > 38_000, "{used} words");
    }
}
