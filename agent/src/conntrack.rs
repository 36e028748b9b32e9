//! Reading the conntrack maps (`sl_ct4`, `sl_ct6`): garbage collection and
//! live flows per backend (for the drain manager and `sluice lb list`).
//! Both families hold the same `CtEntry` values and follow the same rules;
//! only the key type differs (`CtKey`).
//!
//! The datapath never deletes entries. A scan marks as stale:
//! - forward entries idle longer than their state's timeout;
//! - entries whose backend is gone or now belongs to another service port;
//! - reply entries whose forward entry is gone or stale (so a flow where
//!   only the client talks keeps its reply entry), once they have been idle
//!   for `ORPHAN_GRACE`: the datapath inserts a flow's reply entry just
//!   before its forward entry, and a scan may read the one without the
//!   other.

use std::{collections::HashMap, hash::Hash, time::Duration};

use aya::{
    maps::{HashMap as AyaHashMap, MapData},
    Pod,
};
use sluice_common::{
    conntrack::{timeouts, CT_F_SEEN_REPLY},
    maps as names, AffinityValue, Ct4Key, Ct6Key, CtEntry, CtKind, SockEntry, SockRevKey,
    IPPROTO_SCTP, IPPROTO_TCP,
};

use crate::{
    datapath::{DatapathError, Maps},
    reconcile::{BackendId, BackendLookup},
};

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`, and
/// of the datapath's stamps (`bpf_ktime_get_coarse_ns`), which lag it by
/// at most a tick (ages are taken with `saturating_sub`).
pub fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime fills the timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// How long a reply entry without a live forward entry survives.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(timeouts::TCP_CLOSING_S);

/// A conntrack key of either family.
pub trait CtKey: Copy + Eq + Hash {
    fn proto(&self) -> u8;
    /// The key of the forward entry the reply entry `entry` belongs to.
    fn forward_of(entry: &CtEntry, proto: u8) -> Self;
}

impl CtKey for Ct4Key {
    fn proto(&self) -> u8 {
        self.proto
    }
    fn forward_of(entry: &CtEntry, proto: u8) -> Self {
        entry.forward_key_of_reply(proto)
    }
}

impl CtKey for Ct6Key {
    fn proto(&self) -> u8 {
        self.proto
    }
    fn forward_of(entry: &CtEntry, proto: u8) -> Self {
        entry.forward_key6_of_reply(proto)
    }
}

/// How long an entry may stay idle.
pub fn timeout<K: CtKey>(key: &K, entry: &CtEntry) -> Duration {
    let proto = key.proto();
    let secs = if proto != IPPROTO_TCP && proto != IPPROTO_SCTP {
        timeouts::UDP_S
    } else if entry.is_closing() {
        timeouts::TCP_CLOSING_S
    } else if entry.flags & CT_F_SEEN_REPLY == 0 {
        timeouts::TCP_SYN_S
    } else if proto == IPPROTO_SCTP {
        timeouts::SCTP_ESTABLISHED_S
    } else {
        timeouts::TCP_ESTABLISHED_S
    };
    Duration::from_secs(secs)
}

/// The key of the forward entry a reply entry belongs to.
pub fn forward_key_of_reply<K: CtKey>(key: &K, entry: &CtEntry) -> K {
    K::forward_of(entry, key.proto())
}

/// Session affinity entries to delete: their backend is gone or belongs to
/// another service port, or they are idle beyond the longest timeout the
/// API allows (a frontend's own timeout is enforced by the datapath).
pub fn stale_affinities<K: Copy>(
    entries: &[(K, AffinityValue)],
    backends: &impl BackendLookup,
    now_ns: u64,
) -> Vec<K> {
    let max_idle = Duration::from_secs(u64::from(crate::translate::MAX_AFFINITY_TIMEOUT));
    entries
        .iter()
        .filter(|(_, v)| {
            let idle = Duration::from_nanos(now_ns.saturating_sub(v.last_used_ns));
            idle > max_idle
                || backends
                    .backend(BackendId(v.backend_id))
                    .is_none_or(|b| b.svc_id != v.svc_id)
        })
        .map(|(k, _)| *k)
        .collect()
}

/// Every session affinity entry of one family's map (`sl_aff4` or
/// `sl_aff6`, named `name`).
pub fn read_affinities<K: Pod>(
    map: &AyaHashMap<MapData, K, AffinityValue>,
    name: &'static str,
) -> Result<Vec<(K, AffinityValue)>, DatapathError> {
    let mut all = Vec::new();
    for item in map.iter() {
        match item {
            Ok(kv) => all.push(kv),
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(source) => return Err(DatapathError::Map { name, source }),
        }
    }
    Ok(all)
}

#[derive(Debug)]
pub struct CtScan<K> {
    /// Live (not closing, not expired) forward entries per backend id.
    pub flows: HashMap<BackendId, u32>,
    /// Entries to delete.
    pub stale: Vec<K>,
    /// Entries read.
    pub entries: usize,
}

impl<K> Default for CtScan<K> {
    fn default() -> Self {
        Self {
            flows: HashMap::new(),
            stale: Vec::new(),
            entries: 0,
        }
    }
}

/// Every entry of one conntrack map.
fn read_map<K: aya::Pod>(
    map: &aya::maps::HashMap<aya::maps::MapData, K, CtEntry>,
    name: &'static str,
) -> Result<Vec<(K, CtEntry)>, DatapathError> {
    let mut all = Vec::new();
    for item in map.iter() {
        match item {
            Ok(kv) => all.push(kv),
            // An entry may vanish (LRU) between listing its key and reading it.
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(source) => return Err(DatapathError::Map { name, source }),
        }
    }
    Ok(all)
}

/// Every entry of the IPv4 conntrack map.
pub fn read_all(maps: &Maps) -> Result<Vec<(Ct4Key, CtEntry)>, DatapathError> {
    read_map(&maps.conntrack_v4, names::CONNTRACK_V4)
}

/// Every entry of the IPv6 conntrack map.
pub fn read_all6(maps: &Maps) -> Result<Vec<(Ct6Key, CtEntry)>, DatapathError> {
    read_map(&maps.conntrack_v6, names::CONNTRACK_V6)
}

/// Judges every entry against the programmed backends at `now_ns`.
pub fn scan<K: CtKey>(
    entries: &[(K, CtEntry)],
    backends: &impl BackendLookup,
    now_ns: u64,
) -> CtScan<K> {
    let mut out = CtScan {
        entries: entries.len(),
        ..CtScan::default()
    };
    let valid = |e: &CtEntry| {
        backends
            .backend(BackendId(e.backend_id))
            .is_some_and(|b| b.svc_id == e.svc_id)
    };
    let fresh = |k: &K, e: &CtEntry| {
        Duration::from_nanos(now_ns.saturating_sub(e.last_seen_ns)) <= timeout(k, e)
    };
    let mut live_forward: HashMap<K, u32> = HashMap::new();
    for (key, entry) in entries {
        if entry.kind != CtKind::Forward as u8 {
            continue;
        }
        if valid(entry) && fresh(key, entry) {
            live_forward.insert(*key, entry.backend_id);
            if !entry.is_closing() {
                *out.flows.entry(BackendId(entry.backend_id)).or_default() += 1;
            }
        } else {
            out.stale.push(*key);
        }
    }
    for (key, entry) in entries {
        if entry.kind == CtKind::Forward as u8 {
            continue;
        }
        let idle = Duration::from_nanos(now_ns.saturating_sub(entry.last_seen_ns));
        let keep = entry.kind == CtKind::Reply as u8
            && valid(entry)
            && (live_forward.get(&forward_key_of_reply(key, entry)) == Some(&entry.backend_id)
                || idle <= ORPHAN_GRACE);
        if !keep {
            out.stale.push(*key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use sluice_common::{
        conntrack::{CT_F_RST, CT_F_RX_CLOSING, CT_F_SYN, CT_F_TX_CLOSING},
        Backend,
    };

    use super::*;

    const S: u64 = 1_000_000_000;

    fn backend(svc_id: u32) -> Backend {
        Backend {
            svc_id,
            ..Backend::default()
        }
    }

    /// A flow client:40000 -> 10.96.0.1:80 on backend 10.1.1.2:8080.
    fn flow(proto: u8, backend_id: u32, flags: u8, last_seen_ns: u64) -> [(Ct4Key, CtEntry); 2] {
        let fwd_key = Ct4Key::new([10, 0, 0, 1], [10, 96, 0, 1], 40000, 80, proto);
        let rev_key = Ct4Key::new([10, 1, 1, 2], [10, 0, 0, 1], 8080, 40000, proto);
        let mut fwd = CtEntry {
            last_seen_ns,
            backend_id,
            svc_id: 1,
            nat_port: 8080,
            kind: CtKind::Forward as u8,
            flags,
            ..CtEntry::default()
        };
        fwd.nat_addr[..4].copy_from_slice(&[10, 1, 1, 2]);
        let mut rev = CtEntry {
            kind: CtKind::Reply as u8,
            nat_port: 80,
            peer_port: 40000,
            flags: 0,
            ..fwd
        };
        rev.nat_addr = [0; 16];
        rev.nat_addr[..4].copy_from_slice(&[10, 96, 0, 1]);
        rev.peer_addr[..4].copy_from_slice(&[10, 0, 0, 1]);
        [(fwd_key, fwd), (rev_key, rev)]
    }

    #[test]
    fn live_flow_is_counted_and_kept() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let scan = scan(
            &flow(IPPROTO_TCP, 5, CT_F_SEEN_REPLY, 100 * S),
            &backends,
            101 * S,
        );
        assert_eq!(scan.flows.get(&BackendId(5)), Some(&1));
        assert!(scan.stale.is_empty());
    }

    #[test]
    fn closing_flow_is_not_live_and_expires_after_close_timeout() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let closed = CT_F_SEEN_REPLY | CT_F_TX_CLOSING | CT_F_RX_CLOSING;
        let s = scan(&flow(IPPROTO_TCP, 5, closed, 100 * S), &backends, 101 * S);
        assert!(s.flows.is_empty());
        assert!(s.stale.is_empty());
        let s = scan(&flow(IPPROTO_TCP, 5, CT_F_RST, 100 * S), &backends, 111 * S);
        assert_eq!(s.stale.len(), 2, "forward and its reply entry both go");
    }

    #[test]
    fn half_closed_flow_is_still_live() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let s = scan(
            &flow(IPPROTO_TCP, 5, CT_F_SEEN_REPLY | CT_F_TX_CLOSING, 100 * S),
            &backends,
            101 * S,
        );
        assert_eq!(s.flows.get(&BackendId(5)), Some(&1));
    }

    #[test]
    fn entries_of_removed_or_reassigned_backends_are_stale() {
        let s = scan(
            &flow(IPPROTO_TCP, 5, CT_F_SEEN_REPLY, 100 * S),
            &HashMap::new(),
            101 * S,
        );
        assert_eq!(s.stale.len(), 2);
        let s = scan(
            &flow(IPPROTO_TCP, 5, CT_F_SEEN_REPLY, 100 * S),
            &HashMap::from([(BackendId(5), backend(2))]),
            101 * S,
        );
        assert_eq!(s.stale.len(), 2);
    }

    #[test]
    fn udp_expires_after_its_timeout() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let s = scan(
            &flow(17, 5, 0, 100 * S),
            &backends,
            (100 + timeouts::UDP_S) * S,
        );
        assert!(s.stale.is_empty());
        let s = scan(
            &flow(17, 5, 0, 100 * S),
            &backends,
            (101 + timeouts::UDP_S) * S,
        );
        assert_eq!(s.stale.len(), 2);
    }

    #[test]
    fn sctp_follows_its_association() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let at = |flags: u8, idle_s: u64| {
            scan(
                &flow(IPPROTO_SCTP, 5, flags, 100 * S),
                &backends,
                (100 + idle_s) * S,
            )
        };
        // Established (the backend answered): live until its timeout.
        let s = at(CT_F_SEEN_REPLY, timeouts::SCTP_ESTABLISHED_S);
        assert_eq!((s.flows.get(&BackendId(5)), s.stale.len()), (Some(&1), 0));
        assert_eq!(
            at(CT_F_SEEN_REPLY, timeouts::SCTP_ESTABLISHED_S + 1)
                .stale
                .len(),
            2
        );
        // An INIT nobody answered: the SYN timeout.
        assert_eq!(at(CT_F_SYN, timeouts::TCP_SYN_S + 1).stale.len(), 2);
        // ABORT or SHUTDOWN COMPLETE (CT_F_RST): no longer live, gone soon.
        let s = at(CT_F_SEEN_REPLY | CT_F_RST, 1);
        assert!(s.flows.is_empty() && s.stale.is_empty());
        assert_eq!(
            at(CT_F_SEEN_REPLY | CT_F_RST, timeouts::TCP_CLOSING_S + 1)
                .stale
                .len(),
            2
        );
    }

    /// The IPv6 twin of `flow`: client [fd00:10::2]:40000 -> [fd00:96::1]:80.
    fn flow6(backend_id: u32, flags: u8, last_seen_ns: u64) -> [(Ct6Key, CtEntry); 2] {
        let ip = |s: &str| -> [u8; 16] {
            s.parse::<std::net::Ipv6Addr>()
                .map(|a| a.octets())
                .unwrap_or_default()
        };
        let (client, vip, backend) = (ip("fd00:10::2"), ip("fd00:96::1"), ip("fd00:20::2"));
        let fwd = CtEntry {
            last_seen_ns,
            backend_id,
            svc_id: 1,
            kind: CtKind::Forward as u8,
            flags,
            ..CtEntry::default()
        };
        let rev = CtEntry {
            kind: CtKind::Reply as u8,
            nat_addr: vip,
            nat_port: 80,
            peer_addr: client,
            peer_port: 40000,
            flags: 0,
            ..fwd
        };
        [
            (Ct6Key::new(client, vip, 40000, 80, IPPROTO_TCP), fwd),
            (Ct6Key::new(backend, client, 8080, 40000, IPPROTO_TCP), rev),
        ]
    }

    #[test]
    fn ipv6_flows_follow_the_same_rules() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let s = scan(&flow6(5, CT_F_SEEN_REPLY, 100 * S), &backends, 101 * S);
        assert_eq!(s.flows.get(&BackendId(5)), Some(&1));
        assert!(
            s.stale.is_empty(),
            "the reply entry finds its forward entry"
        );
        let s = scan(
            &flow6(5, CT_F_SEEN_REPLY, 100 * S),
            &HashMap::new(),
            101 * S,
        );
        assert_eq!(s.stale.len(), 2, "a removed backend's entries go");
        let [_, reply] = flow6(5, 0, 100 * S);
        let later = 100 * S + ORPHAN_GRACE.as_nanos() as u64 + 1;
        assert_eq!(scan(&[reply], &backends, later).stale, vec![reply.0]);
    }

    #[test]
    fn orphan_reply_entry_is_stale_after_a_grace_period() {
        let backends = HashMap::from([(BackendId(5), backend(1))]);
        let [_, reply] = flow(IPPROTO_TCP, 5, 0, 100 * S);
        // Just inserted, its forward entry may not be visible yet.
        assert!(scan(&[reply], &backends, 101 * S).stale.is_empty());
        let later = 100 * S + ORPHAN_GRACE.as_nanos() as u64 + 1;
        assert_eq!(scan(&[reply], &backends, later).stale, vec![reply.0]);
    }

    fn sock(proto: u8, counted: bool) -> SockEntry {
        let mut e = SockEntry {
            proto,
            ..SockEntry::default()
        };
        if counted {
            e.set_counted();
        }
        e
    }

    /// A socket counts as a flow of its backend only while the backend id
    /// still names the address and port it was sent to (as the socket sees
    /// it: an `AF_INET` socket's address in the first 4 bytes, an
    /// `AF_INET6` one's v4-mapped): an id given to another endpoint of the
    /// service inherits no socket.
    #[test]
    fn a_socket_counts_for_its_backend_only_at_the_address_it_was_sent_to() {
        use sluice_common::{FAMILY_V4, FAMILY_V6, IPPROTO_TCP};
        let v4 = Backend {
            addr: [10, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            port: 8080,
            family: FAMILY_V4,
            svc_id: 1,
            ..Backend::default()
        };
        let v6 = Backend {
            addr: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2],
            port: 8080,
            family: FAMILY_V6,
            svc_id: 1,
            ..Backend::default()
        };
        let backends = HashMap::from([(BackendId(3), v4), (BackendId(4), v6)]);
        let entry = |id: u32, backend: [u8; 16], port: u16| {
            let mut e = sock(IPPROTO_TCP, true);
            (e.backend_id, e.svc_id, e.backend, e.backend_port) = (id, 1, backend, port);
            e
        };
        let mut mapped = [0u8; 16];
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&[10, 1, 1, 2]);
        let mut other = v4.addr;
        other[3] = 9;
        let sockets = [
            (1, entry(3, v4.addr, 8080)),
            (2, entry(3, mapped, 8080)),
            (3, entry(4, v6.addr, 8080)),
            // The id now names another endpoint, or another port.
            (4, entry(3, other, 8080)),
            (5, entry(3, v4.addr, 9090)),
            (6, entry(4, mapped, 8080)),
        ];
        let scan = scan_sockets(&sockets, &[], &backends);
        assert_eq!(
            scan.flows,
            HashMap::from([(BackendId(3), 2), (BackendId(4), 1)])
        );
        let orphaned: Vec<u64> = scan.orphans.iter().map(|(c, _)| *c).collect();
        assert_eq!(orphaned, vec![4, 5, 6]);
    }

    #[test]
    fn a_counted_socket_of_a_gone_backend_is_orphaned_not_deleted() {
        use sluice_common::{IPPROTO_TCP, IPPROTO_UDP};
        let mut backends = HashMap::new();
        backends.insert(BackendId(3), backend(1));
        let mut live = sock(IPPROTO_TCP, true);
        (live.backend_id, live.svc_id) = (3, 1);
        let mut counted = sock(IPPROTO_TCP, true);
        (counted.backend_id, counted.svc_id) = (9, 1);
        let mut uncounted = sock(IPPROTO_TCP, false);
        (uncounted.backend_id, uncounted.svc_id) = (9, 1);
        let mut udp = sock(IPPROTO_UDP, false);
        (udp.backend_id, udp.svc_id) = (9, 1);
        let mut orphaned = counted;
        (orphaned.backend_id, orphaned.svc_id) = (0, 0);
        let sockets = [
            (1, live),
            (2, counted),
            (3, uncounted),
            (4, udp),
            (5, orphaned),
        ];
        let scan = scan_sockets(&sockets, &[], &backends);
        assert_eq!(scan.flows, HashMap::from([(BackendId(3), 1)]));
        // The counted one keeps its entry (its close takes its count
        // back), under no backend; one already orphaned is left as it is.
        assert_eq!(scan.orphans, vec![(2, orphaned)]);
        assert_eq!(scan.stale_sockets, vec![3, 4]);
    }

    #[test]
    fn socket_marks_fall_short_only_of_counted_entries_they_miss() {
        use sluice_common::{socket::mark_slot, IPPROTO_TCP, IPPROTO_UDP};
        let slots = sluice_common::maps::SOCK_MARK_SLOTS as usize;
        let mut marks = vec![0u64; slots];
        let complete = |s: &[(u64, SockEntry)], m: &[u64]| marks_shortfall(s, m) == Some(vec![]);
        // Nothing to count: trusted.
        assert!(complete(&[], &marks));
        // Two counted TCP sockets whose cookies share a slot, one UDP
        // socket (never counted).
        let (a, b) = (7u64, 7 + u64::from(sluice_common::maps::SOCK_MARK_SLOTS));
        assert_eq!(mark_slot(a), mark_slot(b));
        let sockets = vec![
            (a, sock(IPPROTO_TCP, true)),
            (b, sock(IPPROTO_TCP, true)),
            (99, sock(IPPROTO_UDP, false)),
        ];
        // A count lower than the slot's entries (a socket connected
        // between the reads, or a copy that lost an update): that slot,
        // with its cookies, to look at again.
        marks[mark_slot(a) as usize] = 1;
        assert_eq!(
            marks_shortfall(&sockets, &marks),
            Some(vec![(mark_slot(a), vec![a, b])])
        );
        marks[mark_slot(a) as usize] = 2;
        assert!(complete(&sockets, &marks));
        // Higher is harmless (an entry the LRU evicted).
        marks[mark_slot(a) as usize] = 5;
        assert!(complete(&sockets, &marks));
        // An uncounted TCP entry (0.1.0 wrote it): not trusted, whatever
        // the counts say.
        let mut legacy = sockets.clone();
        legacy.push((12, sock(IPPROTO_TCP, false)));
        marks[mark_slot(12) as usize] = 1;
        assert_eq!(marks_shortfall(&legacy, &marks), None);
        // Counts shorter than the slots (a map that could not be read
        // whole): every slot past them falls short.
        assert_eq!(
            marks_shortfall(&sockets, &[]),
            Some(vec![(mark_slot(a), vec![a, b])])
        );
    }
}

/// The node's own sockets (socket-level balancing): live flows per backend
/// and entries to delete.
#[derive(Debug, Default)]
pub struct SockScan {
    pub flows: HashMap<BackendId, u32>,
    /// Sockets whose backend is gone (they cannot reach it any more).
    pub stale_sockets: Vec<u64>,
    /// Counted TCP sockets (`sl_sockmark`) whose backend is gone, as their
    /// entries are to be rewritten (in `sl_sock`; an `sl_socktab` entry is
    /// left as it is, and its close gives its slot and count back): backend and service 0, so that no
    /// backend counts them, while the socket's close still finds the entry
    /// and takes its count back (deleting it here would leave the count
    /// too high for good, and its slot would never skip a lookup again).
    pub orphans: Vec<(u64, SockEntry)>,
    /// Reverse entries of sockets that were released, or whose backend is
    /// gone.
    pub stale_revs: Vec<SockRevKey>,
}

/// The socket map's entries and the reverse map's keys.
pub type SocketEntries = (Vec<(u64, SockEntry)>, Vec<SockRevKey>);

/// Every socket entry, one per cookie (`sl_socktab`'s; then `sl_sock`'s
/// of the sockets that hold no slot), and every reverse entry. A walk of
/// a hash map starts again from its first key when the key it stood on
/// was deleted meanwhile (a socket closed): the repeats are dropped.
pub fn read_sockets(maps: &Maps) -> Result<SocketEntries, DatapathError> {
    let mut sockets = maps.sock_table.entries();
    let mut seen: std::collections::HashSet<u64> = sockets.iter().map(|(c, _)| *c).collect();
    for item in maps.sockets.iter() {
        match item {
            Ok((cookie, e)) => {
                // A socket that went to `sl_sock` (its slot taken) and took
                // its slot on a later connect: the slot's entry is newer.
                if seen.insert(cookie) {
                    sockets.push((cookie, e));
                }
            }
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(source) => {
                return Err(DatapathError::Map {
                    name: names::SOCKETS,
                    source,
                })
            }
        }
    }
    let mut revs = Vec::new();
    for key in maps.sock_rev.keys() {
        match key {
            Ok(k) => revs.push(k),
            Err(aya::maps::MapError::KeyNotFound) => continue,
            Err(source) => {
                return Err(DatapathError::Map {
                    name: names::SOCK_REV,
                    source,
                })
            }
        }
    }
    revs.sort_unstable();
    revs.dedup();
    Ok((sockets, revs))
}

/// Judges the node's own sockets against the programmed backends.
pub fn scan_sockets(
    sockets: &[(u64, SockEntry)],
    revs: &[SockRevKey],
    backends: &impl BackendLookup,
) -> SockScan {
    let mut out = SockScan::default();
    let mut live = std::collections::HashSet::new();
    for (cookie, e) in sockets {
        if backends
            .backend(BackendId(e.backend_id))
            .is_some_and(|b| b.svc_id == e.svc_id && sent_to(e, &b))
        {
            *out.flows.entry(BackendId(e.backend_id)).or_default() += 1;
            live.insert(*cookie);
        } else if e.proto == sluice_common::IPPROTO_TCP && e.counted() {
            if e.backend_id != 0 || e.svc_id != 0 {
                let mut orphan = *e;
                orphan.backend_id = 0;
                orphan.svc_id = 0;
                out.orphans.push((*cookie, orphan));
            }
        } else {
            out.stale_sockets.push(*cookie);
        }
    }
    out.stale_revs = revs
        .iter()
        .filter(|k| !live.contains(&k.cookie))
        .copied()
        .collect();
    out
}

/// Whether the socket of `e` was sent to `b`'s address and port: a
/// backend id given again to another endpoint of the same service does
/// not inherit the sockets of the one it replaced (an `sl_socktab` entry
/// cannot be orphaned while its socket lives, see `SockScan::orphans`).
fn sent_to(e: &SockEntry, b: &sluice_common::Backend) -> bool {
    if e.backend_port != b.port {
        return false;
    }
    if b.family == sluice_common::FAMILY_V6 {
        return e.backend == b.addr;
    }
    let v4 = [b.addr[0], b.addr[1], b.addr[2], b.addr[3]];
    e.backend[..4] == v4 || std::net::Ipv6Addr::from(e.backend).to_ipv4_mapped() == Some(v4.into())
}

/// How far `sl_sockmark`'s counts (`marks`, by slot) fall short of the
/// counted TCP entries of `sl_sock` (`sockets`, read after `marks`):
/// `None` when some TCP entry is not counted (0.1.0's, or one whose
/// counted bit a copy into a new layout dropped), else the slots that
/// count fewer entries than they hold, each with its cookies. A slot may
/// fall short only because a socket connected between the two reads, or
/// because a copy of the counts lost an update; a count above its
/// entries is harmless (a socket released between the reads, an entry the
/// LRU evicted).
pub fn marks_shortfall(
    sockets: &[(u64, SockEntry)],
    marks: &[u64],
) -> Option<Vec<(u32, Vec<u64>)>> {
    let mut held: HashMap<u32, Vec<u64>> = HashMap::new();
    for (cookie, e) in sockets {
        if e.proto != sluice_common::IPPROTO_TCP {
            continue;
        }
        if !e.counted() {
            return None;
        }
        held.entry(sluice_common::socket::mark_slot(*cookie))
            .or_default()
            .push(*cookie);
    }
    let mut short: Vec<(u32, Vec<u64>)> = held
        .into_iter()
        .filter(|(slot, cookies)| {
            marks
                .get(*slot as usize)
                .is_none_or(|m| *m < cookies.len() as u64)
        })
        .collect();
    short.sort_unstable();
    Some(short)
}

/// Live flows per backend: both conntrack maps' and the node's own
/// sockets'.
pub fn live_flows(
    maps: &Maps,
    backends: &impl BackendLookup,
) -> Result<HashMap<BackendId, u32>, DatapathError> {
    let now = monotonic_ns();
    let mut flows = scan(&read_all(maps)?, backends, now).flows;
    add_flows(&mut flows, scan(&read_all6(maps)?, backends, now).flows);
    let (sockets, revs) = read_sockets(maps)?;
    add_flows(&mut flows, scan_sockets(&sockets, &revs, backends).flows);
    Ok(flows)
}

/// Adds per-backend flow counts into `into`.
pub fn add_flows(into: &mut HashMap<BackendId, u32>, more: HashMap<BackendId, u32>) {
    for (id, n) in more {
        *into.entry(id).or_default() += n;
    }
}
