//! IPv4 packets arriving at the node: service frontends get DNAT (IPv6
//! frames go to `ingress6.rs`; `sl_ingress` picks by ethertype). The
//! tracked-flow rules and slot choice are shared with IPv6 (`select.rs`).
//!
//! 0. A non-first fragment takes the ports its first fragment recorded
//!    (`frag.rs`) and then follows its flow's conntrack entry (or is
//!    dropped: it cannot start a flow); only its addresses are rewritten.
//! 1. A packet to a port in the SNAT range may be the reply of an SNATed
//!    flow: turned back and redirected to its client (`snat::reply`).
//!    An ICMP error quoting a packet of an SNATed flow is turned back and
//!    redirected to the client the same way (`icmp::ingress`).
//! 2. Not IPv4 TCP/UDP: pass. Not a frontend (no master entry): a new
//!    flow to a cluster IP is rejected (unserved port or protocol), one
//!    to another address of the service CIDRs dropped (`sl_svcnet4`, as
//!    kube-proxy's `cluster-ips-check`); anything else passes.
//! 3. A forward conntrack entry exists: follow it to its backend (even a
//!    terminating one) unless the backend or the frontend's owner changed,
//!    or a SYN shows a new connection on a closed or non-active entry.
//! 4. Otherwise a new flow: source ranges, session affinity, then a slot by
//!    flow hash among the active backends, or the terminating-but-serving
//!    ones when none is active; none at all means reject (RST / ICMP port
//!    unreachable) or drop. A source inside the cluster (`sl_local4`) takes
//!    the frontend's internal scope when it has one (externalTrafficPolicy
//!    Local short-circuit). SNAT when the frontend asks for it, when it
//!    masquerades sources outside the cluster and this is one, when the
//!    client is its own backend (hairpin), or when a live flow of another
//!    frontend holds the tuple this one would have after DNAT (one client
//!    port shared by connections to two services on one backend:
//!    `conntrack::clashes4`, counted `tuple_clash`). A reselected flow
//!    (the tuple of a finished one) sent to the same backend takes over
//!    that flow's two entries in place (`snat::RECORD_REUSE`, counted
//!    `ct_reused`): no insert.

use aya_ebpf::{bindings::__sk_buff, programs::TcContext};
use sluice_common::{
    config::CFG_F_HOST_ROUTING,
    conntrack::{CT_F_SNAT, CT_REFRESH_NS},
    maps::SVCNET_CLUSTER_IP,
    service::{
        SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_AFFINITY, SVC_F_INTERNAL, SVC_F_MASQ_OUTSIDE,
        SVC_F_SNAT, SVC_F_SOURCE_RANGES,
    },
    Config, CtKind, Stat, Svc4Key, SvcValue, IPPROTO_TCP,
};

use crate::events;
use crate::{
    conntrack::tcp_bits,
    error::{Error, Verdict},
    flow::{Flow4, Parsed},
    hash, icmp,
    maps::{self, count, CONNTRACK_V4},
    nat::{self, Side},
    reject, route,
    select::{
        candidates, judge, orphan_snat_segment, pick4, remember4, Pick, Tracked, PICK_AFFINITY,
    },
    snat,
};
use sluice_common::Hook;

/// The IPv4 path, inlined into the program's own frame: its deepest call
/// chain (SNAT) already fills the 512-byte stack with that frame, so it
/// cannot afford another call level (and its frame must not grow).
#[inline(always)]
pub fn handle(ctx: &TcContext) -> Result<Verdict, Error> {
    let flow = match Flow4::parse(ctx)? {
        Parsed::Flow(flow) => flow,
        Parsed::UnknownFragment => {
            count(Stat::FragmentUnknown);
            events::bare(Stat::FragmentUnknown, Hook::Ingress);
            return Ok(Verdict::Next);
        }
        // An ICMP error may be about an SNATed flow (`icmp::ingress`
        // checks the protocol: the header stays off this frame).
        Parsed::OtherIpv4(_) => {
            return Ok(match icmp::ingress(ctx.skb.skb) {
                Verdict::Next => icmp::cluster_ips_check(ctx.skb.skb),
                done => done,
            })
        }
        Parsed::Other => return Ok(Verdict::Next),
    };
    let config = maps::config();
    let snat_port = flow.dport >= config.snat_port_min
        && flow.dport <= config.snat_port_max
        && config.snat_port_min != 0;
    if snat_port {
        if let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) {
            // SAFETY: pointer from a successful lookup; copied at once.
            let ct = unsafe { *entry };
            if ct.kind == CtKind::Reply as u8 && ct.flags & CT_F_SNAT != 0 {
                return snat::reply(ctx.skb.skb, &flow, entry);
            }
        }
    }
    // No frontend has this address and it is outside the service address
    // space (a pod's packet to another pod): what `unserved` would answer,
    // without the hash lookup.
    if !maps::may_be_served_v4(flow.dst) {
        // A backend's reply to a pod, with host routing: reverse NAT
        // here, and into the client's pod (`route.rs`).
        if config.flags() & CFG_F_HOST_ROUTING != 0 {
            match route::reply4(ctx.skb.skb, &flow, config.flags()) {
                Verdict::Next => {}
                done => return Ok(done),
            }
        }
        return Ok(outside(snat_port));
    }
    let Some(master) = maps::service(&Svc4Key::new(flow.dst, flow.dport, flow.proto, 0)) else {
        // Maybe the reply of an SNATed flow that only the previous
        // generation knows, during an upgrade's handover.
        return unserved(ctx.skb.skb, &flow, snat_port);
    };
    let now = crate::clock::now();

    let mut reselected = false;
    if let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) {
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
            match judge(&flow, master, backend_id, svc_id, ct_flags) {
                Tracked::Follow(backend) => {
                    let flags = ct_flags | tcp_bits(&flow);
                    if flags != ct_flags || now.saturating_sub(last_seen) > CT_REFRESH_NS {
                        // SAFETY: the entry stays valid for this program
                        // run; a racing writer only loses a refresh.
                        unsafe {
                            (*entry).flags = flags;
                            (*entry).last_seen_ns = now;
                        }
                    }
                    count(Stat::Established);
                    if flow.later {
                        count(Stat::FragmentTracked);
                    }
                    if ct_flags & CT_F_SNAT != 0 {
                        return snat::forward(ctx.skb.skb, &flow, backend_id, entry);
                    }
                    nat::rewrite(ctx, &flow, Side::Dst, backend.addr_v4(), backend.port)?;
                    return Ok(route::to_pod4(
                        ctx.skb.skb,
                        route::ports(flow.proto, flow.sport, backend.port),
                        u32::from_ne_bytes(flow.src),
                        u32::from_ne_bytes(backend.addr_v4()),
                        now,
                    ));
                }
                Tracked::Reset if !flow.later => {
                    count(Stat::StaleReset);
                    events::ingress4(Stat::StaleReset, ctx.skb.skb, &flow, svc_id, backend_id);
                    return reject::tcp_reset(ctx.skb.skb, &flow);
                }
                Tracked::Reset | Tracked::Reselect => reselected = true,
            }
        }
    }
    if flow.later {
        // A later fragment cannot start a flow: its first fragment was
        // dropped or rejected, or the flow changed in between.
        count(Stat::FragmentDropped);
        events::ingress4(Stat::FragmentDropped, ctx.skb.skb, &flow, master.svc_id, 0);
        return Ok(Verdict::Drop);
    }
    if !reselected && orphan_snat_segment(flow.proto, flow.tcp_flags, master) {
        count(Stat::SnatFailed);
        events::ingress4(Stat::SnatFailed, ctx.skb.skb, &flow, master.svc_id, 0);
        return Ok(Verdict::Drop);
    }
    new_flow(ctx, &flow, master, now, reselected, &config)
}

/// A packet no frontend takes. kube-proxy (nftables, `cluster-ips-check`,
/// `ct state new` in the forward and output hooks) rejects a new flow to
/// a cluster IP on a port or protocol its service does not serve and
/// drops one to an address of the service CIDRs that no service holds; a
/// packet of a tracked flow (a service port removed under it) passes as
/// before. Outside the service address space: during an upgrade's
/// handover a packet to an SNAT port goes to the previous generation
/// (`snat_port`), anything else passes. A separate BPF function, off the
/// IPv4 frame.
#[inline(never)]
fn unserved(skb: *mut __sk_buff, flow: &Flow4, snat_port: bool) -> Result<Verdict, Error> {
    let kind = maps::svcnet_v4(u32::from_ne_bytes(flow.dst));
    if kind == 0 {
        return Ok(outside(snat_port));
    }
    if CONNTRACK_V4.get_ptr(flow.ct_key()).is_some() {
        return Ok(Verdict::Next);
    }
    if flow.later {
        // Its first fragment was answered (or dropped) already.
        count(Stat::FragmentDropped);
        events::ingress4(Stat::FragmentDropped, skb, flow, 0, 0);
        return Ok(Verdict::Drop);
    }
    if kind == SVCNET_CLUSTER_IP {
        count(Stat::UnservedPort);
        events::ingress4(Stat::UnservedPort, skb, flow, 0, 0);
        return if flow.proto == IPPROTO_TCP {
            reject::tcp_reset(skb, flow)
        } else {
            reject::icmp_port_unreachable(skb, flow)
        };
    }
    count(Stat::UnallocatedIp);
    events::ingress4(Stat::UnallocatedIp, skb, flow, 0, 0);
    Ok(Verdict::Drop)
}

/// The verdict for a packet outside the service address space that no
/// frontend takes: during an upgrade's handover one to an SNAT port may
/// be the reply of a flow only the previous generation knows.
#[inline(always)]
pub fn outside(snat_port: bool) -> Verdict {
    if snat_port {
        Verdict::HandOver
    } else {
        Verdict::Next
    }
}

/// The master entry of the internal scope of `flow`'s frontend, if it has
/// one. A separate BPF function: its key stays off the IPv4 frame.
#[inline(never)]
fn internal_master(flow: &Flow4) -> Option<&'static SvcValue> {
    maps::service(&Svc4Key::scoped(
        flow.dst,
        flow.dport,
        flow.proto,
        0,
        SCOPE_INTERNAL,
    ))
}

#[inline(always)]
fn new_flow(
    ctx: &TcContext,
    flow: &Flow4,
    master: &SvcValue,
    now: u64,
    reselected: bool,
    config: &Config,
) -> Result<Verdict, Error> {
    // Local-traffic detection, only where the frontend needs it: a source
    // inside the cluster takes the internal scope (externalTrafficPolicy
    // Local short-circuit), one outside is masqueraded (cluster IPs).
    let inside = master.flags & (SVC_F_INTERNAL | SVC_F_MASQ_OUTSIDE) != 0
        // SAFETY: reading the context's ingress device.
        && maps::inside_v4(u32::from_ne_bytes(flow.src), unsafe {
            (*ctx.skb.skb).ingress_ifindex
        });
    let mut master = master;
    let mut scope = SCOPE_EXTERNAL;
    if inside && master.flags & SVC_F_INTERNAL != 0 {
        if let Some(internal) = internal_master(flow) {
            master = internal;
            scope = SCOPE_INTERNAL;
        }
    }
    if master.flags & SVC_F_SOURCE_RANGES != 0 && !maps::source_allowed(master.svc_id, flow.src) {
        count(Stat::SourceDenied);
        events::ingress4(Stat::SourceDenied, ctx.skb.skb, flow, master.svc_id, 0);
        return Ok(Verdict::Drop);
    }
    match candidates(master) {
        Pick::Slots(..) => {}
        Pick::Drop => {
            count(Stat::NoBackendDrop);
            events::ingress4(Stat::NoBackendDrop, ctx.skb.skb, flow, master.svc_id, 0);
            return Ok(Verdict::Drop);
        }
        Pick::Reject => {
            count(Stat::NoBackend);
            events::ingress4(Stat::NoBackend, ctx.skb.skb, flow, master.svc_id, 0);
            return if flow.proto == IPPROTO_TCP {
                reject::tcp_reset(ctx.skb.skb, flow)
            } else {
                reject::icmp_port_unreachable(ctx.skb.skb, flow)
            };
        }
    }
    let h = hash::flow(flow, config.hash_seed);
    let picked = pick4(flow, master, scope, h, now);
    let backend_id = picked as u32;
    let backend = maps::backend(backend_id).ok_or(Error::Dangling)?;
    if picked & PICK_AFFINITY != 0 {
        count(Stat::AffinityHit);
    }
    if master.flags & SVC_F_AFFINITY != 0 {
        remember4(flow, master.svc_id, backend_id, now);
    }
    count(if reselected {
        Stat::Reselected
    } else {
        Stat::NewFlow
    });
    events::new_flow4(
        config.flags(),
        reselected,
        ctx.skb.skb,
        flow,
        master.svc_id,
        backend_id,
    );
    let nf = snat::NewFlow {
        svc_id: master.svc_id,
        backend_id,
        now,
        hash: h,
    };
    let backend_addr = backend.addr_v4();
    let masquerade = master.flags & SVC_F_MASQ_OUTSIDE != 0 && !inside;
    if master.flags & SVC_F_SNAT != 0 || masquerade || backend_addr == flow.src {
        return snat::new_flow(ctx.skb.skb, flow, &nf);
    }
    // A pod's flow on the TC path: its replies need reverse NAT on the
    // pod's device (marked `CT_F_POD`; `CFG_F_PODS_ON_SOCKETS` goes).
    // SAFETY: reading the context's ingress device.
    let pod = maps::new_flow_from_v4(u32::from_ne_bytes(flow.src), unsafe {
        (*ctx.skb.skb).ingress_ifindex
    });
    let mut options = if pod { snat::RECORD_POD } else { 0 };
    if reselected {
        options |= snat::RECORD_REUSE;
    }
    let to = u64::from(u32::from_ne_bytes(backend_addr)) | u64::from(backend.port) << 32;
    if snat::record(flow, &nf, to, options).taken()? {
        // Another entry holds the tuple this flow would have after DNAT.
        // A live flow of another frontend keeps it (a client port shared
        // across two services on one backend): this one is masqueraded
        // instead. Anything else is replaced.
        if crate::conntrack::clashes4(flow, backend_addr, backend.port) {
            count(Stat::TupleClash);
            events::ingress4(
                Stat::TupleClash,
                ctx.skb.skb,
                flow,
                master.svc_id,
                backend_id,
            );
            return snat::new_flow(ctx.skb.skb, flow, &nf);
        }
        let options = (options & !snat::RECORD_REUSE) | snat::RECORD_REPLACE;
        snat::record(flow, &nf, to, options).taken()?;
    }
    if pod {
        maps::pod_flow_recorded();
    }
    nat::rewrite(ctx, flow, Side::Dst, backend_addr, backend.port)?;
    Ok(route::to_pod4(
        ctx.skb.skb,
        route::ports(flow.proto, flow.sport, backend.port),
        u32::from_ne_bytes(flow.src),
        u32::from_ne_bytes(backend_addr),
        now,
    ))
}
