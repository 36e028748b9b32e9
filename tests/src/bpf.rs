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

pub(crate) fn put(attr: &mut [u8; 128], offset: usize, bytes: &[u8]) {
    attr[offset..offset + bytes.len()].copy_from_slice(bytes);
}

pub(crate) fn fd(rc: i64) -> io::Result<OwnedFd> {
    let fd = i32::try_from(rc).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: a fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// (link id, program id) of every TCX link on `device` of `ns`.
pub fn tcx_links(ns: &Netns, device: &str, attach_type: u32) -> Result<Vec<(u32, u32)>> {
    let device = CString::new(device)?;
    ns.run(move || -> Result<Vec<(u32, u32)>> {
        // SAFETY: a valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(device.as_ptr()) };
        if ifindex == 0 {
            bail!("no device {device:?}");
        }
        let mut progs = [0u32; 64];
        let mut links = [0u32; 64];
        let mut attr = [0u8; 128];
        put(&mut attr, 0, &ifindex.to_ne_bytes());
        put(&mut attr, 4, &attach_type.to_ne_bytes());
        put(&mut attr, 16, &(progs.as_mut_ptr() as u64).to_ne_bytes());
        put(&mut attr, 24, &64u32.to_ne_bytes());
        put(&mut attr, 40, &(links.as_mut_ptr() as u64).to_ne_bytes());
        sys_bpf(BPF_PROG_QUERY, &mut attr).context("BPF_PROG_QUERY")?;
        let count = u32::from_ne_bytes([attr[24], attr[25], attr[26], attr[27]]) as usize;
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
        let dev = CString::new(device)?;
        let link = ns.run(move || -> Result<OwnedFd> {
            // r0 = -1 (TCX_NEXT); exit
            let insns: [u8; 16] = [
                0xb7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x95, 0, 0, 0, 0, 0, 0, 0,
            ];
            let license = CString::new("GPL")?;
            let mut attr = [0u8; 128];
            put(&mut attr, 0, &BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
            put(&mut attr, 4, &2u32.to_ne_bytes());
            put(&mut attr, 8, &(insns.as_ptr() as u64).to_ne_bytes());
            put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
            put(&mut attr, 48, b"foreign_next");
            let prog = fd(sys_bpf(BPF_PROG_LOAD, &mut attr).context("BPF_PROG_LOAD")?)?;
            // SAFETY: a valid NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
            let mut attr = [0u8; 128];
            put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_ne_bytes());
            put(&mut attr, 4, &ifindex.to_ne_bytes());
            put(&mut attr, 8, &attach_type.to_ne_bytes());
            Ok(fd(
                sys_bpf(BPF_LINK_CREATE, &mut attr).context("BPF_LINK_CREATE")?
            )?)
        })??;
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", link.as_raw_fd()))?;
        let link_id = info
            .lines()
            .find_map(|l| l.strip_prefix("link_id:"))
            .and_then(|v| v.trim().parse().ok())
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
                start = u32::from_ne_bytes([attr[4], attr[5], attr[6], attr[7]]);
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
