//! Internet checksum over fixed-size byte arrays (unrolled by the compiler,
//! no loops for the verifier to bound).

/// One's-complement sum of the big-endian 16-bit words of `bytes`.
#[inline(always)]
pub fn sum_words<const N: usize>(bytes: &[u8; N], mut sum: u32) -> u32 {
    let mut i = 0;
    while i + 1 < N {
        sum += ((bytes[i] as u32) << 8) | bytes[i + 1] as u32;
        i += 2;
    }
    sum
}

/// Folds a sum to 16 bits and complements it, ready to store big-endian.
#[inline(always)]
pub fn fold(sum: u32) -> [u8; 2] {
    let s = (sum & 0xffff) + (sum >> 16);
    let s = (s & 0xffff) + (s >> 16);
    (!(s as u16)).to_be_bytes()
}

/// Views a byte-aligned header struct as its bytes.
#[inline(always)]
pub fn bytes_of<T, const N: usize>(v: &T) -> &[u8; N] {
    const { assert!(core::mem::size_of::<T>() >= N) };
    // SAFETY: T is a byte-aligned `#[repr(C)]` header of at least N bytes
    // with no padding; reading it as bytes is always valid.
    unsafe { &*(v as *const T as *const [u8; N]) }
}

/// Folds a one's-complement sum to 16 bits (not complemented).
#[inline(always)]
pub fn fold16(sum: u32) -> u32 {
    let s = (sum & 0xffff) + (sum >> 16);
    (s & 0xffff) + (s >> 16)
}

/// The sum of the two big-endian 16-bit words of a 4-byte field.
#[inline(always)]
pub fn words4(b: [u8; 4]) -> u32 {
    u16::from_be_bytes([b[0], b[1]]) as u32 + u16::from_be_bytes([b[2], b[3]]) as u32
}

/// RFC 1624 (eqn. 3): checksum `check` (as stored) after covered words
/// summing to `old` were replaced by words summing to `new` (both sums
/// unfolded, of 16-bit words at even offsets from the covered start).
/// Computed in registers: no helper, so it holds whatever the skb's
/// checksum state (the helpers skip non-pseudo updates of a
/// `CHECKSUM_PARTIAL` skb).
#[inline(always)]
pub fn adjust(check: [u8; 2], old: u32, new: u32) -> [u8; 2] {
    let hc = u16::from_be_bytes(check) as u32;
    fold((!hc & 0xffff) + (!fold16(old) & 0xffff) + fold16(new))
}

/// `sum_words` of an IPv6 address. A separate BPF function: inlined, the
/// compiler hoists the loads of several addresses and spills them all.
#[inline(never)]
pub fn sum_addr6(a: &[u8; 16]) -> u32 {
    sum_words(a, 0)
}
