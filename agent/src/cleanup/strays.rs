//! Links of sluice that no pin under the root holds: an agent that
//! crashed between attaching and pinning, a process holding a link whose
//! pin was removed, an instance pinned elsewhere. Only links attached here
//! count: TCX links on a device of the calling process's network namespace
//! (the device's own link list must name the link, as an ifindex alone
//! means nothing across namespaces) and cgroup links on `--cgroup-root`
//! itself. Other namespaces and cgroups, where other sluice instances may
//! run, are never touched.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    os::fd::{AsFd, OwnedFd},
};

use super::CleanupError;
use crate::{
    datapath::{
        bpf::{self, LinkInfo, LinkTarget, ProgInfo},
        CGROUP_PROGRAMS, TC_PROGRAMS,
    },
    netdev,
};

/// A link of one of sluice's programs, open.
pub struct Stray {
    pub fd: OwnedFd,
    pub info: LinkInfo,
    pub program: ProgInfo,
}

/// Whether `name` is one of sluice's programs of the kind `target` is.
pub fn is_sluice_program(target: &LinkTarget, name: &str) -> bool {
    match target {
        LinkTarget::Tcx { .. } => TC_PROGRAMS.contains(&name),
        LinkTarget::Cgroup { .. } => CGROUP_PROGRAMS.contains(&name),
        LinkTarget::Xdp { .. } => name == crate::datapath::XDP_PROGRAM,
        LinkTarget::Other { .. } => false,
    }
}

/// `ingress`/`egress` for a TCX attach type.
pub fn direction(attach_type: u32) -> &'static str {
    match attach_type {
        bpf::BPF_TCX_INGRESS => "ingress",
        bpf::BPF_TCX_EGRESS => "egress",
        _ => "attach type ?",
    }
}

fn gone(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

/// Every link of a sluice program attached to a device of this network
/// namespace or to the cgroup with id `cgroup_id`, except those in `skip`
/// (the pinned ones, handled with their pins).
pub fn find(cgroup_id: Option<u64>, skip: &BTreeSet<u32>) -> Result<Vec<Stray>, CleanupError> {
    let devices: BTreeMap<u32, String> = netdev::devices()
        .into_iter()
        .map(|(name, index)| (index, name))
        .collect();
    let mut out = Vec::new();
    let ids = bpf::link_ids().map_err(CleanupError::bpf("listing BPF links"))?;
    for id in ids.into_iter().filter(|id| !skip.contains(id)) {
        // A link may go between listing and opening it.
        let fd = match bpf::link_by_id(id) {
            Ok(fd) => fd,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(CleanupError::bpf(format!("opening link {id}"))(e)),
        };
        let info =
            bpf::link_info(fd.as_fd()).map_err(CleanupError::bpf(format!("reading link {id}")))?;
        match info.target {
            LinkTarget::Tcx {
                ifindex,
                attach_type,
            } => {
                let Some(device) = devices.get(&ifindex) else {
                    continue;
                };
                let here = bpf::tcx_link_ids(ifindex, attach_type)
                    .map_err(CleanupError::bpf(format!("querying TCX links of {device}")))?;
                if !here.contains(&id) {
                    continue;
                }
            }
            LinkTarget::Cgroup { cgroup_id: cg, .. } if Some(cg) == cgroup_id && cg != 0 => {}
            _ => continue,
        }
        let program = match bpf::prog_info(info.prog_id) {
            Ok(p) => p,
            Err(e) if gone(&e) => continue,
            Err(e) => {
                return Err(CleanupError::bpf(format!(
                    "reading program {} of link {id}",
                    info.prog_id
                ))(e))
            }
        };
        if !is_sluice_program(&info.target, &program.name) {
            continue;
        }
        out.push(Stray { fd, info, program });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_its_programs_by_hook_kind() {
        let tcx = LinkTarget::Tcx {
            ifindex: 3,
            attach_type: bpf::BPF_TCX_INGRESS,
        };
        let cgroup = LinkTarget::Cgroup {
            cgroup_id: 1,
            attach_type: 10,
        };
        assert!(is_sluice_program(&tcx, "sl_ingress"));
        assert!(is_sluice_program(&tcx, "sl_egress"));
        assert!(is_sluice_program(&tcx, "sl_egress_pod"));
        assert!(!is_sluice_program(&tcx, "sl_connect4"), "not a TC program");
        assert!(!is_sluice_program(&tcx, "cil_from_container"));
        assert!(is_sluice_program(&cgroup, "sl_connect4"));
        assert!(is_sluice_program(&cgroup, "sl_sock_release"));
        assert!(!is_sluice_program(&cgroup, "sl_ingress"));
        assert!(!is_sluice_program(
            &LinkTarget::Other { link_type: 2 },
            "sl_ingress"
        ));
        assert_eq!(direction(bpf::BPF_TCX_EGRESS), "egress");
    }
}
