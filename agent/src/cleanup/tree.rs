//! The bpffs tree under `--bpf-root`: checking it is safe to remove,
//! listing what each pin holds, removing it all.

use std::{
    fs, io,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::CleanupError;
use crate::datapath::{
    bpf::{self, LinkInfo, ObjKind},
    fs_type, BPF_FS_MAGIC,
};

/// What a path under the root is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Map,
    Link,
    Program,
    Directory,
    /// A symlink, or a pin that could not be identified.
    Other,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Map => "map",
            Kind::Link => "link",
            Kind::Program => "program",
            Kind::Directory => "directory",
            Kind::Other => "pin",
        }
    }
}

/// One path under the root.
#[derive(Clone, Debug)]
pub struct Entry {
    pub path: PathBuf,
    pub kind: Kind,
    /// The map, link or program id.
    pub id: Option<u32>,
    /// For a link: where it is attached.
    pub link: Option<LinkInfo>,
}

/// Checks that `root` is a directory inside a bpffs mount, and not the
/// mount itself, and returns it in canonical form.
pub fn check_root(root: &Path) -> Result<PathBuf, CleanupError> {
    let meta = fs::symlink_metadata(root).map_err(CleanupError::io(root))?;
    if !meta.is_dir() {
        return Err(CleanupError::NotBpffs(root.to_owned()));
    }
    let root = fs::canonicalize(root).map_err(CleanupError::io(root))?;
    if fs_type(&root)? != BPF_FS_MAGIC {
        return Err(CleanupError::NotBpffs(root));
    }
    let parent = root
        .parent()
        .ok_or_else(|| CleanupError::MountPoint(root.clone()))?;
    let parent_meta = fs::metadata(parent).map_err(CleanupError::io(parent))?;
    if parent_meta.dev() != meta.dev() {
        return Err(CleanupError::MountPoint(root));
    }
    Ok(root)
}

/// Every path under `root` and `root` itself, children before their
/// directory (the order to remove them in).
pub fn list(root: &Path) -> Result<Vec<Entry>, CleanupError> {
    let dev = fs::symlink_metadata(root)
        .map_err(CleanupError::io(root))?
        .dev();
    let mut out = Vec::new();
    walk(root, dev, &mut out)?;
    Ok(out)
}

fn walk(dir: &Path, dev: u64, out: &mut Vec<Entry>) -> Result<(), CleanupError> {
    let mut children: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(CleanupError::io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()
        .map_err(CleanupError::io(dir))?;
    children.sort();
    for path in children {
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(CleanupError::io(path)(e)),
        };
        if meta.is_dir() {
            if meta.dev() != dev {
                return Err(CleanupError::NestedMount(path));
            }
            walk(&path, dev, out)?;
        } else if meta.file_type().is_symlink() {
            out.push(Entry {
                path,
                kind: Kind::Other,
                id: None,
                link: None,
            });
        } else {
            out.push(identify(path)?);
        }
    }
    out.push(Entry {
        path: dir.to_owned(),
        kind: Kind::Directory,
        id: None,
        link: None,
    });
    Ok(())
}

/// Opens a pin to tell a map from a link or a program.
fn identify(path: PathBuf) -> Result<Entry, CleanupError> {
    let fd = match bpf::obj_get(&path) {
        Ok(fd) => fd,
        // Not a BPF object (or gone): removed all the same.
        Err(_) => {
            return Ok(Entry {
                path,
                kind: Kind::Other,
                id: None,
                link: None,
            })
        }
    };
    let (kind, id) = bpf::identify(fd.as_fd()).map_err(CleanupError::io(&path))?;
    let link =
        match kind {
            ObjKind::Link => Some(bpf::link_info(fd.as_fd()).map_err(CleanupError::bpf(
                format!("link pinned at {}", path.display()),
            ))?),
            _ => None,
        };
    let kind = match kind {
        ObjKind::Map => Kind::Map,
        ObjKind::Link => Kind::Link,
        ObjKind::Program => Kind::Program,
        ObjKind::Other => Kind::Other,
    };
    Ok(Entry {
        path,
        kind,
        id,
        link,
    })
}

/// Removes `entries` in order (as listed: children first). Something
/// already gone is fine.
pub fn remove(entries: &[Entry]) -> Result<(), CleanupError> {
    for entry in entries {
        let result = if entry.kind == Kind::Directory {
            fs::remove_dir(&entry.path)
        } else {
            fs::remove_file(&entry.path)
        };
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(CleanupError::io(&entry.path)(e))
            }
            _ => {}
        }
    }
    Ok(())
}
