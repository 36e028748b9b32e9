//! The datapath ABI: every BPF map's name, key and value layout, shared
//! verbatim by the kernel programs (`no_std`) and the agent (`user` feature,
//! which implements `aya::Pod`).
//!
//! Layout rules, checked at compile time at the bottom of each module:
//! - `#[repr(C)]` with every padding byte an explicit field, so a value built
//!   with `Default`/zeroed is fully initialised and `bpftool` shows all of it;
//! - addresses are byte arrays in network order (`bpftool map dump` prints
//!   `[10,96,0,10]`), ports are host-order `u16` (it prints `80`);
//! - IPv4 and IPv6 get their own key types (`Svc4Key`/`Svc6Key`,
//!   `Ct4Key`/`Ct6Key`) and maps; values carry 16-byte addresses so one
//!   value type serves both families.
//!
//! `docs/maps.md` describes the schema for operators.
#![no_std]

pub mod abi;
pub mod affinity;
pub mod backend;
pub mod config;
pub mod conntrack;
pub mod crc32c;
pub mod events;
pub mod filter;
pub mod fragment;
pub mod hash;
pub mod hop;
pub mod maglev;
pub mod maps;
pub mod picks;
pub mod service;
pub mod socket;
pub mod source_range;
pub mod stats;
pub mod svcnet;

pub use affinity::{Affinity4Key, Affinity6Key, AffinityValue};
pub use backend::{Backend, BackendState};
pub use config::Config;
pub use conntrack::{Ct4Key, Ct6Key, CtEntry, CtKind};
pub use events::{Event, EventBucket, Hook};
pub use fragment::{Frag4Key, Frag6Key, FragPorts};
pub use hop::{Hop4Key, Hop6Key, HopEntry};
pub use maglev::MaglevTable;
pub use picks::{SockPick4, SockPick6, SockPicks4, SockPicks6};
pub use service::{FrontendKind, Svc4Key, Svc6Key, SvcValue};
pub use socket::{SockEntry, SockRevKey, SockRevValue, SockSlot};
pub use source_range::{SrcRange4, SrcRange6};
pub use stats::Stat;
pub use svcnet::SvcnetSummary4;

/// IP protocol numbers the datapath balances.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IP protocol number of SCTP.
pub const IPPROTO_SCTP: u8 = 132;

/// Address family tag stored in values that hold a 16-byte address.
pub const FAMILY_V4: u8 = 4;
/// Address family tag for IPv6 addresses.
pub const FAMILY_V6: u8 = 6;

/// Bumped whenever a key or value layout of a pinned map changes
/// (`abi.lock` holds each map's layout and fails the build's tests when
/// one changes without a bump). An agent migrates pins of any other
/// version, older or newer, field by field (`agent/src/datapath/migrate.rs`);
/// release 0.1.0 (ABI 4) adopts only ABI 4 pins.
#[cfg(not(feature = "abi-probe"))]
pub const ABI_VERSION: u32 = 4;
/// The `abi-probe` test build: one extra field in `CtEntry` and `Backend`,
/// so that the upgrade tests cross a real layout change.
#[cfg(feature = "abi-probe")]
pub const ABI_VERSION: u32 = 5;

/// Implements `aya::Pod` for ABI types when building for userspace.
macro_rules! user_pod {
    ($($t:ty),+ $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: the type is `#[repr(C)]`, `Copy`, has no implicit
            // padding (asserted next to its definition) and every bit
            // pattern is a valid value.
            unsafe impl aya::Pod for $t {}
        )+
    };
}
pub(crate) use user_pod;

/// Fails compilation when a type's size differs from the documented one,
/// which is how implicit padding would show up.
macro_rules! assert_size {
    ($t:ty, $n:expr) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $n);
    };
}
pub(crate) use assert_size;
