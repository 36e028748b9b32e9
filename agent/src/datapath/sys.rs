//! The raw `bpf(2)` map commands aya 0.14 does not expose: byte-level map
//! access (a migration copies maps whose types it only knows from BTF),
//! map and BTF info, and swapping the program of a link. Link and program
//! queries (for `sluice cleanup`) are in `bpf.rs`.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// `BPF_NOEXIST`: insert only.
pub const NOEXIST: u64 = 1;
/// `BPF_ANY`.
pub const ANY: u64 = 0;
/// `BPF_EXIST`: update only.
pub const EXIST: u64 = 2;

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-padded 128-byte `union bpf_attr` whose
    // pointers, where the command has any, point at live buffers of the
    // sizes the command reads or writes (checked by each caller).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: a fresh fd the kernel just returned to us.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `BPF_OBJ_GET` (links and programs are in `bpf.rs`, which has it too).
pub use super::bpf::obj_get;

/// `BPF_OBJ_PIN`: pins `fd` at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = [0u64; 16];
    attr[0] = c.as_ptr() as u64;
    attr[1] = fd.as_raw_fd() as u32 as u64;
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_LINK_UPDATE`: swaps the program of `link` (TCX, XDP and cgroup
/// links alike) in one step.
pub fn link_update(link: BorrowedFd<'_>, program: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = (link.as_raw_fd() as u32 as u64) | ((program.as_raw_fd() as u32 as u64) << 32);
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// What the kernel says about a map (`struct bpf_map_info`, the fields a
/// migration needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub btf_id: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
}

fn obj_info(fd: BorrowedFd<'_>, info: &mut [u8]) -> io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = (fd.as_raw_fd() as u32 as u64) | ((info.len() as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a map.
pub fn map_info(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
    // struct bpf_map_info: type, id, key_size, value_size, max_entries,
    // map_flags (u32 each), name[16], ifindex, btf_vmlinux_value_type_id,
    // netns_dev (u64), netns_ino (u64), btf_id, btf_key_type_id,
    // btf_value_type_id.
    let mut b = [0u8; 88];
    obj_info(fd, &mut b)?;
    Ok(MapInfo {
        map_type: le32(&b, 0),
        id: le32(&b, 4),
        key_size: le32(&b, 8),
        value_size: le32(&b, 12),
        max_entries: le32(&b, 16),
        map_flags: le32(&b, 20),
        btf_id: le32(&b, 64),
        btf_key_type_id: le32(&b, 68),
        btf_value_type_id: le32(&b, 72),
    })
}

/// The raw BTF blob with kernel id `id`.
pub fn btf_by_id(id: u32) -> io::Result<Vec<u8>> {
    let mut attr = [0u64; 16];
    attr[0] = id as u64;
    let fd = owned(bpf(BPF_BTF_GET_FD_BY_ID, &mut attr)?);
    // struct bpf_btf_info: btf (u64 pointer), btf_size, id, ...
    let mut info = [0u8; 32];
    obj_info(fd_ref(&fd), &mut info)?;
    let size = le32(&info, 8) as usize;
    let mut data = vec![0u8; size];
    info = [0u8; 32];
    info[0..8].copy_from_slice(&(data.as_mut_ptr() as u64).to_le_bytes());
    info[8..12].copy_from_slice(&(size as u32).to_le_bytes());
    obj_info(fd_ref(&fd), &mut info)?;
    Ok(data)
}

fn fd_ref(fd: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    fd.as_fd()
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first with `None`);
/// `Ok(false)` at the end.
pub fn map_next_key(fd: BorrowedFd<'_>, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let mut attr = [0u64; 16];
    attr[0] = fd.as_raw_fd() as u32 as u64;
    attr[1] = key.map_or(0, |k| k.as_ptr() as u64);
    attr[2] = next.as_mut_ptr() as u64;
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_LOOKUP_ELEM`; `Ok(false)` when absent. `value` must be the
/// map's value size (rounded up to 8 and times the possible CPUs for a
/// per-CPU map).
pub fn map_lookup(fd: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut attr = [0u64; 16];
    attr[0] = fd.as_raw_fd() as u32 as u64;
    attr[1] = key.as_ptr() as u64;
    attr[2] = value.as_mut_ptr() as u64;
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_UPDATE_ELEM` with `flags` (`ANY`, `NOEXIST`).
pub fn map_update(fd: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = fd.as_raw_fd() as u32 as u64;
    attr[1] = key.as_ptr() as u64;
    attr[2] = value.as_ptr() as u64;
    attr[3] = flags;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// `BPF_MAP_UPDATE_BATCH`: puts `keys.len() / key_size` entries in order,
/// `keys` and `values` packed back to back (`values` at the map's value
/// size). On failure, how many entries went in before the one that
/// failed (the kernel writes that count back), and the error.
pub fn map_update_batch(
    fd: BorrowedFd<'_>,
    keys: &[u8],
    values: &[u8],
    count: u32,
) -> Result<(), (u32, io::Error)> {
    // union bpf_attr, batch: in_batch, out_batch, keys, values (u64 each),
    // count, map_fd (u32 each), elem_flags, flags (u64 each).
    let mut attr = [0u64; 16];
    attr[2] = keys.as_ptr() as u64;
    attr[3] = values.as_ptr() as u64;
    attr[4] = count as u64 | ((fd.as_raw_fd() as u32 as u64) << 32);
    attr[5] = ANY;
    match bpf(BPF_MAP_UPDATE_BATCH, &mut attr) {
        Ok(_) => Ok(()),
        Err(e) => {
            // A call refused before the kernel wrote the count back (a
            // permission, a bad fd, an early allocation failure on older
            // kernels) leaves ours in place: nothing is known to have
            // gone in, and the caller's record must not say otherwise
            // (writing an entry again is harmless, missing one is not).
            let done = (attr[4] & 0xffff_ffff) as u32;
            Err((if done >= count { 0 } else { done }, e))
        }
    }
}

/// `BPF_MAP_DELETE_ELEM`; absent keys are fine.
pub fn map_delete(fd: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = fd.as_raw_fd() as u32 as u64;
    attr[1] = key.as_ptr() as u64;
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(e),
        _ => Ok(()),
    }
}

/// `BPF_PROG_GET_FD_BY_ID`.
pub fn prog_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    attr[0] = id as u64;
    bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map(owned)
}

/// CPUs the kernel may run on: per-CPU map values hold one slot each.
pub fn possible_cpus() -> io::Result<usize> {
    aya::util::nr_cpus().map_err(|(_, e)| e)
}
