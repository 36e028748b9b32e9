//! `sluice cleanup`: removes every trace of sluice from the node, for an
//! uninstall (kube-proxy's `--cleanup`).
//!
//! What is sluice's: everything under `--bpf-root` (map pins, the TCX and
//! cgroup link pins under `links/`, whatever else is there, such as a
//! migration's staging directory), and any link of one of sluice's
//! programs (`sl_ingress`, `sl_egress`, the cgroup programs) attached to a
//! device of this network namespace or to `--cgroup-root` (see
//! [`strays`]). Every such link is detached explicitly
//! (`BPF_LINK_DETACH`), so that it goes even if a process holds it open;
//! then the tree is removed, which frees the maps and, with the links,
//! the programs. Nothing is done while a process other than this one
//! holds a map the datapath uses (a running agent), unless forced.
//!
//! Running it again after an interruption finishes the job; with nothing
//! left it reports so and succeeds.

mod error;
mod holders;
mod report;
mod strays;
mod tree;

use std::{
    collections::BTreeSet,
    fs, io,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

pub use error::CleanupError;
pub use report::{Detached, Removed, Report};

use crate::datapath::{
    bpf::{self, LinkInfo, LinkTarget},
    cgroup2_mount, fs_type,
};

/// `CGROUP2_SUPER_MAGIC`.
const CGROUP2_MAGIC: i64 = 0x6367_7270;

pub struct Options {
    pub bpf_root: PathBuf,
    /// The cgroup whose socket-level links are sluice's (default: the
    /// cgroup2 mount).
    pub cgroup_root: Option<PathBuf>,
    /// Go ahead while a process holds the datapath's maps.
    pub force: bool,
}

/// The cgroup's id (on cgroup2, its directory's inode number, which is
/// what a cgroup link's info reports).
fn cgroup_id(path: &Path) -> Result<u64, CleanupError> {
    let meta = fs::metadata(path).map_err(CleanupError::io(path))?;
    if !meta.is_dir() || fs_type(path)? != CGROUP2_MAGIC {
        return Err(CleanupError::NotCgroup2(path.to_owned()));
    }
    Ok(meta.ino())
}

/// Where a link is attached, in words.
fn describe(target: &LinkTarget, cgroup: &Option<(PathBuf, u64)>) -> String {
    match *target {
        LinkTarget::Tcx {
            ifindex,
            attach_type,
        } => {
            let dir = strays::direction(attach_type);
            let name = crate::netdev::devices()
                .into_iter()
                .find(|(_, i)| *i == ifindex)
                .map(|(n, _)| n)
                .unwrap_or_else(|| format!("ifindex {ifindex}"));
            format!("tcx {dir} on {name}")
        }
        LinkTarget::Cgroup { cgroup_id, .. } => match cgroup {
            Some((path, id)) if *id == cgroup_id => format!("cgroup {}", path.display()),
            _ => format!("cgroup id {cgroup_id}"),
        },
        LinkTarget::Xdp { ifindex } => {
            let name = crate::netdev::devices()
                .into_iter()
                .find(|(_, i)| *i == ifindex)
                .map(|(n, _)| n)
                .unwrap_or_else(|| format!("ifindex {ifindex}"));
            format!("xdp on {name}")
        }
        LinkTarget::Other { link_type } => format!("link type {link_type}"),
    }
}

/// Whether a link is still on its hook (a link whose device or cgroup
/// went, or that was detached, reports 0).
fn attached(target: &LinkTarget) -> bool {
    match *target {
        LinkTarget::Tcx { ifindex, .. } | LinkTarget::Xdp { ifindex } => ifindex != 0,
        LinkTarget::Cgroup { cgroup_id, .. } => cgroup_id != 0,
        LinkTarget::Other { .. } => true,
    }
}

/// Removes sluice from this node (this network namespace, `--bpf-root`,
/// `--cgroup-root`) and reports what it removed.
pub fn run(opts: &Options) -> Result<Report, CleanupError> {
    let cgroup_path = opts.cgroup_root.clone().or_else(cgroup2_mount);
    let cgroup = match cgroup_path {
        Some(path) => {
            let id = cgroup_id(&path)?;
            Some((path, id))
        }
        None => None,
    };
    let root = match fs::symlink_metadata(&opts.bpf_root) {
        Ok(_) => Some(tree::check_root(&opts.bpf_root)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(CleanupError::io(&opts.bpf_root)(e)),
    };
    let entries = match &root {
        Some(root) => tree::list(root)?,
        None => Vec::new(),
    };
    let pinned: Vec<(&tree::Entry, LinkInfo)> = entries
        .iter()
        .filter_map(|e| e.link.map(|l| (e, l)))
        .collect();
    let pinned_ids: BTreeSet<u32> = pinned.iter().map(|(_, l)| l.id).collect();
    let strays = strays::find(cgroup.as_ref().map(|(_, id)| *id), &pinned_ids)?;

    // Every map this would free or cut off: the pinned ones, and those of
    // the programs of the links it would detach.
    let mut maps: BTreeSet<u32> = entries
        .iter()
        .filter(|e| e.kind == tree::Kind::Map)
        .filter_map(|e| e.id)
        .collect();
    let mut programs = Vec::with_capacity(pinned.len());
    for (_, link) in &pinned {
        let name = match bpf::prog_info(link.prog_id) {
            Ok(p) => {
                maps.extend(&p.map_ids);
                p.name
            }
            Err(_) => format!("program {}", link.prog_id),
        };
        programs.push(name);
    }
    for stray in &strays {
        maps.extend(&stray.program.map_ids);
    }
    let holders = holders::find(&maps);
    if !holders.is_empty() && !opts.force {
        return Err(CleanupError::InUse {
            root: opts.bpf_root.clone(),
            holders: holders::describe(&holders),
        });
    }

    let mut report = Report {
        bpf_root: root.clone().unwrap_or_else(|| opts.bpf_root.clone()),
        cgroup: cgroup.as_ref().map(|(p, _)| p.clone()),
        forced_past: holders,
        ..Report::default()
    };
    for ((entry, link), program) in pinned.iter().zip(programs) {
        if !attached(&link.target) {
            continue;
        }
        let fd = bpf::obj_get(&entry.path).map_err(CleanupError::io(&entry.path))?;
        bpf::link_detach(fd.as_fd())
            .map_err(CleanupError::bpf(format!("detaching link {}", link.id)))?;
        report.detached.push(Detached {
            link_id: link.id,
            program,
            attach: describe(&link.target, &cgroup),
            pin: Some(entry.path.clone()),
        });
    }
    for stray in &strays {
        bpf::link_detach(stray.fd.as_fd()).map_err(CleanupError::bpf(format!(
            "detaching link {}",
            stray.info.id
        )))?;
        report.detached.push(Detached {
            link_id: stray.info.id,
            program: stray.program.name.clone(),
            attach: describe(&stray.info.target, &cgroup),
            pin: None,
        });
    }
    tree::remove(&entries)?;
    report.removed = entries
        .into_iter()
        .map(|e| Removed {
            path: e.path,
            kind: e.kind,
            id: e.id,
        })
        .collect();
    Ok(report)
}
