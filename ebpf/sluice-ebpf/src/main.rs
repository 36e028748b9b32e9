//! sluice's kernel programs.
//!
//! Two TC (TCX) classifiers, attached to every device the agent manages:
//! - `sl_ingress` sees packets arriving at the node. A packet for a service
//!   frontend is matched to its conntrack entry or assigned a backend, and
//!   its destination is rewritten (DNAT) before the kernel routes it.
//! - `sl_egress` sees packets leaving the node towards a client. A reply
//!   from a backend gets the frontend address back as its source.
//!
//! Both are thin: they call a `handle` function and turn its typed result
//! into a verdict, counting every error by reason. See
//! `docs/architecture.md` for the walk of one packet.
#![no_std]
#![no_main]

mod checksum;
mod conntrack;
mod egress;
mod error;
mod flow;
mod hash;
mod headers;
mod ingress;
mod maps;
mod nat;
mod reject;
mod snat;

use aya_ebpf::{macros::classifier, programs::TcContext};

use crate::error::Verdict;

#[classifier]
pub fn sl_ingress(ctx: TcContext) -> i32 {
    finish(ingress::handle(&ctx))
}

#[classifier]
pub fn sl_egress(ctx: TcContext) -> i32 {
    finish(egress::handle(&ctx))
}

#[inline(always)]
fn finish(result: Result<Verdict, error::Error>) -> i32 {
    match result {
        Ok(verdict) => verdict.code(),
        Err(err) => {
            maps::count(err.stat());
            err.verdict().code()
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
