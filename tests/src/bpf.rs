//! Looking at the kernel's BPF objects from a test, independently of the
//! agent's code: the TCX links on a device (`BPF_PROG_QUERY`), programs,
//! maps and cgroup attachments (bpftool), and a foreign TCX program of
//! our own, to check that sluice leaves other programs alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::Netns;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_MAP_GET_NEXT_ID: libc::c_long = 12;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;

pub(crate) fn sys_bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> io::Result<i64> {
    // SAFETY: a 128-byte `union bpf_attr` filled for `cmd`; every buffer
    // it points to outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// Writes `bytes` at `offset` of a `bpf_attr` or an info struct.
pub(crate) fn put(buf: &mut [u8], offset: usize, bytes: &[u8]) {
    buf[offset..offset + bytes.len()].copy_from_slice(bytes);
}

pub(crate) fn fd(rc: i64) -> io::Result<OwnedFd> {
    let fd = i32::try_from(rc).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: a fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// (link id, program id) of every TCX link on `device` of `ns`.
pub fn tcx_links(ns: &Netns, device: &str, attach_type: u32) -> Result<Vec<(u32, u32)>> {
    let ifindex = ifindex(ns, device)?;
    ns.run(move || -> Result<Vec<(u32, u32)>> {
        let mut progs = [0u32; 64];
        let mut links = [0u32; 64];
        let mut attr = [0u8; 128];
        put(&mut attr, 0, &ifindex.to_ne_bytes());
        put(&mut attr, 4, &attach_type.to_ne_bytes());
        put(&mut attr, 16, &(progs.as_mut_ptr() as u64).to_ne_bytes());
        put(&mut attr, 24, &64u32.to_ne_bytes());
        put(&mut attr, 40, &(links.as_mut_ptr() as u64).to_ne_bytes());
        sys_bpf(BPF_PROG_QUERY, &mut attr).context("BPF_PROG_QUERY")?;
        let count = attr_u32(&attr, 24) as usize;
        Ok(links
            .iter()
            .zip(progs.iter())
            .take(count.min(64))
            .map(|(l, p)| (*l, *p))
            .collect())
    })?
}

/// A TCX program that is not sluice's (`foreign_next`: returns
/// `TCX_NEXT`), attached by a link this holds; detached on drop.
pub struct ForeignTcx {
    _link: OwnedFd,
    pub link_id: u32,
}

impl ForeignTcx {
    pub fn attach(ns: &Netns, device: &str, attach_type: u32) -> Result<Self> {
        let prog = nop_tc("foreign_next")?;
        let link = link_create(ns, &prog, device, attach_type, 0)?;
        let link_id = fdinfo_field(&link, "link_id")?
            .and_then(|v| u32::try_from(v).ok())
            .context("no link_id in fdinfo")?;
        Ok(Self {
            _link: link,
            link_id,
        })
    }

    /// Whether the link is still on `device`'s hook.
    pub fn attached(&self, ns: &Netns, device: &str, attach_type: u32) -> Result<bool> {
        Ok(tcx_links(ns, device, attach_type)?
            .iter()
            .any(|(l, _)| *l == self.link_id))
    }
}

/// The numeric field `name` of a BPF object's fd in `/proc/self/fdinfo`
/// (`prog_id`, `link_id`, `run_time_ns`, ...), `None` when absent.
pub fn fdinfo_field(fd: &impl AsRawFd, name: &str) -> Result<Option<u64>> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok()))
}

/// Loads a program of `prog_type` (for `expected_attach_type`, 0 when
/// the type needs none) named `name` that does nothing but `r0 = r0_imm;
/// exit`.
fn load_nop(prog_type: u32, expected_attach_type: u32, r0_imm: i32, name: &str) -> Result<OwnedFd> {
    let mut insns = [0u8; 16];
    insns[0] = 0xb7; // r0 = imm
    insns[4..8].copy_from_slice(&r0_imm.to_le_bytes());
    insns[8] = 0x95; // exit
    let license = CString::new("GPL")?;
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &prog_type.to_ne_bytes());
    put(&mut attr, 4, &2u32.to_ne_bytes());
    put(&mut attr, 8, &(insns.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
    let name = name.as_bytes();
    put(&mut attr, 48, &name[..name.len().min(15)]);
    put(&mut attr, 68, &expected_attach_type.to_ne_bytes());
    Ok(fd(sys_bpf(BPF_PROG_LOAD, &mut attr).with_context(
        || format!("BPF_PROG_LOAD (type {prog_type}, attach type {expected_attach_type})"),
    )?)?)
}

/// Loads a TC program named `name` that does nothing: `r0 = -1`
/// (`TCX_NEXT`, the packet goes on as if no program were there); exit.
pub fn nop_tc(name: &str) -> Result<OwnedFd> {
    load_nop(BPF_PROG_TYPE_SCHED_CLS, 0, -1, name)
}

/// `BPF_LINK_CREATE` of `prog` on `target_fd` (a device's ifindex, or a
/// cgroup's fd) for `attach_type`, with `flags`: the link's fd.
fn link_create_on(
    prog: &OwnedFd,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 4, &target_fd.to_ne_bytes());
    put(&mut attr, 8, &attach_type.to_ne_bytes());
    put(&mut attr, 12, &flags.to_ne_bytes());
    fd(sys_bpf(BPF_LINK_CREATE, &mut attr)?)
}

/// The `u32` at `offset` of a `bpf_attr` the kernel filled in.
fn attr_u32(attr: &[u8; 128], offset: usize) -> u32 {
    u32::from_ne_bytes([
        attr[offset],
        attr[offset + 1],
        attr[offset + 2],
        attr[offset + 3],
    ])
}

/// `nop_tc` attached to both TCX hooks of each device: what a TC hook
/// costs a packet with nothing in it (the benchmark's `tc-floor`).
pub struct NopTcEverywhere {
    _links: Vec<OwnedFd>,
    prog: OwnedFd,
}

impl NopTcEverywhere {
    pub fn attach(ns: &Netns, devices: &[String], name: &str) -> Result<Self> {
        let prog = nop_tc(name)?;
        let mut links = Vec::new();
        for dev in devices {
            for hook in [BPF_TCX_INGRESS, BPF_TCX_EGRESS] {
                links.push(link_create(ns, &prog, dev, hook, 0)?);
            }
        }
        Ok(Self {
            _links: links,
            prog,
        })
    }

    /// The program's id.
    pub fn prog_id(&self) -> Result<u64> {
        fdinfo_field(&self.prog, "prog_id")?.context("no prog_id in fdinfo")
    }
}

const BPF_PROG_TYPE_CGROUP_SOCK: u32 = 9;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;

/// The cgroup hooks sluice's socket programs use, as (attach type, name
/// of the empty program put there): connect, sendmsg, recvmsg and
/// getpeername of both families, and the socket's release.
const SOCK_HOOKS: [(u32, &str); 9] = [
    (10, "floor_connect4"),
    (11, "floor_connect6"),
    (14, "floor_sendmsg4"),
    (15, "floor_sendmsg6"),
    (19, "floor_recvmsg4"),
    (20, "floor_recvmsg6"),
    (29, "floor_getpeer4"),
    (30, "floor_getpeer6"),
    (34, "floor_release"),
];

/// Loads a cgroup socket program named `name` for `attach_type` that does
/// nothing: `r0 = 1` (carry on); exit.
fn nop_sock(name: &str, attach_type: u32) -> Result<OwnedFd> {
    let prog_type = if attach_type == 34 {
        BPF_PROG_TYPE_CGROUP_SOCK
    } else {
        BPF_PROG_TYPE_CGROUP_SOCK_ADDR
    };
    load_nop(prog_type, attach_type, 1, name)
}

/// An empty program on every cgroup hook sluice's socket programs use,
/// attached to `cgroup` by links this holds (detached on drop): what the
/// hooks cost a socket with nothing in them (the benchmark's
/// `sock-floor`).
pub struct NopSockEverywhere {
    _links: Vec<OwnedFd>,
    progs: Vec<(OwnedFd, &'static str)>,
}

impl NopSockEverywhere {
    pub fn attach(cgroup: &Path) -> Result<Self> {
        let dir =
            std::fs::File::open(cgroup).with_context(|| format!("opening {}", cgroup.display()))?;
        let mut links = Vec::new();
        let mut progs = Vec::new();
        for (attach_type, name) in SOCK_HOOKS {
            let prog = nop_sock(name, attach_type)?;
            let link = link_create_on(&prog, dir.as_raw_fd() as u32, attach_type, 0).with_context(
                || {
                    format!(
                        "BPF_LINK_CREATE (attach type {attach_type}) on {}",
                        cgroup.display()
                    )
                },
            )?;
            links.push(link);
            progs.push((prog, name));
        }
        Ok(Self {
            _links: links,
            progs,
        })
    }

    /// The programs' ids and names.
    pub fn prog_ids(&self) -> Result<Vec<(u64, &'static str)>> {
        self.progs
            .iter()
            .map(|(p, name)| {
                Ok((
                    fdinfo_field(p, "prog_id")?.context("no prog_id in fdinfo")?,
                    *name,
                ))
            })
            .collect()
    }
}

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;

/// An fd of the loaded program `id`.
pub fn prog_fd_by_id(id: u64) -> Result<OwnedFd> {
    let id = u32::try_from(id).context("program id out of range")?;
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &id.to_ne_bytes());
    Ok(fd(sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)
        .with_context(|| format!("BPF_PROG_GET_FD_BY_ID {id}"))?)?)
}

/// What one test run of a TC program gave.
pub struct TestRun {
    /// The program's return value.
    pub verdict: u32,
    /// The kernel's time for the run, in ns.
    pub ns: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
}

/// `BPF_PROG_TEST_RUN` of the TC program `prog` on `frame`, `repeat`
/// times on one CPU (`ns`: the average). Each run after the first sees
/// the frame as the one before left it, so a frame the program rewrites
/// is timed as it came only with `repeat` 1.
pub fn test_run(prog: &OwnedFd, frame: &[u8], repeat: u32) -> Result<TestRun> {
    let mut out = vec![0u8; frame.len() + 256];
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 8, &(frame.len() as u32).to_ne_bytes());
    put(&mut attr, 12, &(out.len() as u32).to_ne_bytes());
    put(&mut attr, 16, &(frame.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 24, &(out.as_mut_ptr() as u64).to_ne_bytes());
    put(&mut attr, 32, &repeat.to_ne_bytes());
    sys_bpf(BPF_PROG_TEST_RUN, &mut attr).context("BPF_PROG_TEST_RUN")?;
    out.truncate(attr_u32(&attr, 12) as usize);
    Ok(TestRun {
        verdict: attr_u32(&attr, 4),
        ns: attr_u32(&attr, 36),
        frame: out,
    })
}

/// Opens the object pinned at `path`: holding it keeps it alive (and a
/// link attached) after its pin is removed.
pub fn hold_pin(path: &Path) -> Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(c.as_ptr() as u64).to_ne_bytes());
    Ok(fd(sys_bpf(BPF_OBJ_GET, &mut attr).with_context(|| {
        format!("BPF_OBJ_GET {}", path.display())
    })?)?)
}

fn bpftool_json(args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .context("running bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // `cgroup show` of a cgroup without programs prints nothing at all.
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every loaded program: id -> (name, map ids).
pub fn programs() -> Result<BTreeMap<u32, (String, Vec<u32>)>> {
    let list = bpftool_json(&["prog", "show"])?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let id = p["id"].as_u64()? as u32;
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            let maps = p["map_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m.as_u64().map(|m| m as u32))
                .collect();
            Some((id, (name, maps)))
        })
        .collect())
}

/// Every id `cmd` (`BPF_*_GET_NEXT_ID`) lists. Listing takes no
/// reference, unlike opening by id (bpftool): opening a prog array by id
/// while it is being released leaked it on kernel 6.18.
fn ids(cmd: libc::c_long) -> Result<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    let mut start = 0u32;
    loop {
        let mut attr = [0u8; 128];
        put(&mut attr, 0, &start.to_ne_bytes());
        match sys_bpf(cmd, &mut attr) {
            Ok(_) => {
                start = attr_u32(&attr, 4);
                out.insert(start);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Every map id.
pub fn map_ids() -> Result<BTreeSet<u32>> {
    ids(BPF_MAP_GET_NEXT_ID)
}

/// Every program id.
pub fn program_ids() -> Result<BTreeSet<u32>> {
    ids(BPF_PROG_GET_NEXT_ID)
}

/// The names of the programs attached to a cgroup (all attach types).
pub fn cgroup_programs(cgroup: &Path) -> Result<Vec<String>> {
    let path = cgroup.display().to_string();
    let list = bpftool_json(&["cgroup", "show", &path])?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .collect())
}

/// The BPF objects of one sluice instance: its pinned maps, and every
/// program that uses one of them (the attached ones and the tail-call
/// halves).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instance {
    pub maps: BTreeSet<u32>,
    pub programs: BTreeSet<u32>,
    pub pins: Vec<PathBuf>,
}

impl Instance {
    pub fn of(root: &Path) -> Result<Self> {
        let mut pins = Vec::new();
        let mut dirs = vec![root.to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    pins.push(path);
                }
            }
        }
        let mut maps = BTreeSet::new();
        for pin in &pins {
            let path = pin.display().to_string();
            if let Ok(map) = bpftool_json(&["map", "show", "pinned", &path]) {
                if let Some(id) = map["id"].as_u64() {
                    maps.insert(id as u32);
                }
            }
        }
        anyhow::ensure!(!maps.is_empty(), "no map pinned under {}", root.display());
        let programs = programs()?
            .into_iter()
            .filter(|(_, (_, m))| m.iter().any(|id| maps.contains(id)))
            .map(|(id, _)| id)
            .collect();
        pins.sort();
        Ok(Self {
            maps,
            programs,
            pins,
        })
    }

    /// The ids of the maps and programs of this instance still loaded
    /// (listed, never opened).
    pub fn remaining(&self) -> Result<(Vec<u32>, Vec<u32>)> {
        Ok((
            self.maps.intersection(&map_ids()?).copied().collect(),
            self.programs
                .intersection(&program_ids()?)
                .copied()
                .collect(),
        ))
    }
}

const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_DRV_MODE: u32 = 4;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 2;

/// A minimal XDP program of the benchmark's wire, written as BPF
/// instructions (no object file).
#[derive(Clone, Debug)]
pub enum WireAction {
    /// `bpf_redirect(ifindex, 0)`: the frame leaves through that device
    /// of the same namespace as an `xdp_frame` (`ndo_xdp_xmit`), which is
    /// how a NIC's driver hands frames to XDP: no skb.
    Redirect(u32),
    /// As `Redirect`, after writing the frame anew (its bytes, whole
    /// words of it, are in the program) with a random UDP source port in
    /// 20000..21024: the packet generator (1,024 flows) of an IPv4 UDP
    /// frame without options, run with live frames. The whole frame is
    /// rewritten because live frames recycle their pages: a page comes
    /// back with whatever the datapath under test wrote into it.
    Generate(u32, Vec<u8>),
    /// `XDP_DROP`: a sink that counts (the device's `xdp_drops`).
    Drop,
}

impl WireAction {
    /// The program's instructions.
    fn instructions(&self) -> Result<Vec<u8>> {
        let mut insns: Vec<u8> = Vec::new();
        let mut insn = |code: u8, regs: u8, off: i16, imm: i32| {
            insns.extend_from_slice(&[code, regs]);
            insns.extend_from_slice(&off.to_le_bytes());
            insns.extend_from_slice(&imm.to_le_bytes());
        };
        let redirect = |insn: &mut dyn FnMut(u8, u8, i16, i32), ifindex: u32| -> Result<()> {
            let ifindex = i32::try_from(ifindex).context("ifindex")?;
            insn(0xb7, 0x01, 0, ifindex); // r1 = ifindex
            insn(0xb7, 0x02, 0, 0); // r2 = 0
            insn(0x85, 0x00, 0, 23); // call bpf_redirect
            insn(0x95, 0x00, 0, 0); // exit
            Ok(())
        };
        match *self {
            WireAction::Redirect(ifindex) => redirect(&mut insn, ifindex)?,
            WireAction::Generate(ifindex, ref frame) => {
                if frame.len() < 42 || frame.len() % 4 != 0 {
                    bail!("a generated frame has whole words, at least 42 bytes");
                }
                let words = frame.len() / 4;
                let len = i32::try_from(frame.len())?;
                insn(0x61, 0x16, 0, 0); // r6 = ctx->data
                insn(0x61, 0x17, 4, 0); // r7 = ctx->data_end
                insn(0xbf, 0x64, 0, 0); // r4 = r6
                insn(0x07, 0x04, 0, len); // r4 += len
                                          // if r4 > r7 goto drop (past the stores, the port and the
                                          // redirect)
                insn(0x2d, 0x74, i16::try_from(words + 9)?, 0);
                for (k, w) in frame.chunks(4).enumerate() {
                    let imm = i32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    insn(0x62, 0x06, i16::try_from(4 * k)?, imm); // *(u32 *)(r6 + 4k) = imm
                }
                insn(0x85, 0x00, 0, 7); // call bpf_get_prandom_u32
                insn(0x57, 0x00, 0, 1023); // r0 &= 1023
                insn(0x07, 0x00, 0, 20000); // r0 += 20000
                insn(0xdc, 0x00, 0, 16); // r0 = htons(r0)
                insn(0x6b, 0x06, 34, 0); // *(u16 *)(r6 + 34) = r0
                redirect(&mut insn, ifindex)?;
                insn(0xb7, 0x00, 0, 1); // drop: r0 = XDP_DROP
                insn(0x95, 0x00, 0, 0); // exit
            }
            WireAction::Drop => {
                insn(0xb7, 0x00, 0, 1); // r0 = XDP_DROP
                insn(0x95, 0x00, 0, 0); // exit
            }
        }
        Ok(insns)
    }

    /// Loads the program.
    pub fn load(&self) -> Result<OwnedFd> {
        let insns = self.instructions()?;
        let license = CString::new("GPL")?;
        let mut log = vec![0u8; 4096];
        let mut attr = [0u8; 128];
        put(&mut attr, 0, &BPF_PROG_TYPE_XDP.to_ne_bytes());
        put(&mut attr, 4, &((insns.len() / 8) as u32).to_ne_bytes());
        put(&mut attr, 8, &(insns.as_ptr() as u64).to_ne_bytes());
        put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
        put(&mut attr, 24, &1u32.to_ne_bytes());
        put(&mut attr, 28, &(log.len() as u32).to_ne_bytes());
        put(&mut attr, 32, &(log.as_mut_ptr() as u64).to_ne_bytes());
        put(&mut attr, 48, b"bench_wire");
        match sys_bpf(BPF_PROG_LOAD, &mut attr) {
            Ok(rc) => Ok(fd(rc)?),
            Err(e) => {
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                bail!(
                    "BPF_PROG_LOAD (xdp {self:?}): {e}: {}",
                    String::from_utf8_lossy(&log[..end])
                )
            }
        }
    }
}

/// An XDP program of the benchmark's wire attached natively to a device
/// by a link this holds; detached on drop.
pub struct WireXdp {
    _link: OwnedFd,
}

impl WireXdp {
    pub fn attach(ns: &Netns, device: &str, action: WireAction) -> Result<Self> {
        let prog = action.load()?;
        let link = link_create(ns, &prog, device, BPF_XDP, XDP_FLAGS_DRV_MODE)?;
        Ok(Self { _link: link })
    }
}

/// Attaches `prog` to `device` of `ns` (`attach_type`, `flags`) by a
/// link, which the returned fd holds.
fn link_create(
    ns: &Netns,
    prog: &OwnedFd,
    device: &str,
    attach_type: u32,
    flags: u32,
) -> Result<OwnedFd> {
    let ifindex = ifindex(ns, device)?;
    ns.run(move || -> Result<OwnedFd> {
        link_create_on(prog, ifindex, attach_type, flags)
            .with_context(|| format!("BPF_LINK_CREATE (attach type {attach_type}) on {device}"))
    })?
}

/// Runs the XDP program `prog` in live-frames mode (the kernel's XDP
/// packet generator, `BPF_F_TEST_XDP_LIVE_FRAMES`, which xdp-trafficgen
/// uses): `repeat` copies of `frame` go through the program on the
/// calling thread's CPU, and what it redirects really leaves. Call it in
/// the namespace whose devices the program names.
pub fn xdp_live_frames(prog: &OwnedFd, frame: &[u8], repeat: u32) -> Result<()> {
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 8, &(frame.len() as u32).to_ne_bytes());
    put(&mut attr, 16, &(frame.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 32, &repeat.to_ne_bytes());
    put(&mut attr, 64, &BPF_F_TEST_XDP_LIVE_FRAMES.to_ne_bytes());
    sys_bpf(BPF_PROG_TEST_RUN, &mut attr).context("BPF_PROG_TEST_RUN (xdp live frames)")?;
    Ok(())
}

/// The ifindex of `device` in `ns`.
pub fn ifindex(ns: &Netns, device: &str) -> Result<u32> {
    let dev = CString::new(device)?;
    let index = ns.run(move || {
        // SAFETY: a valid NUL-terminated name.
        unsafe { libc::if_nametoindex(dev.as_ptr()) }
    })?;
    if index == 0 {
        bail!("no device {device} in {}", ns.name());
    }
    Ok(index)
}

/// The `map_flags` of the map pinned at `pin` (`BPF_F_NO_PREALLOC` is 1).
pub fn pinned_map_flags(pin: &Path) -> Result<u32> {
    Ok(aya::maps::MapInfo::from_pin(pin)
        .with_context(|| format!("opening {}", pin.display()))?
        .map_flags())
}
