//! Verdicts and the typed errors that map to them.

use aya_ebpf::bindings::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC};
use sluice_common::Stat;

use crate::maps;

/// What a program tells the kernel to do with the packet.
#[derive(Clone, Copy)]
pub enum Verdict {
    /// Carry on: the next TCX program, then the normal stack
    /// (`TCX_NEXT`/`TC_ACT_UNSPEC`), so sluice composes with a CNI's programs.
    Next,
    /// Drop the packet.
    Drop,
    /// The packet was redirected with `bpf_redirect`.
    Redirect,
    /// No conntrack entry knows the packet's flow: during an upgrade's
    /// handover, the entry point hands it to the previous program
    /// generation (`maps::hand_over`); otherwise it carries on (`Next`).
    HandOver,
}

impl Verdict {
    #[inline(always)]
    pub fn code(self) -> i32 {
        match self {
            Verdict::Next => TC_ACT_UNSPEC,
            Verdict::Drop => TC_ACT_SHOT,
            Verdict::Redirect => TC_ACT_REDIRECT,
            Verdict::HandOver => TC_ACT_UNSPEC,
        }
    }
}

/// Why a packet could not be handled.
#[derive(Clone, Copy)]
pub enum Error {
    /// A header was cut short; not ours to judge, so it passes.
    Truncated,
    /// A master entry covered a slot or backend that is missing.
    Dangling,
    /// A rewrite helper failed half way; the packet is inconsistent.
    Nat,
    /// A RST or ICMP reply could not be built.
    Reject,
}

impl Error {
    #[inline(always)]
    pub fn stat(self) -> Stat {
        match self {
            Error::Truncated => Stat::Truncated,
            Error::Dangling => Stat::Dangling,
            Error::Nat => Stat::NatFailed,
            Error::Reject => Stat::RejectFailed,
        }
    }

    #[inline(always)]
    pub fn verdict(self) -> Verdict {
        match self {
            Error::Truncated => Verdict::Next,
            Error::Dangling | Error::Nat | Error::Reject => Verdict::Drop,
        }
    }
}

/// A result as a verdict, counting the error by its reason.
///
/// The IPv6 path's separate BPF functions return this rather than a
/// `Result`: a `Result<Verdict, Error>` comes back through a hidden pointer
/// to the caller's stack, the function is `void` to LLVM, and LLVM may
/// leave a stack address in R0 at its exit (it uses R0 as a scratch
/// register), which the verifier refuses ("cannot return stack pointer to
/// the caller").
#[inline(always)]
pub fn settle(result: Result<Verdict, Error>) -> Verdict {
    match result {
        Ok(verdict) => verdict,
        Err(err) => {
            maps::count(err.stat());
            crate::events::bare(err.stat(), sluice_common::Hook::Tc);
            err.verdict()
        }
    }
}
