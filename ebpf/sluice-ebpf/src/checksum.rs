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
