//! Socket-level balancing: connections are sent to a backend when the
//! socket connects (or, for unconnected UDP, per datagram), and the service
//! address is put back where the application looks (`getpeername`, UDP
//! `recvmsg`), so that no packet of the flow is translated. Attached to a
//! cgroup that may span several network namespaces, these programs act on
//! the node's own sockets (`--socket-lb=host`: traffic from the node never
//! crosses a TC ingress hook) and, with `CFG_F_SOCK_PODS`
//! (`--socket-lb=all`), on every pod's, with the TC path's answers.
//!
//! Both families: `connect4` & co. look in `sl_svc4`; `connect6` & co. in
//! `sl_svc6`, or in `sl_svc4` for a v4-mapped address (`::ffff:a.b.c.d`,
//! an `AF_INET6` socket reaching an IPv4 service), whose backend is then
//! written back v4-mapped too, as Cilium does.
//!
//! What a pod's socket gets differs from the node's only where the TC path
//! would look at the pod's source address, which a socket has not chosen
//! yet when it connects: session affinity keys the pod by its network
//! namespace (`client_id`); a frontend with `loadBalancerSourceRanges`, and
//! a datagram of a flow the TC path already tracks (one that began before
//! socket balancing reached the pod), are left to the TC path
//! (`sock_left_to_tc`); the externalTrafficPolicy Local short-circuit
//! follows `CFG_F_SOCK_PODS_LOCAL`.
//!
//! A frontend whose pick is a hash over its active backends alone has an
//! entry in `sl_sockfe4`/`sl_sockfe6` (`sluice_common::picks`), which
//! `connect` takes first: one lookup gives the service port and the
//! backend, the one the general path (master, slot, backend: three
//! lookups) would give the same socket.

use aya_ebpf::{
    bindings::{bpf_sock_addr, BPF_ANY},
    btf_maps::lpm_trie::Key,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::{SockAddrContext, SockContext},
    EbpfContext,
};
use sluice_common::{
    config::{CFG_F_SOCK_PICKS, CFG_F_SOCK_PODS, CFG_F_SOCK_PODS_LOCAL},
    hash::{jhash_3words, pick_slot},
    maps::SVCNET_CLUSTER_IP,
    picks::SOCK_PICKS_MAX,
    service::{
        SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_AFFINITY, SVC_F_INTERNAL, SVC_F_MAGLEV,
        SVC_F_NODE_DENIED, SVC_F_SOURCE_RANGES,
    },
    socket::mark_slot,
    Affinity4Key, Affinity6Key, AffinityValue, Backend, Config, Ct4Key, Ct6Key, CtKind, SockEntry,
    SockRevKey, SockRevValue, Stat, Svc4Key, Svc6Key, SvcValue, FAMILY_V4, FAMILY_V6, IPPROTO_TCP,
    IPPROTO_UDP,
};

use crate::events;
use crate::{
    maglev,
    maps::{
        self, count, Claim, Held, SockMarks, AFFINITY_V4, AFFINITY_V6, CONNTRACK_V4, CONNTRACK_V6,
        SOCKETS, SOCK_REV,
    },
    select::{candidates, sticky, Pick},
};

/// What cgroup socket-address programs return to let the call proceed.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;
const ETIMEDOUT: i32 = 110;

/// The first 12 bytes of a v4-mapped IPv6 address.
const V4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// Which hook family a program serves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Whose socket a call is on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The node's own network namespace.
    Node,
    /// Another namespace (a pod's), by its cookie.
    Pod(u64),
}

/// Whose socket this is, if the programs act on it: the node's always
/// (once the agent wrote its cookie), a pod's with `CFG_F_SOCK_PODS`.
#[inline(always)]
fn caller<C: EbpfContext>(ctx: &C, config: &Config) -> Option<Caller> {
    if config.netns_cookie == 0 {
        return None;
    }
    // SAFETY: plain helper call on the program's context.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    if netns == config.netns_cookie {
        Some(Caller::Node)
    } else if config.flags() & CFG_F_SOCK_PODS != 0 {
        Some(Caller::Pod(netns))
    } else {
        None
    }
}

/// The destination address of the call, as the socket sees it (IPv4 in
/// the first 4 bytes for `AF_INET`).
#[inline(always)]
fn read_addr(sa: *const bpf_sock_addr, family: Family) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: reading fields of the program's context, word by word as
    // the kernel requires.
    unsafe {
        match family {
            Family::V4 => out[..4].copy_from_slice(&(*sa).user_ip4.to_ne_bytes()),
            Family::V6 => {
                let w = (*sa).user_ip6;
                out[..4].copy_from_slice(&w[0].to_ne_bytes());
                out[4..8].copy_from_slice(&w[1].to_ne_bytes());
                out[8..12].copy_from_slice(&w[2].to_ne_bytes());
                out[12..].copy_from_slice(&w[3].to_ne_bytes());
            }
        }
    }
    out
}

/// Rewrites the call's address (`addr` as the socket sees it) and port.
#[inline(always)]
fn write_addr(sa: *mut bpf_sock_addr, family: Family, addr: &[u8; 16], port: u16) {
    let w = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    // SAFETY: these hooks may rewrite the address they see, word by word.
    unsafe {
        match family {
            Family::V4 => (*sa).user_ip4 = w(0),
            Family::V6 => {
                (*sa).user_ip6[0] = w(0);
                (*sa).user_ip6[1] = w(4);
                (*sa).user_ip6[2] = w(8);
                (*sa).user_ip6[3] = w(12);
            }
        }
        (*sa).user_port = u32::from(port.to_be());
    }
}

/// Whether `addr` (an `AF_INET6` socket's view) is v4-mapped.
#[inline(always)]
fn is_v4_mapped(addr: &[u8; 16]) -> bool {
    let w = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    let m = |i: usize| {
        u32::from_ne_bytes([
            V4_MAPPED[i],
            V4_MAPPED[i + 1],
            V4_MAPPED[i + 2],
            V4_MAPPED[i + 3],
        ])
    };
    (w(0) ^ m(0)) | (w(4) ^ m(4)) | (w(8) ^ m(8)) == 0
}

/// A frontend entry (`slot` 0: the master) of the service at `addr`, in
/// `scope`: in `sl_svc4` when `v4` (the address in bytes 12..16 when
/// `mapped`, else 0..4), else in `sl_svc6`.
#[inline(always)]
fn service(at: &Target, slot: u16, scope: u8) -> Option<&'static SvcValue> {
    if at.v4 {
        maps::service(&Svc4Key::scoped(
            at.v4_addr(),
            at.port,
            at.proto,
            slot,
            scope,
        ))
    } else {
        maps::service6(&Svc6Key::scoped(at.addr, at.port, at.proto, slot, scope))
    }
}

/// The service address a call names.
struct Target {
    /// As the socket sees it.
    addr: [u8; 16],
    port: u16,
    proto: u8,
    /// An IPv4 service (an `AF_INET` socket, or a v4-mapped address).
    v4: bool,
    /// A v4-mapped address on an `AF_INET6` socket.
    mapped: bool,
}

impl Target {
    #[inline(always)]
    fn v4_addr(&self) -> [u8; 4] {
        let o = if self.mapped { 12 } else { 0 };
        [
            self.addr[o],
            self.addr[o + 1],
            self.addr[o + 2],
            self.addr[o + 3],
        ]
    }
}

/// The client of a session-affinity key for a socket of `who`. Sockets
/// pick before they have a source address, so the client is named by its
/// network namespace, in addresses no packet on the TC path carries as a
/// source: the node (every process of which would leave with the node's
/// address) is the unspecified address; a pod is `0.x.y.z` (the low 24
/// bits of its namespace cookie, never 0) and `0:0:0:1::/64` with the
/// cookie as interface identifier.
#[inline(always)]
fn client_id(who: Caller) -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Caller::Pod(cookie) = who {
        let low = (cookie & 0x00ff_ffff) as u32;
        let low = if low == 0 { 0x00ff_ffff } else { low };
        out[..4].copy_from_slice(&low.to_be_bytes());
        out[7] = 1;
        out[8..].copy_from_slice(&cookie.to_be_bytes());
    }
    out
}

/// The backend the caller's session affinity to this frontend names, if
/// it may still take new flows (0: none).
#[inline(always)]
fn affinity(at: &Target, client: &[u8; 16], master: &SvcValue, now: u64) -> u32 {
    let entry = if at.v4 {
        AFFINITY_V4.get_ptr(affinity_key4(at, client))
    } else {
        AFFINITY_V6.get_ptr(affinity_key6(at, client))
    };
    match entry {
        // SAFETY: pointer from a successful lookup; read at once.
        Some(a) => sticky(unsafe { &*a }, master, now),
        None => 0,
    }
}

#[inline(always)]
fn affinity_key4(at: &Target, client: &[u8; 16]) -> Affinity4Key {
    Affinity4Key {
        client: [client[0], client[1], client[2], client[3]],
        frontend: at.v4_addr(),
        port: at.port,
        proto: at.proto,
        _pad: 0,
    }
}

#[inline(always)]
fn affinity_key6(at: &Target, client: &[u8; 16]) -> Affinity6Key {
    Affinity6Key {
        client: *client,
        frontend: at.addr,
        port: at.port,
        proto: at.proto,
        _pad: 0,
    }
}

/// Records the caller's affinity to `backend_id`.
#[inline(always)]
fn remember(at: &Target, client: &[u8; 16], master: &SvcValue, backend_id: u32, now: u64) {
    let value = AffinityValue {
        last_used_ns: now,
        backend_id,
        svc_id: master.svc_id,
    };
    if at.v4 {
        let _ = AFFINITY_V4.insert(affinity_key4(at, client), value, BPF_ANY as u64);
    } else {
        let _ = AFFINITY_V6.insert(affinity_key6(at, client), value, BPF_ANY as u64);
    }
}

/// Picks the backend of a new socket with the TC path's rules
/// (`select.rs`): session affinity, then the frontend's Maglev table, then
/// a slot among the candidates. `h` hashes the socket (the source port
/// does not exist yet).
#[inline(always)]
fn pick(
    at: &Target,
    who: Caller,
    master: &SvcValue,
    scope: u8,
    (first, n): (u16, u16),
    h: u32,
) -> u32 {
    let sticky_on = master.flags & SVC_F_AFFINITY != 0;
    // The clock only where session affinity needs it.
    let now = if sticky_on { crate::clock::now() } else { 0 };
    let client = client_id(who);
    let mut id = if sticky_on {
        affinity(at, &client, master, now)
    } else {
        0
    };
    if id != 0 {
        count(Stat::AffinityHit);
    } else {
        if master.flags & SVC_F_MAGLEV != 0 {
            id = if at.v4 {
                let key = Svc4Key::scoped(at.v4_addr(), at.port, at.proto, 0, scope);
                maglev::pick4_by_hash(&key, h, master)
            } else {
                let key = Svc6Key::scoped(at.addr, at.port, at.proto, 0, scope);
                maglev::pick6_by_hash(&key, h, master)
            };
        }
        if id == 0 {
            id = match service(at, pick_slot(h, first, n), scope) {
                Some(slot) => slot.backend_id,
                None => 0,
            };
        }
    }
    if id != 0 && sticky_on {
        remember(at, &client, master, id, now);
    }
    id
}

/// `backend`'s address as a socket of `family` (v4-mapped when `mapped`)
/// sees it.
#[inline(always)]
fn socket_view(backend: &Backend, mapped: bool) -> [u8; 16] {
    if backend.family == FAMILY_V6 {
        return backend.addr;
    }
    v4_view(&backend.addr_v4(), mapped)
}

/// An IPv4 address as a socket sees it: in the first 4 bytes (`AF_INET`),
/// or v4-mapped (`mapped`: an `AF_INET6` socket).
#[inline(always)]
fn v4_view(addr: &[u8; 4], mapped: bool) -> [u8; 16] {
    let mut out = [0u8; 16];
    let o = if mapped {
        out[..12].copy_from_slice(&V4_MAPPED);
        12
    } else {
        0
    };
    out[o..o + 4].copy_from_slice(addr);
    out
}

/// A call to no frontend: like the TC path (`ingress::unserved`), a
/// cluster IP's unserved port is refused and an unallocated address of the
/// service CIDRs gets what a dropped connection would (a timeout, said at
/// once, as for `Pick::Drop`); any other address goes ahead.
#[inline(never)]
fn unserved(at: &Target) -> i32 {
    let kind = if at.v4 {
        maps::svcnet_v4(u32::from_ne_bytes(at.v4_addr()))
    } else {
        let mut key = Key {
            prefix_len: 128,
            data: [0u8; 16],
        };
        maps::svcnet_v6(&mut key, &at.addr)
    };
    let errno = match kind {
        0 => return ALLOW,
        SVCNET_CLUSTER_IP => {
            count(Stat::UnservedPort);
            events::sock(Stat::UnservedPort, &at.addr, at.port, at.proto, at.v4);
            ECONNREFUSED
        }
        _ => {
            count(Stat::UnallocatedIp);
            events::sock(Stat::UnallocatedIp, &at.addr, at.port, at.proto, at.v4);
            ETIMEDOUT
        }
    };
    // SAFETY: plain helper call; sets the errno the syscall returns.
    unsafe { bpf_set_retval(-errno) };
    REJECT
}

/// Whether a pod's datagram to `at` belongs to a flow the TC path tracks
/// (its forward conntrack entry exists): one that began before socket
/// balancing reached the pod keeps its backend (and its SNAT, if any) by
/// staying on the TC path until its entry expires. The source is the
/// datagram's (`IP_PKTINFO`) or the socket's bound address; a socket bound
/// to the wildcard address has none yet and cannot be looked up. A
/// separate BPF function: the key stays off the caller's frame.
#[inline(never)]
fn tracked_by_tc(sa: *const bpf_sock_addr, family: Family, at: &Target) -> bool {
    // SAFETY: reading fields of the program's context and of its socket
    // (`sk` is never null in these hooks), word by word.
    let (src, sport) = unsafe {
        let sk = (*sa).__bindgen_anon_1.sk;
        let sport = (*sk).src_port as u16;
        let mut src = [0u8; 16];
        match family {
            Family::V4 => {
                let mut w = (*sa).msg_src_ip4;
                if w == 0 {
                    w = (*sk).src_ip4;
                }
                src[..4].copy_from_slice(&w.to_ne_bytes());
            }
            Family::V6 => {
                let mut w = (*sa).msg_src_ip6;
                if w[0] | w[1] | w[2] | w[3] == 0 {
                    w = (*sk).src_ip6;
                }
                src[..4].copy_from_slice(&w[0].to_ne_bytes());
                src[4..8].copy_from_slice(&w[1].to_ne_bytes());
                src[8..12].copy_from_slice(&w[2].to_ne_bytes());
                src[12..].copy_from_slice(&w[3].to_ne_bytes());
            }
        }
        (src, sport)
    };
    let entry = if at.v4 {
        let o = if at.mapped { 12 } else { 0 };
        let src4 = [src[o], src[o + 1], src[o + 2], src[o + 3]];
        if u32::from_ne_bytes(src4) == 0 {
            return false;
        }
        let key = Ct4Key::new(src4, at.v4_addr(), sport, at.port, at.proto);
        CONNTRACK_V4.get_ptr(key)
    } else {
        if src == [0u8; 16] {
            return false;
        }
        let key = Ct6Key::new(src, at.addr, sport, at.port, at.proto);
        CONNTRACK_V6.get_ptr(key)
    };
    // SAFETY: pointer from a successful lookup; one field read at once.
    matches!(entry, Some(e) if unsafe { (*e).kind } == CtKind::Forward as u8)
}

/// The backend a socket goes to, as the socket sees it.
struct Chosen {
    backend_id: u32,
    svc_id: u32,
    /// `backend`'s address in the socket's family (v4-mapped for a
    /// v4-mapped target).
    addr: [u8; 16],
    port: u16,
}

/// The backend `at`'s entry in `sl_sockfe4`/`sl_sockfe6` gives a socket
/// whose hash is `h` (`picks[i]` is slot `i + 1`, so the one the general
/// path would give), if the frontend has one (`sluice_common::picks`).
#[inline(always)]
fn from_picks(at: &Target, h: u32) -> Option<Chosen> {
    let (svc_id, backend_id, addr, port) = if at.v4 {
        let key = Svc4Key::scoped(at.v4_addr(), at.port, at.proto, 0, SCOPE_EXTERNAL);
        let picks = maps::sock_picks4(&key)?;
        let pick = nth(&picks.picks, picks.count, h)?;
        let addr = v4_view(&pick.addr, at.mapped);
        (picks.svc_id, pick.backend_id, addr, pick.port)
    } else {
        let key = Svc6Key::scoped(at.addr, at.port, at.proto, 0, SCOPE_EXTERNAL);
        let picks = maps::sock_picks6(&key)?;
        let pick = nth(&picks.picks, picks.count, h)?;
        (picks.svc_id, pick.backend_id, pick.addr, pick.port)
    };
    // An element the agent deleted while this ran may be reused and read
    // half written: a zeroed pick names no backend (ids start at 1), and
    // the general path answers.
    if backend_id == 0 {
        return None;
    }
    Some(Chosen {
        backend_id,
        svc_id,
        addr,
        port,
    })
}

/// The pick hash `h` names among an entry's first `count`, if `count` is
/// one an entry may hold.
#[inline(always)]
fn nth<T>(picks: &[T; SOCK_PICKS_MAX], count: u16, h: u32) -> Option<&T> {
    if count == 0 || usize::from(count) > SOCK_PICKS_MAX {
        return None;
    }
    picks.get(usize::from(pick_slot(h, 0, count)))
}

/// `connect()` (TCP, UDP) and, with `datagram`, `sendmsg()` on unconnected
/// UDP sockets: a frontend address becomes a backend address.
#[inline(always)]
pub fn connect(ctx: &SockAddrContext, family: Family, datagram: bool) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: reading fields of the program's context.
    let (proto, raw_port) = unsafe { ((*sa).protocol as u8, (*sa).user_port) };
    let wanted = if datagram {
        proto == IPPROTO_UDP
    } else {
        proto == IPPROTO_TCP || proto == IPPROTO_UDP
    };
    if !wanted {
        return ALLOW;
    }
    let addr = read_addr(sa, family);
    let mapped = family == Family::V6 && is_v4_mapped(&addr);
    let at = Target {
        addr,
        port: u16::from_be(raw_port as u16),
        proto,
        v4: family == Family::V4 || mapped,
        mapped,
    };
    // No frontend has this address and (IPv4) it is outside the service
    // address space: what `unserved` would answer, without the lookups
    // (and, for IPv4, before asking whose socket it is: the answer is
    // the same for every caller).
    if at.v4 && !maps::may_be_served_v4(at.v4_addr()) {
        return ALLOW;
    }
    let config = maps::config();
    let Some(who) = caller(ctx, &config) else {
        return ALLOW;
    };
    if !at.v4 && !maps::may_be_frontend_v6(&at.addr) {
        return unserved(&at);
    }
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let h = jhash_3words(
        cookie as u32,
        (cookie >> 32) as u32,
        u32::from(at.port),
        config.hash_seed,
    );
    let picked = if config.flags() & CFG_F_SOCK_PICKS != 0 {
        from_picks(&at, h)
    } else {
        None
    };
    let chosen = match picked {
        Some(chosen) => {
            if who != Caller::Node && datagram && tracked_by_tc(sa, family, &at) {
                count(Stat::SockLeftToTc);
                return ALLOW;
            }
            count(Stat::SockPicked);
            chosen
        }
        None => match general(ctx, sa, family, &at, who, &config, datagram, h) {
            Ok(chosen) => chosen,
            Err(verdict) => return verdict,
        },
    };
    write_addr(sa, family, &chosen.addr, chosen.port);
    record(family, &at, cookie, &chosen);
    count(Stat::SockConnect);
    if who != Caller::Node {
        count(Stat::SockPodConnect);
    }
    ALLOW
}

/// The general path of `connect`: the master entry, its flags, a pick
/// among its slots and the backend the slot names. `Err` is the call's
/// verdict when the socket goes to no backend (refused, left to the TC
/// path, a dangling slot).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn general(
    ctx: &SockAddrContext,
    sa: *mut bpf_sock_addr,
    family: Family,
    at: &Target,
    who: Caller,
    config: &Config,
    datagram: bool,
    h: u32,
) -> Result<Chosen, i32> {
    let Some(mut master) = service(at, 0, SCOPE_EXTERNAL) else {
        return Err(unserved(at));
    };
    if who == Caller::Node {
        if master.flags & SVC_F_NODE_DENIED != 0 {
            // loadBalancerSourceRanges without a node address: kube-proxy
            // drops the node's packets, so the caller would time out.
            count(Stat::SourceDenied);
            events::sock(Stat::SourceDenied, &at.addr, at.port, at.proto, at.v4);
            // SAFETY: plain helper call; sets the errno the syscall returns.
            unsafe { bpf_set_retval(-ETIMEDOUT) };
            return Err(REJECT);
        }
    } else if master.flags & SVC_F_SOURCE_RANGES != 0 || (datagram && tracked_by_tc(sa, family, at))
    {
        // The TC path sees the pod's source address and the flow's
        // conntrack entry: it gives the answer.
        count(Stat::SockLeftToTc);
        return Err(ALLOW);
    }
    // The node, and pods when local-traffic detection is configured, are
    // inside the cluster: an externalTrafficPolicy Local frontend gives
    // them every endpoint (kube-proxy's short-circuit).
    let local = who == Caller::Node || config.flags() & CFG_F_SOCK_PODS_LOCAL != 0;
    let mut scope = SCOPE_EXTERNAL;
    if local && master.flags & SVC_F_INTERNAL != 0 {
        if let Some(internal) = service(at, 0, SCOPE_INTERNAL) {
            master = internal;
            scope = SCOPE_INTERNAL;
        }
    }
    let slots = match candidates(master) {
        Pick::Slots(first, n) => (first, n),
        Pick::Drop => {
            // kube-proxy drops the connection's packets, so the caller
            // would time out: say so at once.
            count(Stat::NoBackendDrop);
            events::sock(Stat::NoBackendDrop, &at.addr, at.port, at.proto, at.v4);
            // SAFETY: plain helper call; sets the errno the syscall returns.
            unsafe { bpf_set_retval(-ETIMEDOUT) };
            return Err(REJECT);
        }
        Pick::Reject => {
            count(Stat::SockRefused);
            events::sock(Stat::SockRefused, &at.addr, at.port, at.proto, at.v4);
            // SAFETY: plain helper call; sets the errno the syscall returns.
            unsafe { bpf_set_retval(-ECONNREFUSED) };
            return Err(REJECT);
        }
    };
    let backend_id = pick(at, who, master, scope, slots, h);
    let Some(backend) = maps::backend(backend_id) else {
        count(Stat::Dangling);
        crate::log::socket_dangling(ctx, backend_id);
        events::sock(Stat::Dangling, &at.addr, at.port, at.proto, at.v4);
        return Err(ALLOW);
    };
    if (backend.family == FAMILY_V4) != at.v4 {
        count(Stat::Dangling);
        events::sock(Stat::Dangling, &at.addr, at.port, at.proto, at.v4);
        return Err(ALLOW);
    }
    Ok(Chosen {
        backend_id,
        svc_id: master.svc_id,
        addr: socket_view(backend, at.mapped),
        port: backend.port,
    })
}

/// Records where socket `cookie` went: its `sl_socktab` slot or `sl_sock`
/// entry (TCP), or its `sl_sock` and `sl_sockrev` entries (UDP).
#[inline(always)]
fn record(family: Family, at: &Target, cookie: u64, chosen: &Chosen) {
    let proto = at.proto;
    let mut entry = SockEntry {
        backend_id: chosen.backend_id,
        svc_id: chosen.svc_id,
        backend: chosen.addr,
        frontend: at.addr,
        backend_port: chosen.port,
        frontend_port: at.port,
        proto,
        family: match family {
            Family::V4 => FAMILY_V4,
            Family::V6 => FAMILY_V6,
        },
        _pad: [0; 2],
    };
    if proto == IPPROTO_TCP {
        // Counted in `sl_sockmark` once it is in. While the counts are
        // valid the entry goes to the socket's `sl_socktab` slot unless
        // another socket holds it; otherwise (and before) to `sl_sock`. A
        // socket that connects twice to `sl_sock` is counted twice: counts
        // are never rebased, so its slot looks `sl_sock` up at every close
        // from then on (safe, slower).
        entry.set_counted();
        let slot = mark_slot(cookie);
        let claim = if maps::sock_marks_valid() {
            maps::sock_table_claim(cookie, &entry)
        } else {
            // A slot this socket held (it connects again) goes: its new
            // entry is `sl_sock`'s, and the slot's count with it.
            if maps::sock_table_release(cookie, false) == Held::Yes {
                maps::add_sock_mark(slot, u64::MAX);
            }
            Claim::Busy
        };
        let in_table = match claim {
            Claim::Taken => {
                // A socket that went to `sl_sock` before (its slot was
                // another's) and connects again: its older entry goes, so
                // that it has one. Only where its cookie's count says an
                // entry may be (while the counts are valid every TCP entry
                // is counted): no hash lookup for most sockets.
                if maps::sock_mark(slot) != 0 && SOCKETS.remove(cookie).is_ok() {
                    maps::add_sock_mark(slot, u64::MAX);
                }
                maps::add_sock_mark(slot, 1);
                true
            }
            Claim::Again => true,
            Claim::Busy => false,
        };
        // The validity gone since it was read: the agent's move may have
        // passed this slot already. Given back (unless the agent moves or
        // moved it: then its copy in `sl_sock` holds the count), the entry
        // goes to `sl_sock`, where an older release looks.
        let moved_out = in_table
            && !maps::sock_marks_valid()
            && maps::sock_table_release(cookie, false) == Held::Yes;
        if moved_out {
            if SOCKETS.insert(cookie, entry, BPF_ANY as u64).is_err() {
                maps::add_sock_mark(slot, u64::MAX);
            }
        } else if !in_table && SOCKETS.insert(cookie, entry, BPF_ANY as u64).is_ok() {
            maps::add_sock_mark(slot, 1);
        }
    } else {
        let _ = SOCKETS.insert(cookie, entry, BPF_ANY as u64);
        let rev_key = SockRevKey {
            cookie,
            backend: chosen.addr,
            port: chosen.port,
            _pad: [0; 6],
        };
        let rev = SockRevValue {
            frontend: at.addr,
            port: at.port,
            _pad: [0; 2],
        };
        // A TCP socket has one peer, which `reverse` finds in `sl_sock`; a
        // UDP socket may send to several frontends, one reverse entry each.
        let _ = SOCK_REV.insert(rev_key, rev, BPF_ANY as u64);
    }
}

/// `getpeername()` and UDP `recvmsg()`: a backend address the socket was
/// sent to reads as the frontend it asked for.
#[inline(always)]
pub fn reverse(ctx: &SockAddrContext, family: Family) -> i32 {
    if caller(ctx, &maps::config()).is_none() {
        return ALLOW;
    }
    let sa = ctx.sock_addr;
    // SAFETY: reading a field of the program's context.
    let port = u16::from_be(unsafe { (*sa).user_port } as u16);
    // Only a backend's port can be one the socket was sent to.
    if !maps::may_be_backend_port(port) {
        return ALLOW;
    }
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let backend = read_addr(sa, family);
    // SAFETY: reading a field of the program's context.
    if unsafe { (*sa).protocol } as u8 == IPPROTO_TCP {
        // Its one peer is in its `sl_socktab` slot or in `sl_sock` (0.1.0
        // wrote a reverse entry too).
        // While the agent moves the slot, an `sl_sock` entry is its copy or
        // newer (the socket connected again meanwhile): read first.
        let from_sock = || {
            SOCKETS.get_ptr(cookie).map(|e| {
                // SAFETY: the pointer comes from a successful lookup; copied at once.
                unsafe { *e }
            })
        };
        let e = match maps::sock_table_entry(cookie) {
            Some((e, false)) => e,
            Some((e, true)) => from_sock().unwrap_or(e),
            None => match from_sock() {
                Some(e) => e,
                None => return ALLOW,
            },
        };
        if e.backend == backend && e.backend_port == port {
            write_addr(sa, family, &e.frontend, e.frontend_port);
        }
        return ALLOW;
    }
    let key = SockRevKey {
        cookie,
        backend,
        port,
        _pad: [0; 6],
    };
    if let Some(rev) = SOCK_REV.get_ptr(key) {
        // SAFETY: the pointer comes from a successful lookup; copied at once.
        let (frontend, port) = unsafe { ((*rev).frontend, (*rev).port) };
        write_addr(sa, family, &frontend, port);
    }
    ALLOW
}

/// A socket closes: its entries go (the drain manager then stops counting
/// it as a live flow of its backend).
#[inline(always)]
pub fn release(ctx: &SockContext) -> i32 {
    // SAFETY: reading a field of the program's context.
    let proto = unsafe { (*ctx.sock).protocol };
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let slot = mark_slot(cookie);
    // A TCP socket whose slot counts no entry was never balanced, while
    // the counts are valid (`sluice_common::socket`): no lookup in the
    // big `sl_sock`. This holds for an entry whatever became of its
    // backend's port (an orphan, or a socket that disconnected with
    // `AF_UNSPEC` and connected elsewhere), which a check of the peer's
    // port would not. Until the counts are valid, every TCP socket looks.
    // (A UDP socket always looks: it may have sent to a service before
    // its last peer.)
    if proto == u32::from(IPPROTO_TCP) {
        let marks = maps::sock_marks(slot);
        if let SockMarks::Unmarked = marks {
            return ALLOW;
        }
        // Its `sl_socktab` slot, given back with its count. One the agent
        // was moving may have a copy in `sl_sock` already (one count for
        // both); an `sl_sock` entry a socket holding a slot may have
        // beside it (it connected there first) is left to the LRU.
        match maps::sock_table_release(cookie, true) {
            Held::Yes => {
                maps::add_sock_mark(slot, u64::MAX);
                return ALLOW;
            }
            Held::Moving => {
                maps::add_sock_mark(slot, u64::MAX);
                let _ = SOCKETS.remove(cookie);
                return ALLOW;
            }
            Held::No => {}
        }
        if let SockMarks::Marked = marks {
            // While the counts are valid every TCP entry is counted (the
            // agent validated that none was not, and since then only this
            // build's `connect` has written TCP entries, counted; a
            // stopping agent clears the validity before an older
            // release's programs can run), and a TCP socket has no reverse
            // entry: one delete, no lookup first.
            if SOCKETS.remove(cookie).is_ok() {
                maps::add_sock_mark(slot, u64::MAX);
            }
            return ALLOW;
        }
    }
    if let Some(e) = SOCKETS.get_ptr(cookie) {
        // SAFETY: the pointer comes from a successful lookup.
        let e = unsafe { *e };
        // A TCP socket has no reverse entry (one that 0.1.0 wrote goes with
        // the agent's next scan: its socket is gone from `sl_sock`).
        if e.proto != IPPROTO_TCP {
            let _ = SOCK_REV.remove(SockRevKey {
                cookie,
                backend: e.backend,
                port: e.backend_port,
                _pad: [0; 6],
            });
        }
        // Its count goes with the entry that held it (an entry the LRU
        // evicted first leaves its count: too high, never too low).
        if SOCKETS.remove(cookie).is_ok() && e.counted() {
            maps::add_sock_mark(slot, u64::MAX);
        }
    }
    ALLOW
}
