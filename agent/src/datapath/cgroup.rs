//! The socket-level programs: loaded with the TC ones, attached to a
//! cgroup (the whole node's, by default the cgroup2 root) with pinned links
//! `<root>/links/cgroup/<program>` (apart from the device links, which the
//! device manager owns), replaced in place on restart.

use std::{
    fs, io,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    path::{Path, PathBuf},
};

use aya::{
    programs::{links::FdLink, CgroupAttachMode, Program},
    Ebpf,
};
use sluice_common::{config::CFG_F_SOCK_PODS, Config};
use tracing::info;

use super::{Datapath, DatapathError, LINKS_DIR};

/// The cgroup programs, by name.
pub const PROGRAMS: [&str; 9] = [
    "sl_connect4",
    "sl_sendmsg4",
    "sl_recvmsg4",
    "sl_getpeername4",
    "sl_connect6",
    "sl_sendmsg6",
    "sl_recvmsg6",
    "sl_getpeername6",
    "sl_sock_release",
];

pub(super) fn load(ebpf: &mut Ebpf) -> Result<(), DatapathError> {
    for name in PROGRAMS {
        let program = ebpf
            .program_mut(name)
            .ok_or(DatapathError::MissingProgram(name))?;
        let result = match program {
            Program::CgroupSockAddr(p) => p.load(),
            Program::CgroupSock(p) => p.load(),
            _ => return Err(DatapathError::MissingProgram(name)),
        };
        result.map_err(|source| DatapathError::Program { name, source })?;
    }
    Ok(())
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on hybrid hosts).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, path, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(path))
    })
}

/// The calling thread's network namespace cookie (`SO_NETNS_COOKIE`).
pub fn netns_cookie() -> io::Result<u64> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The `--socket-lb` mode the datapath under `root` runs in, as the pins
/// and `config` say: `off` without pinned cgroup links or without the
/// node's namespace cookie, else `all` or `host` by `CFG_F_SOCK_PODS`.
pub fn socket_lb_mode(root: &Path, config: &Config) -> &'static str {
    let pins = root.join(LINKS_DIR).join("cgroup");
    let attached = PROGRAMS.iter().any(|name| pins.join(name).exists());
    if !attached || config.netns_cookie == 0 {
        "off"
    } else if config.flags() & CFG_F_SOCK_PODS != 0 {
        "all"
    } else {
        "host"
    }
}

/// Swaps the program of the cgroup link pinned at `pin` (aya 0.14 can do
/// this for TCX and XDP links only).
fn link_update(pin: &Path, program: BorrowedFd<'_>) -> io::Result<()> {
    let link = super::sys::obj_get(pin)?;
    super::sys::link_update(link.as_fd(), program)
}

impl Datapath {
    /// Removes the pinned cgroup links (`--socket-lb=off`): the programs a
    /// previous agent attached are detached with them.
    pub fn detach_cgroup(&mut self) -> Result<(), DatapathError> {
        let pins = self.root.join(LINKS_DIR).join("cgroup");
        for name in PROGRAMS {
            let pin = pins.join(name);
            match fs::remove_file(&pin) {
                Ok(()) => info!(program = name, "detached pinned cgroup link"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(DatapathError::Io { path: pin, source }),
            }
        }
        Ok(())
    }

    /// Attaches the socket-level programs to `cgroup`, swapping programs
    /// into pinned links left by a previous agent.
    pub fn attach_cgroup(&mut self, cgroup: &Path) -> Result<(), DatapathError> {
        let dir = fs::File::open(cgroup).map_err(|source| DatapathError::Io {
            path: cgroup.to_owned(),
            source,
        })?;
        let pins = self.root.join(LINKS_DIR).join("cgroup");
        fs::create_dir_all(&pins).map_err(|source| DatapathError::Io {
            path: pins.clone(),
            source,
        })?;
        for name in PROGRAMS {
            let pin = pins.join(name);
            let program = self
                .ebpf
                .program_mut(name)
                .ok_or(DatapathError::MissingProgram(name))?;
            let program_fd = match program {
                Program::CgroupSockAddr(p) => p.fd(),
                Program::CgroupSock(p) => p.fd(),
                _ => return Err(DatapathError::MissingProgram(name)),
            }
            .map_err(|source| DatapathError::Program { name, source })?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| DatapathError::Io {
                path: PathBuf::from(name),
                source,
            })?;
            if pin.exists() {
                if link_update(&pin, program_fd.as_fd()).is_ok() {
                    info!(program = name, "replaced program in pinned cgroup link");
                    continue;
                }
                let _ = fs::remove_file(&pin);
            }
            let target = format!("cgroup {}", cgroup.display());
            // Link-based cgroup attachments take no flags: they always
            // coexist with other programs (`Single` passes 0).
            let link: FdLink = match program {
                Program::CgroupSockAddr(p) => {
                    let id = p.attach(&dir, CgroupAttachMode::Single);
                    let link = id.and_then(|id| p.take_link(id));
                    let link = link.map_err(|source| DatapathError::Attach {
                        device: target.clone(),
                        source,
                    })?;
                    FdLink::try_from(link).map_err(|source| DatapathError::Link {
                        device: target,
                        source,
                    })?
                }
                Program::CgroupSock(p) => {
                    let id = p.attach(&dir, CgroupAttachMode::Single);
                    let link = id.and_then(|id| p.take_link(id));
                    let link = link.map_err(|source| DatapathError::Attach {
                        device: target.clone(),
                        source,
                    })?;
                    FdLink::try_from(link).map_err(|source| DatapathError::Link {
                        device: target,
                        source,
                    })?
                }
                _ => return Err(DatapathError::MissingProgram(name)),
            };
            link.pin(&pin).map_err(|e| DatapathError::Io {
                path: pin.clone(),
                source: io::Error::other(e),
            })?;
        }
        Ok(())
    }
}
