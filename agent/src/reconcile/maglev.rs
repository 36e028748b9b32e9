//! Maglev table population (Eisenbud et al., "Maglev: A Fast and Reliable
//! Software Network Load Balancer", NSDI 2016, section 3.4), as a pure
//! function of the backends' identities.
//!
//! Each backend gets a permutation of the table's slots from two hashes
//! of its address and port (`offset`, and an odd `skip`: the table size is
//! a power of two, see `MAGLEV_M`); backends take turns
//! claiming their next free preferred slot until the table is full. So
//! every backend owns about `M / N` entries, a backend that comes or goes
//! moves about `1 / N` of them, and every node, whatever ids it gave the
//! backends, builds the same table.

use std::net::IpAddr;

use sluice_common::maglev::MAGLEV_M;

use crate::model::Endpoint;

/// 64-bit FNV-1a over the endpoint's address and port, from `basis`:
/// stable across nodes, agent versions and platforms (unlike std's
/// hasher), which is what makes tables agree.
fn fnv(endpoint: &Endpoint, basis: u64) -> u64 {
    let mut h = basis;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    match endpoint.addr {
        IpAddr::V4(a) => eat(&a.octets()),
        IpAddr::V6(a) => eat(&a.octets()),
    }
    eat(&endpoint.port.to_be_bytes());
    h
}

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// A second, independent basis for `skip`.
const SKIP_BASIS: u64 = 0x8422_2325_cbf2_9ce4;

/// The table for `backends` (id, endpoint), `MAGLEV_M` backend ids; empty
/// without backends. The result depends on the set of endpoints only, not
/// on the order given or on the ids' values.
pub fn populate<Id: Copy + Default>(backends: &[(Id, Endpoint)]) -> Vec<Id> {
    let mut members: Vec<&(Id, Endpoint)> = backends.iter().collect();
    members.sort_by_key(|(_, ep)| *ep);
    members.dedup_by_key(|(_, ep)| *ep);
    if members.is_empty() {
        return Vec::new();
    }
    let m = MAGLEV_M as u64;
    let perms: Vec<(u64, u64)> = members
        .iter()
        // `skip` odd, so coprime with the power-of-two `MAGLEV_M`: each
        // backend's preference list visits every slot.
        .map(|(_, ep)| {
            (
                fnv(ep, OFFSET_BASIS) % m,
                (fnv(ep, SKIP_BASIS) % (m / 2)) * 2 + 1,
            )
        })
        .collect();
    let mut next = vec![0u64; members.len()];
    let mut table: Vec<Option<Id>> = vec![None; MAGLEV_M];
    let mut filled = 0;
    'fill: loop {
        for (i, (id, _)) in members.iter().enumerate() {
            let (offset, skip) = perms[i];
            loop {
                let c = ((offset + next[i] * skip) % m) as usize;
                next[i] += 1;
                if table[c].is_none() {
                    table[c] = Some(*id);
                    filled += 1;
                    break;
                }
            }
            if filled == MAGLEV_M {
                break 'fill;
            }
        }
    }
    table.into_iter().map(Option::unwrap_or_default).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn ep(i: u32) -> Endpoint {
        Endpoint {
            addr: IpAddr::from([10, 20, (i / 250) as u8, (i % 250) as u8 + 2]),
            port: 8080,
        }
    }

    fn backends(range: impl Iterator<Item = u32>) -> Vec<(u32, Endpoint)> {
        range.map(|i| (i + 1, ep(i))).collect()
    }

    /// Entries, by endpoint, that differ between two tables.
    fn moved(a: &[u32], a_set: &[(u32, Endpoint)], b: &[u32], b_set: &[(u32, Endpoint)]) -> usize {
        let ea: HashMap<u32, Endpoint> = a_set.iter().copied().collect();
        let eb: HashMap<u32, Endpoint> = b_set.iter().copied().collect();
        a.iter()
            .zip(b)
            .filter(|(x, y)| ea.get(x) != eb.get(y))
            .count()
    }

    #[test]
    fn every_entry_is_filled_and_shares_are_even() {
        for n in [1u32, 2, 3, 10, 100] {
            let set = backends(0..n);
            let table = populate(&set);
            assert_eq!(table.len(), MAGLEV_M);
            let mut share: HashMap<u32, usize> = HashMap::new();
            for id in &table {
                *share.entry(*id).or_default() += 1;
            }
            assert_eq!(share.len(), n as usize, "every backend owns entries");
            let ideal = MAGLEV_M as f64 / f64::from(n);
            for (id, count) in share {
                let off = (count as f64 - ideal).abs() / ideal;
                assert!(
                    off < 0.02,
                    "n={n}: backend {id} owns {count}, ideal {ideal:.0}"
                );
            }
        }
        assert!(populate::<u32>(&[]).is_empty());
    }

    #[test]
    fn removing_one_backend_moves_little_more_than_its_own_entries() {
        for n in [3u32, 5, 10, 50] {
            let before = backends(0..n);
            let after: Vec<_> = before.iter().copied().filter(|(id, _)| *id != 2).collect();
            let (a, b) = (populate(&before), populate(&after));
            let own = a.iter().filter(|id| **id == 2).count();
            let others_moved = moved(&a, &before, &b, &after) - own;
            // Maglev's bound: a few percent of the table beyond the removed
            // backend's share (the paper measures ~1-2% at M >> N).
            assert!(
                (others_moved as f64) < 0.03 * MAGLEV_M as f64,
                "n={n}: {others_moved} entries of surviving backends moved"
            );
        }
    }

    #[test]
    fn adding_one_backend_moves_about_its_share() {
        for n in [3u32, 10, 50] {
            let before = backends(0..n);
            let after = backends(0..n + 1);
            let changed = moved(&populate(&before), &before, &populate(&after), &after);
            let share = MAGLEV_M as f64 / f64::from(n + 1);
            assert!(
                (changed as f64) < share * 1.2 + 0.03 * MAGLEV_M as f64,
                "n={n}: {changed} entries moved, a new backend's share is {share:.0}"
            );
        }
    }

    #[test]
    fn the_table_depends_on_endpoints_not_on_order_or_ids() {
        let set = backends(0..7);
        let mut reversed = set.clone();
        reversed.reverse();
        assert_eq!(populate(&set), populate(&reversed));
        // Another node numbers the same backends differently: its table
        // names the same endpoints at every index.
        let renumbered: Vec<_> = set.iter().map(|(id, ep)| (id + 100, *ep)).collect();
        assert_eq!(
            moved(&populate(&set), &set, &populate(&renumbered), &renumbered),
            0
        );
    }
}
