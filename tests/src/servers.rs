//! Servers that run inside a pod namespace and answer with the pod's name,
//! so a client knows which backend it reached.
//!
//! TCP: on accept, sends `<name>\n`, then echoes every line back until the
//! client closes. UDP: answers every datagram with `<name>`.

use std::{
    io::{BufRead, BufReader, ErrorKind, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

use crate::netns::Netns;

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
    tcp_server(ns, port, name, false)
}

/// Like `tcp_greeter`, but the greeting is `<name> <client address>`: what
/// source address the backend saw (to tell SNAT from a preserved client).
pub fn tcp_whoami(ns: &Netns, port: u16, name: &str) -> Result<Server> {
    tcp_server(ns, port, name, true)
}

fn tcp_server(ns: &Netns, port: u16, name: &str, with_peer: bool) -> Result<Server> {
    let listener = ns
        .run(move || TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)))?
        .with_context(|| format!("binding TCP port {port} in {}", ns.name()))?;
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
    let socket = ns
        .run(move || UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)))?
        .with_context(|| format!("binding UDP port {port} in {}", ns.name()))?;
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
