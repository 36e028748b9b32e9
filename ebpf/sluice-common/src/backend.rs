//! `sl_backends`: backends by id.
//!
//! A backend is one endpoint (address, port) of one service port, like an
//! IPVS real server. Its id is allocated by the agent and never reused while
//! a conntrack entry may still name it.

use crate::{assert_size, user_pod};

/// Value of `sl_backends` (key: backend id, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    /// Only in the `abi-probe` test build (see `CtEntry::probe`).
    #[cfg(feature = "abi-probe")]
    pub probe: u32,
    /// Address, network order; IPv4 uses the first 4 bytes.
    pub addr: [u8; 16],
    /// Port, host order.
    pub port: u16,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// A `BackendState` value.
    pub state: u8,
    /// The service port that owns this backend (`SvcValue::svc_id`).
    pub svc_id: u32,
}
#[cfg(not(feature = "abi-probe"))]
assert_size!(Backend, 24);
#[cfg(feature = "abi-probe")]
assert_size!(Backend, 28);

impl Backend {
    /// The IPv4 address (first 4 bytes of `addr`).
    pub const fn addr_v4(&self) -> [u8; 4] {
        [self.addr[0], self.addr[1], self.addr[2], self.addr[3]]
    }
}

/// The state of a backend, from its EndpointSlice conditions.
///
/// The datapath selects only `Active` backends for new flows, or
/// `TerminatingServing` ones when a frontend has no active backend. Flows
/// already in conntrack keep reaching a backend in any state for as long as
/// the backend exists.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendState {
    /// Ready: selectable.
    Active = 0,
    /// Terminating but still serving: selectable only as a fallback.
    TerminatingServing = 1,
    /// Terminating and not serving: never selected; drained then removed.
    Terminating = 2,
    /// Not ready and not terminating: never selected, kept (a failing
    /// readiness probe must not cut the flows it already has).
    NotReady = 3,
    /// Gone from every EndpointSlice (or its service was deleted): kept
    /// only until its flows end or the drain timeout passes.
    Draining = 4,
}

impl BackendState {
    /// Decodes a stored state; unknown values read as `Draining`, the state
    /// that never attracts new flows.
    pub const fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Active,
            1 => Self::TerminatingServing,
            2 => Self::Terminating,
            3 => Self::NotReady,
            _ => Self::Draining,
        }
    }

    /// The name operators see.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::TerminatingServing => "terminating-serving",
            Self::Terminating => "terminating",
            Self::NotReady => "not-ready",
            Self::Draining => "draining",
        }
    }
}

user_pod!(Backend);
