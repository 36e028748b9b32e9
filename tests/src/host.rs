//! Processes of the node itself (in the node's network namespace and the
//! topology's cgroup), or of a pod (its namespace, the same cgroup), for
//! socket-level balancing: a small Python client driven over stdin/stdout.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, ChildStdin, ChildStdout, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::{netns::Netns, topology::Topology};

const CLIENT: &str = r#"
import socket, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Optional: the local address to bind first (UDP modes).
bind = sys.argv[4] if len(sys.argv) > 4 else None
# The socket's family follows the address: an IPv6 address (v4-mapped
# ones included) gets an AF_INET6 socket. Peers print as Rust's
# SocketAddr does.
family = socket.AF_INET6 if ":" in host else socket.AF_INET
def show(addr):
    return ("[%s]:%d" if family == socket.AF_INET6 else "%s:%d") % addr[:2]
try:
    if mode == "tcp":
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((host, port))
        f = s.makefile("rw")
        greeting = f.readline().strip()
        print("ok", greeting, show(s.getpeername()), flush=True)
        for line in sys.stdin:
            # Each ping also says what getpeername() reads now.
            f.write("ping\n"); f.flush()
            ok = "ok" if f.readline() == "ping\n" else "err"
            print(ok, show(s.getpeername()), flush=True)
    elif mode == "udpc":
        # Connected UDP: getpeername() and every reply's source; one
        # datagram more per stdin line after the first.
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.connect((host, port))
        s.send(b"hello")
        data, src = s.recvfrom(512)
        print("ok", data.decode(), show(src), show(s.getpeername()), flush=True)
        for line in sys.stdin:
            s.send(b"hello")
            data, src = s.recvfrom(512)
            print("ok", data.decode(), show(src), flush=True)
    else:
        # Unconnected UDP, as a DNS client: one datagram per stdin line
        # after the first, each reply's source printed.
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(3)
        if bind:
            s.bind((bind, 0))
        s.sendto(b"hello", (host, port))
        data, src = s.recvfrom(512)
        print("ok", data.decode(), show(src), flush=True)
        for line in sys.stdin:
            s.sendto(b"hello", (host, port))
            data, src = s.recvfrom(512)
            print("ok", data.decode(), show(src), flush=True)
except OSError as e:
    import errno
    print("error", errno.errorcode.get(e.errno, str(e)), flush=True)
"#;

/// `n` TCP connections in one process: one line each, as `CLIENT` prints
/// its first.
const MANY: &str = r#"
import socket, sys, errno
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
for _ in range(n):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((host, port))
        print("ok", s.makefile("r").readline().strip(), flush=True)
        s.close()
    except OSError as e:
        print("error", errno.errorcode.get(e.errno, str(e)), flush=True)
"#;

/// A node-side client process.
pub struct HostClient {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl HostClient {
    /// Starts a TCP (`"tcp"`) or UDP (`"udp"`) client to `host:port`, on an
    /// `AF_INET6` socket when `host` is an IPv6 address (v4-mapped ones
    /// included).
    pub fn start(topo: &Topology, mode: &str, host: &str, port: u16) -> Result<Self> {
        Self::start_in(topo, &topo.node, mode, host, port, None)
    }

    /// `start` in network namespace `ns` (a pod's), in the topology's
    /// cgroup. Modes: `"tcp"`, `"udp"` (unconnected; `exchange` sends
    /// again on the same socket, bound to `bind` first if given) and
    /// `"udpc"` (connected UDP: prints the reply's source and
    /// `getpeername()`; `exchange` sends again).
    pub fn start_in(
        topo: &Topology,
        ns: &Netns,
        mode: &str,
        host: &str,
        port: u16,
        bind: Option<&str>,
    ) -> Result<Self> {
        let port = port.to_string();
        let mut args = vec!["-c", CLIENT, mode, host, &port];
        args.extend(bind);
        let mut child = topo
            .cgroup_command(ns, "python3")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting python3 in the node namespace")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// The next line the client printed, split into words.
    pub fn line(&mut self) -> Result<Vec<String>> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("host client exited");
        }
        Ok(line.split_whitespace().map(str::to_owned).collect())
    }

    /// Asks an unconnected UDP client for one more request/reply on its
    /// socket: the reply's words.
    pub fn exchange(&mut self) -> Result<Vec<String>> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin)?;
        stdin.flush()?;
        self.line()
    }

    /// Asks a TCP client to exchange one line over its connection.
    pub fn ping(&mut self) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin)?;
        stdin.flush()?;
        match self.line()?.first().map(String::as_str) {
            Some("ok") => Ok(()),
            other => bail!("ping failed: {other:?}"),
        }
    }

    /// Asks a TCP client to exchange one line over its connection: the
    /// peer its `getpeername()` reads afterwards.
    pub fn ping_peer(&mut self) -> Result<String> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        writeln!(stdin)?;
        stdin.flush()?;
        match self.line()?.as_slice() {
            [ok, peer] if ok == "ok" => Ok(peer.clone()),
            other => bail!("ping failed: {other:?}"),
        }
    }

    /// `n` TCP connections to `host:port` from one node process, one
    /// after the other: each one's first line, split into words.
    pub fn tcp_many(topo: &Topology, host: &str, port: u16, n: usize) -> Result<Vec<Vec<String>>> {
        let out = topo
            .host_command("python3")
            .args(["-c", MANY, host, &port.to_string(), &n.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .context("running python3 in the node namespace")?;
        let lines: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect();
        if lines.len() != n {
            bail!("{} of {n} connections reported: {lines:?}", lines.len());
        }
        Ok(lines)
    }

    /// One-shot: start, read the first line.
    pub fn once(topo: &Topology, mode: &str, host: &str, port: u16) -> Result<Vec<String>> {
        let mut c = Self::start(topo, mode, host, port)?;
        c.line()
    }

    /// `once` in network namespace `ns` (a pod's).
    pub fn once_in(
        topo: &Topology,
        ns: &Netns,
        mode: &str,
        host: &str,
        port: u16,
    ) -> Result<Vec<String>> {
        let mut c = Self::start_in(topo, ns, mode, host, port, None)?;
        c.line()
    }
}

impl Drop for HostClient {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
