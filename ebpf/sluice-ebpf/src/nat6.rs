//! IPv6 address and port rewriting with incremental L4 checksum updates.
//!
//! IPv6 has no header checksum; the TCP/UDP checksum covers the pseudo
//! header, so an address change is folded in as one `bpf_csum_diff` over
//! the 16 bytes and applied with `BPF_F_PSEUDO_HDR` (the helper also keeps
//! a `CHECKSUM_PARTIAL` skb consistent). UDP differs from IPv4: a zero
//! checksum is invalid in IPv6 (RFC 8200 8.1), so it is always updated
//! (no `BPF_F_MARK_MANGLED_0`, which would skip a zero field), and a
//! result of zero is written as 0xffff, its one's-complement twin. SCTP's
//! CRC32c covers no pseudo header: an address change leaves it alone (the
//! store then recomputes a `CHECKSUM_COMPLETE` skb's sum, which no L4
//! checksum change makes up for), a port change updates it (`sctp::fix`,
//! on the way out).

use aya_ebpf::{
    bindings::{__sk_buff, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    helpers::bpf_csum_diff,
    programs::TcContext,
};
use sluice_common::{IPPROTO_SCTP, IPPROTO_UDP};

use crate::{
    error::Error,
    flow6::{same_addr, Flow6},
    headers::ETH_LEN,
    nat::Side,
};

const IP6_SRC_OFF: usize = ETH_LEN + 8;
const IP6_DST_OFF: usize = ETH_LEN + 24;

/// `BPF_F_IPV6` (Linux 6.16+): tells `bpf_l4_csum_replace` that the
/// pseudo header is IPv6, so a `CHECKSUM_COMPLETE` skb's `csum` is left
/// alone (an IPv6 address change and its L4 checksum change cancel out in
/// it). Older kernels reject the flag with EINVAL before touching
/// anything; the update is then retried without it.
const BPF_F_IPV6: u64 = 1 << 7;

/// Rewrites one end of the packet. A separate BPF function: called from
/// every IPv6 path, with its 16-byte temporaries in a frame of its own.
#[inline(never)]
pub fn rewrite(
    skb: *mut __sk_buff,
    flow: &Flow6,
    side: Side,
    addr: &[u8; 16],
    port: u16,
) -> Result<(), Error> {
    let ctx = &TcContext::new(skb);
    if flow.later() {
        // No L4 header, and IPv6 has no header checksum: the address is
        // all there is to rewrite (the first fragment's L4 checksum
        // update covered the whole datagram).
        let addr_off = match side {
            Side::Src => IP6_SRC_OFF,
            Side::Dst => IP6_DST_OFF,
        };
        return ctx.store(addr_off, addr, 0).map_err(|_| Error::Nat);
    }
    let l4_off = flow.l4_off();
    let (addr_off, port_off, old_port) = match side {
        Side::Src => (IP6_SRC_OFF, l4_off, flow.sport),
        Side::Dst => (IP6_DST_OFF, l4_off + 2, flow.dport),
    };
    if flow.proto == IPPROTO_SCTP {
        // No checksum here: the CRC32c is settled on the way out
        // (`sctp::fix`); the sum of a `CHECKSUM_COMPLETE` skb is recomputed.
        let new = *addr;
        let recompute = BPF_F_RECOMPUTE_CSUM as u64;
        if !same_addr(&old_addr(flow, side), &new) {
            ctx.store(addr_off, &new, recompute)
                .map_err(|_| Error::Nat)?;
        }
        if old_port != port {
            ctx.store(port_off, &port.to_be(), recompute)
                .map_err(|_| Error::Nat)?;
        }
        return Ok(());
    }
    let mut old = old_addr(flow, side);
    let mut new = *addr;
    let udp = flow.proto == IPPROTO_UDP;
    let csum_off = if udp { l4_off + 6 } else { l4_off + 16 };
    if !same_addr(&old, &new) {
        // SAFETY: both buffers are 16-byte stack arrays (a multiple of 4,
        // as the helper requires) that live across the call.
        let diff =
            unsafe { bpf_csum_diff(old.as_mut_ptr().cast(), 16, new.as_mut_ptr().cast(), 16, 0) };
        if diff < 0 {
            return Err(Error::Nat);
        }
        let flags = BPF_F_PSEUDO_HDR as u64;
        if ctx
            .l4_csum_replace(csum_off, 0, diff as u64, flags | BPF_F_IPV6)
            .is_err()
        {
            ctx.l4_csum_replace(csum_off, 0, diff as u64, flags)
                .map_err(|_| Error::Nat)?;
        }
        ctx.store(addr_off, &new, 0).map_err(|_| Error::Nat)?;
    }
    if old_port != port {
        let from = old_port.to_be() as u64;
        let to = port.to_be() as u64;
        ctx.l4_csum_replace(csum_off, from, to, 2)
            .map_err(|_| Error::Nat)?;
        ctx.store(port_off, &port.to_be(), 0)
            .map_err(|_| Error::Nat)?;
    }
    if udp {
        let check: u16 = ctx.load(csum_off).map_err(|_| Error::Nat)?;
        if check == 0 {
            ctx.store(csum_off, &0xffffu16, 0).map_err(|_| Error::Nat)?;
        }
    }
    Ok(())
}

/// The address `side` of the packet had before the rewrite.
#[inline(always)]
fn old_addr(flow: &Flow6, side: Side) -> [u8; 16] {
    match side {
        Side::Src => flow.src,
        Side::Dst => flow.dst,
    }
}
