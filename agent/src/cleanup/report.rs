//! What `sluice cleanup` did, as text or JSON.

use std::{fmt::Write, path::PathBuf};

use serde::Serialize;

use super::{holders::Holder, tree::Kind};

/// A link taken off its hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Detached {
    pub link_id: u32,
    pub program: String,
    /// `tcx ingress on c0`, `cgroup /sys/fs/cgroup`.
    pub attach: String,
    /// Its pin under the root, if it had one.
    pub pin: Option<PathBuf>,
}

/// A pin or directory removed from the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub path: PathBuf,
    pub kind: Kind,
    pub id: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub bpf_root: PathBuf,
    /// The cgroup searched for socket-level links, if any.
    pub cgroup: Option<PathBuf>,
    pub detached: Vec<Detached>,
    pub removed: Vec<Removed>,
    /// With `--force`: the processes that held the maps (their programs
    /// and maps are freed only when they exit).
    pub forced_past: Vec<Holder>,
}

impl Report {
    /// Nothing was there.
    pub fn is_empty(&self) -> bool {
        self.detached.is_empty() && self.removed.is_empty()
    }

    pub fn text(&self) -> String {
        let root = self.bpf_root.display();
        let cgroup = self
            .cgroup
            .as_ref()
            .map(|c| format!("cgroup {}", c.display()))
            .unwrap_or_else(|| "no cgroup".into());
        if self.is_empty() {
            return format!(
                "nothing to clean up: {root} does not exist, and no sluice program is attached \
                 to a device of this network namespace or to {cgroup}\n"
            );
        }
        let mut out = String::new();
        for d in &self.detached {
            let pin = match &d.pin {
                Some(p) => format!("pinned at {}", p.display()),
                None => "not pinned".into(),
            };
            let _ = writeln!(
                out,
                "detached link {} ({} {}), {pin}",
                d.link_id, d.program, d.attach
            );
        }
        for r in &self.removed {
            let id = r.id.map(|i| format!(" {i}")).unwrap_or_default();
            let _ = writeln!(out, "removed {}{id} {}", r.kind.as_str(), r.path.display());
        }
        for h in &self.forced_past {
            let _ = writeln!(
                out,
                "warning: pid {} ({}) still holds the maps; they and their programs are freed when it exits",
                h.pid, h.command
            );
        }
        let count = |k: Kind| self.removed.iter().filter(|r| r.kind == k).count();
        let _ = writeln!(
            out,
            "cleaned up {root}: {} links detached, {} map pins, {} link pins and {} directories removed",
            self.detached.len(),
            count(Kind::Map),
            count(Kind::Link),
            count(Kind::Directory),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_so_when_there_was_nothing() {
        let report = Report {
            bpf_root: "/sys/fs/bpf/sluice".into(),
            cgroup: Some("/sys/fs/cgroup".into()),
            ..Report::default()
        };
        assert!(report.is_empty());
        assert_eq!(
            report.text(),
            "nothing to clean up: /sys/fs/bpf/sluice does not exist, and no sluice program is \
             attached to a device of this network namespace or to cgroup /sys/fs/cgroup\n"
        );
    }

    #[test]
    fn lists_what_went() {
        let report = Report {
            bpf_root: "/r".into(),
            cgroup: None,
            detached: vec![Detached {
                link_id: 7,
                program: "sl_ingress".into(),
                attach: "tcx ingress on c0".into(),
                pin: Some("/r/links/c0_ingress".into()),
            }],
            removed: vec![
                Removed {
                    path: "/r/sl_svc4".into(),
                    kind: Kind::Map,
                    id: Some(12),
                },
                Removed {
                    path: "/r".into(),
                    kind: Kind::Directory,
                    id: None,
                },
            ],
            forced_past: Vec::new(),
        };
        assert_eq!(
            report.text(),
            "detached link 7 (sl_ingress tcx ingress on c0), pinned at /r/links/c0_ingress\n\
             removed map 12 /r/sl_svc4\n\
             removed directory /r\n\
             cleaned up /r: 1 links detached, 1 map pins, 0 link pins and 1 directories removed\n"
        );
    }
}
