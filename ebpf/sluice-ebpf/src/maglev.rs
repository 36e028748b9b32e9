//! Maglev frontends (`SVC_F_MAGLEV`): a new flow takes the backend its
//! flow hash (with the cluster-wide `MAGLEV_SEED`) names in the frontend's
//! table, if that backend may take new flows; otherwise it is balanced
//! over the slots as usual, counted `maglev_fallback`. The agent writes a
//! table before the master entry that flags it, so a missing table only
//! means a fallback.
//!
//! Separate BPF functions (`inline(never)`): their keys and hashing stay
//! out of the IPv4 path's frame, which has no room left.
#![allow(clippy::needless_borrows_for_generic_args)]

use sluice_common::{
    hash::flow_hash_v6,
    maglev::{index, MAGLEV_M, MAGLEV_SEED},
    Stat, Svc4Key, Svc6Key, SvcValue,
};

use crate::{
    flow::Flow4,
    flow6::Flow6,
    hash,
    maps::{count, MAGLEV_V4, MAGLEV_V6},
    select::selectable,
};

/// The backend the table of `flow`'s IPv4 frontend (in `scope`) names (0:
/// none usable).
#[inline(never)]
pub fn pick4(flow: &Flow4, master: &SvcValue, scope: u8) -> u32 {
    let key = Svc4Key::scoped(flow.dst, flow.dport, flow.proto, 0, scope);
    let h = hash::flow(flow, MAGLEV_SEED);
    let id = match MAGLEV_V4.get_ptr(&key) {
        // SAFETY: pointer from a successful lookup; one entry read.
        Some(table) => entry(unsafe { &(*table).backends }, h),
        None => 0,
    };
    usable(id, master)
}

/// `pick4` for an IPv6 flow (its master key is in `s.svc_key` with slot 0).
#[inline(never)]
pub fn pick6(flow: &Flow6, key: &Svc6Key, master: &SvcValue) -> u32 {
    let h = flow_hash_v6(
        &flow.src,
        &flow.dst,
        flow.sport,
        flow.dport,
        flow.proto,
        MAGLEV_SEED,
    );
    let id = match MAGLEV_V6.get_ptr(key) {
        // SAFETY: pointer from a successful lookup; one entry read.
        Some(table) => entry(unsafe { &(*table).backends }, h),
        None => 0,
    };
    usable(id, master)
}

#[inline(always)]
fn entry(table: &[u32; MAGLEV_M], h: u32) -> u32 {
    table.get(index(h)).copied().unwrap_or(0)
}

/// `id` if it may take a new flow of `master`'s frontend, else 0 (counted).
#[inline(always)]
fn usable(id: u32, master: &SvcValue) -> u32 {
    if selectable(id, master) {
        return id;
    }
    count(Stat::MaglevFallback);
    0
}

/// The backend the table of an IPv4 frontend (master `key`) names for a
/// socket's hash `h` (0: none usable). The socket programs pick before
/// the source port exists, so they hash the socket, not the flow.
#[inline(never)]
pub fn pick4_by_hash(key: &Svc4Key, h: u32, master: &SvcValue) -> u32 {
    let id = match MAGLEV_V4.get_ptr(key) {
        // SAFETY: pointer from a successful lookup; one entry read.
        Some(table) => entry(unsafe { &(*table).backends }, h),
        None => 0,
    };
    usable(id, master)
}

/// `pick4_by_hash` for an IPv6 frontend.
#[inline(never)]
pub fn pick6_by_hash(key: &Svc6Key, h: u32, master: &SvcValue) -> u32 {
    let id = match MAGLEV_V6.get_ptr(key) {
        // SAFETY: pointer from a successful lookup; one entry read.
        Some(table) => entry(unsafe { &(*table).backends }, h),
        None => 0,
    };
    usable(id, master)
}
