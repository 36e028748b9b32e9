use std::{io, path::PathBuf};

use aya::{maps::MapError, programs::ProgramError};

/// Failures to load, adopt or attach the datapath.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error(
        "this sluice binary was built without its eBPF object: run `cargo xtask build-ebpf`, then rebuild"
    )]
    NoObject,
    #[error("reading the programs' logs (--datapath-log-level): {0}")]
    Log(#[source] aya_log::Error),
    #[error("{0} is not on a bpffs mount (mount one with `mount -t bpf bpf /sys/fs/bpf`)")]
    NotBpffs(PathBuf),
    #[error("reading BTF: {0}")]
    Btf(#[from] super::btf::BtfError),
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("program {0} is missing from the eBPF object")]
    MissingProgram(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("map {0} is missing from the eBPF object or its pins")]
    MissingMap(&'static str),
    #[error("attaching to {device}: {source}")]
    Attach {
        device: String,
        #[source]
        source: ProgramError,
    },
    #[error("link of {device}: {source}")]
    Link {
        device: String,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("device {0} does not exist")]
    NoDevice(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A bit of `sl_config` the agent cleared read back set every time
    /// (the datapath's own stores of the word kept bringing it back).
    #[error("sl_config: {0} came back each time it was cleared")]
    BitReturns(&'static str),
    /// A write of the agent's own (`sl_config`) while adopting or
    /// configuring the datapath.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Failures of single map writes. `Full` is reported per map so that the
/// agent can refuse the one service that does not fit.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("map {map} is full")]
    Full { map: &'static str },
    #[error("writing map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

impl WriteError {
    /// Classifies a failed update: E2BIG/ENOSPC/ENOMEM mean the map is full.
    pub(crate) fn from_map(map: &'static str, source: MapError) -> Self {
        if let MapError::SyscallError(sys) = &source {
            if matches!(
                sys.io_error.raw_os_error(),
                Some(libc::E2BIG) | Some(libc::ENOSPC) | Some(libc::ENOMEM)
            ) {
                return WriteError::Full { map };
            }
        }
        WriteError::Map { map, source }
    }
}
