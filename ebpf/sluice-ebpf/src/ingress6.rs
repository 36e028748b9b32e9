//! IPv6 packets arriving at the node: the IPv6 twin of `ingress.rs`, with
//! the same conntrack rules (`select.rs`) and the same maps' semantics
//! (`sl_svc6`, `sl_ct6`, the shared `sl_backends`).
//!
//! It runs as `sl_ingress6`, entered by tail call, with a stack of its
//! own. The flow and the map keys still live in the per-CPU `Scratch6`
//! (40-byte keys would crowd the stack), and the work is split into BPF
//! functions (`handle` -> `new_flow` -> `record`/`snat6`/`nat6`/`reject6`).
//!
//! The same features as IPv4: SNAT to the node (externalTrafficPolicy
//! Cluster on external frontends, hairpin), loadBalancerSourceRanges
//! (`sl_srcrng6`) and session affinity (`sl_aff6`).
//!
//! Map calls take keys and values by reference on purpose (clippy would
//! pass them by value): a copy would put them back on the stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{__sk_buff, BPF_ANY},
    programs::TcContext,
};
use sluice_common::{
    config::CFG_F_HOST_ROUTING,
    conntrack::{CT_F_SNAT, CT_REFRESH_NS},
    hash::flow_hash_v6,
    maps::SVCNET_CLUSTER_IP,
    service::{
        SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_AFFINITY, SVC_F_INTERNAL, SVC_F_MASQ_OUTSIDE,
        SVC_F_SNAT, SVC_F_SOURCE_RANGES,
    },
    Backend, CtKind, Stat, SvcValue, FAMILY_V6, IPPROTO_TCP,
};

use crate::events;
use crate::{
    conntrack::tcp_bits_of,
    error::{settle, Error, Verdict},
    flow6::{same_addr, Flow6, Parsed6},
    frag, icmp6,
    maps::{self, count, Scratch6, CONNTRACK_V6},
    nat::Side,
    nat6, reject6, route,
    select::{
        candidates, judge, orphan_snat_segment, pick6, remember6, Pick, Tracked, PICK_AFFINITY,
    },
    snat::Recorded,
    snat6,
};

/// A separate BPF function (returning a `Verdict`, see `error::settle`).
#[inline(never)]
pub fn handle(skb: *mut __sk_buff) -> Verdict {
    let Some(s) = maps::scratch6() else {
        return Verdict::Next;
    };
    settle(try_handle(skb, s))
}

#[inline(always)]
fn try_handle(skb: *mut __sk_buff, s: &mut Scratch6) -> Result<Verdict, Error> {
    let ctx = &TcContext::new(skb);
    match s.flow.parse(ctx)? {
        Parsed6::Flow => {}
        Parsed6::ExtHeader => {
            count(Stat::Ipv6ExtHeader);
            events::ingress6(Stat::Ipv6ExtHeader, skb, &s.flow, 0, 0);
            return Ok(Verdict::Next);
        }
        // An ICMPv6 error may be about an SNATed flow.
        Parsed6::Icmp => {
            return Ok(match icmp6::ingress(skb, s) {
                Verdict::Next => icmp6::cluster_ips_check(skb, s),
                done => done,
            })
        }
        Parsed6::Other => return Ok(icmp6::cluster_ips_check(skb, s)),
    }
    // A fragment: record a first one's ports, or take a later one's.
    if !frag::track6(s) {
        count(Stat::FragmentUnknown);
        events::ingress6(Stat::FragmentUnknown, skb, &s.flow, 0, 0);
        return Ok(Verdict::Next);
    }
    let config = maps::config();
    let snat_port = s.flow.dport >= config.snat_port_min
        && s.flow.dport <= config.snat_port_max
        && config.snat_port_min != 0;
    if snat_port {
        s.flow.ct_key_into(&mut s.ct_key);
        if let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) {
            // SAFETY: pointer from a successful lookup; copied at once.
            let (kind, flags) = unsafe { ((*entry).kind, (*entry).flags) };
            if kind == CtKind::Reply as u8 && flags & CT_F_SNAT != 0 {
                return snat6::reply(skb, s, entry);
            }
        }
    }
    // No frontend has this address: what a miss in `sl_svc6` would
    // answer, without the hash lookup.
    if !maps::may_be_frontend_v6(&s.flow.dst) {
        // A backend's reply to a pod, with host routing (`route.rs`).
        if config.flags() & CFG_F_HOST_ROUTING != 0 {
            match route::reply6(skb, s, config.flags()) {
                Verdict::Next => {}
                done => return Ok(done),
            }
        }
        return Ok(unserved(skb, s, snat_port));
    }
    s.flow.svc_key_into(&mut s.svc_key, 0, SCOPE_EXTERNAL);
    let Some(master) = maps::service6(&s.svc_key) else {
        // Maybe the reply of an SNATed flow that only the previous
        // generation knows, during an upgrade's handover.
        return Ok(unserved(skb, s, snat_port));
    };
    let now = crate::clock::now();

    let mut reselected = false;
    s.flow.ct_key_into(&mut s.ct_key);
    if let Some(entry) = CONNTRACK_V6.get_ptr_mut(&s.ct_key) {
        // SAFETY: pointer from a successful lookup; fields copied at once.
        let (kind, ct_flags, backend_id, svc_id, last_seen) = unsafe {
            (
                (*entry).kind,
                (*entry).flags,
                (*entry).backend_id,
                (*entry).svc_id,
                (*entry).last_seen_ns,
            )
        };
        if kind == CtKind::Forward as u8 {
            let flow = &s.flow;
            match judge(flow, master, backend_id, svc_id, ct_flags) {
                Tracked::Follow(backend) => {
                    let flags = ct_flags | tcp_bits_of(flow.proto, flow.tcp_flags);
                    if flags != ct_flags || now.saturating_sub(last_seen) > CT_REFRESH_NS {
                        // SAFETY: the entry stays valid for this program
                        // run; a racing writer only loses a refresh.
                        unsafe {
                            (*entry).flags = flags;
                            (*entry).last_seen_ns = now;
                        }
                    }
                    count(Stat::Established);
                    if flow.later() {
                        count(Stat::FragmentTracked);
                    }
                    if ct_flags & CT_F_SNAT != 0 {
                        return snat6::forward(skb, s, backend_id, entry);
                    }
                    nat6::rewrite(skb, flow, Side::Dst, &backend.addr, backend.port)?;
                    return Ok(route::to_pod6(
                        skb,
                        route::ports(flow.proto, flow.sport, backend.port),
                        &flow.src,
                        &backend.addr,
                        now,
                    ));
                }
                Tracked::Reset if !flow.later() => {
                    count(Stat::StaleReset);
                    events::ingress6(Stat::StaleReset, skb, flow, svc_id, backend_id);
                    return Ok(reject6::tcp_reset(skb, flow));
                }
                Tracked::Reset | Tracked::Reselect => reselected = true,
            }
        }
    }
    if s.flow.later() {
        // A later fragment cannot start a flow (as on the IPv4 path).
        count(Stat::FragmentDropped);
        events::ingress6(Stat::FragmentDropped, skb, &s.flow, master.svc_id, 0);
        return Ok(Verdict::Drop);
    }
    if !reselected && orphan_snat_segment(s.flow.proto, s.flow.tcp_flags, master) {
        count(Stat::SnatFailed);
        events::ingress6(Stat::SnatFailed, skb, &s.flow, master.svc_id, 0);
        return Ok(Verdict::Drop);
    }
    Ok(new_flow(skb, s, master, reselected))
}

/// A packet no frontend takes: `ingress::unserved` for IPv6 (a cluster
/// IP's unserved port is rejected, an unallocated address of the service
/// CIDRs dropped, new flows only; `sl_svcnet6`). Outside the service
/// address space, one to an SNAT port goes to the previous generation
/// during an upgrade's handover (`ingress::outside`).
#[inline(never)]
fn unserved(skb: *mut __sk_buff, s: &mut Scratch6, snat_port: bool) -> Verdict {
    let kind = maps::svcnet_v6(&mut s.local_key, &s.flow.dst);
    if kind == 0 {
        return crate::ingress::outside(snat_port);
    }
    s.flow.ct_key_into(&mut s.ct_key);
    if CONNTRACK_V6.get_ptr(&s.ct_key).is_some() {
        return Verdict::Next;
    }
    if s.flow.later() {
        // Its first fragment was answered (or dropped) already.
        count(Stat::FragmentDropped);
        events::ingress6(Stat::FragmentDropped, skb, &s.flow, 0, 0);
        return Verdict::Drop;
    }
    if kind == SVCNET_CLUSTER_IP {
        count(Stat::UnservedPort);
        events::ingress6(Stat::UnservedPort, skb, &s.flow, 0, 0);
        return if s.flow.proto == IPPROTO_TCP {
            reject6::tcp_reset(skb, &s.flow)
        } else {
            reject6::port_unreachable(skb, &s.flow)
        };
    }
    count(Stat::UnallocatedIp);
    events::ingress6(Stat::UnallocatedIp, skb, &s.flow, 0, 0);
    Verdict::Drop
}

/// Picks a backend for a new flow, records it and DNATs the packet.
#[inline(never)]
fn new_flow(skb: *mut __sk_buff, s: &mut Scratch6, master: &SvcValue, reselected: bool) -> Verdict {
    settle(try_new_flow(skb, s, master, reselected))
}

#[inline(always)]
fn try_new_flow(
    skb: *mut __sk_buff,
    s: &mut Scratch6,
    master: &SvcValue,
    reselected: bool,
) -> Result<Verdict, Error> {
    // Local-traffic detection, as on the IPv4 path.
    let inside = master.flags & (SVC_F_INTERNAL | SVC_F_MASQ_OUTSIDE) != 0
        // SAFETY: reading the context's ingress device.
        && maps::inside_v6(&mut s.local_key, &s.flow.src, unsafe {
            (*skb).ingress_ifindex
        });
    let mut master = master;
    let mut scope = SCOPE_EXTERNAL;
    if inside && master.flags & SVC_F_INTERNAL != 0 {
        s.flow.svc_key_into(&mut s.svc_key, 0, SCOPE_INTERNAL);
        if let Some(internal) = maps::service6(&s.svc_key) {
            master = internal;
            scope = SCOPE_INTERNAL;
        }
    }
    if master.flags & SVC_F_SOURCE_RANGES != 0
        && !maps::source_allowed6(&mut s.range_key, master.svc_id, &s.flow.src)
    {
        count(Stat::SourceDenied);
        events::ingress6(Stat::SourceDenied, skb, &s.flow, master.svc_id, 0);
        return Ok(Verdict::Drop);
    }
    match candidates(master) {
        Pick::Slots(..) => {}
        Pick::Drop => {
            count(Stat::NoBackendDrop);
            events::ingress6(Stat::NoBackendDrop, skb, &s.flow, master.svc_id, 0);
            return Ok(Verdict::Drop);
        }
        Pick::Reject => {
            count(Stat::NoBackend);
            events::ingress6(Stat::NoBackend, skb, &s.flow, master.svc_id, 0);
            return Ok(if s.flow.proto == IPPROTO_TCP {
                reject6::tcp_reset(skb, &s.flow)
            } else {
                reject6::port_unreachable(skb, &s.flow)
            });
        }
    }
    let h = hash(&s.flow);
    let picked = pick6(s, master, scope, h);
    let backend_id = picked as u32;
    if picked & PICK_AFFINITY != 0 {
        count(Stat::AffinityHit);
    }
    let backend = maps::backend(backend_id).ok_or(Error::Dangling)?;
    if backend.family != FAMILY_V6 {
        return Err(Error::Dangling);
    }
    if master.flags & SVC_F_AFFINITY != 0 {
        remember6(s, master.svc_id, backend_id);
    }
    count(if reselected {
        Stat::Reselected
    } else {
        Stat::NewFlow
    });
    events::new_flow6(reselected, skb, &s.flow, master.svc_id, backend_id);
    // SNAT when the frontend asks for it, or when the client is the
    // backend itself (hairpin: it would answer itself directly, from the
    // wrong address).
    let masquerade = master.flags & SVC_F_MASQ_OUTSIDE != 0 && !inside;
    if master.flags & SVC_F_SNAT != 0 || masquerade || same_addr(&backend.addr, &s.flow.src) {
        return Ok(snat6::new_flow(skb, s, master.svc_id, backend_id, h));
    }
    // A pod's flow on the TC path (see `ingress.rs`).
    // SAFETY: reading the context's ingress device.
    let ifindex = unsafe { (*skb).ingress_ifindex };
    let pod = maps::new_flow_from_v6(&mut s.local_key, &s.flow.src, ifindex);
    let mut options = if pod { crate::snat::RECORD_POD } else { 0 };
    if reselected {
        options |= crate::snat::RECORD_REUSE;
    }
    if record(s, backend, master.svc_id, backend_id, options).taken()? {
        // Another entry holds this one's tuple after DNAT: a live flow of
        // another frontend keeps it and this one is masqueraded instead
        // (see `ingress.rs`); anything else is replaced.
        if crate::conntrack::clashes6(&s.flow, &backend.addr, backend.port, &mut s.ct_key) {
            count(Stat::TupleClash);
            events::ingress6(Stat::TupleClash, skb, &s.flow, master.svc_id, backend_id);
            return Ok(snat6::new_flow(skb, s, master.svc_id, backend_id, h));
        }
        record(
            s,
            backend,
            master.svc_id,
            backend_id,
            (options & !crate::snat::RECORD_REUSE) | crate::snat::RECORD_REPLACE,
        )
        .taken()?;
    }
    if pod {
        maps::pod_flow_recorded();
    }
    nat6::rewrite(skb, &s.flow, Side::Dst, &backend.addr, backend.port)?;
    Ok(route::to_pod6(
        skb,
        route::ports(s.flow.proto, s.flow.sport, backend.port),
        &s.flow.src,
        &backend.addr,
        crate::clock::now(),
    ))
}

/// The flow hash with the node's seed. A separate BPF function: the hash
/// over eight address words needs many registers, and its spills would
/// otherwise sit in `new_flow`'s frame under every call it makes.
#[inline(never)]
pub(crate) fn hash(flow: &Flow6) -> u32 {
    let seed = maps::config().hash_seed;
    flow_hash_v6(
        &flow.src, &flow.dst, flow.sport, flow.dport, flow.proto, seed,
    )
}

/// Records a new flow: reply entry first (the backend cannot answer before
/// the rewritten packet leaves), then forward entry; `options` as for
/// IPv4 (`snat::record`): `Taken`, with nothing written, when another entry
/// holds the reply tuple and `RECORD_REPLACE` is not given. The entry is
/// built in the per-CPU scratch map and the keys in `Scratch6`; map
/// inserts take references so that nothing is copied onto the stack.
#[inline(never)]
fn record(
    s: &mut Scratch6,
    backend: &Backend,
    svc_id: u32,
    backend_id: u32,
    options: u8,
) -> Recorded {
    let Some(scratch) = maps::scratch() else {
        return Recorded::NoScratch;
    };
    let e = &mut scratch.ct;
    let flow = &s.flow;
    let mark = crate::snat::record_mark(options);
    e.last_seen_ns = crate::clock::now();
    e.backend_id = backend_id;
    e.svc_id = svc_id;
    e.nat_addr = flow.dst;
    e.peer_addr = flow.src;
    e.nat_port = flow.dport;
    e.peer_port = flow.sport;
    e.kind = CtKind::Reply as u8;
    e.flags = mark;
    e._pad = [0; 2];
    let key = &mut s.ct_key;
    flow.reply_ct_key_into(key, &backend.addr, backend.port);
    if options & crate::snat::RECORD_REUSE != 0 {
        // The finished flow's own entries, taken over in place (see
        // `snat::record`).
        if let Some(reply) = CONNTRACK_V6.get_ptr_mut(&*key) {
            flow.ct_key_into(key);
            if let Some(fwd) = CONNTRACK_V6.get_ptr_mut(&*key) {
                // SAFETY: pointers from successful lookups, to entries
                // used within `CT_REUSE_IDLE_NS` (see `snat::record`).
                unsafe {
                    let now = e.last_seen_ns;
                    if crate::conntrack::reusable(&*reply, &*fwd, &flow.dst, flow.dport, now) {
                        *reply = *e;
                        crate::snat::forward_fields(
                            e,
                            tcp_bits_of(flow.proto, flow.tcp_flags) | mark,
                        );
                        *fwd = *e;
                        count(Stat::CtReused);
                        return Recorded::Done;
                    }
                }
            }
            // The reply key again, for the inserts.
            flow.reply_ct_key_into(key, &backend.addr, backend.port);
        }
    }
    let Some(reply_ok) = crate::snat::reply_inserted(CONNTRACK_V6.insert(
        &*key,
        &*e,
        crate::snat::reply_insert_flag(options),
    )) else {
        return Recorded::Taken;
    };
    crate::snat::forward_fields(e, tcp_bits_of(flow.proto, flow.tcp_flags) | mark);
    flow.ct_key_into(key);
    if !reply_ok || CONNTRACK_V6.insert(&*key, &*e, BPF_ANY as u64).is_err() {
        count(Stat::CtInsertFailed);
    }
    Recorded::Done
}
