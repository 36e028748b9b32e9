//! `sl_maglev4` and `sl_maglev6`: Maglev lookup tables (Eisenbud et al.,
//! NSDI 2016), one per frontend of a service annotated
//! `service.sluice.dev/lb-algorithm: maglev`, keyed like the frontend's
//! master entry (slot 0).
//!
//! Each of the `MAGLEV_M` entries names a backend id; a new flow takes
//! `table[hash % MAGLEV_M]`. The agent fills the table from the frontend's
//! selectable backends with Maglev's permutation scheme, seeded by each
//! backend's address and port (never its node-local id), so every node
//! builds the same table, and the flow hash uses the fixed `MAGLEV_SEED`
//! rather than the node's random seed, so every node picks the same
//! backend for a flow. When a backend comes or goes, about 1/N of the
//! entries change: established flows keep their conntrack entries anyway,
//! and a flow re-sent to another node (ECMP change, node failure) still
//! lands on its backend.

use crate::{assert_size, hash::jhash_3words, user_pod};

/// Entries per table: 2^14, about Cilium's default (16381). Maglev
/// balances within about 1% while `MAGLEV_M` is over 100 times the backend
/// count (~160 backends here); 64 KiB per table. A power of two rather
/// than the paper's prime, so that the datapath's index is a mask the
/// verifier can bound (a modulo compiles to a multiply it cannot); the
/// agent makes each backend's `skip` odd, hence coprime with `MAGLEV_M`,
/// which is all the prime was for: every preference list is still a
/// permutation of the table.
pub const MAGLEV_M: usize = 1 << 14;

/// The flow-hash seed of Maglev frontends: the same on every node.
pub const MAGLEV_SEED: u32 = 0x6d61_676c;

/// The table index of a flow whose 5-tuple hashed (`flow_hash_v4`/`v6`)
/// to `flow_hash` with `MAGLEV_SEED`: mixed once more, so that the index
/// does not share the low bits that other frontends' slot choice uses.
pub const fn index(flow_hash: u32) -> usize {
    (jhash_3words(flow_hash, 0, 0, MAGLEV_SEED) as usize) & (MAGLEV_M - 1)
}

/// Value of `sl_maglev4` / `sl_maglev6`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevTable {
    pub backends: [u32; MAGLEV_M],
}
assert_size!(MaglevTable, MAGLEV_M * 4);

impl Default for MaglevTable {
    fn default() -> Self {
        Self {
            backends: [0; MAGLEV_M],
        }
    }
}

user_pod!(MaglevTable);
