//! Packets leaving the node towards a client: a backend's reply gets the
//! frontend address back as its source (reverse NAT). SNATed flows are
//! turned back on the way in instead (`snat::reply`). This is the IPv4
//! path; IPv6 frames go to `egress6.rs` (`sl_egress` picks by ethertype).

use aya_ebpf::programs::TcContext;
use sluice_common::Stat;

use crate::events;
use crate::{
    conntrack::{note_reply, reverse_nat_of, syn_reply, v4},
    error::{Error, Verdict},
    flow::{Flow4, Parsed},
    headers::TCP_SYN,
    icmp,
    maps::{self, count, CONNTRACK_V4},
    nat::{self, Side},
};
use sluice_common::Hook;

/// The IPv4 path, inlined into the program's own frame: its deepest call
/// chain (SNAT) already fills the 512-byte stack with that frame, so it
/// cannot afford another level.
#[inline(always)]
pub fn handle(ctx: &TcContext) -> Result<Verdict, Error> {
    let flow = match Flow4::parse(ctx)? {
        Parsed::Flow(flow) => flow,
        Parsed::OtherIpv4(ip) => return icmp::egress(ctx, &ip),
        Parsed::UnknownFragment => {
            count(Stat::FragmentUnknown);
            events::bare(Stat::FragmentUnknown, Hook::Egress);
            return Ok(Verdict::Next);
        }
        Parsed::Other => return Ok(Verdict::Next),
    };
    // Reverse NAT applies only to a packet from a backend's port.
    if !maps::may_be_backend_port(flow.sport) {
        return Ok(Verdict::HandOver);
    }
    let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) else {
        // During an upgrade's handover the old generation may know it.
        return Ok(Verdict::HandOver);
    };
    let Some((frontend, port)) = reverse_nat_of(entry) else {
        return Ok(Verdict::Next);
    };
    let frontend = v4(&frontend);
    if flow.has_tcp_flag(TCP_SYN) {
        if !syn_reply(&flow, entry, crate::clock::now()) {
            return Ok(Verdict::Next);
        }
    } else {
        note_reply(&flow, entry);
    }
    nat::rewrite(ctx, &flow, Side::Src, frontend, port)?;
    count(Stat::ReplyNat);
    if flow.later {
        count(Stat::FragmentTracked);
    }
    Ok(Verdict::Next)
}
