//! Developer logs (aya-log), for the rare paths only: never on a packet's
//! normal path. Off unless the agent runs with `--datapath-log-level`
//! (it sets `AYA_LOG_LEVEL` at load; off, each call is one load and a
//! compare), forwarded into the agent's tracing output. Each is a separate
//! BPF function, so that its frame stays off the caller's.

use aya_ebpf::{
    bindings::__sk_buff,
    programs::{SockAddrContext, TcContext},
};
use aya_log_ebpf::{debug, error, warn};

/// A TC program found no IPv6 half (or SCTP checksum program) in
/// `sl_progs` at `index`.
#[inline(never)]
pub fn tail_call_missing(ctx: &TcContext, index: u32) {
    error!(ctx, "sl_progs[{}] is empty: packet passed untouched", index);
}

/// A new SNAT flow found no free port in the SNAT range.
#[inline(never)]
pub fn snat_exhausted(skb: *mut __sk_buff, backend_id: u32, min: u16, max: u16) {
    let ctx = TcContext::new(skb);
    debug!(
        &ctx,
        "SNAT to backend {}: no free port in {}-{}", backend_id, min, max
    );
}

/// A socket's pick named a backend that is missing or of the other family.
#[inline(never)]
pub fn socket_dangling(ctx: &SockAddrContext, backend_id: u32) {
    warn!(
        ctx,
        "socket pick named backend {}, which is not usable", backend_id
    );
}
