//! Socket-level balancing for the node's own processes: traffic from the
//! node never crosses a TC ingress hook, so its connections are sent to a
//! backend when the socket connects (or, for unconnected UDP, per
//! datagram), and the service address is put back where the application
//! looks (`getpeername`, UDP `recvmsg`). Attached to a cgroup, these
//! programs act only on sockets of the node's network namespace.

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::{SockAddrContext, SockContext},
    EbpfContext,
};
use sluice_common::{
    hash::{jhash_3words, pick_slot},
    SockEntry, SockRevKey, SockRevValue, Stat, Svc4Key, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::maps::{self, count, SOCKETS_V4, SOCK_REV_V4};

/// What cgroup socket-address programs return to let the call proceed.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// Whether the socket belongs to the node's own network namespace.
#[inline(always)]
fn ours<C: EbpfContext>(ctx: &C) -> bool {
    let cookie = maps::config().netns_cookie;
    // SAFETY: plain helper call on the program's context.
    cookie != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == cookie
}

/// `connect()` (TCP, UDP) and, with `datagram`, `sendmsg()` on unconnected
/// UDP sockets: a frontend address becomes a backend address.
#[inline(always)]
pub fn connect(ctx: &SockAddrContext, datagram: bool) -> i32 {
    if !ours(ctx) {
        return ALLOW;
    }
    let sa = ctx.sock_addr;
    // SAFETY: reading fields of the program's context.
    let (proto, ip, raw_port) = unsafe { ((*sa).protocol as u8, (*sa).user_ip4, (*sa).user_port) };
    let wanted = if datagram {
        proto == IPPROTO_UDP
    } else {
        proto == IPPROTO_TCP || proto == IPPROTO_UDP
    };
    if !wanted {
        return ALLOW;
    }
    let addr = ip.to_ne_bytes();
    let port = u16::from_be(raw_port as u16);
    let Some(master) = maps::service(&Svc4Key::new(addr, port, proto, 0)) else {
        return ALLOW;
    };
    let (first, n) = if master.active > 0 {
        (1, master.active)
    } else if master.fallback > 0 {
        (1 + master.active, master.fallback)
    } else {
        count(Stat::SockRefused);
        // SAFETY: plain helper call; sets the errno the syscall returns.
        unsafe { bpf_set_retval(-ECONNREFUSED) };
        return REJECT;
    };
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let h = jhash_3words(
        cookie as u32,
        (cookie >> 32) as u32,
        u32::from(port),
        maps::config().hash_seed,
    );
    let slot = pick_slot(h, first, n);
    let Some(slot) = maps::service(&Svc4Key::new(addr, port, proto, slot)) else {
        count(Stat::Dangling);
        return ALLOW;
    };
    let Some(backend) = maps::backend(slot.backend_id) else {
        count(Stat::Dangling);
        return ALLOW;
    };
    let baddr = backend.addr_v4();
    // SAFETY: connect4 and sendmsg4 may rewrite the destination.
    unsafe {
        (*sa).user_ip4 = u32::from_ne_bytes(baddr);
        (*sa).user_port = u32::from(backend.port.to_be());
    }
    let entry = SockEntry {
        backend_id: slot.backend_id,
        svc_id: master.svc_id,
        backend: baddr,
        frontend: addr,
        backend_port: backend.port,
        frontend_port: port,
        proto,
        _pad: [0; 3],
    };
    let rev_key = SockRevKey {
        cookie,
        backend: baddr,
        port: backend.port,
        _pad: [0; 2],
    };
    let rev = SockRevValue {
        frontend: addr,
        port,
        _pad: [0; 2],
    };
    let _ = SOCKETS_V4.insert(cookie, entry, BPF_ANY as u64);
    let _ = SOCK_REV_V4.insert(rev_key, rev, BPF_ANY as u64);
    count(Stat::SockConnect);
    ALLOW
}

/// `getpeername()` and UDP `recvmsg()`: a backend address the socket was
/// sent to reads as the frontend it asked for.
#[inline(always)]
pub fn reverse(ctx: &SockAddrContext) -> i32 {
    if !ours(ctx) {
        return ALLOW;
    }
    let sa = ctx.sock_addr;
    // SAFETY: reading fields of the program's context.
    let (ip, raw_port) = unsafe { ((*sa).user_ip4, (*sa).user_port) };
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey {
        cookie,
        backend: ip.to_ne_bytes(),
        port: u16::from_be(raw_port as u16),
        _pad: [0; 2],
    };
    if let Some(rev) = SOCK_REV_V4.get_ptr(key) {
        // SAFETY: the pointer comes from a successful lookup; these hooks
        // may rewrite the address they report.
        unsafe {
            (*sa).user_ip4 = u32::from_ne_bytes((*rev).frontend);
            (*sa).user_port = u32::from((*rev).port.to_be());
        }
    }
    ALLOW
}

/// A socket closes: its entries go (the drain manager then stops counting
/// it as a live flow of its backend).
#[inline(always)]
pub fn release(ctx: &SockContext) -> i32 {
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some(e) = SOCKETS_V4.get_ptr(cookie) {
        // SAFETY: the pointer comes from a successful lookup.
        let (backend, port) = unsafe { ((*e).backend, (*e).backend_port) };
        let _ = SOCK_REV_V4.remove(SockRevKey {
            cookie,
            backend,
            port,
            _pad: [0; 2],
        });
        let _ = SOCKETS_V4.remove(cookie);
    }
    ALLOW
}
