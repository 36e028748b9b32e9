//! sluice's kernel programs.
//!
//! Two TC (TCX) classifiers, attached to every device the agent manages.
//! Both handle IPv4 themselves and hand IPv6 frames to their IPv6 halves,
//! `sl_ingress6` / `sl_egress6` (`ingress6.rs`, `egress6.rs`), by tail
//! call through `sl_progs`: each family's path gets the whole 512-byte
//! BPF stack, as Cilium's per-family tail calls do.
//! - `sl_ingress` sees packets arriving at the node. A packet for a service
//!   frontend is matched to its conntrack entry or assigned a backend, and
//!   its destination is rewritten (DNAT) before the kernel routes it.
//! - `sl_egress` sees packets leaving the node towards a client. A reply
//!   from a backend gets the frontend address back as its source.
//!   `sl_egress_pod`, on the pods' devices, lets every packet pass at once
//!   while the socket programs serve every pod (`CFG_F_PODS_ON_SOCKETS`).
//!
//! - `sl_xdp` (XDP, on the external devices `--xdp-devices`) balances
//!   north-south IPv4 and IPv6 traffic to NodePorts, load-balancer IPs and external
//!   IPs with a remote backend at the driver, and drops denied sources.
//!
//! - `sl_connect4`/`6`, `sl_sendmsg4`/`6`, `sl_recvmsg4`/`6`,
//!   `sl_getpeername4`/`6` and `sl_sock_release` (cgroup programs) balance
//!   the node's own sockets, whose packets never cross a TC ingress hook.
//!
//! The TC programs are thin: they pick the family's `handle` function,
//! which turns its typed result into a verdict, counting every error by
//! reason (`error::settle`), and settle an SCTP packet's CRC32c after its
//! ports were rewritten (`sctp::fix`). See
//! `docs/architecture.md` for the walk of one packet.
#![no_std]
#![no_main]
// `atomic_xadd` and `atomic_cxchg`: `core`'s atomic types are not offered
// on the BPF target; the intrinsics lower to BPF's atomic add and
// compare-and-swap.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod checksum;
mod clock;
mod conntrack;
mod egress;
mod egress6;
mod error;
mod events;
mod flow;
mod flow6;
mod frag;
mod hash;
mod headers;
mod icmp;
mod icmp6;
mod ingress;
mod ingress6;
mod log;
mod maglev;
mod maps;
mod nat;
mod nat6;
mod reject;
mod reject6;
mod route;
mod sctp;
mod select;
mod snat;
mod snat6;
mod sock;
mod xdp;
mod xdp6;
mod xdp_nat;

use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, SockContext, TcContext, XdpContext},
};

use sluice_common::{
    maps::{HANDOVER_EGRESS, HANDOVER_INGRESS, PROG_EGRESS6, PROG_INGRESS6},
    Stat,
};

use crate::{
    error::{settle, Verdict},
    headers::ETH_P_IPV6,
    maps::{count, PROGS},
    sock::Family,
};
use sluice_common::Hook;

/// IPv4 runs in the program's own frame (see `ingress::handle`); IPv6
/// jumps to `sl_ingress6`.
#[classifier]
pub fn sl_ingress(ctx: TcContext) -> i32 {
    if flow::ether_type(&ctx) == Some(ETH_P_IPV6) {
        return jump(&ctx, PROG_INGRESS6);
    }
    let sctp = sctp::ports(&ctx);
    let code = match ingress::handle(&ctx) {
        Ok(Verdict::HandOver) => hand_over(&ctx, HANDOVER_INGRESS),
        other => settle(other).code(),
    };
    sctp::defer(&ctx, sctp, code, PROG_INGRESS6)
}

#[classifier]
pub fn sl_egress(ctx: TcContext) -> i32 {
    egress(&ctx)
}

/// The egress program of the pods' devices (`--pod-devices`): while every
/// pod's socket is balanced at `connect()` and the TC path tracks no flow
/// of a pod (`CFG_F_PODS_ON_SOCKETS`), nothing leaving towards a pod needs
/// reverse NAT, and the packet passes without a look; otherwise it is
/// `sl_egress`.
#[classifier]
pub fn sl_egress_pod(ctx: TcContext) -> i32 {
    if maps::pods_on_sockets() {
        return Verdict::Next.code();
    }
    egress(&ctx)
}

#[inline(always)]
fn egress(ctx: &TcContext) -> i32 {
    if flow::ether_type(ctx) == Some(ETH_P_IPV6) {
        return jump(ctx, PROG_EGRESS6);
    }
    let sctp = sctp::ports(ctx);
    let code = match egress::handle(ctx) {
        Ok(Verdict::HandOver) => hand_over(ctx, HANDOVER_EGRESS),
        other => settle(other).code(),
    };
    sctp::defer(ctx, sctp, code, PROG_EGRESS6)
}

/// Entered only by tail call from `sl_ingress` (never attached): an IPv6
/// frame, or an IPv4 SCTP packet whose checksum is to be settled
/// (`sctp::defer`).
#[classifier]
pub fn sl_ingress6(ctx: TcContext) -> i32 {
    if let Some(code) = sctp::deferred(ctx.skb.skb) {
        return code;
    }
    let sctp = sctp::ports6(ctx.skb.skb);
    let verdict = ingress6::handle(ctx.skb.skb);
    if let Verdict::HandOver = verdict {
        // No entry of this generation's conntrack knows its flow: the
        // previous generation takes it whole.
        crate::maps::hand_over(&ctx, HANDOVER_INGRESS);
    }
    sctp::fix(ctx.skb.skb, sctp, verdict.code())
}

/// Entered only by tail call from `sl_egress` (never attached), as
/// `sl_ingress6` is.
#[classifier]
pub fn sl_egress6(ctx: TcContext) -> i32 {
    if let Some(code) = sctp::deferred(ctx.skb.skb) {
        return code;
    }
    let sctp = sctp::ports6(ctx.skb.skb);
    let verdict = egress6::handle(ctx.skb.skb);
    if let Verdict::HandOver = verdict {
        crate::maps::hand_over(&ctx, HANDOVER_EGRESS);
    }
    sctp::fix(ctx.skb.skb, sctp, verdict.code())
}

/// Tail-calls the IPv6 half at `index`. Returns only if the slot is empty
/// (the agent fills it before attaching anything): the packet then passes
/// untouched, counted.
/// During an upgrade's handover, to the previous generation's program;
/// otherwise (no program there) the packet carries on.
#[inline(always)]
fn hand_over(ctx: &TcContext, index: u32) -> i32 {
    crate::maps::hand_over(ctx, index);
    Verdict::Next.code()
}

#[inline(always)]
fn jump(ctx: &TcContext, index: u32) -> i32 {
    sctp::not_deferred(ctx.skb.skb);
    // SAFETY: the target is a TC program over the same context; on
    // success control never comes back here.
    unsafe { PROGS.tail_call(ctx, index) };
    count(Stat::TailCallFailed);
    events::bare(Stat::TailCallFailed, Hook::Tc);
    log::tail_call_missing(ctx, index);
    Verdict::Next.code()
}

/// North-south service traffic at the driver, on the node's external
/// devices (`xdp.rs`); what it does not finish passes to `sl_ingress`.
#[xdp]
pub fn sl_xdp(ctx: XdpContext) -> u32 {
    xdp::run(&ctx)
}

#[cgroup_sock_addr(connect4)]
pub fn sl_connect4(ctx: SockAddrContext) -> i32 {
    sock::connect(&ctx, Family::V4, false)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sl_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::connect(&ctx, Family::V4, true)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn sl_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse(&ctx, Family::V4)
}

#[cgroup_sock_addr(getpeername4)]
pub fn sl_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse(&ctx, Family::V4)
}

#[cgroup_sock_addr(connect6)]
pub fn sl_connect6(ctx: SockAddrContext) -> i32 {
    sock::connect(&ctx, Family::V6, false)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sl_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::connect(&ctx, Family::V6, true)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn sl_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::reverse(&ctx, Family::V6)
}

#[cgroup_sock_addr(getpeername6)]
pub fn sl_getpeername6(ctx: SockAddrContext) -> i32 {
    sock::reverse(&ctx, Family::V6)
}

#[cgroup_sock(sock_release)]
pub fn sl_sock_release(ctx: SockContext) -> i32 {
    sock::release(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
