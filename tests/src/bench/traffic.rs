//! The benchmark's server (one per backend pod) and its three clients,
//! all running inside their pods' namespaces.
//!
//! One TCP port serves three kinds of connections, told apart by the first
//! byte the client sends: none (a connect-rate probe: the client resets
//! the connection right after the handshake), `E` (echo fixed-size
//! messages: request/response) or `B` (discard a stream, then answer with
//! the byte count: bulk throughput). The accept loop never spawns a thread
//! for a probe, so the server keeps up with tens of thousands of
//! connections per second.

use std::{
    io::{self, ErrorKind, Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};

use crate::netns::Netns;

const MODE_ECHO: u8 = b'E';
const MODE_BULK: u8 = b'B';
/// Request and response size of the request/response test.
pub const MESSAGE: usize = 64;
const BULK_CHUNK: usize = 256 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_MS: i32 = 200;

/// CPUs the client and the servers are pinned to, when pinning is on.
static PINNING: std::sync::Mutex<Option<(usize, usize)>> = std::sync::Mutex::new(None);

/// Pins every client thread to `client` and every server thread to
/// `server` from now on (`None`: no pinning). With two CPUs this keeps
/// the scheduler from moving the client and the server between runs,
/// which otherwise makes connect latency bimodal from round to round.
pub fn set_pinning(cpus: Option<(usize, usize)>) {
    *PINNING.lock().unwrap_or_else(|p| p.into_inner()) = cpus;
}

fn pin(client: bool) {
    let Some((c, s)) = *PINNING.lock().unwrap_or_else(|p| p.into_inner()) else {
        return;
    };
    let cpu = if client { c } else { s };
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // within it; sched_setaffinity(0) affects the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A server in one pod; stops on drop.
pub struct Server {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Starts the server on `0.0.0.0:port` inside `ns`.
pub fn serve(ns: &Netns, port: u16) -> Result<Server> {
    let listener = ns
        .run(move || -> io::Result<TcpListener> {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            s.set_reuse_address(true)?;
            s.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())?;
            s.listen(4096)?;
            s.set_nonblocking(true)?;
            Ok(s.into())
        })?
        .with_context(|| format!("listening on port {port} in {}", ns.name()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<TcpStream>();
    let stop_accept = stop.clone();
    let acceptor = thread::spawn(move || accept_loop(&listener, &tx, &stop_accept));
    let stop_classify = stop.clone();
    let classifier = thread::spawn(move || classify_loop(&rx, &stop_classify));
    Ok(Server {
        stop,
        threads: vec![acceptor, classifier],
    })
}

fn accept_loop(listener: &TcpListener, tx: &mpsc::Sender<TcpStream>, stop: &AtomicBool) {
    pin(false);
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        if ready <= 0 {
            continue;
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if tx.send(stream).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // ECONNABORTED and the like: the next one.
                Err(_) => {}
            }
        }
    }
}

fn classify_loop(rx: &mpsc::Receiver<TcpStream>, stop: &AtomicBool) {
    pin(false);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = rx.recv_timeout(Duration::from_millis(POLL_MS as u64)) else {
            continue;
        };
        let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
        let mut mode = [0u8; 1];
        // A probe is reset by its client at once: the read fails (or sees
        // end of stream) and the socket is dropped without a thread.
        if let Ok(1) = stream.read(&mut mode) {
            match mode[0] {
                MODE_ECHO => {
                    thread::spawn(move || echo(stream));
                }
                MODE_BULK => {
                    thread::spawn(move || sink(stream));
                }
                _ => {}
            }
        }
    }
}

fn echo(mut stream: TcpStream) {
    pin(false);
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; MESSAGE];
    while stream.read_exact(&mut buf).is_ok() {
        if stream.write_all(&buf).is_err() {
            return;
        }
    }
}

fn sink(mut stream: TcpStream) {
    pin(false);
    let mut buf = vec![0u8; BULK_CHUNK];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    let _ = stream.write_all(&total.to_le_bytes());
}

/// Sequential connections: connect latency of each, and the rate of the
/// whole loop (socket, connect, reset).
#[derive(Debug, Default)]
pub struct ConnectRun {
    pub latencies_ns: Vec<u64>,
    pub elapsed: Duration,
    pub errors: usize,
    pub first_error: Option<String>,
}

impl ConnectRun {
    pub fn rate(&self) -> f64 {
        self.latencies_ns.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn probe(addr: SocketAddrV4) -> io::Result<Duration> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    // Closing sends a reset: no TIME_WAIT, so the client never runs out of
    // ports however many connections a run makes.
    socket.set_linger(Some(Duration::ZERO))?;
    // Bounds a blocking connect (SYN retransmissions) on Linux.
    socket.set_write_timeout(Some(IO_TIMEOUT))?;
    let addr = SocketAddr::V4(addr).into();
    let start = Instant::now();
    socket.connect(&addr)?;
    Ok(start.elapsed())
}

/// `warmup` unrecorded, then `n` recorded connections from inside `ns`,
/// cycling through `targets`; stops early once `limit` has passed and at
/// least a tenth of `n` are recorded (slow variants at large sizes).
pub fn connects(
    ns: &Netns,
    targets: &[SocketAddrV4],
    warmup: usize,
    n: usize,
    limit: Duration,
) -> Result<ConnectRun> {
    let targets = targets.to_vec();
    ns.run(move || {
        pin(true);
        let mut run = ConnectRun {
            latencies_ns: Vec::with_capacity(n),
            ..ConnectRun::default()
        };
        for i in 0..warmup {
            let _ = probe(targets[i % targets.len()]);
        }
        let start = Instant::now();
        for i in 0..n {
            if i >= n / 10 && start.elapsed() > limit {
                break;
            }
            match probe(targets[i % targets.len()]) {
                Ok(d) => run.latencies_ns.push(d.as_nanos() as u64),
                Err(e) => {
                    run.errors += 1;
                    run.first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        run.elapsed = start.elapsed();
        run
    })
}

fn open(addr: SocketAddrV4, mode: u8) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&SocketAddr::V4(addr), IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    stream.write_all(&[mode])?;
    Ok(stream)
}

/// Round trips of one established connection.
#[derive(Debug, Default)]
pub struct RrRun {
    pub rtts_ns: Vec<u64>,
    pub elapsed: Duration,
}

impl RrRun {
    pub fn rate(&self) -> f64 {
        self.rtts_ns.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Request/response for `duration` on one connection (after 200 unrecorded
/// round trips).
pub fn request_response(ns: &Netns, addr: SocketAddrV4, duration: Duration) -> Result<RrRun> {
    ns.run(move || -> io::Result<RrRun> {
        pin(true);
        let mut stream = open(addr, MODE_ECHO)?;
        let request = [0x5au8; MESSAGE];
        let mut response = [0u8; MESSAGE];
        for _ in 0..200 {
            stream.write_all(&request)?;
            stream.read_exact(&mut response)?;
        }
        let mut run = RrRun::default();
        let start = Instant::now();
        while start.elapsed() < duration {
            let t = Instant::now();
            stream.write_all(&request)?;
            stream.read_exact(&mut response)?;
            run.rtts_ns.push(t.elapsed().as_nanos() as u64);
        }
        run.elapsed = start.elapsed();
        Ok(run)
    })?
    .with_context(|| format!("request/response with {addr}"))
}

/// One bulk transfer: bytes the server received and the time until it
/// confirmed them.
#[derive(Debug, Default)]
pub struct BulkRun {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl BulkRun {
    pub fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// Streams to the server for `duration` on one connection.
pub fn bulk(ns: &Netns, addr: SocketAddrV4, duration: Duration) -> Result<BulkRun> {
    let run = ns
        .run(move || -> io::Result<(u64, u64, Duration)> {
            pin(true);
            let mut stream = open(addr, MODE_BULK)?;
            let chunk = vec![0xa5u8; BULK_CHUNK];
            let mut sent = 0u64;
            let start = Instant::now();
            while start.elapsed() < duration {
                stream.write_all(&chunk)?;
                sent += chunk.len() as u64;
            }
            stream.shutdown(Shutdown::Write)?;
            let mut count = [0u8; 8];
            stream.read_exact(&mut count)?;
            Ok((sent, u64::from_le_bytes(count), start.elapsed()))
        })?
        .with_context(|| format!("bulk transfer to {addr}"))?;
    let (sent, received, elapsed) = run;
    if sent != received {
        bail!("bulk transfer to {addr}: sent {sent} bytes, the server counted {received}");
    }
    Ok(BulkRun {
        bytes: received,
        elapsed,
    })
}

/// `ip:port` helper.
pub fn addr(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}
