//! `BPF_PROG_TEST_RUN` through the raw bpf(2) syscall (aya 0.14 has no
//! wrapper), and opening one sluice instance's programs by name.

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd},
    path::Path,
};

use anyhow::{Context, Result};

use crate::bpf::{fd, put, sys_bpf, Instance};

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;

/// Size of `struct __sk_buff` on this kernel's ABI; offsets used below.
pub const SKB_CTX_LEN: usize = 192;
const SKB_INGRESS_IFINDEX: usize = 36;
const SKB_IFINDEX: usize = 40;

/// The largest packet test-run takes (a page minus head- and tailroom).
pub const MAX_PACKET: usize = 3000;

/// A program of a loaded instance, opened by id.
pub struct Program {
    pub name: String,
    pub fd: OwnedFd,
}

/// Opens the programs named `names` among those that use a map pinned
/// under `root` (the attached TC programs, their IPv6 halves, the socket
/// programs).
pub fn open_programs(root: &Path, names: &[&str]) -> Result<Vec<Program>> {
    let instance = Instance::of(root)?;
    let all = crate::bpf::programs()?;
    let mut out = Vec::new();
    for name in names {
        let id = instance
            .programs
            .iter()
            .find(|id| all.get(id).is_some_and(|(n, _)| n == name))
            .with_context(|| format!("no program {name} in {}", root.display()))?;
        let mut attr = [0u8; 128];
        put(&mut attr, 0, &id.to_ne_bytes());
        let fd = fd(sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)
            .with_context(|| format!("BPF_PROG_GET_FD_BY_ID {name}"))?)?;
        out.push(Program {
            name: (*name).to_owned(),
            fd,
        });
    }
    Ok(out)
}

/// One run's result: the program's return value and the packet it left.
pub struct Outcome {
    pub retval: u32,
    pub data: Vec<u8>,
}

/// Runs `prog` once on `data` as an skb arriving on/leaving `ifindex`
/// (resolved in the calling thread's network namespace).
pub fn run_skb(prog: &Program, data: &[u8], ifindex: u32) -> io::Result<Outcome> {
    let mut ctx = [0u8; SKB_CTX_LEN];
    ctx[SKB_INGRESS_IFINDEX..SKB_INGRESS_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
    ctx[SKB_IFINDEX..SKB_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
    test_run(prog, data, &ctx)
}

/// One `BPF_PROG_TEST_RUN` of `prog` on `data` with the context `ctx`
/// (the program type's context struct, as bytes).
fn test_run(prog: &Program, data: &[u8], ctx: &[u8]) -> io::Result<Outcome> {
    let mut out = vec![0u8; MAX_PACKET + 512];
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(prog.fd.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 8, &(data.len() as u32).to_ne_bytes());
    put(&mut attr, 12, &(out.len() as u32).to_ne_bytes());
    put(&mut attr, 16, &(data.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 24, &(out.as_mut_ptr() as u64).to_ne_bytes());
    put(&mut attr, 32, &1u32.to_ne_bytes());
    put(&mut attr, 40, &(ctx.len() as u32).to_ne_bytes());
    put(&mut attr, 48, &(ctx.as_ptr() as u64).to_ne_bytes());
    sys_bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    let retval = u32::from_ne_bytes([attr[4], attr[5], attr[6], attr[7]]);
    let size = u32::from_ne_bytes([attr[12], attr[13], attr[14], attr[15]]) as usize;
    out.truncate(size.min(out.len()));
    Ok(Outcome { retval, data: out })
}

/// Size of `struct xdp_md`: `data`, `data_end`, `data_meta`,
/// `ingress_ifindex`, `rx_queue_index`, `egress_ifindex`.
const XDP_CTX_LEN: usize = 24;
const XDP_DATA_END: usize = 4;
const XDP_INGRESS_IFINDEX: usize = 12;

/// Runs the XDP program `prog` once on `data` as a frame received by
/// `ifindex` (queue 0; resolved in the calling thread's network
/// namespace). Test-run performs no transmission: `XDP_TX` and
/// `XDP_REDIRECT` come back as the verdict, with the frame as the program
/// left it.
pub fn run_xdp(prog: &Program, data: &[u8], ifindex: u32) -> io::Result<Outcome> {
    let mut ctx = [0u8; XDP_CTX_LEN];
    ctx[XDP_DATA_END..XDP_DATA_END + 4].copy_from_slice(&(data.len() as u32).to_ne_bytes());
    ctx[XDP_INGRESS_IFINDEX..XDP_INGRESS_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
    test_run(prog, data, &ctx)
}

/// Whether test-run supports `prog` at all: the error of one run on a
/// minimal input (`None`: it ran).
pub fn probe(prog: &Program) -> Option<io::Error> {
    let data = [0u8; 64];
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(prog.fd.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 8, &(data.len() as u32).to_ne_bytes());
    put(&mut attr, 16, &(data.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 32, &1u32.to_ne_bytes());
    sys_bpf(BPF_PROG_TEST_RUN, &mut attr).err()
}
