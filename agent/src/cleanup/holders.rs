//! Which processes hold the datapath's maps open: a running agent always
//! does (and so, for a moment, does `sluice status` or `bpftool`). Read
//! from `/proc/<pid>/fdinfo`, so it sees an agent in a container too when
//! run on the host (or in a pod with `hostPID`).

use std::{collections::BTreeSet, fs, path::Path};

use serde::Serialize;

use crate::datapath::bpf::{fdinfo_value, kind_of_anon_inode, ObjKind};

/// A process holding some of the maps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
}

/// Every process but this one with an fd on one of `map_ids`.
pub fn find(map_ids: &BTreeSet<u32>) -> Vec<Holder> {
    if map_ids.is_empty() {
        return Vec::new();
    }
    let me = std::process::id();
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != me && holds(&entry.path(), map_ids) {
            let command = fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim().to_owned())
                .unwrap_or_default();
            out.push(Holder { pid, command });
        }
    }
    out
}

/// Whether the process at `/proc/<pid>` has an fd on one of `map_ids`.
/// A process that exits or hides its fds holds nothing.
fn holds(proc_dir: &Path, map_ids: &BTreeSet<u32>) -> bool {
    let Ok(fds) = fs::read_dir(proc_dir.join("fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        let is_map = fs::read_link(fd.path())
            .is_ok_and(|t| kind_of_anon_inode(&t.to_string_lossy()) == ObjKind::Map);
        is_map
            && fs::read_to_string(proc_dir.join("fdinfo").join(fd.file_name()))
                .ok()
                .and_then(|info| fdinfo_value(&info, "map_id"))
                .is_some_and(|id| map_ids.contains(&id))
    })
}

/// `pid 123 (sluice), pid 456 (bpftool)`.
pub fn describe(holders: &[Holder]) -> String {
    holders
        .iter()
        .map(|h| format!("pid {} ({})", h.pid, h.command))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_maps_no_holders_and_a_readable_list() {
        assert!(find(&BTreeSet::new()).is_empty());
        let holders = [
            Holder {
                pid: 12,
                command: "sluice".into(),
            },
            Holder {
                pid: 40,
                command: "bpftool".into(),
            },
        ];
        assert_eq!(describe(&holders), "pid 12 (sluice), pid 40 (bpftool)");
    }
}
