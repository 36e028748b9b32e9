//! The raw `bpf(2)` commands aya 0.14 does not expose: opening a pin
//! whatever it holds, walking links by id, reading a link's attach point,
//! querying a device's TCX links, detaching a link, and a program's name
//! and maps. Everything works on the calling thread's network namespace.

use std::{
    ffi::CString,
    fs, io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;
const BPF_LINK_DETACH: libc::c_long = 34;

const BPF_LINK_TYPE_CGROUP: u32 = 3;
const BPF_LINK_TYPE_TCX: u32 = 11;
const BPF_LINK_TYPE_XDP: u32 = 6;
/// `BPF_TCX_INGRESS`; `BPF_TCX_EGRESS` is the next one.
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;

/// A `union bpf_attr` (at most 128 bytes for every command used here), or
/// an info struct the kernel fills; fields are written at their offsets in
/// native byte order.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Attr([u8; 128]);

impl Default for Attr {
    fn default() -> Self {
        Self([0; 128])
    }
}

impl Attr {
    fn set_u32(&mut self, offset: usize, value: u32) {
        self.0[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
    }

    fn set_u64(&mut self, offset: usize, value: u64) {
        self.0[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
    }

    fn u32(&self, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[offset..offset + 4]);
        u32::from_ne_bytes(b)
    }

    fn u64(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[offset..offset + 8]);
        u64::from_ne_bytes(b)
    }

    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
}

fn sys_bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-initialised `union bpf_attr` of 128 bytes,
    // filled for `cmd`; the kernel reads (and for queries writes) at most
    // that many bytes, and every buffer it points to is alive and as large
    // as the attr says.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.ptr(), 128u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

fn owned_fd(rc: i64) -> io::Result<OwnedFd> {
    let fd = i32::try_from(rc).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: a fresh fd returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `BPF_OBJ_GET`: opens the object (map, link or program) pinned at `path`.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = Attr::default();
    attr.set_u64(0, c.as_ptr() as u64); // pathname; bpf_fd, file_flags 0
    owned_fd(sys_bpf(BPF_OBJ_GET, &mut attr)?)
}

/// What kind of BPF object an fd refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjKind {
    Map,
    Link,
    Program,
    Other,
}

/// The kind of the object behind `fd` and its id, from
/// `/proc/self/fd` and `/proc/self/fdinfo` (which every BPF fd has).
pub fn identify(fd: BorrowedFd<'_>) -> io::Result<(ObjKind, Option<u32>)> {
    let n = fd.as_raw_fd();
    let target = fs::read_link(format!("/proc/self/fd/{n}"))?;
    let kind = kind_of_anon_inode(&target.to_string_lossy());
    let key = match kind {
        ObjKind::Map => "map_id",
        ObjKind::Link => "link_id",
        ObjKind::Program => "prog_id",
        ObjKind::Other => return Ok((kind, None)),
    };
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{n}"))?;
    Ok((kind, fdinfo_value(&info, key)))
}

/// `anon_inode:bpf-map` and friends. A link fd is `bpf_link` when the link
/// was created and `bpf-link` when opened from a pin or an id.
pub fn kind_of_anon_inode(target: &str) -> ObjKind {
    match target {
        "anon_inode:bpf-map" => ObjKind::Map,
        "anon_inode:bpf_link" | "anon_inode:bpf-link" => ObjKind::Link,
        "anon_inode:bpf-prog" => ObjKind::Program,
        _ => ObjKind::Other,
    }
}

/// The value of `key:` in an fdinfo text (`map_id:\t12`).
pub fn fdinfo_value(info: &str, key: &str) -> Option<u32> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().parse().ok())?
    })
}

/// Where a link is attached, as far as sluice cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkTarget {
    /// A TCX link: device index (0 once the device is gone) and
    /// `BPF_TCX_INGRESS`/`BPF_TCX_EGRESS`.
    Tcx { ifindex: u32, attach_type: u32 },
    /// A cgroup link: the cgroup's id (its inode number on cgroup2; 0 once
    /// detached) and its attach type.
    Cgroup { cgroup_id: u64, attach_type: u32 },
    /// An XDP link: device index (0 once the device is gone).
    Xdp { ifindex: u32 },
    /// Any other link type.
    Other { link_type: u32 },
}

/// The part of `struct bpf_link_info` sluice reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub id: u32,
    pub prog_id: u32,
    pub target: LinkTarget,
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info`, `len` bytes of it.
fn obj_info(fd: BorrowedFd<'_>, info: &mut Attr, len: u32) -> io::Result<()> {
    let mut attr = Attr::default();
    attr.set_u32(0, fd.as_raw_fd() as u32); // bpf_fd
    attr.set_u32(4, len); // info_len
    attr.set_u64(8, info.ptr() as u64); // info
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a link.
pub fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    // struct bpf_link_info: type u32 @0, id @4, prog_id @8, then the
    // per-type union at 16 (tcx: ifindex, attach_type; xdp: ifindex;
    // cgroup: cgroup_id u64, attach_type).
    let mut info = Attr::default();
    obj_info(fd, &mut info, 64)?;
    let link_type = info.u32(0);
    let target = match link_type {
        BPF_LINK_TYPE_TCX => LinkTarget::Tcx {
            ifindex: info.u32(16),
            attach_type: info.u32(20),
        },
        BPF_LINK_TYPE_XDP => LinkTarget::Xdp {
            ifindex: info.u32(16),
        },
        BPF_LINK_TYPE_CGROUP => LinkTarget::Cgroup {
            cgroup_id: info.u64(16),
            attach_type: info.u32(24),
        },
        _ => LinkTarget::Other { link_type },
    };
    Ok(LinkInfo {
        id: info.u32(4),
        prog_id: info.u32(8),
        target,
    })
}

/// Every link id on the machine (`BPF_LINK_GET_NEXT_ID`).
pub fn link_ids() -> io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut start = 0u32;
    loop {
        let mut attr = Attr::default();
        attr.set_u32(0, start); // start_id
        match sys_bpf(BPF_LINK_GET_NEXT_ID, &mut attr) {
            Ok(_) => {
                start = attr.u32(4); // next_id
                ids.push(start);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(ids),
            Err(e) => return Err(e),
        }
    }
}

/// `BPF_LINK_GET_FD_BY_ID`.
pub fn link_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr::default();
    attr.set_u32(0, id);
    owned_fd(sys_bpf(BPF_LINK_GET_FD_BY_ID, &mut attr)?)
}

/// `BPF_LINK_DETACH`: takes the link off its hook now, whoever else holds
/// or pins it (they keep a defunct link).
pub fn link_detach(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = Attr::default();
    attr.set_u32(0, fd.as_raw_fd() as u32); // link_fd
    sys_bpf(BPF_LINK_DETACH, &mut attr).map(drop)
}

/// A program's name and the ids of the maps it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgInfo {
    pub name: String,
    pub map_ids: Vec<u32>,
}

/// `BPF_PROG_GET_FD_BY_ID` + `BPF_OBJ_GET_INFO_BY_FD`.
pub fn prog_info(id: u32) -> io::Result<ProgInfo> {
    let mut attr = Attr::default();
    attr.set_u32(0, id); // prog_id
    let fd = owned_fd(sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?)?;
    let mut map_ids = [0u32; 64];
    // struct bpf_prog_info: nr_map_ids u32 @52, map_ids u64 @56,
    // name[16] @64; the kernel fills up to nr_map_ids ids into map_ids
    // and sets nr_map_ids to the program's count.
    let mut info = Attr::default();
    info.set_u32(52, map_ids.len() as u32);
    info.set_u64(56, map_ids.as_mut_ptr() as u64);
    obj_info(fd.as_fd(), &mut info, 80)?;
    let name = &info.0[64..80];
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    let count = (info.u32(52) as usize).min(map_ids.len());
    Ok(ProgInfo {
        name: String::from_utf8_lossy(&name[..end]).into_owned(),
        map_ids: map_ids[..count].to_vec(),
    })
}

/// The ids of the TCX links on device `ifindex` of the calling thread's
/// network namespace at `attach_type` (`BPF_PROG_QUERY`). A device that does
/// not exist here has none.
pub fn tcx_link_ids(ifindex: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut capacity = 64usize;
    loop {
        let mut progs = vec![0u32; capacity];
        let mut links = vec![0u32; capacity];
        let mut attr = Attr::default();
        attr.set_u32(0, ifindex); // target_ifindex
        attr.set_u32(4, attach_type);
        attr.set_u64(16, progs.as_mut_ptr() as u64); // prog_ids
        attr.set_u32(24, capacity as u32); // count
        attr.set_u64(40, links.as_mut_ptr() as u64); // link_ids
        match sys_bpf(BPF_PROG_QUERY, &mut attr) {
            Ok(_) => {
                let count = (attr.u32(24) as usize).min(capacity);
                links.truncate(count);
                links.retain(|id| *id != 0);
                return Ok(links);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && capacity < 65536 => {
                capacity *= 8;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fdinfo_and_anon_inodes() {
        let info =
            "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\nmap_type:\t1\nmap_id:\t842\n";
        assert_eq!(fdinfo_value(info, "map_id"), Some(842));
        assert_eq!(fdinfo_value(info, "map_type"), Some(1));
        assert_eq!(fdinfo_value(info, "link_id"), None);
        assert_eq!(kind_of_anon_inode("anon_inode:bpf-map"), ObjKind::Map);
        assert_eq!(kind_of_anon_inode("anon_inode:bpf_link"), ObjKind::Link);
        assert_eq!(kind_of_anon_inode("anon_inode:bpf-link"), ObjKind::Link);
        assert_eq!(kind_of_anon_inode("anon_inode:bpf-prog"), ObjKind::Program);
        assert_eq!(kind_of_anon_inode("/dev/null"), ObjKind::Other);
    }

    #[test]
    fn packs_attr_fields_at_their_offsets() {
        let mut attr = Attr::default();
        attr.set_u32(0, 7);
        attr.set_u32(4, 46);
        attr.set_u64(16, 0x1122_3344_5566_7788);
        attr.set_u32(24, 0xdead_beef);
        assert_eq!(attr.u32(0), 7);
        assert_eq!(attr.u32(4), 46);
        assert_eq!(attr.u64(16), 0x1122_3344_5566_7788);
        assert_eq!(attr.u32(24), 0xdead_beef);
        assert_eq!(attr.u32(28), 0);
        attr.set_u32(0, 9);
        assert_eq!(attr.u32(4), 46, "neighbour kept");
    }
}
