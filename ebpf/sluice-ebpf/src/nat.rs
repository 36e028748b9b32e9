//! Address and port rewriting with incremental checksum updates.
//!
//! The L4 checksum covers the pseudo header, so an address change updates
//! it with `BPF_F_PSEUDO_HDR`; the kernel helpers also keep a
//! `CHECKSUM_PARTIAL` skb (veth with TX offload) consistent. A UDP
//! checksum of 0 means "none" and stays 0 (`BPF_F_MARK_MANGLED_0`). SCTP's
//! CRC32c covers no pseudo header: an address change leaves it alone, a
//! port change updates it (`sctp::fix`, on the way out).
//!
//! A non-first fragment (`Flow4::later`) has no L4 header: only its
//! addresses and the IP header checksum change; the L4 checksum, in the
//! first fragment, was updated for the whole datagram there.

use aya_ebpf::{
    bindings::{__sk_buff, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    programs::TcContext,
};
use sluice_common::{IPPROTO_SCTP, IPPROTO_TCP};

use crate::{
    checksum,
    error::Error,
    flow::{read, Flow4},
    headers::ETH_LEN,
};

/// Rewrites one end of the packet (see `rewrite_skb`).
#[inline(always)]
pub fn rewrite(
    ctx: &TcContext,
    flow: &Flow4,
    side: Side,
    addr: [u8; 4],
    port: u16,
) -> Result<(), Error> {
    rewrite_skb(ctx.skb.skb, flow, side, addr, port)
}

/// Which end of the packet to rewrite.
#[derive(Clone, Copy)]
pub enum Side {
    Src,
    Dst,
}

const IP_CSUM_OFF: usize = ETH_LEN + 10;
const IP_SRC_OFF: usize = ETH_LEN + 12;
const IP_DST_OFF: usize = ETH_LEN + 16;

/// A separate BPF function: called from every path, its temporaries then
/// live in one small frame of their own.
#[inline(never)]
pub fn rewrite_skb(
    skb: *mut __sk_buff,
    flow: &Flow4,
    side: Side,
    addr: [u8; 4],
    port: u16,
) -> Result<(), Error> {
    let ctx = &TcContext::new(skb);
    let (addr_off, port_off, old_addr, old_port) = match side {
        Side::Src => (IP_SRC_OFF, flow.l4_off, flow.src, flow.sport),
        Side::Dst => (IP_DST_OFF, flow.l4_off + 2, flow.dst, flow.dport),
    };
    let sctp = flow.proto == IPPROTO_SCTP;
    let (csum_off, mangled) = if flow.proto == IPPROTO_TCP {
        (flow.l4_off + 16, 0)
    } else {
        (flow.l4_off + 6, BPF_F_MARK_MANGLED_0 as u64)
    };
    if old_addr == addr && (old_port == port || flow.later) {
        return Ok(());
    }
    // The L4 checksum (TCP, UDP; a later fragment has no L4 header) by the
    // kernel's helpers, which know the skb's checksum state: a
    // `CHECKSUM_PARTIAL` packet's port change leaves the field alone.
    if !flow.later && !sctp {
        if old_addr != addr {
            let from = u32::from_ne_bytes(old_addr) as u64;
            let to = u32::from_ne_bytes(addr) as u64;
            ctx.l4_csum_replace(csum_off, from, to, BPF_F_PSEUDO_HDR as u64 | mangled | 4)
                .map_err(|_| Error::Nat)?;
        }
        if old_port != port {
            let from = old_port.to_be() as u64;
            let to = port.to_be() as u64;
            ctx.l4_csum_replace(csum_off, from, to, mangled | 2)
                .map_err(|_| Error::Nat)?;
        }
        // With a 20-byte IPv4 header (all but a few packets): the rest in
        // one store. Read after the helpers (which may move the packet), as
        // the bytes are then: a rewrite of the other side may have come
        // first.
        if flow.l4_off == ETH_LEN + 20 {
            if let Some(ends) = read::<Ends>(ctx, IP_CSUM_OFF) {
                return store_ends(ctx, side, ends, addr, port);
            }
        }
    }
    if old_addr != addr {
        let from = u32::from_ne_bytes(old_addr) as u64;
        let to = u32::from_ne_bytes(addr) as u64;
        ctx.l3_csum_replace(IP_CSUM_OFF, from, to, 4)
            .map_err(|_| Error::Nat)?;
        ctx.store(addr_off, &addr, 0).map_err(|_| Error::Nat)?;
    }
    if old_port != port && !flow.later {
        if sctp {
            // The CRC32c is settled on the way out (`sctp::fix`); the sum
            // of a `CHECKSUM_COMPLETE` skb is recomputed.
            return ctx
                .store(port_off, &port.to_be(), BPF_F_RECOMPUTE_CSUM as u64)
                .map_err(|_| Error::Nat);
        }
        ctx.store(port_off, &port.to_be(), 0)
            .map_err(|_| Error::Nat)?;
    }
    Ok(())
}

/// The header checksum, addresses and ports, contiguous from
/// `IP_CSUM_OFF` in a packet with a 20-byte IPv4 header.
type Ends = [u8; 14];

/// The header checksum, the address and the port of `side` of a TCP or
/// UDP packet with a 20-byte IPv4 header, in one store of `e` (its bytes
/// as they are) with them replaced: two helper calls fewer than a
/// checksum helper and a store for each. The IPv4 header checksum is never
/// left to an offload, so it is computed here (RFC 1624).
#[inline(always)]
fn store_ends(
    ctx: &TcContext,
    side: Side,
    mut e: Ends,
    addr: [u8; 4],
    port: u16,
) -> Result<(), Error> {
    let [p0, p1] = port.to_be_bytes();
    let was = match side {
        Side::Src => {
            let was = [e[2], e[3], e[4], e[5]];
            (e[2], e[3], e[4], e[5]) = (addr[0], addr[1], addr[2], addr[3]);
            (e[10], e[11]) = (p0, p1);
            was
        }
        Side::Dst => {
            let was = [e[6], e[7], e[8], e[9]];
            (e[6], e[7], e[8], e[9]) = (addr[0], addr[1], addr[2], addr[3]);
            (e[12], e[13]) = (p0, p1);
            was
        }
    };
    if was != addr {
        let [c0, c1] =
            checksum::adjust([e[0], e[1]], checksum::words4(was), checksum::words4(addr));
        (e[0], e[1]) = (c0, c1);
    }
    ctx.store(IP_CSUM_OFF, &e, 0).map_err(|_| Error::Nat)
}
