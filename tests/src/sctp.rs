//! SCTP on a kernel without SCTP sockets: packets crafted and read over raw
//! IP sockets (`socket(AF_INET[6], SOCK_RAW, IPPROTO_SCTP)` works without
//! the SCTP module; a raw socket bound to the protocol also keeps the
//! kernel from answering with "protocol unreachable").
//!
//! A client sends INIT chunks with a valid CRC32c and collects the
//! INIT-ACKs; a backend ([`Responder`]) answers every INIT to its port
//! with an INIT-ACK. Both check every CRC32c they receive: the kernel
//! checks none here, so these checks are what proves the datapath's
//! checksum updates. IPv4 raw sockets deliver the IP header (source and
//! destination are checked); IPv6 ones deliver the payload only, with the
//! source address (a packet reaching the backend's namespace at all was
//! routed to its address).
//!
//! The sockets are driven through `std::net::UdpSocket`, whose
//! `send_to`/`recv_from` are plain `sendto`/`recvfrom` on any datagram
//! socket.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};

use crate::{
    clients::{ext_headers, ExtHeaders},
    netns::Netns,
};

/// IP protocol number of SCTP.
pub const IPPROTO_SCTP: i32 = 132;
/// Chunk types.
pub const INIT: u8 = 1;
pub const INIT_ACK: u8 = 2;
pub const ABORT: u8 = 6;

/// CRC32c (Castagnoli, reflected), computed bit by bit.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An SCTP packet with one INIT or INIT-ACK chunk (no parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub sport: u16,
    pub dport: u16,
    pub vtag: u32,
    pub chunk: u8,
    /// The chunk's Initiate Tag: the peer's verification tag from now on.
    pub init_tag: u32,
}

impl Packet {
    /// The wire form, checksum included (CRC32c over the packet with a
    /// zero checksum field, stored little-endian, as Linux does).
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(32);
        p.extend_from_slice(&self.sport.to_be_bytes());
        p.extend_from_slice(&self.dport.to_be_bytes());
        p.extend_from_slice(&self.vtag.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        // Chunk: type, flags, length 20; initiate tag, a_rwnd, outbound
        // and inbound streams, initial TSN.
        p.extend_from_slice(&[self.chunk, 0, 0, 20]);
        p.extend_from_slice(&self.init_tag.to_be_bytes());
        p.extend_from_slice(&65536u32.to_be_bytes());
        p.extend_from_slice(&[0, 10, 0, 10]);
        p.extend_from_slice(&self.init_tag.wrapping_add(1).to_be_bytes());
        let sum = crc32c(&p);
        p[8..12].copy_from_slice(&sum.to_le_bytes());
        p
    }

    /// Parses an SCTP packet; the second value says whether its CRC32c is
    /// valid.
    pub fn decode(p: &[u8]) -> Option<(Packet, bool)> {
        if p.len() < 20 {
            return None;
        }
        let mut zeroed = p.to_vec();
        zeroed[8..12].fill(0);
        let stored = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
        let be16 = |i: usize| u16::from_be_bytes([p[i], p[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        Some((
            Packet {
                sport: be16(0),
                dport: be16(2),
                vtag: be32(4),
                chunk: p[12],
                init_tag: be32(16),
            },
            stored == crc32c(&zeroed),
        ))
    }
}

/// One SCTP packet a raw socket received.
#[derive(Clone, Copy, Debug)]
pub struct Received {
    pub src: IpAddr,
    /// The destination address (IPv4 only: IPv6 raw sockets do not show
    /// the header).
    pub dst: Option<IpAddr>,
    pub packet: Packet,
    pub crc_ok: bool,
    /// The checksum field as received (little-endian CRC32c).
    pub checksum: u32,
}

/// A raw SCTP socket of the family of `v6`, in the calling thread's netns.
fn raw_socket(v6: bool) -> std::io::Result<UdpSocket> {
    raw_socket_ext(v6, None)
}

/// `raw_socket`, its IPv6 packets carrying the extension headers `ext`.
fn raw_socket_ext(v6: bool, ext: Option<ExtHeaders>) -> std::io::Result<UdpSocket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let socket = Socket::new(domain, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))?;
    if let Some(which) = ext {
        ext_headers(&socket, which)?;
    }
    socket.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(UdpSocket::from(socket))
}

/// Receives one SCTP packet (`None` on timeout).
fn receive(sock: &UdpSocket, v6: bool) -> std::io::Result<Option<Received>> {
    let mut buf = [0u8; 2048];
    let (n, from) = match sock.recv_from(&mut buf) {
        Ok(r) => r,
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let data = &buf[..n];
    let (dst, payload) = if v6 {
        (None, data)
    } else {
        let ihl = usize::from(data.first().copied().unwrap_or(0) & 0x0f) * 4;
        if data.len() < ihl.max(20) {
            return Ok(None);
        }
        let dst = Ipv4Addr::new(data[16], data[17], data[18], data[19]);
        (Some(IpAddr::V4(dst)), &data[ihl..])
    };
    Ok(Packet::decode(payload).map(|(packet, crc_ok)| Received {
        src: from.ip(),
        dst,
        packet,
        crc_ok,
        checksum: u32::from_le_bytes([payload[8], payload[9], payload[10], payload[11]]),
    }))
}

fn send(sock: &UdpSocket, to: IpAddr, packet: &Packet) -> std::io::Result<()> {
    sock.send_to(&packet.encode(), SocketAddr::new(to, 0))?;
    Ok(())
}

/// A backend answering every INIT to `port` with an INIT-ACK (from
/// `port`, to the INIT's source, with the INIT's initiate tag as its
/// verification tag and `tag_base | sport` as its own initiate tag),
/// recording every packet it received. Stops on drop.
pub struct Responder {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Received>>>,
    handle: Option<thread::JoinHandle<std::io::Result<std::io::Result<()>>>>,
}

impl Responder {
    pub fn start(ns: &Netns, v6: bool, port: u16, tag_base: u32) -> Result<Self> {
        Self::start_ext(ns, v6, port, tag_base, None)
    }

    /// `start`, the answers carrying the IPv6 extension headers `ext`.
    pub fn start_ext(
        ns: &Netns,
        v6: bool,
        port: u16,
        tag_base: u32,
        ext: Option<ExtHeaders>,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let handle = ns.spawn(move || -> std::io::Result<()> {
            let sock = match raw_socket_ext(v6, ext) {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            while !stop2.load(Ordering::Relaxed) {
                let Some(got) = receive(&sock, v6)? else {
                    continue;
                };
                if let Ok(mut seen) = seen2.lock() {
                    seen.push(got);
                }
                let p = got.packet;
                if p.chunk == INIT && p.dport == port && got.crc_ok {
                    let answer = Packet {
                        sport: port,
                        dport: p.sport,
                        vtag: p.init_tag,
                        chunk: INIT_ACK,
                        init_tag: tag_base | u32::from(p.sport),
                    };
                    send(&sock, got.src, &answer)?;
                }
            }
            Ok(())
        });
        match ready_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("raw SCTP socket in {}: {e}", ns.name()),
            Err(_) => bail!("responder in {} did not start", ns.name()),
        }
        Ok(Self {
            stop,
            seen,
            handle: Some(handle),
        })
    }

    /// Every SCTP packet received so far.
    pub fn seen(&self) -> Vec<Received> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The initiate tag a client puts in the INIT it sends from `sport`.
pub fn client_tag(sport: u16) -> u32 {
    0xc11e_0000 | u32::from(sport)
}

/// Sends an INIT to `to` from each source port in `sports` (from inside
/// `ns`) and waits up to `timeout` for the INIT-ACKs. Returns the INIT-ACK
/// each source port got (addressed to it, with its initiate tag as the
/// verification tag), keyed by source port; ports without one are absent.
pub fn init_exchange(
    ns: &Netns,
    to: SocketAddr,
    sports: &[u16],
    timeout: Duration,
) -> Result<BTreeMap<u16, Received>> {
    init_exchange_ext(ns, to, sports, timeout, None)
}

/// `init_exchange`, the INITs carrying the IPv6 extension headers `ext`.
pub fn init_exchange_ext(
    ns: &Netns,
    to: SocketAddr,
    sports: &[u16],
    timeout: Duration,
    ext: Option<ExtHeaders>,
) -> Result<BTreeMap<u16, Received>> {
    let sports = sports.to_vec();
    let v6 = to.is_ipv6();
    ns.run(move || -> std::io::Result<BTreeMap<u16, Received>> {
        let sock = raw_socket_ext(v6, ext)?;
        for &sport in &sports {
            let init = Packet {
                sport,
                dport: to.port(),
                vtag: 0,
                chunk: INIT,
                init_tag: client_tag(sport),
            };
            send(&sock, to.ip(), &init)?;
        }
        let mut answers = BTreeMap::new();
        let deadline = Instant::now() + timeout;
        while answers.len() < sports.len() && Instant::now() < deadline {
            let Some(got) = receive(&sock, v6)? else {
                continue;
            };
            let p = got.packet;
            if p.chunk == INIT_ACK && sports.contains(&p.dport) && p.vtag == client_tag(p.dport) {
                answers.insert(p.dport, got);
            }
        }
        Ok(answers)
    })?
    .context("SCTP INIT exchange")
}

/// Sends raw SCTP packets (wire form, checksum as given) to `to` from
/// inside `ns`.
pub fn send_raw(ns: &Netns, to: IpAddr, packets: &[Vec<u8>]) -> Result<()> {
    let packets = packets.to_vec();
    ns.run(move || -> std::io::Result<()> {
        let sock = raw_socket(to.is_ipv6())?;
        for p in &packets {
            sock.send_to(p, SocketAddr::new(to, 0))?;
        }
        Ok(())
    })?
    .context("sending raw SCTP")
}
