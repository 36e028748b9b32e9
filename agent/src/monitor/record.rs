//! One datapath event decoded for people and tools: addresses as text, the
//! reason and hook by name, the backend resolved through `sl_backends`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;
use sluice_common::{Event, Hook, FAMILY_V4, FAMILY_V6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};

/// An event as `sluice monitor` prints it (`--json`: one per line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Record {
    /// Wall-clock time, RFC 3339 in UTC with milliseconds.
    pub time: String,
    /// The counter this verdict counts (`sluice status`).
    pub reason: String,
    /// `ingress`, `egress`, `socket`, or `tc` (an error whose direction
    /// was not kept).
    pub hook: &'static str,
    /// `ipv4`, `ipv6`, or null for an event without a tuple.
    pub family: Option<&'static str>,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, or the number.
    pub proto: Option<String>,
    pub src: Option<IpAddr>,
    pub sport: Option<u16>,
    pub dst: Option<IpAddr>,
    pub dport: Option<u16>,
    /// The frontend the packet was for (`dst:dport`), for ingress and
    /// socket events.
    pub frontend: Option<String>,
    /// Service port id (`sluice lb list` shows it), when one was known.
    pub svc_id: Option<u32>,
    /// `sl_backends` id and its address, when one was picked.
    pub backend_id: Option<u32>,
    pub backend: Option<String>,
    /// The device (`skb->ifindex`); null for sockets.
    pub ifindex: Option<u32>,
}

/// Decodes the bytes of one ring buffer record.
pub fn parse(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<Event>() {
        return None;
    }
    // SAFETY: `Event` is plain old data (`repr(C)`, every bit pattern
    // valid) and `bytes` holds at least its size; the read is unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) })
}

fn addr(family: u8, a: &[u8; 16]) -> Option<IpAddr> {
    match family {
        FAMILY_V4 => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
        FAMILY_V6 => Some(IpAddr::V6(Ipv6Addr::from(*a))),
        _ => None,
    }
}

/// Protocol name.
pub fn proto_name(proto: u8, family: u8) -> String {
    match proto {
        IPPROTO_TCP => "tcp".into(),
        IPPROTO_UDP => "udp".into(),
        IPPROTO_SCTP => "sctp".into(),
        1 => "icmp".into(),
        58 if family == FAMILY_V6 => "icmpv6".into(),
        n => n.to_string(),
    }
}

fn some_nonzero(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

/// The record of `event`, stamped `time`, with `backend` the address of
/// its backend if `sl_backends` still has it.
pub fn record(event: &Event, time: String, backend: Option<SocketAddr>) -> Record {
    let hook = Hook::from_u8(event.hook);
    let reason = event.stat().map_or_else(
        || format!("reason_{}", event.reason),
        |s| s.name().to_owned(),
    );
    let family = match event.family {
        FAMILY_V4 => Some("ipv4"),
        FAMILY_V6 => Some("ipv6"),
        _ => None,
    };
    let tuple = family.is_some();
    let src = addr(event.family, &event.src);
    let dst = addr(event.family, &event.dst);
    let socket = hook == Some(Hook::Socket);
    let ports = tuple && event.proto != 1 && event.proto != 58;
    let frontend = match (hook, dst) {
        (Some(Hook::Ingress | Hook::Xdp | Hook::Socket), Some(dst)) if ports => {
            Some(SocketAddr::new(dst, event.dport).to_string())
        }
        (Some(Hook::Ingress | Hook::Xdp), Some(dst)) => Some(dst.to_string()),
        _ => None,
    };
    Record {
        time,
        reason,
        hook: hook.map_or("unknown", Hook::name),
        family,
        proto: tuple.then(|| proto_name(event.proto, event.family)),
        src: if socket { None } else { src },
        sport: (ports && !socket).then_some(event.sport),
        dst,
        dport: ports.then_some(event.dport),
        frontend,
        svc_id: some_nonzero(event.svc_id),
        backend_id: some_nonzero(event.backend_id),
        backend: backend.map(|b| b.to_string()),
        ifindex: some_nonzero(event.ifindex),
    }
}

fn endpoint(a: Option<IpAddr>, port: Option<u16>) -> String {
    match (a, port) {
        (Some(a), Some(p)) => SocketAddr::new(a, p).to_string(),
        (Some(a), None) => a.to_string(),
        (None, _) => "-".into(),
    }
}

/// One line of text.
pub fn line(r: &Record) -> String {
    let mut out = format!("{} {:<8} {:<20}", r.time, r.hook, r.reason);
    if let Some(proto) = &r.proto {
        out.push_str(&format!(
            " {proto} {} -> {}",
            endpoint(r.src, r.sport),
            endpoint(r.dst, r.dport)
        ));
    }
    if let Some(id) = r.svc_id {
        out.push_str(&format!(" svc_id={id}"));
    }
    match (&r.backend, r.backend_id) {
        (Some(b), Some(id)) => out.push_str(&format!(" backend={b} (id {id})")),
        (None, Some(id)) => out.push_str(&format!(" backend_id={id}")),
        _ => {}
    }
    if let Some(i) = r.ifindex {
        out.push_str(&format!(" if={i}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::Stat;

    fn event() -> Event {
        let mut e = Event {
            reason: Stat::NoBackend as u8,
            hook: Hook::Ingress as u8,
            family: FAMILY_V4,
            proto: IPPROTO_TCP,
            sport: 40000,
            dport: 80,
            svc_id: 3,
            ifindex: 7,
            ..Event::default()
        };
        e.src[..4].copy_from_slice(&[10, 0, 0, 2]);
        e.dst[..4].copy_from_slice(&[10, 96, 0, 10]);
        e
    }

    #[test]
    fn an_ingress_event_names_its_frontend_and_reason() {
        let r = record(&event(), "t".into(), None);
        assert_eq!(r.reason, "no_backend");
        assert_eq!(r.hook, "ingress");
        assert_eq!(r.frontend.as_deref(), Some("10.96.0.10:80"));
        assert_eq!(r.src, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(r.backend_id, None);
        assert_eq!(
            line(&r),
            "t ingress  no_backend           tcp 10.0.0.2:40000 -> 10.96.0.10:80 svc_id=3 if=7"
        );
    }

    #[test]
    fn bytes_round_trip() {
        let e = event();
        // SAFETY: reading a plain-old-data value's bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&e as *const Event).cast::<u8>(), size_of::<Event>())
        };
        assert_eq!(parse(bytes), Some(e));
        assert_eq!(parse(&bytes[..10]), None);
    }
}
