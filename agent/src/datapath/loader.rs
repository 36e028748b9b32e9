//! Loading the embedded object, adopting pinned maps, checking they fit.

use std::{
    ffi::CString,
    fs, io, mem,
    os::fd::AsFd,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, ProgramArray},
    programs::{SchedClassifier, Xdp},
    Ebpf, EbpfLoader,
};
use sluice_common::{abi::MAPS, maps as names, socket::MARKS_VALID};

use super::{
    layout,
    links::TC_PROGRAMS,
    log::{LogLevel, Logger},
    migrate::Migration,
    DatapathError, Maps, BPF_OBJECT, BPF_OBJECT_PREALLOC, LINKS_DIR,
};

/// Capacities of the sized maps (the `--*-map-size` flags), and whether
/// the preallocatable ones are preallocated (`--preallocate-maps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub conntrack: u32,
    pub affinity: u32,
    pub maglev: u32,
    /// `sluice_common::abi::PREALLOCATABLE` created without
    /// `BPF_F_NO_PREALLOC` (from the object built with that feature).
    pub preallocate: bool,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            services: names::DEFAULT_SERVICES_MAX,
            backends: names::DEFAULT_BACKENDS_MAX,
            conntrack: names::DEFAULT_CONNTRACK_MAX,
            affinity: names::DEFAULT_AFFINITY_MAX,
            maglev: names::MAGLEV_MAX,
            preallocate: false,
        }
    }
}

/// The loaded programs, ready to attach. Dropping it leaves attached
/// devices running: their links are pinned.
pub struct Datapath {
    pub(super) ebpf: Ebpf,
    pub(super) root: PathBuf,
    pub(super) migration: Migration,
    /// The reader of the programs' logs, when `--datapath-log-level` is on.
    logger: Option<Logger>,
}

/// `statfs` magic of bpffs.
pub(crate) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The embedded eBPF object these sizes load: the one whose
/// preallocatable maps are preallocated, or the default one.
pub fn object(sizes: &MapSizes) -> &'static [u8] {
    if sizes.preallocate {
        BPF_OBJECT_PREALLOC
    } else {
        BPF_OBJECT
    }
}

impl Datapath {
    /// Loads the programs, reusing the maps pinned under `root` (creating
    /// and pinning them on first start). Nothing is attached yet.
    pub fn load(root: &Path, sizes: &MapSizes) -> Result<(Self, Maps), DatapathError> {
        Self::load_logging(root, sizes, LogLevel::Off)
    }

    /// `load`, with the programs' developer logs at `log_level` (read by
    /// `take_logger`).
    pub fn load_logging(
        root: &Path,
        sizes: &MapSizes,
        log_level: LogLevel,
    ) -> Result<(Self, Maps), DatapathError> {
        let object = object(sizes);
        if object.is_empty() {
            return Err(DatapathError::NoObject);
        }
        prepare_root(root)?;
        // Pins of another layout (an upgrade, a rollback, a resize) get new
        // maps staged beside them, filled from the old ones.
        let mut migration = Migration::begin(root, sizes, object)?;

        let mut loader = EbpfLoader::new();
        let level = log_level.aya();
        loader.override_global("AYA_LOG_LEVEL", &level, true);
        for decl in &MAPS {
            loader
                .map_max_entries(decl.name, layout::capacity(decl, sizes))
                .map_pin_path(decl.name, migration.pin_path(decl.name));
        }
        let mut ebpf = loader.load(object)?;
        for name in TC_PROGRAMS {
            let program: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(DatapathError::MissingProgram(name))?
                .try_into()
                .map_err(|source| DatapathError::Program { name, source })?;
            program
                .load()
                .map_err(|source| DatapathError::Program { name, source })?;
        }
        let name = super::xdp::PROGRAM;
        let program: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or(DatapathError::MissingProgram(name))?
            .try_into()
            .map_err(|source| DatapathError::Program { name, source })?;
        program
            .load()
            .map_err(|source| DatapathError::Program { name, source })?;
        load_ipv6_halves(&mut ebpf)?;
        super::cgroup::load(&mut ebpf)?;
        // Everything that can refuse this object (its maps' types, the
        // log reader) comes before the copy commits a migration: a
        // refusal after the commit point would leave a committed
        // generation that no agent of this build can take up.
        let mut maps = Maps::take(&mut ebpf)?;
        let logger = if log_level == LogLevel::Off {
            None
        } else {
            Some(
                aya_log::EbpfLogger::init_with_logger(&mut ebpf, super::log::Forward)
                    .map_err(DatapathError::Log)?,
            )
        };
        migration.copy()?;
        // `sl_sockmark`'s counts are trusted only once this agent's scan
        // found them complete: the pins may come from a rollback whose
        // programs never counted (or a copy may have lost an update).
        maps.sock_marks
            .set(MARKS_VALID, 0, 0)
            .map_err(|source| DatapathError::Map {
                name: names::SOCK_MARKS,
                source,
            })?;
        // With the counts not valid no program takes an `sl_socktab` slot:
        // what the table holds (the last agent's, or stale ones an older
        // release left behind) goes to `sl_sock`.
        maps.move_sock_table();
        if migration.pending() {
            let name = names::HANDOVER;
            match ebpf.map(name) {
                Some(aya::maps::Map::ProgramArray(data)) => {
                    migration.hand_over(data.fd().as_fd())?;
                }
                _ => return Err(DatapathError::MissingMap(name)),
            }
        }
        Ok((
            Self {
                ebpf,
                root: root.to_owned(),
                migration,
                logger,
            },
            maps,
        ))
    }

    /// Ends a migration once every pinned link runs this agent's programs
    /// (after the first device scan and the cgroup attach); a no-op when
    /// the pins fitted as they were.
    pub fn finish_migration(&mut self) -> Result<(), DatapathError> {
        self.migration.finish()
    }

    /// The reader of the programs' logs (once; `None` with logs off).
    pub fn take_logger(&mut self) -> Option<Logger> {
        self.logger.take()
    }

    /// Whether the pins are being migrated to this agent's layout.
    pub fn migrating(&self) -> bool {
        self.migration.pending()
    }

    /// The bpffs directory of this instance.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// The IPv6 halves of the TC programs, entered by tail call from the
/// attached programs through the pinned `sl_progs`. Filled before anything
/// is attached; a restarted agent's entries replace the old ones in place,
/// so every attached program jumps to a loaded one at all times.
const IPV6_HALVES: [(&str, u32); 2] = [
    ("sl_ingress6", names::PROG_INGRESS6),
    ("sl_egress6", names::PROG_EGRESS6),
];

fn load_ipv6_halves(ebpf: &mut Ebpf) -> Result<(), DatapathError> {
    let mut fds = Vec::with_capacity(IPV6_HALVES.len());
    for (name, index) in IPV6_HALVES {
        let program: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or(DatapathError::MissingProgram(name))?
            .try_into()
            .map_err(|source| DatapathError::Program { name, source })?;
        program
            .load()
            .map_err(|source| DatapathError::Program { name, source })?;
        let fd = program
            .fd()
            .map_err(|source| DatapathError::Program { name, source })?
            .try_clone()
            .map_err(|source| DatapathError::Io {
                path: PathBuf::from(name),
                source,
            })?;
        fds.push((index, fd));
    }
    let map = ebpf
        .map_mut(names::PROGS)
        .ok_or(DatapathError::MissingMap(names::PROGS))?;
    let name = names::PROGS;
    let mut progs: ProgramArray<&mut MapData> =
        ProgramArray::try_from(map).map_err(|source| DatapathError::Map { name, source })?;
    for (index, fd) in &fds {
        progs
            .set(*index, fd, 0)
            .map_err(|source| DatapathError::Map { name, source })?;
    }
    Ok(())
}

/// Creates `root` (and its links directory) on a bpffs mount.
fn prepare_root(root: &Path) -> Result<(), DatapathError> {
    let mut existing = root;
    while !existing.exists() {
        existing = existing
            .parent()
            .ok_or_else(|| DatapathError::NotBpffs(root.to_owned()))?;
    }
    if fs_type(existing)? != BPF_FS_MAGIC {
        return Err(DatapathError::NotBpffs(root.to_owned()));
    }
    let links = root.join(LINKS_DIR);
    fs::create_dir_all(&links).map_err(|source| DatapathError::Io {
        path: links,
        source,
    })
}

/// The `statfs` filesystem magic of `path`.
pub(crate) fn fs_type(path: &Path) -> Result<i64, DatapathError> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| DatapathError::Io {
        path: path.to_owned(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    // SAFETY: statfs writes into the zeroed struct we own; `c` is a valid
    // NUL-terminated path.
    let mut st: libc::statfs = unsafe { mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(DatapathError::Io {
            path: path.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(st.f_type)
}
