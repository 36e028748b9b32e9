use std::{io, path::PathBuf};

use crate::datapath::DatapathError;

/// Why `sluice cleanup` removed nothing, or stopped half way (running it
/// again finishes the job).
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("refusing to clean {0}: it is not a directory on a bpffs mount")]
    NotBpffs(PathBuf),
    #[error(
        "refusing to clean {0}: it is a bpffs mount itself, which may hold other tools' pins; \
         sluice's --bpf-root is a directory inside one (default /sys/fs/bpf/sluice)"
    )]
    MountPoint(PathBuf),
    #[error("refusing to descend into {0}: another filesystem is mounted there")]
    NestedMount(PathBuf),
    #[error("--cgroup-root {0} is not a cgroup v2 directory")]
    NotCgroup2(PathBuf),
    #[error(
        "the datapath under {root} is in use by {holders}: stop the agent first \
         (delete the DaemonSet, or stop the process), or pass --force"
    )]
    InUse { root: PathBuf, holders: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Bpf {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

impl CleanupError {
    pub(super) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| CleanupError::Io { path, source }
    }

    pub(super) fn bpf(what: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let what = what.into();
        move |source| CleanupError::Bpf { what, source }
    }
}
