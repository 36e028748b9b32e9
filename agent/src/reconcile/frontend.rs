//! Writing one frontend: its socket programs' entry, its slots, its Maglev
//! table and its master entry, in an order that keeps the datapath
//! consistent at every instant, after
//! Cilium's `lb.h` discipline: a backend exists before any slot names it
//! (the caller writes backends first), a slot exists before a master count
//! covers it, a table exists before a master entry flags it, surplus slots
//! and tables go only after the master stopped covering them, and a
//! backend goes only after no slot names it (the caller deletes backends
//! last). The socket programs' entry (`sl_sockfe4`/`sl_sockfe6`,
//! `picks.rs`) always gives what the master entry and slots give: one that
//! changes goes before them and comes back after them. IPv6 frontends go
//! to `sl_svc6` under the same rules; both families name backends in the
//! one `sl_backends`.
//! Each call updates the caller's record of what is programmed write by
//! write, so the record stays exact even when a write fails half way.

use sluice_common::{MaglevTable, SvcValue};

use super::{
    backends::BackendLookup,
    ids::{BackendId, SvcId},
    maglev, picks,
    state::{FrontendState, MaglevMembers},
};
use crate::{
    datapath::{Entry, EntryKey, MapWrites, PicksEntry, ServiceKey, WriteError},
    model::FrontendKey,
};

/// Slot number of slot index `i` (slot 0 is the master).
fn slot_number(i: usize) -> u16 {
    (i + 1) as u16
}

/// Brings one frontend from `current` to `target`: takes its socket
/// programs' entry away first if the target's differs, then the changed
/// slots, the Maglev table, the master entry, trims the slots and the
/// table it no longer covers, and writes the target's socket programs'
/// entry last. `backends` are the programmed backends (the target's among
/// them). On failure `current` is marked unknown (`svc_id` 0) so the next
/// call rewrites everything.
pub fn sync<W: MapWrites>(
    writer: &mut W,
    frontend: &FrontendKey,
    current: &mut FrontendState,
    target: &FrontendState,
    backends: &impl BackendLookup,
) -> Result<(), WriteError> {
    let want = if target.sock_picks {
        picks::entry(frontend, target, backends)
    } else {
        None
    };
    let result = drop_picks_unless(writer, frontend, current, want.as_ref(), backends)
        .and_then(|()| sync_inner(writer, frontend, current, target));
    if result.is_err() {
        current.svc_id = SvcId::default();
        return result;
    }
    // The rest is exact whether this goes in or not: `sock_picks` says.
    if let Some(entry) = want.filter(|_| !current.sock_picks) {
        writer.put(Entry::SockPicks(&entry))?;
        current.sock_picks = true;
    }
    Ok(())
}

/// Deletes the frontend's `sl_sockfe4`/`sl_sockfe6` entry unless it is
/// `keep`: an entry always gives what the master entry and slots give, so
/// it goes before they change (a socket meanwhile takes the general
/// lookups) and the new one comes after them. `current.sock_picks` says
/// the map holds the entry `picks::entry` gives for `current`.
fn drop_picks_unless<W: MapWrites>(
    writer: &mut W,
    frontend: &FrontendKey,
    current: &mut FrontendState,
    keep: Option<&PicksEntry>,
    backends: &impl BackendLookup,
) -> Result<(), WriteError> {
    if !current.sock_picks {
        return Ok(());
    }
    // The map holds what `picks::entry` gave for `current` when it was
    // written; the same today unless a backend it names stopped being
    // active since (its id keeps its address while it lives).
    if keep.is_none() || picks::entry(frontend, current, backends).as_ref() != keep {
        writer.delete(EntryKey::SockPicks(ServiceKey::of(frontend, 0)))?;
        current.sock_picks = false;
    }
    Ok(())
}

fn sync_inner<W: MapWrites>(
    writer: &mut W,
    frontend: &FrontendKey,
    current: &mut FrontendState,
    target: &FrontendState,
) -> Result<(), WriteError> {
    let owner_changed = current.svc_id != target.svc_id;
    // The master's slot count as programmed: the record of the slots
    // grows below, before the master covers them.
    let total = current.slots.len();
    // The changed slots, in one batch.
    let changed: Vec<(usize, ServiceKey, SvcValue)> = target
        .slots
        .iter()
        .enumerate()
        .filter(|(i, id)| owner_changed || current.slots.get(*i) != Some(*id))
        .map(|(i, id)| {
            let value = SvcValue {
                svc_id: target.svc_id.get(),
                backend_id: id.get(),
                ..SvcValue::default()
            };
            (i, ServiceKey::of(frontend, slot_number(i)), value)
        })
        .collect();
    let entries: Vec<Entry<'_>> = changed
        .iter()
        .map(|(_, key, value)| Entry::Service(*key, value))
        .collect();
    let result = writer.put_batch(&entries);
    // The record holds as many slots as programmed, without spare room
    // (100,000 frontends of 10 slots would keep 16 each).
    let written = result.as_ref().err().map_or(changed.len(), |(n, _)| *n);
    let reach = changed[..written].iter().map(|&(i, _, _)| i + 1).max();
    if let Some(reach) = reach.filter(|&r| r > current.slots.len()) {
        current.resize_slots(reach);
    }
    if written > 0 {
        current.slots.update(|slots| {
            for &(i, _, _) in &changed[..written] {
                slots[i] = target.slots[i];
            }
        });
    }
    result.map_err(|(_, e)| e)?;
    // A table exists before a master entry that flags it.
    let table_changed = owner_changed || current.maglev != target.maglev;
    if table_changed && !target.maglev.is_empty() {
        let mut table = Box::<MaglevTable>::default();
        for (slot, id) in table
            .backends
            .iter_mut()
            .zip(maglev::populate(&target.maglev))
        {
            *slot = id.get();
        }
        writer.put(Entry::Maglev(ServiceKey::of(frontend, 0), &table))?;
        current.maglev = target.maglev.clone();
    }
    let master_changed = owner_changed
        || current.flags != target.flags
        || current.active != target.active
        || current.fallback != target.fallback
        || current.affinity_s != target.affinity_s
        || total != target.slots.len();
    if master_changed {
        let value = SvcValue {
            svc_id: target.svc_id.get(),
            backend_id: 0,
            active: target.active,
            fallback: target.fallback,
            total: target.slots.len() as u16,
            flags: target.flags,
            affinity_s: target.affinity_s,
            _pad: 0,
        };
        writer.put(Entry::Service(ServiceKey::of(frontend, 0), &value))?;
        current.svc_id = target.svc_id;
        current.flags = target.flags;
        current.active = target.active;
        current.fallback = target.fallback;
        current.affinity_s = target.affinity_s;
    }
    delete_slots_from(writer, frontend, current, target.slots.len())?;
    // A table goes after the master entry stopped flagging it.
    if target.maglev.is_empty() && !current.maglev.is_empty() {
        writer.delete(EntryKey::Maglev(ServiceKey::of(frontend, 0)))?;
        current.maglev = MaglevMembers::default();
    }
    Ok(())
}

/// Deletes `current`'s slots from the last down to slot `keep + 1`; the
/// record keeps those a failed delete left.
fn delete_slots_from<W: MapWrites>(
    writer: &mut W,
    frontend: &FrontendKey,
    current: &mut FrontendState,
    keep: usize,
) -> Result<(), WriteError> {
    let mut len = current.slots.len();
    let mut result = Ok(());
    while len > keep {
        let i = len - 1;
        if current.slots[i] != BackendId::default() {
            result = writer.delete(EntryKey::Service(ServiceKey::of(frontend, slot_number(i))));
            if result.is_err() {
                break;
            }
        }
        len = i;
    }
    current.resize_slots(len);
    result
}

/// Removes a frontend: its socket programs' entry and the master first
/// (new flows stop matching), then its table and its slots. `current`
/// shrinks as entries go.
pub fn delete<W: MapWrites>(
    writer: &mut W,
    frontend: &FrontendKey,
    current: &mut FrontendState,
) -> Result<(), WriteError> {
    if current.sock_picks {
        writer.delete(EntryKey::SockPicks(ServiceKey::of(frontend, 0)))?;
        current.sock_picks = false;
    }
    writer.delete(EntryKey::Service(ServiceKey::of(frontend, 0)))?;
    current.svc_id = SvcId::default();
    if !current.maglev.is_empty() {
        writer.delete(EntryKey::Maglev(ServiceKey::of(frontend, 0)))?;
        current.maglev = MaglevMembers::default();
    }
    delete_slots_from(writer, frontend, current, 0)
}
