//! Attaching the programs to devices with pinned TCX links.
//!
//! Each device gets two links, pinned as `<root>/links/<device>_ingress` and
//! `_egress` (bpffs reserves names with dots, so a `.` in a device name is
//! written `%2e`), so the datapath keeps forwarding while no agent runs. A
//! restarted or upgraded agent swaps its programs into the existing links
//! (`bpf_link_update`): no instant without a program.

use std::{
    ffi::CString,
    fs, io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, MapError},
    programs::{
        links::{FdLink, LinkError, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
    },
    sys::SyscallError,
};
use tracing::{info, warn};

use super::{Datapath, DatapathError, LINKS_DIR};
use sluice_common::{maps as names, Hop4Key, Hop6Key, HopEntry};

/// The two attach points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

/// The egress program of the pods' devices (`--pod-devices`): `sl_egress`
/// that lets every packet pass while the socket programs serve every pod
/// (`CFG_F_PODS_ON_SOCKETS`).
pub const EGRESS_POD_PROGRAM: &str = "sl_egress_pod";

/// Every program a TCX link of sluice's may run.
pub const TC_PROGRAMS: [&str; 3] = ["sl_ingress", "sl_egress", EGRESS_POD_PROGRAM];

/// What a device faces, which decides its egress program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Facing {
    /// Anything (an uplink, a tunnel, a device not named a pod's).
    Any,
    /// This node's pods only (`--pod-devices`): `sl_egress_pod`.
    Pods,
}

impl Hook {
    pub const ALL: [Hook; 2] = [Hook::Ingress, Hook::Egress];

    /// The order in which `Datapath::attach_facing` swaps a device's links.
    pub const SWAP_ORDER: [Hook; 2] = [Hook::Egress, Hook::Ingress];

    /// The program this hook runs on a device that faces `facing`.
    pub const fn program_for(self, facing: Facing) -> &'static str {
        match (self, facing) {
            (Hook::Egress, Facing::Pods) => EGRESS_POD_PROGRAM,
            _ => self.program(),
        }
    }

    pub const fn program(self) -> &'static str {
        match self {
            Hook::Ingress => "sl_ingress",
            Hook::Egress => "sl_egress",
        }
    }

    const fn attach_type(self) -> TcAttachType {
        match self {
            Hook::Ingress => TcAttachType::Ingress,
            Hook::Egress => TcAttachType::Egress,
        }
    }

    const fn suffix(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
}

/// Whether `attach` created links or replaced the programs in existing ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    Fresh,
    Replaced,
}

fn ifindex(device: &str) -> u32 {
    let Ok(name) = CString::new(device) else {
        return 0;
    };
    // SAFETY: valid NUL-terminated string.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

fn device_exists(device: &str) -> bool {
    ifindex(device) != 0
}

/// The ifindex of the device the link pinned at `pin` is attached to, when
/// that is not `device` (a pin names a device, a link holds an ifindex:
/// they disagree after a rename).
fn pinned_elsewhere(pin: &Path, device: &str) -> Option<u32> {
    let link = super::bpf::obj_get(pin).ok()?;
    match super::bpf::link_info(link.as_fd()).ok()?.target {
        super::bpf::LinkTarget::Tcx { ifindex: on, .. } if on != 0 && on != ifindex(device) => {
            Some(on)
        }
        _ => None,
    }
}

impl Datapath {
    /// Attaches both programs to `device` (in the caller's network
    /// namespace), replacing the programs of existing pinned links in place.
    pub fn attach(&mut self, device: &str) -> Result<Attached, DatapathError> {
        self.attach_facing(device, Facing::Any)
    }

    /// `attach`, with the egress program of a device that faces `facing`.
    ///
    /// Egress first: while an upgrade swaps the links, the flows a device's
    /// ingress creates are then created by the old generation's program
    /// until the new one runs on both hooks, and a reply the new egress
    /// program's conntrack lacks goes to the old program through the
    /// handover (`migrate.rs`). The other order would leave a moment in
    /// which the new ingress program creates a flow whose first reply the
    /// old egress program of the same device, which has no handover, passes
    /// untranslated. This covers replies that leave through the device the
    /// flow came in on (a pod's connections, an outside client's
    /// connections to a local backend without SNAT); an SNATed flow's reply
    /// is turned back on the ingress of the backend's device, which is why
    /// the pods' devices are swapped first (`devices::swap_order`,
    /// docs/install.md).
    pub fn attach_facing(
        &mut self,
        device: &str,
        facing: Facing,
    ) -> Result<Attached, DatapathError> {
        let mut outcome = Attached::Replaced;
        for hook in Hook::SWAP_ORDER {
            if self.attach_hook(device, hook, facing)? == Attached::Fresh {
                outcome = Attached::Fresh;
            }
        }
        Ok(outcome)
    }

    /// One hook of `attach_facing`: creates the link, or replaces the
    /// program of the existing pinned one in place.
    pub fn attach_hook(
        &mut self,
        device: &str,
        hook: Hook,
        facing: Facing,
    ) -> Result<Attached, DatapathError> {
        if !device_exists(device) {
            return Err(DatapathError::NoDevice(device.to_owned()));
        }
        let pin = pin_path(&self.root, device, hook);
        let name = hook.program_for(facing);
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .ok_or(DatapathError::MissingProgram(name))?
            .try_into()
            .map_err(|source| DatapathError::Program { name, source })?;
        let attach_err = |source: ProgramError| DatapathError::Attach {
            device: device.to_owned(),
            source,
        };
        if replace(program, &pin, device)? {
            if self.migration.pending() {
                super::migrate::failpoint("migrate-swapped-one");
            }
            return Ok(Attached::Replaced);
        }
        let id = program
            .attach_with_options(
                device,
                hook.attach_type(),
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(attach_err)?;
        let link = program.take_link(id).map_err(attach_err)?;
        pin_new_link(link, &pin, device)?;
        Ok(Attached::Fresh)
    }

    /// Lets host routing (`--host-routing`) take packets from `device`
    /// and hand them to it: enters it in this program generation's
    /// `sl_peer_devs` if it is a veth or netkit device (whose peer, in a
    /// pod's namespace, `bpf_redirect_peer` delivers to). False, and
    /// nothing entered, for another kind of device.
    pub fn route_into(&mut self, device: &str) -> Result<bool, DatapathError> {
        let index = ifindex(device);
        if index == 0 {
            return Err(DatapathError::NoDevice(device.to_owned()));
        }
        if !matches!(
            crate::netdev::driver(device).as_deref(),
            Some("veth" | "netkit")
        ) {
            return Ok(false);
        }
        // A hop remembered through a gone device that had this index
        // must not pass for this one's (`sluice_common::hop`): forgotten
        // before the device becomes a pod's.
        self.forget_hops_through(index)?;
        self.enter_device(names::PEER_DEVS, index)?;
        Ok(true)
    }

    /// Host routing's route cache for IPv4 destinations (`sl_hops4`,
    /// `sluice_common::hop`): this program generation's, which its packets
    /// fill.
    pub fn hops_v4(&mut self) -> Result<HopsMap<'_, Hop4Key>, DatapathError> {
        self.hops(names::HOPS_V4)
    }

    /// `hops_v4` for IPv6 destinations (`sl_hops6`).
    pub fn hops_v6(&mut self) -> Result<HopsMap<'_, Hop6Key>, DatapathError> {
        self.hops(names::HOPS_V6)
    }

    fn hops<K: aya::Pod>(&mut self, name: &'static str) -> Result<HopsMap<'_, K>, DatapathError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        aya::maps::HashMap::try_from(map).map_err(|source| DatapathError::Map { name, source })
    }

    /// Deletes the remembered hops whose device is `index`.
    fn forget_hops_through(&mut self, index: u32) -> Result<(), DatapathError> {
        forget(&mut self.hops_v4()?, names::HOPS_V4, index)?;
        forget(&mut self.hops_v6()?, names::HOPS_V6, index)
    }
}

/// One of host routing's route caches (`Datapath::hops_v4`/`hops_v6`).
pub type HopsMap<'a, K> = aya::maps::HashMap<&'a mut MapData, K, HopEntry>;

/// Deletes the entries of `hops` (map `name`) whose device is `index`.
fn forget<K: aya::Pod>(
    hops: &mut HopsMap<'_, K>,
    name: &'static str,
    index: u32,
) -> Result<(), DatapathError> {
    let stale: Vec<K> = hops
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, hop)| hop.out == index)
        .map(|(key, _)| key)
        .collect();
    for key in stale {
        match hops.remove(&key) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(source) => return Err(DatapathError::Map { name, source }),
        }
    }
    Ok(())
}

/// Swaps `program` into the link pinned at `pin`. Returns false when there
/// is no usable link (none pinned, or its device is gone: then the stale
/// pin is removed).
fn replace(program: &mut SchedClassifier, pin: &Path, device: &str) -> Result<bool, DatapathError> {
    let link_err = |source| DatapathError::Link {
        device: device.to_owned(),
        source,
    };
    if let Some(ifindex) = pinned_elsewhere(pin, device) {
        warn!(device, pin = %pin.display(), ifindex, "pinned link is on another device (renamed?), detaching it and attaching afresh");
        detach_pin(pin, device)?;
        return Ok(false);
    }
    let old = match PinnedLink::from_pin(pin) {
        Ok(old) => old,
        Err(LinkError::SyscallError(SyscallError { io_error, .. }))
            if io_error.kind() == io::ErrorKind::NotFound =>
        {
            return Ok(false)
        }
        Err(e) => return Err(link_err(e)),
    };
    let link: SchedClassifierLink = FdLink::from(old).try_into().map_err(link_err)?;
    match program.attach_to_link(link) {
        Ok(id) => {
            // The kernel link stays pinned; our handle just closes.
            drop(
                program
                    .take_link(id)
                    .map_err(|source| DatapathError::Attach {
                        device: device.to_owned(),
                        source,
                    })?,
            );
            info!(device, pin = %pin.display(), "replaced program in pinned link");
            Ok(true)
        }
        Err(e) => {
            warn!(device, pin = %pin.display(), error = %e, "pinned link is stale, attaching afresh");
            let _ = fs::remove_file(pin);
            Ok(false)
        }
    }
}

/// Pins a link just created on `device` (TCX or XDP) at `pin`, where the
/// next agent finds it to replace its program in place.
pub(super) fn pin_new_link<L>(link: L, pin: &Path, device: &str) -> Result<(), DatapathError>
where
    L: TryInto<FdLink, Error = LinkError>,
{
    let link: FdLink = link.try_into().map_err(|source| DatapathError::Link {
        device: device.to_owned(),
        source,
    })?;
    link.pin(pin).map_err(|e| DatapathError::Io {
        path: pin.to_owned(),
        source: io::Error::other(e),
    })?;
    Ok(())
}

/// Where the link of `device` at `hook` is pinned.
fn pin_path(root: &Path, device: &str, hook: Hook) -> PathBuf {
    let escaped = device.replace('%', "%25").replace('.', "%2e");
    root.join(LINKS_DIR)
        .join(format!("{escaped}_{}", hook.suffix()))
}

fn unescape(name: &str) -> String {
    name.replace("%2e", ".").replace("%25", "%")
}

/// The name of the program the link pinned for `device`'s `hook` under
/// `root` runs, if there is one.
pub fn pinned_program(root: &Path, device: &str, hook: Hook) -> Option<String> {
    let link = super::bpf::obj_get(&pin_path(root, device, hook)).ok()?;
    let info = super::bpf::link_info(link.as_fd()).ok()?;
    Some(super::bpf::prog_info(info.prog_id).ok()?.name)
}

/// Devices with link pins under `root`.
pub fn attached_devices(root: &Path) -> Vec<String> {
    let mut devices: Vec<String> = fs::read_dir(root.join(LINKS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (device, _) = name.rsplit_once('_')?;
            Some(unescape(device))
        })
        .collect();
    devices.sort();
    devices.dedup();
    devices
}

/// Detaches `device`: each of its pinned links (TC and XDP) is taken off its hook
/// (`BPF_LINK_DETACH`, so that it goes even if another process holds the
/// link open) and its pin removed. Only sluice's own links are touched:
/// other programs on the device stay attached.
pub fn detach_device(root: &Path, device: &str) -> Result<(), DatapathError> {
    for hook in Hook::ALL {
        detach_pin(&pin_path(root, device, hook), device)?;
    }
    super::xdp::detach_xdp(root, device)
}

/// Detaches the link pinned at `pin` and removes the pin.
fn detach_pin(pin: &Path, device: &str) -> Result<(), DatapathError> {
    match super::bpf::obj_get(pin) {
        Ok(link) => {
            if let Err(e) = super::bpf::link_detach(link.as_fd()) {
                // A link whose device is gone is already off its hook.
                warn!(device, pin = %pin.display(), error = %e, "cannot detach link, removing its pin");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            warn!(device, pin = %pin.display(), error = %e, "cannot open link pin, removing it")
        }
    }
    match fs::remove_file(pin) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DatapathError::Io {
            path: pin.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}
