//! Servers that run inside a pod namespace and answer with the pod's name,
//! so a client knows which backend it reached.
//!
//! TCP: on accept, sends `<name>\n`, then echoes every line back until the
//! client closes. UDP: answers every datagram with `<name>` (the echo
//! server: with `<name> <peer>\n` and the datagram itself). The plain
//! functions listen on IPv4, the `6` ones on IPv6 only (`IPV6_V6ONLY`), so
//! that a dual-stack pod runs one of each on the same port.

use std::{
    io::{BufRead, BufReader, ErrorKind, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result};
use socket2::{Domain, Protocol, Socket, Type};

use crate::{
    clients::{ext_headers, ExtHeaders},
    netns::Netns,
    topology::Pod,
};

/// A running server; stops on drop.
pub struct Server {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    handle: Option<thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Connections accepted (TCP) or datagrams answered (UDP).
    pub fn served(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

const POLL: Duration = Duration::from_millis(20);

/// Starts a TCP greeter on `0.0.0.0:port` inside `ns`.
pub fn tcp_greeter(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    tcp_server(ns, any(false, port), name, false)
}

/// A TCP greeter on `0.0.0.0:port` in every backend pod of `topo`.
pub fn tcp_greeters(topo: &crate::Topology, port: u16) -> Result<Vec<Server>> {
    topo.backends
        .iter()
        .map(|b| tcp_greeter(&b.ns, port, &b.name))
        .collect()
}

/// Starts a TCP greeter on `[::]:port` (IPv6 only) inside `ns`.
pub fn tcp_greeter6(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    tcp_server(ns, any(true, port), name, false)
}

/// A TCP greeter of each family on `port` in every pod of `pods`, each
/// answering with its pod's name.
pub fn tcp_greeters_dual(pods: &[Pod], port: u16) -> Result<Vec<Server>> {
    let mut servers = Vec::new();
    for p in pods {
        servers.push(tcp_greeter(&p.ns, port, &p.name)?);
        servers.push(tcp_greeter6(&p.ns, port, &p.name)?);
    }
    Ok(servers)
}

/// `tcp_greeter6` whose packets (SYN-ACK on) carry the IPv6 extension
/// headers `which` (`clients::ext_headers`).
pub fn tcp_greeter6_ext(ns: &Netns, port: u16, name: &str, which: ExtHeaders) -> Result<Server> {
    serve_tcp(ns, any(true, port), name, false, Some(which))
}

/// `udp_greeter6` whose answers carry the IPv6 extension headers `which`.
pub fn udp_greeter6_ext(ns: &Netns, port: u16, name: &str, which: ExtHeaders) -> Result<Server> {
    serve_udp(ns, any(true, port), name, Some(which))
}

fn any(v6: bool, port: u16) -> SocketAddr {
    if v6 {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

/// A bound socket of `ty` on `addr`; IPv6 sockets take no IPv4 traffic.
fn bound(addr: SocketAddr, ty: Type) -> std::io::Result<Socket> {
    let proto = if ty == Type::STREAM {
        Protocol::TCP
    } else {
        Protocol::UDP
    };
    let socket = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if ty == Type::STREAM {
        // As std's TcpListener::bind: restartable despite TIME_WAIT.
        socket.set_reuse_address(true)?;
    }
    socket.bind(&addr.into())?;
    if ty == Type::STREAM {
        socket.listen(1024)?;
    }
    Ok(socket)
}

/// `bound`, with extension headers on the socket's packets.
fn bound_ext(addr: SocketAddr, ty: Type, ext: Option<ExtHeaders>) -> std::io::Result<Socket> {
    let socket = bound(addr, ty)?;
    if let Some(which) = ext {
        ext_headers(&socket, which)?;
    }
    Ok(socket)
}

/// Like `tcp_greeter`, but the greeting is `<name> <client address>`: what
/// source address the backend saw (to tell SNAT from a preserved client).
pub fn tcp_whoami(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    tcp_server(ns, any(false, port), name, true)
}

/// `tcp_whoami` on `[::]:port` (IPv6 only).
pub fn tcp_whoami6(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    tcp_server(ns, any(true, port), name, true)
}

fn tcp_server(ns: &Netns, addr: SocketAddr, name: &str, with_peer: bool) -> Result<Server> {
    serve_tcp(ns, addr, name, with_peer, None)
}

fn serve_tcp(
    ns: &Netns,
    addr: SocketAddr,
    name: &str,
    with_peer: bool,
    ext: Option<ExtHeaders>,
) -> Result<Server> {
    let listener: TcpListener = ns
        .run(move || bound_ext(addr, Type::STREAM, ext))?
        .with_context(|| format!("binding TCP {addr} in {}", ns.name()))?
        .into();
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let name = name.to_owned();
    let (stop2, accepted2) = (stop.clone(), accepted.clone());
    let handle = thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut stream, peer)) => {
                    accepted2.fetch_add(1, Ordering::Relaxed);
                    stream.set_nonblocking(false)?;
                    let greeting = if with_peer {
                        format!("{name} {}\n", peer.ip())
                    } else {
                        format!("{name}\n")
                    };
                    if stream.write_all(greeting.as_bytes()).is_err() {
                        continue;
                    }
                    let stop3 = stop2.clone();
                    thread::spawn(move || echo(stream, stop3));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(POLL),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    Ok(Server {
        stop,
        accepted,
        handle: Some(handle),
    })
}

fn echo(stream: std::net::TcpStream, stop: Arc<AtomicBool>) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if writer.write_all(line.as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Starts a UDP greeter on `0.0.0.0:port` inside `ns`.
pub fn udp_greeter(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    udp_server(ns, any(false, port), name)
}

/// Starts a UDP greeter on `[::]:port` (IPv6 only) inside `ns`.
pub fn udp_greeter6(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    udp_server(ns, any(true, port), name)
}

fn udp_server(ns: &Netns, addr: SocketAddr, name: &str) -> Result<Server> {
    serve_udp(ns, addr, name, None)
}

fn serve_udp(ns: &Netns, addr: SocketAddr, name: &str, ext: Option<ExtHeaders>) -> Result<Server> {
    let socket: UdpSocket = ns
        .run(move || bound_ext(addr, Type::DGRAM, ext))?
        .with_context(|| format!("binding UDP {addr} in {}", ns.name()))?
        .into();
    socket.set_read_timeout(Some(POLL))?;
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let name = name.to_owned();
    let (stop2, accepted2) = (stop.clone(), accepted.clone());
    let handle = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop2.load(Ordering::Relaxed) {
            match socket.recv_from(&mut buf) {
                Ok((_, from)) => {
                    accepted2.fetch_add(1, Ordering::Relaxed);
                    socket.send_to(name.as_bytes(), from)?;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    Ok(Server {
        stop,
        accepted,
        handle: Some(handle),
    })
}

/// Starts a UDP echo server on `port` (`[::]` IPv6 only, or `0.0.0.0`)
/// inside `ns`: every datagram is answered with `<name> <peer address>\n`
/// followed by the datagram itself, so a large request gets a large
/// answer, which the server's stack fragments (IPv4 path MTU discovery
/// off, as `clients::udp_echoes` does).
pub fn udp_echo(ns: &Netns, port: u16, name: &str, v6: bool) -> Result<Server> {
    let addr = any(v6, port);
    let socket: UdpSocket = ns
        .run(move || -> std::io::Result<Socket> {
            let socket = bound(addr, Type::DGRAM)?;
            crate::clients::allow_fragments(&socket, v6)?;
            Ok(socket)
        })?
        .with_context(|| format!("binding UDP {addr} in {}", ns.name()))?
        .into();
    socket.set_read_timeout(Some(POLL))?;
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let name = name.to_owned();
    let (stop2, accepted2) = (stop.clone(), accepted.clone());
    let handle = thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while !stop2.load(Ordering::Relaxed) {
            match socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    accepted2.fetch_add(1, Ordering::Relaxed);
                    let mut answer = format!("{name} {}\n", from.ip()).into_bytes();
                    answer.extend_from_slice(&buf[..n]);
                    socket.send_to(&answer, from)?;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    Ok(Server {
        stop,
        accepted,
        handle: Some(handle),
    })
}
