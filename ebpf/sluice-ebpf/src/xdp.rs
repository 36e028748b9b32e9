//! `sl_xdp`: north-south service traffic decided at the driver, on
//! the node's external devices (`--xdp-devices`).
//!
//! The program finishes what it can do alone and hands everything else
//! to the TC path (`XDP_PASS`) *before* deciding anything, so a packet is
//! never decided twice, differently:
//! - a reply to an SNAT port of a flow SNATed to the node: reverse NAT,
//!   sent towards the client (`xdp_nat::reply`);
//! - a packet of a tracked SNATed flow: rewritten like its predecessors
//!   (`xdp_nat::forward`), whichever hook started the flow (the conntrack
//!   entries are the TC path's, written by the same `snat::claim`);
//! - a new flow to a NodePort, load-balancer IP or external IP with
//!   externalTrafficPolicy Cluster: the backend from the one selection
//!   (`select::pick4`), SNAT to the node, sent on (`new_flow`);
//! - drops: a source outside the frontend's loadBalancerSourceRanges, a
//!   drop-when-empty frontend without backends, a new flow to an
//!   unallocated address of the service CIDRs.
//!
//! "Sent" means `XDP_TX` when the route leaves through the device the
//! packet came in on, `XDP_REDIRECT` when it leaves through another XDP
//! device (`sl_xdp_devs`), and only when `bpf_fib_lookup` answers
//! SUCCESS (a known neighbour). Anything else passes undecided: IP
//! options, fragments, ICMP, SCTP, a TTL about to expire, cluster IPs,
//! policy Local frontends (their backends are local), rejects (TC builds
//! the RST), a backend behind another device or an unresolved neighbour,
//! a tracked flow whose entry must be judged again (TC reselects or
//! resets). IPv6 frames take the same steps in `xdp6.rs`.

use aya_ebpf::{
    bindings::{xdp_action, xdp_md},
    programs::XdpContext,
};
use sluice_common::{
    conntrack::{CT_F_SNAT, CT_REFRESH_NS},
    maps::SVCNET_CLUSTER_IP,
    service::{
        FrontendKind, SCOPE_EXTERNAL, SVC_F_AFFINITY, SVC_F_INTERNAL, SVC_F_MASQ_OUTSIDE,
        SVC_F_SNAT, SVC_F_SOURCE_RANGES,
    },
    CtEntry, CtKind, Stat, Svc4Key, SvcValue, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::{
    checksum::{fold16, sum_words},
    conntrack::tcp_bits,
    events,
    flow::Flow4,
    hash,
    headers::{
        EthHdr, Ipv4Hdr, TcpHdr, UdpHdr, ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_LEN, IP_MF_OFFSET,
        TCP_LEN, UDP_LEN,
    },
    maps::{self, count, CONNTRACK_V4},
    select::{candidates, judge, orphan_snat_segment, pick4, remember4, Pick, Tracked},
    snat::{claim, NewFlow},
    xdp_nat::{self, Ends},
};

/// What `sl_xdp` does with a frame.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Not service traffic: to the stack, uncounted.
    Ignore,
    /// Service traffic handed to TC undecided (`xdp_pass`).
    Pass,
    Tx,
    Redirect,
    /// Rewritten but not sendable: dropped (`xdp_aborted`).
    Aborted,
    /// Dropped (`xdp_drop`) for this reason, which `run` counts: every
    /// drop has one, and is an event for `sluice monitor`, which the function
    /// holding the flow emits (`refused4`, `xdp6::refused6`) so that the
    /// emitting call stays off the deep chains (512 bytes of stack).
    Refused(Stat),
}

/// Emits the event of a `Refused` action (see `Action::Refused`).
#[inline(always)]
fn refused4(ctx: *mut xdp_md, flow: &Flow4, svc_id: u32, action: Action) -> Action {
    if let Action::Refused(reason) = action {
        // SAFETY: reading the context's ingress device.
        events::xdp4(reason, unsafe { (*ctx).ingress_ifindex }, flow, svc_id);
    }
    action
}

/// The program: a verdict, counted per kind.
#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    let action = if at::<EthHdr>(ctx, 0).is_some_and(|eth| eth.ether_type == ETH_P_IPV6) {
        crate::xdp6::decide6(ctx.ctx)
    } else {
        decide(ctx.ctx)
    };
    match action {
        Action::Ignore => xdp_action::XDP_PASS,
        Action::Pass => {
            count(Stat::XdpPass);
            xdp_action::XDP_PASS
        }
        Action::Refused(reason) => {
            count(reason);
            count(Stat::XdpDrop);
            xdp_action::XDP_DROP
        }
        Action::Tx => {
            count(Stat::XdpTx);
            xdp_action::XDP_TX
        }
        Action::Redirect => {
            count(Stat::XdpRedirect);
            xdp_action::XDP_REDIRECT
        }
        Action::Aborted => {
            count(Stat::XdpAborted);
            xdp_action::XDP_DROP
        }
    }
}

/// Offset of the L4 header: `sl_xdp` takes IPv4 headers without options
/// only (others pass).
pub const L4_OFF: usize = ETH_LEN + IPV4_LEN;

/// A header of the frame at `off`, bounds-checked.
#[inline(always)]
pub(crate) fn at<T: Copy>(ctx: &XdpContext, off: usize) -> Option<T> {
    let start = ctx.data();
    if start + off + core::mem::size_of::<T>() > ctx.data_end() {
        return None;
    }
    // SAFETY: bounds checked just above; T is a byte-aligned header.
    Some(unsafe { *((start + off) as *const T) })
}

/// The frame as a flow `sl_xdp` may handle (IPv4 TCP/UDP, no options,
/// not a fragment, TTL above 1), with the IP total length.
#[inline(always)]
fn parse(ctx: &XdpContext) -> Option<(Flow4, u16)> {
    let eth = at::<EthHdr>(ctx, 0)?;
    if eth.ether_type != ETH_P_IP {
        return None;
    }
    let ip = at::<Ipv4Hdr>(ctx, ETH_LEN)?;
    if ip.vihl != 0x45 || u16::from_be_bytes(ip.frag_off) & IP_MF_OFFSET != 0 || ip.ttl <= 1 {
        return None;
    }
    let (sport, dport, tcp_flags) = if ip.proto == IPPROTO_TCP {
        let tcp = at::<TcpHdr>(ctx, L4_OFF)?;
        (tcp.sport, tcp.dport, tcp.flags)
    } else if ip.proto == IPPROTO_UDP {
        let udp = at::<UdpHdr>(ctx, L4_OFF)?;
        (udp.sport, udp.dport, 0)
    } else {
        return None;
    };
    const _: () = assert!(TCP_LEN > UDP_LEN);
    Some((
        Flow4 {
            src: ip.src,
            dst: ip.dst,
            sport: u16::from_be_bytes(sport),
            dport: u16::from_be_bytes(dport),
            proto: ip.proto,
            tcp_flags,
            l4_off: L4_OFF,
            later: false,
        },
        u16::from_be_bytes(ip.tot_len),
    ))
}

/// What the stack would drop before forwarding (`ip_rcv_core`), `sl_xdp`
/// must not send on (`xdp_nat::route` passes it to TC, and the stack
/// drops it): a total length beyond the frame or short of the TCP or UDP
/// header, a header checksum that does not add up. Asked only of frames
/// about to be sent (parsed by `parse`: 20-byte header, TCP or UDP). A
/// separate BPF function that reads the header in place: no frame of its
/// own on the deepest chain (`new_flow`, `route`).
#[inline(never)]
pub fn forwardable(ctx: *mut xdp_md) -> bool {
    let xdp = XdpContext::new(ctx);
    let Some(ip) = bytes_at::<IPV4_LEN>(&xdp, ETH_LEN) else {
        return false;
    };
    let tot_len = u16::from_be_bytes([ip[2], ip[3]]) as u64;
    fold16(sum_words(ip, 0)) == 0xffff
        && tot_len >= (IPV4_LEN + l4_min_len(ip[9])) as u64
        && (ETH_LEN as u64) + tot_len <= frame_len(ctx)
}

/// The `N` bytes of the frame at `off`, in place (no copy on the stack),
/// bounds-checked.
#[inline(always)]
pub(crate) fn bytes_at<const N: usize>(ctx: &XdpContext, off: usize) -> Option<&[u8; N]> {
    let start = ctx.data();
    if start + off + N > ctx.data_end() {
        return None;
    }
    // SAFETY: the N bytes lie within the frame (checked above).
    Some(unsafe { &*((start + off) as *const [u8; N]) })
}

/// The shortest L4 header of `proto` that `sl_xdp` parses (TCP or UDP).
#[inline(always)]
pub(crate) fn l4_min_len(proto: u8) -> usize {
    if proto == IPPROTO_TCP {
        TCP_LEN
    } else {
        UDP_LEN
    }
}

/// The frame's length, as a number the verifier lets the program compare
/// (the difference of the end and start pointers it refuses).
#[inline(always)]
pub(crate) fn frame_len(ctx: *mut xdp_md) -> u64 {
    // SAFETY: plain helper call on the running program's frame.
    unsafe { aya_ebpf::helpers::bpf_xdp_get_buff_len(ctx) }
}

/// An IPv4 frame. A separate BPF function: the program's own frame stays
/// small for the IPv6 half's deeper chain.
#[inline(never)]
fn decide(ctx: *mut xdp_md) -> Action {
    let ctx = &XdpContext::new(ctx);
    let Some((flow, tot_len)) = parse(ctx) else {
        return Action::Ignore;
    };
    let config = maps::config();
    if config.snat_port_min != 0
        && flow.dport >= config.snat_port_min
        && flow.dport <= config.snat_port_max
    {
        if let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) {
            // SAFETY: pointer from a successful lookup; read at once.
            let (kind, flags) = unsafe { ((*entry).kind, (*entry).flags) };
            if kind == CtKind::Reply as u8 && flags & CT_F_SNAT != 0 {
                return xdp_nat::reply(ctx.ctx, &flow, entry, tot_len);
            }
        }
    }
    let Some(master) = maps::service(&Svc4Key::new(flow.dst, flow.dport, flow.proto, 0)) else {
        return refused4(ctx.ctx, &flow, 0, unserved(&flow));
    };
    if master.kind() == FrontendKind::ClusterIp {
        return Action::Pass;
    }
    let now = crate::clock::now();
    if let Some(entry) = CONNTRACK_V4.get_ptr_mut(flow.ct_key()) {
        // SAFETY: pointer from a successful lookup; fields copied at once.
        let (kind, ct_flags, backend_id, svc_id) = unsafe {
            (
                (*entry).kind,
                (*entry).flags,
                (*entry).backend_id,
                (*entry).svc_id,
            )
        };
        if kind != CtKind::Forward as u8 || ct_flags & CT_F_SNAT == 0 {
            return Action::Pass;
        }
        return match judge(&flow, master, backend_id, svc_id, ct_flags) {
            Tracked::Follow(_) => forward(ctx.ctx, &flow, entry, now, tot_len),
            // A fresh pick or a reset: TC's to decide.
            Tracked::Reselect | Tracked::Reset => Action::Pass,
        };
    }
    let action = new_flow(ctx.ctx, &flow, master, now, tot_len);
    refused4(ctx.ctx, &flow, master.svc_id, action)
}

/// A packet to no frontend: a new flow to an address of the service CIDRs
/// that no service holds is dropped here (as `ingress::unserved` would);
/// everything else is not ours.
#[inline(never)]
fn unserved(flow: &Flow4) -> Action {
    let kind = maps::svcnet_v4(u32::from_ne_bytes(flow.dst));
    if kind == 0 || kind == SVCNET_CLUSTER_IP {
        // A cluster IP's unserved port gets a RST or port unreachable: TC.
        return if kind == 0 {
            Action::Ignore
        } else {
            Action::Pass
        };
    }
    if CONNTRACK_V4.get_ptr(flow.ct_key()).is_some() {
        return Action::Pass;
    }
    Action::Refused(Stat::UnallocatedIp)
}

/// A packet of a tracked flow SNATed to the node (`entry`: its forward
/// entry, judged `Follow`). A separate BPF function.
#[inline(never)]
fn forward(ctx: *mut xdp_md, flow: &Flow4, entry: *mut CtEntry, now: u64, tot_len: u16) -> Action {
    // SAFETY: the caller found the entry; fields copied at once.
    let (backend_id, ct_flags, last_seen, nat_addr, nat_port) = unsafe {
        (
            (*entry).backend_id,
            (*entry).flags,
            (*entry).last_seen_ns,
            crate::conntrack::v4(&(*entry).nat_addr),
            (*entry).nat_port,
        )
    };
    let Some(backend) = maps::backend(backend_id) else {
        return Action::Pass;
    };
    let ends = Ends {
        src: nat_addr,
        dst: backend.addr_v4(),
        sport: nat_port,
        dport: backend.port,
    };
    let ifindex = xdp_nat::route(ctx, flow, ends.dst, tot_len);
    if ifindex == 0 {
        return Action::Pass;
    }
    let flags = ct_flags | tcp_bits(flow);
    if flags != ct_flags || now.saturating_sub(last_seen) > CT_REFRESH_NS {
        // SAFETY: the entry stays valid for this program run; a racing
        // writer only loses a refresh.
        unsafe {
            (*entry).flags = flags;
            (*entry).last_seen_ns = now;
        }
    }
    count(Stat::Established);
    xdp_nat::send(ctx, flow, &ends, ifindex)
}

/// A new flow to an external frontend. Everything that would make TC
/// decide otherwise (or decide at all: a reject) passes before anything
/// is written. A separate BPF function.
#[inline(never)]
fn new_flow(ctx: *mut xdp_md, flow: &Flow4, master: &SvcValue, now: u64, tot_len: u16) -> Action {
    if master.flags & SVC_F_MASQ_OUTSIDE != 0 {
        return Action::Pass;
    }
    // SAFETY: reading the context's ingress device.
    let ingress = unsafe { (*ctx).ingress_ifindex };
    if master.flags & SVC_F_INTERNAL != 0 && maps::inside_v4(u32::from_ne_bytes(flow.src), ingress)
    {
        // A source inside the cluster takes the internal scope: TC.
        return Action::Pass;
    }
    if master.flags & SVC_F_SOURCE_RANGES != 0 && !maps::source_allowed(master.svc_id, flow.src) {
        return Action::Refused(Stat::SourceDenied);
    }
    match candidates(master) {
        Pick::Slots(..) => {}
        Pick::Drop => {
            return Action::Refused(Stat::NoBackendDrop);
        }
        Pick::Reject => return Action::Pass,
    }
    if master.flags & SVC_F_SNAT == 0 || orphan_snat_segment(flow.proto, flow.tcp_flags, master) {
        return Action::Pass;
    }
    let h = hash::flow(flow, maps::config().hash_seed);
    let picked = pick4(flow, master, SCOPE_EXTERNAL, h, now);
    let backend_id = picked as u32;
    let Some(backend) = maps::backend(backend_id) else {
        return Action::Pass;
    };
    let (baddr, bport) = (backend.addr_v4(), backend.port);
    if baddr == flow.src {
        return Action::Pass;
    }
    let ifindex = xdp_nat::route(ctx, flow, baddr, tot_len);
    if ifindex == 0 {
        return Action::Pass;
    }
    let Some(src) = xdp_nat::route_source() else {
        return Action::Pass;
    };
    // Decided: from here on, as `ingress::new_flow` and `snat::new_flow`.
    if picked & crate::select::PICK_AFFINITY != 0 {
        count(Stat::AffinityHit);
    }
    if master.flags & SVC_F_AFFINITY != 0 {
        remember4(flow, master.svc_id, backend_id, now);
    }
    let nf = NewFlow {
        svc_id: master.svc_id,
        backend_id,
        now,
        hash: h,
    };
    let port = claim(flow, &nf, baddr, bport, src);
    if port == 0 {
        return Action::Refused(Stat::SnatFailed);
    }
    count(Stat::NewFlow);
    let ends = Ends {
        src,
        dst: baddr,
        sport: port,
        dport: bport,
    };
    xdp_nat::send(ctx, flow, &ends, ifindex)
}
