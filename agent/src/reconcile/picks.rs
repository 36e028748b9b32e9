//! A frontend's entry in `sl_sockfe4`/`sl_sockfe6` (`sluice_common::picks`):
//! whether it has one, and what it holds, from the record of its master
//! entry and slots and from its backends. Pure: `frontend.rs` writes what
//! this says, and the adoption at start-up keeps only read-back entries
//! equal to it.

use std::net::IpAddr;

use sluice_common::{
    picks::{takes_picks, SOCK_PICKS_MAX},
    BackendState, SockPick4, SockPick6, SockPicks4, SockPicks6,
};

use super::{backends::BackendLookup, endpoint_of, state::FrontendState};
use crate::{
    datapath::{PicksEntry, ServiceKey},
    model::{FrontendKey, Proto, Scope},
};

/// Whether the frontend at `key` with record `fe` gets an entry: an
/// external-scope TCP or UDP frontend whose socket pick is a hash over its
/// active backends alone (the socket programs look up the external scope
/// only, and leave SCTP sockets alone).
pub fn qualifies(key: &FrontendKey, fe: &FrontendState) -> bool {
    key.scope == Scope::External && key.proto != Proto::Sctp && takes_picks(fe.flags, fe.active)
}

/// The entry of the frontend at `key` whose record is `fe`: its service
/// port and its active backends (slots `1..=active`), in slot order.
/// `None` when it does not qualify, or when a backend it would name is
/// unknown, not active, another service port's or of the other family
/// (a record the reconciler is about to rewrite: no entry then).
pub fn entry(
    key: &FrontendKey,
    fe: &FrontendState,
    backends: &impl BackendLookup,
) -> Option<PicksEntry> {
    if !qualifies(key, fe) {
        return None;
    }
    let active = fe.slots.get(..usize::from(fe.active))?;
    let mut named = Vec::with_capacity(active.len());
    for id in active {
        let b = backends.backend(*id)?;
        if b.svc_id != fe.svc_id.get() || b.state != BackendState::Active as u8 {
            return None;
        }
        named.push((id.get(), endpoint_of(&b)));
    }
    let count = named.len() as u16;
    match ServiceKey::of(key, 0) {
        ServiceKey::V4(k) => {
            let mut value = SockPicks4 {
                svc_id: fe.svc_id.get(),
                count,
                ..SockPicks4::default()
            };
            for (slot, (id, ep)) in value.picks.iter_mut().zip(&named) {
                let IpAddr::V4(addr) = ep.addr else {
                    return None;
                };
                *slot = SockPick4 {
                    backend_id: *id,
                    addr: addr.octets(),
                    port: ep.port,
                    _pad: [0; 2],
                };
            }
            Some(PicksEntry::V4(k, value))
        }
        ServiceKey::V6(k) => {
            let mut value = SockPicks6 {
                svc_id: fe.svc_id.get(),
                count,
                ..SockPicks6::default()
            };
            for (slot, (id, ep)) in value.picks.iter_mut().zip(&named) {
                let IpAddr::V6(addr) = ep.addr else {
                    return None;
                };
                *slot = SockPick6 {
                    backend_id: *id,
                    port: ep.port,
                    _pad: [0; 2],
                    addr: addr.octets(),
                };
            }
            Some(PicksEntry::V6(k, value))
        }
    }
}

// `qualifies` caps the count at what an entry holds.
const _: () = assert!(SOCK_PICKS_MAX <= u16::MAX as usize);

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use sluice_common::{
        service::{SVC_F_AFFINITY, SVC_F_SNAT},
        Backend, FAMILY_V4,
    };

    use super::*;
    use crate::reconcile::{BackendId, SvcId};

    #[allow(clippy::needless_update)] // not needless in the `abi-probe` build
    fn backend(last: u8, state: BackendState, svc: u32) -> Backend {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[10, 0, 0, last]);
        Backend {
            addr,
            port: 8080,
            family: FAMILY_V4,
            state: state as u8,
            svc_id: svc,
            ..Backend::default()
        }
    }

    fn record(flags: u16, active: u16, ids: &[u32]) -> FrontendState {
        let mut fe = FrontendState {
            svc_id: SvcId(7),
            flags,
            active,
            ..FrontendState::default()
        };
        for (i, id) in ids.iter().enumerate() {
            fe.set_slot(i, BackendId(*id));
        }
        fe
    }

    #[test]
    fn an_entry_holds_the_active_slots_in_order() {
        let key = FrontendKey::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, Proto::Tcp);
        let backends: std::collections::HashMap<BackendId, Backend> = [
            (BackendId(3), backend(3, BackendState::Active, 7)),
            (BackendId(1), backend(1, BackendState::Active, 7)),
            (BackendId(2), backend(2, BackendState::Terminating, 7)),
        ]
        .into();
        let fe = record(SVC_F_SNAT, 2, &[3, 1, 2]);
        let Some(PicksEntry::V4(k, v)) = entry(&key, &fe, &backends) else {
            panic!("a plain frontend with active backends has an entry");
        };
        assert_eq!(
            (k.addr, k.port, k.slot, k.scope),
            ([10, 96, 0, 1], 80, 0, 0)
        );
        assert_eq!((v.svc_id, v.count), (7, 2));
        assert_eq!(
            (v.picks[0].backend_id, v.picks[0].addr, v.picks[0].port),
            (3, [10, 0, 0, 3], 8080)
        );
        assert_eq!(v.picks[1].backend_id, 1);
        assert_eq!(v.picks[2], SockPick4::default(), "the rest stays zero");

        // Not for what a socket must decide on its own, nor for the
        // internal scope, nor without an active backend.
        assert!(entry(&key, &record(SVC_F_AFFINITY, 2, &[3, 1, 2]), &backends).is_none());
        assert!(entry(&key.in_scope(Scope::Internal), &fe, &backends).is_none());
        let sctp = FrontendKey::new(key.addr, 80, Proto::Sctp);
        assert!(
            entry(&sctp, &fe, &backends).is_none(),
            "SCTP sockets are not balanced"
        );
        assert!(entry(&key, &record(0, 0, &[2]), &backends).is_none());
        // A record naming a backend that is not active, not known or
        // another service port's gets none (it is being rewritten).
        assert!(entry(&key, &record(0, 3, &[3, 1, 2]), &backends).is_none());
        assert!(entry(&key, &record(0, 1, &[9]), &backends).is_none());
        let mut other = fe.clone();
        other.svc_id = SvcId(8);
        assert!(entry(&key, &other, &backends).is_none());
    }
}
