//! Loading the embedded object, adopting pinned maps, checking they fit.

use std::{
    ffi::CString,
    fs, io, mem,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, Map, MapData, MapInfo, ProgramArray},
    programs::SchedClassifier,
    Ebpf, EbpfLoader,
};
use sluice_common::{
    maps as names, stats::STAT_COUNT, Affinity4Key, Affinity6Key, AffinityValue, Backend, Config,
    Ct4Key, Ct6Key, CtEntry, MaglevTable, SockEntry, SockRevKey, SockRevValue, SrcRange4,
    SrcRange6, Svc4Key, Svc6Key, SvcValue, ABI_VERSION,
};

use super::{links::Hook, DatapathError, Maps, BPF_OBJECT, LINKS_DIR};

/// Capacities of the sized maps (the `--*-map-size` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub conntrack: u32,
    pub affinity: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            services: names::DEFAULT_SERVICES_MAX,
            backends: names::DEFAULT_BACKENDS_MAX,
            conntrack: names::DEFAULT_CONNTRACK_MAX,
            affinity: names::DEFAULT_AFFINITY_MAX,
        }
    }
}

/// The loaded programs, ready to attach. Dropping it leaves attached
/// devices running: their links are pinned.
pub struct Datapath {
    pub(super) ebpf: Ebpf,
    pub(super) root: PathBuf,
}

/// `statfs` magic of bpffs.
pub(crate) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// What one map must look like, to adopt a pin of it.
struct Spec {
    name: &'static str,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
}

fn specs(sizes: &MapSizes) -> [Spec; 16] {
    [
        Spec {
            name: names::SERVICES_V4,
            key_size: mem::size_of::<Svc4Key>(),
            value_size: mem::size_of::<SvcValue>(),
            max_entries: sizes.services,
        },
        Spec {
            name: names::BACKENDS,
            key_size: mem::size_of::<u32>(),
            value_size: mem::size_of::<Backend>(),
            max_entries: sizes.backends,
        },
        Spec {
            name: names::CONNTRACK_V4,
            key_size: mem::size_of::<Ct4Key>(),
            value_size: mem::size_of::<CtEntry>(),
            max_entries: sizes.conntrack,
        },
        // The IPv6 maps take the IPv4 maps' sizes: one flag per kind.
        Spec {
            name: names::SERVICES_V6,
            key_size: mem::size_of::<Svc6Key>(),
            value_size: mem::size_of::<SvcValue>(),
            max_entries: sizes.services,
        },
        Spec {
            name: names::CONNTRACK_V6,
            key_size: mem::size_of::<Ct6Key>(),
            value_size: mem::size_of::<CtEntry>(),
            max_entries: sizes.conntrack,
        },
        Spec {
            name: names::STATS,
            key_size: mem::size_of::<u32>(),
            value_size: mem::size_of::<u64>(),
            max_entries: STAT_COUNT,
        },
        Spec {
            name: names::CONFIG,
            key_size: mem::size_of::<u32>(),
            value_size: mem::size_of::<Config>(),
            max_entries: 1,
        },
        Spec {
            name: names::AFFINITY_V4,
            key_size: mem::size_of::<Affinity4Key>(),
            value_size: mem::size_of::<AffinityValue>(),
            max_entries: sizes.affinity,
        },
        Spec {
            name: names::SOURCE_RANGES_V4,
            key_size: 4 + mem::size_of::<SrcRange4>(),
            value_size: 1,
            max_entries: names::SOURCE_RANGES_MAX,
        },
        Spec {
            name: names::SOCKETS,
            key_size: mem::size_of::<u64>(),
            value_size: mem::size_of::<SockEntry>(),
            max_entries: names::SOCKETS_MAX,
        },
        Spec {
            name: names::SOCK_REV,
            key_size: mem::size_of::<SockRevKey>(),
            value_size: mem::size_of::<SockRevValue>(),
            max_entries: names::SOCKETS_MAX,
        },
        Spec {
            name: names::AFFINITY_V6,
            key_size: mem::size_of::<Affinity6Key>(),
            value_size: mem::size_of::<AffinityValue>(),
            max_entries: sizes.affinity,
        },
        Spec {
            name: names::SOURCE_RANGES_V6,
            key_size: 4 + mem::size_of::<SrcRange6>(),
            value_size: 1,
            max_entries: names::SOURCE_RANGES_MAX,
        },
        Spec {
            name: names::MAGLEV_V4,
            key_size: mem::size_of::<Svc4Key>(),
            value_size: mem::size_of::<MaglevTable>(),
            max_entries: names::MAGLEV_MAX,
        },
        Spec {
            name: names::MAGLEV_V6,
            key_size: mem::size_of::<Svc6Key>(),
            value_size: mem::size_of::<MaglevTable>(),
            max_entries: names::MAGLEV_MAX,
        },
        Spec {
            name: names::PROGS,
            key_size: mem::size_of::<u32>(),
            value_size: mem::size_of::<u32>(),
            max_entries: names::PROGS_MAX,
        },
    ]
}

impl Datapath {
    /// Loads the programs, reusing the maps pinned under `root` (creating
    /// and pinning them on first start). Nothing is attached yet.
    pub fn load(root: &Path, sizes: &MapSizes) -> Result<(Self, Maps), DatapathError> {
        if BPF_OBJECT.is_empty() {
            return Err(DatapathError::NoObject);
        }
        prepare_root(root)?;
        for spec in specs(sizes) {
            check_pin(root, &spec)?;
        }
        check_abi(root)?;

        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries(names::SERVICES_V4, sizes.services)
            .map_max_entries(names::BACKENDS, sizes.backends)
            .map_max_entries(names::CONNTRACK_V4, sizes.conntrack)
            .map_max_entries(names::SERVICES_V6, sizes.services)
            .map_max_entries(names::CONNTRACK_V6, sizes.conntrack)
            .map_max_entries(names::AFFINITY_V4, sizes.affinity)
            .map_max_entries(names::AFFINITY_V6, sizes.affinity);
        for name in names::ALL {
            loader.map_pin_path(name, root.join(name));
        }
        let mut ebpf = loader.load(BPF_OBJECT)?;
        for hook in Hook::ALL {
            let name = hook.program();
            let program: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(DatapathError::MissingProgram(name))?
                .try_into()
                .map_err(|source| DatapathError::Program { name, source })?;
            program
                .load()
                .map_err(|source| DatapathError::Program { name, source })?;
        }
        load_ipv6_halves(&mut ebpf)?;
        super::cgroup::load(&mut ebpf)?;
        let maps = Maps::take(&mut ebpf)?;
        Ok((
            Self {
                ebpf,
                root: root.to_owned(),
            },
            maps,
        ))
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

/// A pinned map must have the key, value and entry counts this agent
/// expects; otherwise the programs would run against the wrong layout.
fn check_pin(root: &Path, spec: &Spec) -> Result<(), DatapathError> {
    let path = root.join(spec.name);
    if !path.exists() {
        return Ok(());
    }
    let info = MapInfo::from_pin(&path).map_err(|source| DatapathError::Map {
        name: spec.name,
        source,
    })?;
    let checks = [
        ("key size", info.key_size(), spec.key_size as u32),
        ("value size", info.value_size(), spec.value_size as u32),
        ("max_entries", info.max_entries(), spec.max_entries),
    ];
    for (what, pinned, wanted) in checks {
        if pinned != wanted {
            return Err(DatapathError::IncompatiblePin {
                path,
                what,
                pinned,
                wanted,
            });
        }
    }
    Ok(())
}

/// Pins written by another ABI version are refused.
fn check_abi(root: &Path) -> Result<(), DatapathError> {
    let path = root.join(names::CONFIG);
    if !path.exists() {
        return Ok(());
    }
    let name = names::CONFIG;
    let data = MapData::from_pin(&path).map_err(|source| DatapathError::Map { name, source })?;
    let map = Map::from_map_data(data).map_err(|source| DatapathError::Map { name, source })?;
    let config: Array<MapData, Config> =
        Array::try_from(map).map_err(|source| DatapathError::Map { name, source })?;
    let found = config
        .get(&0, 0)
        .map_err(|source| DatapathError::Map { name, source })?
        .abi_version;
    if found != 0 && found != ABI_VERSION {
        return Err(DatapathError::AbiMismatch {
            root: root.to_owned(),
            found,
            wanted: ABI_VERSION,
        });
    }
    Ok(())
}
