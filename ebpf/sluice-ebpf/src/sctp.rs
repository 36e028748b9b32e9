//! SCTP's CRC32c kept valid across port rewrites.
//!
//! SCTP's checksum is CRC32c over the SCTP packet alone (no pseudo
//! header): an address rewrite leaves it valid, a port rewrite (port ->
//! targetPort and back, an SNAT port) must update it.
//! `sluice_common::crc32c` computes the new value from the old one, the
//! old and new port bytes and the number of bytes after them, without
//! reading the rest of the packet.
//!
//! The rewrites themselves (`nat.rs`, `nat6.rs`) only store the ports. The
//! checksum is settled once, when the program is about to return: the TC
//! entry points note the SCTP ports of the packet on entry (`ports`) and
//! fix the checksum for whatever changed (`fix`). The CRC arithmetic is a
//! few hundred instructions, which the verifier walks again for every
//! state that reaches it: the IPv6 programs call `fix` from their entry
//! point, whose frame is small, but the IPv4 path is inlined into its
//! program's frame and thousands of verifier states reach its end (a
//! call there ran the verifier out of its million instructions; a call
//! under a rewrite would also overflow the stack of the SNAT chain). So
//! the IPv4 programs hand an SCTP packet, with their verdict and the ports
//! they found, to their IPv6 half by tail call (`defer`, through the
//! `sl_progs` slots they already use, the hand-off in the skb's `cb`), and
//! the IPv6 half's entry point settles it (`deferred`) before anything
//! else.
//!
//! A checksum field of 0 is left as it is. Linux writes 0 there when it
//! leaves the CRC to the device (`CHECKSUM_PARTIAL` with `csum_not_inet`:
//! a pod's SCTP socket sending through its veth, which offers
//! `NETIF_F_SCTP_CRC`); the CRC is then computed later over the packet as
//! it is then, rewritten ports included (`skb_crc32c_csum_help` on a device
//! without the offload), or never checked (a local receiver trusts a
//! `CHECKSUM_PARTIAL` skb). Updating the 0 would plant a wrong value in
//! that computation. A packet whose real CRC32c is 0 (one in 2^32) is
//! then delivered with a stale checksum and dropped by its receiver, as a
//! corrupted packet is, and retransmitted.

use aya_ebpf::{
    bindings::{__sk_buff, BPF_F_RECOMPUTE_CSUM, TC_ACT_SHOT},
    programs::TcContext,
};
use sluice_common::{crc32c, Stat, IPPROTO_SCTP};

use crate::events;
use crate::{
    flow6::{is_ext, walk, walked, L4_OFF6},
    headers::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IP_MF_OFFSET, SCTP_LEN},
    maps::{count, PROGS},
};
use sluice_common::Hook;

/// `cb[0]` of an skb that an IPv4 program handed to its IPv6 half with a
/// checksum to settle (`cb[1]`: the ports on entry, `cb[2]`: their offset,
/// `cb[3]`: the verdict). Any other value means an IPv6 packet.
const DEFERRED: u32 = 0x5c70_0132;

/// Marks the skb as an ordinary IPv6 packet before the jump to the IPv6
/// half (the `cb` area is not cleared between hooks).
#[inline(always)]
pub fn not_deferred(skb: *mut __sk_buff) {
    // SAFETY: TC programs may write `cb`.
    unsafe { (*skb).cb[0] = 0 };
}

/// The end of an IPv4 TC program: an SCTP packet that was not dropped
/// goes on to the IPv6 half at `index` of `sl_progs` with the verdict, to
/// have its checksum settled there (see the module comment). Returns only
/// when that is not needed, or the slot is empty (counted: the packet goes
/// on with the checksum it has).
#[inline(always)]
pub fn defer(ctx: &TcContext, before: u64, code: i32, index: u32) -> i32 {
    if before == 0 || code == TC_ACT_SHOT {
        return code;
    }
    let skb = ctx.skb.skb;
    // SAFETY: TC programs may write `cb`; the target is a TC program over
    // the same context, and on success control never comes back here.
    unsafe {
        (*skb).cb[0] = DEFERRED;
        (*skb).cb[1] = before as u32;
        (*skb).cb[2] = (before >> 32) as u32;
        (*skb).cb[3] = code as u32;
        PROGS.tail_call(ctx, index);
    }
    count(Stat::TailCallFailed);
    events::bare(Stat::TailCallFailed, Hook::Tc);
    code
}

/// At the entry of an IPv6 half: the verdict of a packet an IPv4 program
/// deferred, with its checksum settled; `None` for an IPv6 packet.
#[inline(always)]
pub fn deferred(skb: *mut __sk_buff) -> Option<i32> {
    // SAFETY: TC programs may read and write `cb`.
    let (tag, ports, off, code) = unsafe {
        let cb = &mut (*skb).cb;
        let tag = cb[0];
        cb[0] = 0;
        (tag, cb[1], cb[2], cb[3])
    };
    if tag != DEFERRED {
        return None;
    }
    Some(fix(skb, ((off as u64) << 32) | ports as u64, code as i32))
}

/// `N` bytes at `off`, read in place when they are in the linear part of
/// the packet (no helper call: every IPv4 packet on both hooks comes
/// through here, SCTP or not), else with `bpf_skb_load_bytes`.
#[inline(always)]
fn peek<const N: usize>(ctx: &TcContext, off: usize) -> Option<[u8; N]> {
    let start = ctx.data();
    if start + off + N <= ctx.data_end() {
        // SAFETY: bounds checked just above; byte-aligned read.
        return Some(unsafe { *((start + off) as *const [u8; N]) });
    }
    ctx.load(off).ok()
}

/// Where an SCTP packet's L4 header starts and how long the SCTP packet
/// is (from the IP header, not the frame: an Ethernet frame may carry
/// padding), or `None` for anything else (other protocols, fragments).
/// With `ext`, an IPv6 packet's extension headers are walked
/// (`flow6::walk`), as the IPv6 path finds its L4 header; without, only
/// SCTP right after the fixed header is found (the IPv4 programs, whose
/// frame has no room for the walk, hand IPv6 packets over before).
#[inline(always)]
fn locate(ctx: &TcContext, ext: bool) -> Option<(usize, usize)> {
    let ether_type: [u8; 2] = peek(ctx, 12)?;
    if ether_type == ETH_P_IP {
        // vihl, tos, tot_len, id, frag_off, ttl, proto.
        let ip: [u8; 10] = peek(ctx, ETH_LEN)?;
        if ip[9] != IPPROTO_SCTP || u16::from_be_bytes([ip[6], ip[7]]) & IP_MF_OFFSET != 0 {
            return None;
        }
        let ihl = ((ip[0] & 0x0f) as usize) * 4;
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        Some((ETH_LEN + ihl, total.checked_sub(ihl)?))
    } else if ether_type == ETH_P_IPV6 {
        // vtcfl, payload_len, next_header.
        let ip: [u8; 7] = ctx.load(ETH_LEN).ok()?;
        let payload = u16::from_be_bytes([ip[4], ip[5]]) as usize;
        let mut next = ip[6];
        let mut l4_off = L4_OFF6;
        if ext && is_ext(next) {
            (next, l4_off) = walked(walk(ctx.skb.skb, L4_OFF6 as u32, next as u32)).ok()?;
        }
        if next != IPPROTO_SCTP {
            return None;
        }
        Some((l4_off, payload.checked_sub(l4_off - L4_OFF6)?))
    } else {
        None
    }
}

/// The ports of an SCTP packet as the program found it, packed with
/// their offset for `fix`: `l4_off << 32 | ports`; 0 for anything else.
/// For the IPv4 programs (see `locate`); `ports6` in the IPv6 ones. The
/// BPF call is made only for a frame that may be SCTP
/// (`flow::may_be_sctp4`): every other packet is spared it.
#[inline(always)]
pub fn ports(ctx: &TcContext) -> u64 {
    if crate::flow::may_be_sctp4(ctx) {
        ports_v4(ctx.skb.skb)
    } else {
        0
    }
}

#[inline(never)]
fn ports_v4(skb: *mut __sk_buff) -> u64 {
    ports_at(skb, false)
}

/// `ports` for the IPv6 programs: behind extension headers too.
#[inline(never)]
pub fn ports6(skb: *mut __sk_buff) -> u64 {
    ports_at(skb, true)
}

#[inline(always)]
fn ports_at(skb: *mut __sk_buff, ext: bool) -> u64 {
    let ctx = &TcContext::new(skb);
    let Some((l4_off, len)) = locate(ctx, ext) else {
        return 0;
    };
    if len < SCTP_LEN {
        return 0;
    }
    match ctx.load::<[u8; 4]>(l4_off) {
        Ok(p) => ((l4_off as u64) << 32) | u32::from_ne_bytes(p) as u64,
        Err(_) => 0,
    }
}

/// Brings the CRC32c of a packet that left the program with other ports
/// than `before` (from `ports`) up to date, and returns the program's
/// return `code`, or `TC_ACT_SHOT` if the checksum could not be written.
/// A packet the program dropped, or turned into something else (a reject
/// reply), is left alone.
#[inline(never)]
pub fn fix(skb: *mut __sk_buff, before: u64, code: i32) -> i32 {
    if before == 0 || code == TC_ACT_SHOT {
        return code;
    }
    let ctx = &TcContext::new(skb);
    let Some((l4_off, len)) = locate(ctx, true) else {
        return code;
    };
    if l4_off as u64 != before >> 32 || len < SCTP_LEN || len > u16::MAX as usize {
        return code;
    }
    let Ok(now) = ctx.load::<[u8; 4]>(l4_off) else {
        return code;
    };
    let old = (before as u32).to_ne_bytes();
    if old == now {
        return code;
    }
    let check_off = l4_off + 8;
    let Ok(check) = ctx.load::<[u8; 4]>(check_off) else {
        count(Stat::NatFailed);
        events::bare(Stat::NatFailed, Hook::Tc);
        return TC_ACT_SHOT;
    };
    let sum = u32::from_le_bytes(check);
    if sum == 0 {
        return code;
    }
    let sum = crc32c::update(sum, old, now, (len - 4) as u16);
    // The sum of a `CHECKSUM_COMPLETE` skb is recomputed: nothing else in
    // the packet makes up for a CRC change, unlike a TCP checksum's.
    if ctx
        .store(check_off, &sum.to_le_bytes(), BPF_F_RECOMPUTE_CSUM as u64)
        .is_err()
    {
        count(Stat::NatFailed);
        events::bare(Stat::NatFailed, Hook::Tc);
        return TC_ACT_SHOT;
    }
    code
}
