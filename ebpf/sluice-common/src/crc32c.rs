//! Incremental update of SCTP's CRC32c checksum (RFC 9260 appendix A)
//! after a rewrite of a few bytes, without reading the rest of the packet.
//!
//! SCTP's checksum is CRC32c (Castagnoli) over the SCTP packet (common
//! header with the checksum field zeroed, then the chunks), with no
//! pseudo-header: rewriting an IP address leaves it valid, rewriting a port
//! does not. A CRC is linear over GF(2): for two messages `a` and `b` of the
//! same length, `crc(a) ^ crc(b) = crc0(a ^ b)`, where `crc0` is the CRC
//! without its initial and final XOR. `a ^ b` is zero except for the
//! rewritten bytes, so
//!
//! `new = old ^ crc0(delta followed by n zero bytes)
//!      = old ^ (crc0(delta) * x^(8n) mod P)`
//!
//! with `n` the number of packet bytes after the rewritten ones. The
//! product is computed with 16 multiplications in GF(2)[x]/P, one per bit
//! of `n`, by the constants `x^(8 * 2^k)` (the "CRC shift" of zlib's
//! `crc32_combine`), each a fixed 32-step loop, and no branch on data:
//! bounded, and one path for the BPF verifier (a few thousand
//! instructions, walked once per call site). Everything here works in the
//! reflected bit order of CRC32c: bit 31 of a `u32` is the coefficient of
//! `x^0`.

/// The CRC32c polynomial, reflected.
pub const POLY: u32 = 0x82f6_3b78;

/// `x^0` (the polynomial 1) in the reflected representation.
const ONE: u32 = 1 << 31;

/// `v` when `bit` (0 or 1) is 1, else 0, as a multiplication. Not a mask
/// (`v & 0u32.wrapping_sub(bit)`) nor a comparison: BPF has no conditional
/// move, so LLVM turns a comparison into a branch, and the kernel's
/// verifier forks its state on a mask made of a bit (a register known to be
/// -1 or 0, ANDed), so either walks one path per bit pattern, billions for
/// a CRC. `black_box` keeps LLVM from turning the product back into one of
/// those.
#[inline(always)]
const fn pick(v: u32, bit: u32) -> u32 {
    v.wrapping_mul(core::hint::black_box(bit & 1))
}

/// `b * x mod P` (one bit step of the reflected CRC).
#[inline(always)]
const fn times_x(b: u32) -> u32 {
    (b >> 1) ^ pick(POLY, b)
}

/// `a * b mod P`, both in the reflected representation.
#[inline(always)]
pub const fn mul(a: u32, b: u32) -> u32 {
    let mut b = b;
    let mut p = 0u32;
    let mut i = 0;
    while i < 32 {
        // The coefficient of x^i in `a` selects the current `b * x^i`.
        p ^= pick(b, a >> (31 - i));
        b = times_x(b);
        i += 1;
    }
    p
}

/// `x^(8 * 2^k) mod P` for k = 0..16: the factors `shift` multiplies by,
/// computed at compile time (in the program they are immediates).
pub const X8_POW2: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut sq = ONE >> 8; // x^8
    let mut k = 0;
    while k < 16 {
        t[k] = sq;
        sq = mul(sq, sq);
        k += 1;
    }
    t
};

/// `p * factor` when bit `k` of `n` is set, else `p` (chosen by `pick`).
#[inline(always)]
const fn step(p: u32, n: u16, k: u32, factor: u32) -> u32 {
    let m = mul(factor, p);
    p ^ pick(p ^ m, (n >> k) as u32)
}

/// `crc * x^(8n) mod P`: the raw CRC state `crc` carried over `n` zero
/// bytes. `n` is at most 65535 (an SCTP packet's length fits in 16 bits).
/// Written out step by step so that every factor is a constant (no table
/// in memory), one step per bit of `n`.
#[inline(always)]
pub const fn shift(crc: u32, n: u16) -> u32 {
    macro_rules! steps {
        ($p:ident, $($k:literal)+) => {
            $( $p = step($p, n, $k, X8_POW2[$k]); )+
        };
    }
    let mut p = crc;
    steps!(p, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    p
}

/// The raw CRC (`crc0`: no initial or final XOR) of `N` bytes.
#[inline(always)]
pub const fn crc0<const N: usize>(bytes: [u8; N]) -> u32 {
    let mut crc = 0u32;
    let mut j = 0;
    while j < N {
        crc ^= bytes[j] as u32;
        let mut i = 0;
        while i < 8 {
            crc = times_x(crc);
            i += 1;
        }
        j += 1;
    }
    crc
}

/// The SCTP checksum after `N` bytes of the packet changed from `old` to
/// `new` (e.g. both ports, in wire order), with `after` packet bytes
/// following them. `checksum` and the result are CRC values as `u32`, i.e.
/// the checksum field read little-endian (`u32::from_le_bytes`), as Linux
/// stores it.
#[inline(always)]
pub const fn update<const N: usize>(checksum: u32, old: [u8; N], new: [u8; N], after: u16) -> u32 {
    let mut delta = [0u8; N];
    let mut i = 0;
    while i < N {
        delta[i] = old[i] ^ new[i];
        i += 1;
    }
    checksum ^ shift(crc0(delta), after)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// The plain bitwise CRC32c of a whole message.
    fn crc32c(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// An SCTP packet's checksum as Linux computes it: CRC32c over the
    /// packet with the checksum field (bytes 8..12) zero.
    fn sctp_checksum(packet: &[u8]) -> u32 {
        let mut p = packet.to_vec();
        p[8..12].fill(0);
        crc32c(&p)
    }

    #[test]
    fn the_reference_crc_matches_the_rfc_vectors() {
        // RFC 3720 B.4 and the usual check value.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46dd_794e);
    }

    #[test]
    fn multiplication_by_one_and_shift_by_zero_are_identities() {
        for v in [0u32, 1, 0xdead_beef, ONE, POLY] {
            assert_eq!(mul(ONE, v), v);
            assert_eq!(mul(v, ONE), v);
            assert_eq!(shift(v, 0), v);
        }
    }

    #[test]
    fn shift_is_crc_over_zero_bytes() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for n in [1u16, 2, 3, 7, 8, 100, 1452, 9000, 65535] {
            let start = rng.next() as u32;
            let mut crc = start;
            for _ in 0..n {
                for _ in 0..8 {
                    crc = (crc >> 1) ^ (POLY & 0u32.wrapping_sub(crc & 1));
                }
            }
            assert_eq!(shift(start, n), crc, "n = {n}");
        }
    }

    #[test]
    fn a_port_rewrite_updates_the_checksum_as_a_full_recompute_would() {
        let mut rng = Rng(0x0bad_cafe_f00d_0001);
        for len in [16usize, 20, 36, 64, 100, 1000, 1480, 9000, 65535] {
            for _ in 0..20 {
                let mut packet: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                let old_sum = sctp_checksum(&packet);
                packet[8..12].copy_from_slice(&old_sum.to_le_bytes());
                // Source port (offset 0) or destination port (offset 2).
                for off in [0usize, 2] {
                    let old = [packet[off], packet[off + 1]];
                    let new = (rng.next() as u16).to_be_bytes();
                    let sum = u32::from_le_bytes(packet[8..12].try_into().unwrap());
                    let after = u16::try_from(len - off - 2).unwrap();
                    let updated = update(sum, old, new, after);
                    packet[off..off + 2].copy_from_slice(&new);
                    assert_eq!(updated, sctp_checksum(&packet), "len {len} off {off}");
                    packet[8..12].copy_from_slice(&updated.to_le_bytes());
                }
            }
        }
    }

    #[test]
    fn both_ports_at_once_as_the_datapath_updates_them() {
        let mut rng = Rng(0x5eed_5eed_5eed_5eed);
        for len in [16usize, 17, 52, 1500, 65535] {
            let mut packet: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let sum = sctp_checksum(&packet);
            let old: [u8; 4] = packet[0..4].try_into().unwrap();
            let new = (rng.next() as u32).to_ne_bytes();
            packet[0..4].copy_from_slice(&new);
            let after = u16::try_from(len - 4).unwrap();
            assert_eq!(
                update(sum, old, new, after),
                sctp_checksum(&packet),
                "len {len}"
            );
        }
    }

    #[test]
    fn unchanged_bytes_keep_the_checksum() {
        assert_eq!(update(0x1234_5678, [1, 2], [1, 2], 100), 0x1234_5678);
        assert_eq!(
            update(0x1234_5678, [1, 2, 3, 4], [1, 2, 3, 4], 0),
            0x1234_5678
        );
    }
}
