//! Clients that run inside a pod namespace.

use std::{
    io::{self, BufRead, BufReader, Write},
    net::{Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};

use crate::{fuzz::packet, netns::Netns};

pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to `addr` and reads the greeting: the name of the backend
/// that answered.
pub fn hello(stream: TcpStream) -> io::Result<String> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before greeting",
        ));
    }
    Ok(line.trim_end().to_owned())
}

/// One TCP connection from inside `ns`: which backend answered. (Every
/// client takes an IPv4 or an IPv6 address.)
pub fn tcp_hello(ns: &Netns, addr: impl Into<SocketAddr>) -> Result<String> {
    let addr = addr.into();
    ns.run(move || TcpStream::connect_timeout(&addr, TIMEOUT).and_then(hello))?
        .with_context(|| format!("TCP hello to {addr}"))
}

/// `n` sequential TCP connections from inside `ns`, each with its own
/// outcome (the backend's name, or the error).
pub fn tcp_hellos(
    ns: &Netns,
    addr: impl Into<SocketAddr>,
    n: usize,
) -> Result<Vec<io::Result<String>>> {
    let addr = addr.into();
    ns.run(move || {
        (0..n)
            .map(|_| TcpStream::connect_timeout(&addr, TIMEOUT).and_then(hello))
            .collect()
    })
}

/// A local port for a one-datagram UDP client that no earlier one of this
/// process used: each such exchange is a flow of its own. An ephemeral
/// port may come back within a test (about 3% over 40 sockets), and its
/// datagram then follows the earlier flow's conntrack entry instead of
/// starting one, which tests counting new flows must not see. Below the
/// default ephemeral range (32768 and up), which the test namespaces keep,
/// so the kernel does not hand these out meanwhile.
fn fresh_udp_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    20_000 + NEXT.fetch_add(1, Ordering::Relaxed) % 10_000
}

/// The unspecified address of `addr`'s family, port `port`.
fn unspecified(addr: &SocketAddr, port: u16) -> SocketAddr {
    if addr.is_ipv6() {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from(([0, 0, 0, 0], port))
    }
}

/// A TCP connection from a fixed source port (SO_REUSEADDR), to exercise
/// source-port reuse.
pub fn tcp_hello_from_port(ns: &Netns, addr: impl Into<SocketAddr>, port: u16) -> Result<String> {
    let addr = addr.into();
    ns.run(move || -> io::Result<String> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.bind(&unspecified(&addr, port).into())?;
        socket.connect_timeout(&addr.into(), TIMEOUT)?;
        hello(socket.into())
    })?
    .with_context(|| format!("TCP hello to {addr} from port {port}"))
}

/// A long-lived connection that exchanges lines with an echoing backend.
pub struct Stream {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The backend that greeted this connection.
    pub backend: String,
    seq: u64,
}

impl Stream {
    pub fn connect(ns: &Netns, addr: impl Into<SocketAddr>) -> Result<Self> {
        Self::connect_ext(ns, addr, None)
    }

    /// `connect` from local port `port`.
    pub fn connect_from(ns: &Netns, port: u16, addr: impl Into<SocketAddr>) -> Result<Self> {
        let addr = addr.into();
        let stream = ns
            .run(move || -> io::Result<TcpStream> {
                let socket =
                    Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
                let local: SocketAddr = if addr.is_ipv6() {
                    (std::net::Ipv6Addr::UNSPECIFIED, port).into()
                } else {
                    (std::net::Ipv4Addr::UNSPECIFIED, port).into()
                };
                socket.bind(&local.into())?;
                socket.connect_timeout(&addr.into(), TIMEOUT)?;
                Ok(socket.into())
            })?
            .with_context(|| format!("connecting to {addr} from port {port}"))?;
        Self::greeted(stream)
    }

    /// `connect`, the connection's packets carrying the IPv6 extension
    /// headers `ext` (`ext_headers`).
    pub fn connect_ext(
        ns: &Netns,
        addr: impl Into<SocketAddr>,
        ext: Option<ExtHeaders>,
    ) -> Result<Self> {
        let addr = addr.into();
        let stream = ns
            .run(move || -> io::Result<TcpStream> {
                let Some(which) = ext else {
                    return TcpStream::connect_timeout(&addr, TIMEOUT);
                };
                let socket =
                    Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
                ext_headers(&socket, which)?;
                socket.connect_timeout(&addr.into(), TIMEOUT)?;
                Ok(socket.into())
            })?
            .with_context(|| format!("connecting to {addr}"))?;
        Self::greeted(stream)
    }

    /// Reads the backend's greeting of a connected stream.
    fn greeted(stream: TcpStream) -> Result<Self> {
        stream.set_read_timeout(Some(TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        let mut backend = String::new();
        reader.read_line(&mut backend)?;
        Ok(Self {
            reader,
            writer,
            backend: backend.trim_end().to_owned(),
            seq: 0,
        })
    }

    /// The client's end of the connection (its port names its conntrack
    /// entries), if the socket still knows it.
    pub fn local(&self) -> Option<SocketAddr> {
        self.writer.local_addr().ok()
    }

    /// Sends one line and expects it back.
    pub fn ping(&mut self) -> Result<()> {
        self.seq += 1;
        self.exchange(&format!("ping {}", self.seq))
    }

    /// Sends `text` (no newline in it) as one line and expects it back.
    pub fn exchange(&mut self, text: &str) -> Result<()> {
        let msg = format!("{text}\n");
        self.writer.write_all(msg.as_bytes())?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        if line != msg {
            if msg.len() > 80 {
                bail!(
                    "echo mismatch: sent {} bytes, got {}",
                    msg.len(),
                    line.len()
                );
            }
            bail!("echo mismatch: sent {msg:?}, got {line:?}");
        }
        Ok(())
    }

    /// The local (client) address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.writer.local_addr()?)
    }
}

/// One UDP request from inside `ns`: the answer and where it came from.
pub fn udp_hello(ns: &Netns, addr: impl Into<SocketAddr>) -> Result<(String, SocketAddr)> {
    let addr = addr.into();
    ns.run(move || -> io::Result<(String, SocketAddr)> {
        let socket = UdpSocket::bind(unspecified(&addr, fresh_udp_port()))?;
        socket.set_read_timeout(Some(TIMEOUT))?;
        // Not connected: a reply from any source is received and reported,
        // so a test can check that it carries the frontend address.
        socket.send_to(b"hello", addr)?;
        let mut buf = [0u8; 512];
        let (n, from) = socket.recv_from(&mut buf)?;
        Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
    })?
    .with_context(|| format!("UDP hello to {addr}"))
}

/// Which IPv6 extension headers `ext_headers` puts on a socket's packets.
#[derive(Clone, Copy, Debug)]
pub struct ExtHeaders {
    /// A hop-by-hop options header (`IPV6_HOPOPTS`).
    pub hop_by_hop: bool,
    /// A destination options header (`IPV6_DSTOPTS`; Linux puts it before
    /// a fragment header when there is no routing header).
    pub dst_opts: bool,
}

impl ExtHeaders {
    /// Both: hop-by-hop, then destination options, before the L4 header.
    pub const BOTH: ExtHeaders = ExtHeaders {
        hop_by_hop: true,
        dst_opts: true,
    };
}

/// Makes every packet the socket sends carry real IPv6 extension headers
/// (each an 8-byte header holding one PadN option), set with the sticky
/// socket options. A listening TCP socket passes them on to the
/// connections it accepts (their SYN-ACK included). Needs CAP_NET_RAW.
pub fn ext_headers(socket: &impl std::os::fd::AsRawFd, which: ExtHeaders) -> io::Result<()> {
    // Next header (filled in by the kernel), length 0 (8 bytes), PadN of
    // 4 bytes.
    let header: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
    let options = [
        (which.hop_by_hop, libc::IPV6_HOPOPTS),
        (which.dst_opts, libc::IPV6_DSTOPTS),
    ];
    for (on, option) in options {
        if !on {
            continue;
        }
        // SAFETY: a valid socket descriptor and a buffer of the given size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IPV6,
                option,
                header.as_ptr().cast(),
                header.len() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `tcp_hello` from a socket whose packets carry the extension headers
/// `which` (`ext_headers`).
pub fn tcp_hello_ext(ns: &Netns, addr: impl Into<SocketAddr>, which: ExtHeaders) -> Result<String> {
    let addr = addr.into();
    ns.run(move || -> io::Result<String> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        ext_headers(&socket, which)?;
        socket.connect_timeout(&addr.into(), TIMEOUT)?;
        hello(socket.into())
    })?
    .with_context(|| format!("TCP hello with extension headers to {addr}"))
}

/// A UDP datagram of `size` bytes from a socket whose packets carry the
/// extension headers `which` (`ext_headers`): the answer and where it
/// came from.
pub fn udp_hello_ext(
    ns: &Netns,
    addr: impl Into<SocketAddr>,
    size: usize,
    which: ExtHeaders,
) -> Result<(String, SocketAddr)> {
    let addr = addr.into();
    ns.run(move || -> io::Result<(String, SocketAddr)> {
        let socket = UdpSocket::bind(unspecified(&addr, fresh_udp_port()))?;
        ext_headers(&socket, which)?;
        socket.set_read_timeout(Some(TIMEOUT))?;
        socket.send_to(&vec![7u8; size], addr)?;
        let mut buf = [0u8; 512];
        let (n, from) = socket.recv_from(&mut buf)?;
        Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
    })?
    .with_context(|| format!("UDP datagram with extension headers to {addr}"))
}

/// Lets the kernel fragment this socket's IPv4 datagrams that exceed the
/// path MTU (`IP_MTU_DISCOVER` = `IP_PMTUDISC_DONT`: no DF bit, no
/// EMSGSIZE). IPv6 senders fragment at the source anyway.
pub fn allow_fragments(socket: &impl std::os::fd::AsRawFd, v6: bool) -> io::Result<()> {
    if v6 {
        return Ok(());
    }
    let value: libc::c_int = libc::IP_PMTUDISC_DONT;
    // SAFETY: a valid socket descriptor and an int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One answer of a `servers::udp_echo` that came back whole.
#[derive(Clone, Debug)]
pub struct Echo {
    /// The backend that answered.
    pub backend: String,
    /// The source address the backend saw.
    pub peer: std::net::IpAddr,
    /// Where the answer came from (the frontend, when reverse-NATed).
    pub from: SocketAddr,
}

/// `n` UDP datagrams of `size` bytes from inside `ns`, each from a socket
/// of its own, all open until the end (distinct source ports: distinct
/// flows), to a `servers::udp_echo`
/// at `addr`. A datagram larger than the MTU leaves in fragments, and so
/// does its echo. Each outcome is the echo, or an error if none came back
/// within the timeout or it did not carry the datagram byte for byte; the
/// first error ends the run (the rest would only wait out their timeouts).
pub fn udp_echoes(
    ns: &Netns,
    addr: impl Into<SocketAddr>,
    size: usize,
    n: usize,
) -> Result<Vec<io::Result<Echo>>> {
    let addr = addr.into();
    ns.run(move || {
        let mut open = Vec::with_capacity(n);
        (0..n)
            .map(|i| -> io::Result<Echo> {
                let socket = UdpSocket::bind(unspecified(&addr, 0))?;
                allow_fragments(&socket, addr.is_ipv6())?;
                socket.set_read_timeout(Some(TIMEOUT))?;
                let socket = {
                    open.push(socket);
                    &open[open.len() - 1]
                };
                let payload: Vec<u8> = (0..size).map(|k| (k * 7 + i) as u8).collect();
                // Not connected: an answer from any source is received and
                // reported, so a test can check that it carries the frontend.
                socket.send_to(&payload, addr)?;
                let mut buf = vec![0u8; 65_536];
                let (len, from) = socket.recv_from(&mut buf)?;
                let answer = &buf[..len];
                let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
                let nl = answer
                    .iter()
                    .position(|b| *b == b'\n')
                    .ok_or_else(|| bad("no header line"))?;
                let header = String::from_utf8_lossy(&answer[..nl]).into_owned();
                let (backend, peer) = header
                    .split_once(' ')
                    .ok_or_else(|| bad("header without peer"))?;
                if answer[nl + 1..] != payload[..] {
                    return Err(bad(&format!(
                        "echo of {} bytes differs from the {size} sent",
                        len - nl - 1
                    )));
                }
                Ok(Echo {
                    backend: backend.to_owned(),
                    peer: peer.parse().map_err(|_| bad("peer address"))?,
                    from,
                })
            })
            .scan(false, |failed, outcome| {
                if *failed {
                    return None;
                }
                *failed = outcome.is_err();
                Some(outcome)
            })
            .collect()
    })
}

/// The wall clock's time of day in UTC (`HH:MM:SS.mmm`), as the agent's
/// log lines carry it: puts a failure beside what the agent was doing.
pub fn utc_time_of_day() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = now.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        now.subsec_millis()
    )
}

/// What a prober thread returns: successes and failures.
type ProbeOutcome = std::io::Result<(u64, Vec<String>)>;

/// Keeps connecting to a service from inside a namespace until stopped,
/// counting successes and keeping every failure: the "a client keeps
/// connecting and sees zero failures" half of a scenario.
pub struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<ProbeOutcome>>,
}

impl Prober {
    /// One connection (with the greeting read) every `every`.
    pub fn start(ns: &Netns, addr: impl Into<SocketAddr>, every: Duration) -> Self {
        let addr = addr.into();
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = ns.spawn(move || {
            let begun = std::time::Instant::now();
            let (mut ok, mut failures) = (0u64, Vec::new());
            while !stop2.load(Ordering::Relaxed) {
                let started = std::time::Instant::now();
                let at = utc_time_of_day();
                // Which half failed tells a lost handshake from a flow
                // whose data went astray after it.
                let outcome = match TcpStream::connect_timeout(&addr, TIMEOUT) {
                    Err(e) => Err(format!("connect: {e}")),
                    Ok(s) => {
                        let local = s
                            .local_addr()
                            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
                        hello(s).map_err(|e| format!("greeting on {local} (connected): {e}"))
                    }
                };
                match outcome {
                    Ok(_) => ok += 1,
                    Err(e) => failures.push(format!(
                        "after {ok} ok, {:?} into the loop (at {at} UTC): {e} ({:?})",
                        started.duration_since(begun),
                        started.elapsed()
                    )),
                }
                std::thread::sleep(every);
            }
            (ok, failures)
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops and returns (successful connections, failures).
    pub fn finish(mut self) -> Result<(u64, Vec<String>)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let handle = self.handle.take().context("prober already finished")?;
        let outcome = handle
            .join()
            .map_err(|_| anyhow::anyhow!("prober panicked"))??;
        Ok(outcome)
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// An IPv6 UDP datagram `src:port -> dst:port_dst` with a type 0 routing
/// header (one address, `waypoint`) and `segments_left`, for a raw socket.
/// The UDP checksum is over the final destination: `waypoint` while a
/// segment is left, `dst` (where the header leads) when none is.
pub fn routed_udp(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    waypoint: Ipv6Addr,
    segments_left: u8,
    sport: u16,
    dport: u16,
) -> Vec<u8> {
    let last = if segments_left > 0 { waypoint } else { dst };
    let udp = packet::udp(
        &src.octets(),
        &last.octets(),
        sport,
        dport,
        b"routed",
        false,
    );
    let mut pkt = packet::ipv6_header(src.octets(), dst.octets(), 43, 24 + udp.len());
    // Routing header: UDP next, 24 bytes, type 0, segments left, reserved.
    pkt.extend_from_slice(&[packet::UDP, 2, 0, segments_left, 0, 0, 0, 0]);
    pkt.extend_from_slice(&waypoint.octets());
    pkt.extend_from_slice(&udp);
    pkt
}
