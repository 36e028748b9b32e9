//! Packets leaving the node towards a client: a backend's reply gets the
//! frontend address back as its source (reverse NAT). The reply side also
//! feeds the forward entry the flags only it can see (the backend's FIN or
//! RST, and that the backend answered), at most once per second per flow.

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use sluice_common::{
    conntrack::{CT_F_RST, CT_F_RX_CLOSING, CT_F_SEEN_REPLY, CT_REFRESH_NS},
    Ct4Key, CtKind, Stat,
};

use crate::{
    error::{Error, Verdict},
    flow::{Flow4, Parsed},
    headers::{TCP_FIN, TCP_RST},
    maps::{count, CONNTRACK_V4},
    nat::{self, Side},
};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> Result<Verdict, Error> {
    let Parsed::Flow(flow) = Flow4::parse(ctx)? else {
        return Ok(Verdict::Next);
    };
    let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) else {
        return Ok(Verdict::Next);
    };
    // SAFETY: pointer from a successful lookup; copied at once.
    let ct = unsafe { *entry };
    if ct.kind != CtKind::Reply as u8 {
        return Ok(Verdict::Next);
    }
    let frontend = [
        ct.nat_addr[0],
        ct.nat_addr[1],
        ct.nat_addr[2],
        ct.nat_addr[3],
    ];

    let mut flags = ct.flags | CT_F_SEEN_REPLY;
    if flow.has_tcp_flag(TCP_FIN) {
        flags |= CT_F_RX_CLOSING;
    }
    if flow.has_tcp_flag(TCP_RST) {
        flags |= CT_F_RST;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if flags != ct.flags || now.wrapping_sub(ct.last_seen_ns) > CT_REFRESH_NS {
        // SAFETY: the entry stays valid for this program run.
        unsafe {
            (*entry).flags = flags;
            (*entry).last_seen_ns = now;
        }
        let forward_key = Ct4Key::new(flow.dst, frontend, flow.dport, ct.nat_port, flow.proto);
        if let Some(fwd) = CONNTRACK_V4.get_ptr_mut(forward_key) {
            // SAFETY: as above; only bits are added.
            unsafe {
                if (*fwd).kind == CtKind::Forward as u8 && (*fwd).backend_id == ct.backend_id {
                    (*fwd).flags |= flags;
                    (*fwd).last_seen_ns = now;
                }
            }
        }
    }
    nat::rewrite(ctx, &flow, Side::Src, frontend, ct.nat_port)?;
    count(Stat::ReplyNat);
    Ok(Verdict::Next)
}
