//! ICMPv6 errors about DNATed flows, translated back so that the client's
//! stack recognises them: the IPv6 twin of `icmp.rs`. It matters more for
//! IPv6 than for IPv4, as routers never fragment: a node or router between
//! here and a backend answers a too-big DNATed packet with Packet Too Big,
//! quoting it as it was after DNAT (client -> backend), while the client's
//! socket talks to the VIP. On its way out to the client the quoted
//! destination is put back to the frontend, and the ICMPv6 checksum is
//! updated for the changed bytes (the quoted packet is ordinary data to
//! it; the outer addresses do not change, so no pseudo-header update).
//!
//! Not handled, as for IPv4: errors generated on the client's side about
//! replies.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{bindings::__sk_buff, helpers::bpf_csum_diff, programs::TcContext};
use sluice_common::{CtKind, Stat, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    error::{settle, Error, Verdict},
    flow6::{same_addr, L4_OFF6},
    headers::{Ipv6Hdr, IPV6_LEN},
    maps::{count, Scratch6, CONNTRACK_V6},
};

const DEST_UNREACH: u8 = 1;
const PACKET_TOO_BIG: u8 = 2;
const TIME_EXCEEDED: u8 = 3;
const PARAMETER_PROBLEM: u8 = 4;

/// Offsets: the ICMPv6 checksum, the quoted IPv6 header, its destination,
/// the quoted L4 header (quoted packets with extension headers are left
/// alone: their L4 header is elsewhere).
const ICMP_CSUM: usize = L4_OFF6 + 2;
const INNER: usize = L4_OFF6 + 8;
const INNER_DST: usize = INNER + 24;
const INNER_L4: usize = INNER + IPV6_LEN;

/// An ICMPv6 message leaving towards a client (a separate BPF function,
/// returning a `Verdict`, see `error::settle`).
#[inline(never)]
pub fn egress(skb: *mut __sk_buff, s: &mut Scratch6) -> Verdict {
    settle(try_egress(skb, s))
}

#[inline(always)]
fn try_egress(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    let kind: u8 = ctx.load(L4_OFF6).map_err(|_| Error::Truncated)?;
    if !matches!(
        kind,
        DEST_UNREACH | PACKET_TOO_BIG | TIME_EXCEEDED | PARAMETER_PROBLEM
    ) {
        return Ok(Verdict::Next);
    }
    // Loaded with the helper: the quote may lie beyond the linear part.
    let inner: Ipv6Hdr = ctx.load(INNER).map_err(|_| Error::Truncated)?;
    if inner.next_header != IPPROTO_TCP && inner.next_header != IPPROTO_UDP {
        return Ok(Verdict::Next);
    }
    // The first 4 bytes of TCP and UDP are the ports alike.
    let ports: [u8; 4] = ctx.load(INNER_L4).map_err(|_| Error::Truncated)?;
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    // The quoted packet went client -> backend: its reply entry is keyed
    // backend -> client.
    let key = &mut s.ct_key;
    key.src = inner.dst;
    key.dst = inner.src;
    key.sport = dport;
    key.dport = sport;
    key.proto = inner.next_header;
    key._pad = [0; 3];
    let Some(entry) = CONNTRACK_V6.get_ptr(&*key) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: pointer from a successful lookup; fields copied at once.
    let (entry_kind, mut frontend, frontend_port) =
        unsafe { ((*entry).kind, (*entry).nat_addr, (*entry).nat_port) };
    if entry_kind != CtKind::Reply as u8 {
        return Ok(Verdict::Next);
    }
    let mut old = inner.dst;
    if !same_addr(&old, &frontend) {
        // SAFETY: two 16-byte stack arrays, as the helper requires.
        let diff = unsafe {
            bpf_csum_diff(
                old.as_mut_ptr().cast(),
                16,
                frontend.as_mut_ptr().cast(),
                16,
                0,
            )
        };
        if diff < 0 {
            return Err(Error::Nat);
        }
        ctx.l4_csum_replace(ICMP_CSUM, 0, diff as u64, 0)
            .map_err(|_| Error::Nat)?;
        ctx.store(INNER_DST, &frontend, 0).map_err(|_| Error::Nat)?;
    }
    if dport != frontend_port {
        let (from, to) = (dport.to_be() as u64, frontend_port.to_be() as u64);
        ctx.l4_csum_replace(ICMP_CSUM, from, to, 2)
            .map_err(|_| Error::Nat)?;
        ctx.store(INNER_L4 + 2, &frontend_port.to_be(), 0)
            .map_err(|_| Error::Nat)?;
    }
    count(Stat::IcmpTranslated);
    Ok(Verdict::Next)
}
