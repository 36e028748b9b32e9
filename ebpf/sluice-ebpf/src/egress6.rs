//! IPv6 packets leaving the node towards a client: a backend's reply gets
//! the frontend address back as its source (the IPv6 twin of `egress.rs`).
//! Map lookups take the key by reference on purpose (clippy would pass it
//! by value): a copy would put the 40-byte key on the stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{bindings::__sk_buff, programs::TcContext};
use sluice_common::Stat;

use crate::events;
use crate::{
    conntrack::{note_reply6, reverse_nat_of, syn_reply6},
    error::{settle, Error, Verdict},
    flow6::Parsed6,
    frag,
    headers::TCP_SYN,
    icmp6,
    maps::{self, count, Scratch6, CONNTRACK_V6},
    nat::Side,
    nat6,
};
use sluice_common::Hook;

/// The body of `sl_egress6` (returning a `Verdict`, see `error::settle`).
#[inline(never)]
pub fn handle(skb: *mut __sk_buff) -> Verdict {
    let Some(s) = maps::scratch6() else {
        return Verdict::Next;
    };
    settle(try_handle(skb, s))
}

#[inline(always)]
fn try_handle(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    match s.flow.parse(ctx)? {
        Parsed6::Flow => {}
        Parsed6::Icmp => return Ok(icmp6::egress(skb, s)),
        Parsed6::ExtHeader | Parsed6::Other => return Ok(Verdict::Next),
    }
    // A fragment: record a first one's ports, or take a later one's.
    if !frag::track6(s) {
        count(Stat::FragmentUnknown);
        events::flow6(Stat::FragmentUnknown, Hook::Egress, skb, &s.flow, 0, 0);
        return Ok(Verdict::Next);
    }
    // Reverse NAT applies only to a packet from a backend's port (as
    // `egress::handle`: during an upgrade's handover, the previous
    // generation decides that by its own filter).
    if !maps::may_be_backend_port(s.flow.sport) {
        return Ok(Verdict::HandOver);
    }
    s.flow.ct_key_into(&mut s.ct_key);
    let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) else {
        // During an upgrade's handover the old generation may know it.
        return Ok(Verdict::HandOver);
    };
    let flow = &s.flow;
    let Some((frontend, port)) = reverse_nat_of(entry) else {
        return Ok(Verdict::Next);
    };
    if flow.has_tcp_flag(TCP_SYN) {
        if !syn_reply6(flow, entry, &mut s.ct_key, crate::clock::now()) {
            return Ok(Verdict::Next);
        }
    } else {
        note_reply6(flow, entry);
    }
    nat6::rewrite(skb, flow, Side::Src, &frontend, port)?;
    count(Stat::ReplyNat);
    if flow.later() {
        count(Stat::FragmentTracked);
    }
    Ok(Verdict::Next)
}
