//! Attaching `sl_xdp` to the node's external devices with pinned XDP
//! links (`<root>/links/<device>_xdp`), as the TC links are pinned: the
//! program keeps running while no agent runs, a restarted or upgraded
//! agent swaps its program into the existing link (`bpf_link_update`),
//! and `sluice cleanup` detaches it. Each attached device is also entered
//! in `sl_xdp_devs`, the devices `sl_xdp` may redirect frames to.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::DevMapHash,
    programs::{
        links::{FdLink, LinkError, PinnedLink},
        xdp::XdpLink,
        ProgramError, Xdp, XdpMode as AyaXdpMode,
    },
    sys::SyscallError,
};
use sluice_common::maps as names;
use tracing::{info, warn};

use super::{links::Attached, Datapath, DatapathError, LINKS_DIR};

/// The XDP program's name in the object.
pub const PROGRAM: &str = "sl_xdp";

/// How `sl_xdp` is attached (`--xdp-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// In the driver (veth, most NICs): the fast path.
    Native,
    /// On the skb, after the driver (any device; slower than native).
    Generic,
    /// No XDP program: everything goes through TC.
    Off,
}

impl XdpMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
            XdpMode::Off => "off",
        }
    }

    fn aya(self) -> AyaXdpMode {
        match self {
            XdpMode::Native | XdpMode::Off => AyaXdpMode::Driver,
            XdpMode::Generic => AyaXdpMode::Skb,
        }
    }
}

/// Where the XDP link of `device` is pinned.
pub fn pin_path(root: &Path, device: &str) -> PathBuf {
    let escaped = device.replace('%', "%25").replace('.', "%2e");
    root.join(LINKS_DIR).join(format!("{escaped}_xdp"))
}

/// Devices with an XDP link pin under `root` (for `sluice status`).
pub fn xdp_devices(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(root.join(LINKS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let device = name.strip_suffix("_xdp")?;
            Some(device.replace("%2e", ".").replace("%25", "%"))
        })
        .collect();
    out.sort();
    out
}

fn ifindex(device: &str) -> u32 {
    let Ok(name) = std::ffi::CString::new(device) else {
        return 0;
    };
    // SAFETY: valid NUL-terminated string.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

impl Datapath {
    /// Attaches `sl_xdp` to `device` in `mode` (in the caller's network
    /// namespace), or swaps it into the device's pinned XDP link (whatever
    /// mode that link was made in), and lets `sl_xdp` redirect to it.
    pub fn attach_xdp(&mut self, device: &str, mode: XdpMode) -> Result<Attached, DatapathError> {
        let index = ifindex(device);
        if index == 0 {
            return Err(DatapathError::NoDevice(device.to_owned()));
        }
        let pin = pin_path(&self.root, device);
        let program: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM)
            .ok_or(DatapathError::MissingProgram(PROGRAM))?
            .try_into()
            .map_err(|source| DatapathError::Program {
                name: PROGRAM,
                source,
            })?;
        let attach_err = |source: ProgramError| DatapathError::Attach {
            device: device.to_owned(),
            source,
        };
        let outcome = if replace(program, &pin, device)? {
            Attached::Replaced
        } else {
            let id = program.attach(device, mode.aya()).map_err(attach_err)?;
            let link = program.take_link(id).map_err(attach_err)?;
            super::links::pin_new_link(link, &pin, device)?;
            Attached::Fresh
        };
        self.allow_redirect(index)?;
        Ok(outcome)
    }

    /// Enters `index` in this program generation's `sl_xdp_devs`.
    fn allow_redirect(&mut self, index: u32) -> Result<(), DatapathError> {
        self.enter_device(names::XDP_DEVS, index)
    }

    /// Enters device `index` in the devmap hash `name` of this program
    /// generation (`sl_xdp_devs`, `sl_peer_devs`), as its own target.
    pub(super) fn enter_device(
        &mut self,
        name: &'static str,
        index: u32,
    ) -> Result<(), DatapathError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(DatapathError::MissingMap(name))?;
        let mut devs: DevMapHash<_> =
            DevMapHash::try_from(map).map_err(|source| DatapathError::Map { name, source })?;
        devs.insert(index, index, None, 0)
            .map_err(|e| DatapathError::Io {
                path: PathBuf::from(name),
                source: io::Error::other(e),
            })
    }
}

/// Swaps `program` into the XDP link pinned at `pin`. False when there is
/// none usable (a stale pin is removed).
fn replace(program: &mut Xdp, pin: &Path, device: &str) -> Result<bool, DatapathError> {
    let link_err = |source| DatapathError::Link {
        device: device.to_owned(),
        source,
    };
    let old = match PinnedLink::from_pin(pin) {
        Ok(old) => old,
        Err(LinkError::SyscallError(SyscallError { io_error, .. }))
            if io_error.kind() == io::ErrorKind::NotFound =>
        {
            return Ok(false)
        }
        Err(e) => return Err(link_err(e)),
    };
    let link = XdpLink::try_from(FdLink::from(old)).map_err(link_err)?;
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
            info!(device, pin = %pin.display(), "replaced XDP program in pinned link");
            Ok(true)
        }
        Err(e) => {
            warn!(device, pin = %pin.display(), error = %e, "pinned XDP link is stale, attaching afresh");
            detach_xdp(pin.parent().and_then(Path::parent).unwrap_or(pin), device)?;
            Ok(false)
        }
    }
}

/// Detaches the XDP link of `device` pinned under `root` and removes its
/// pin (nothing to do when there is none).
pub fn detach_xdp(root: &Path, device: &str) -> Result<(), DatapathError> {
    let pin = pin_path(root, device);
    match super::bpf::obj_get(&pin) {
        Ok(link) => {
            use std::os::fd::AsFd;
            if let Err(e) = super::bpf::link_detach(link.as_fd()) {
                warn!(device, pin = %pin.display(), error = %e, "cannot detach XDP link, removing its pin");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            warn!(device, pin = %pin.display(), error = %e, "cannot open XDP link pin, removing it")
        }
    }
    match fs::remove_file(&pin) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DatapathError::Io {
            path: pin,
            source: e,
        }),
        _ => Ok(()),
    }
}
