//! Adopting pins of another datapath layout (an upgrade, a rollback, a
//! resized map) without losing a flow.
//!
//! A small state machine whose state lives in bpffs, so that a crash at
//! any point leaves a node that forwards and an agent that can finish:
//!
//! 1. **Plan**: every pinned map is compared with what this agent's object
//!    declares (BTF field layout, sizes, type, flags). Maps that differ
//!    are *staged*: this agent's object gets new maps pinned under
//!    `<root>/migrate/`, the rest are shared as they are. A new program
//!    generation always gets its own tail-call array.
//! 2. **Copy**: every entry of each staged map's old generation is
//!    converted field by field (by name, from both maps' BTF, so a newer
//!    layout this agent has never seen converts too) into the new map.
//! 3. **Commit**: `<root>/migrate/committed/` is created. Before it, no link
//!    runs a new program: a crash is undone by deleting `migrate/`.
//! 4. **Swap**: the caller swaps the new programs into every pinned TCX and
//!    cgroup link (`BPF_LINK_UPDATE`, no instant without a program).
//! 5. **Finish**: entries the old programs created between the copy and
//!    their swap are copied over (insert-only, never over what the new
//!    programs wrote), each staged pin is renamed over the old one
//!    (atomic in bpffs), and `migrate/` goes.
//!
//! After the commit point, an agent that starts and finds `committed/`
//! promotes whatever is still staged, keeps the replaced maps open (links
//! it has not swapped yet may still run programs that use them), and
//! copies their late entries once it has swapped every link itself.

use std::{
    fs, io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use sluice_common::{
    abi::{self, Carry, MapDecl, MapKind, MAPS},
    maps as names, Config, ABI_VERSION,
};
use tracing::{error, info, warn};

use super::{
    convert::Plan,
    layout::{self, BtfCache, Shape},
    loader::MapSizes,
    sys, DatapathError,
};

/// Subdirectory of the bpffs root holding the staged maps.
pub const MIGRATE_DIR: &str = "migrate";
/// Marker directory: the staged maps are complete and links may use them.
const COMMITTED: &str = "committed";

/// The test hook that simulates a crash: the agent exits at once, without
/// cleaning up, when `SLUICE_FAILPOINT` names the point it reaches.
pub fn failpoint(point: &str) {
    if std::env::var("SLUICE_FAILPOINT").is_ok_and(|p| p == point) {
        error!(point, "failpoint reached: exiting as if crashed");
        // SAFETY: ends the process at once, as a crash would.
        unsafe { libc::_exit(86) };
    }
}

/// A migration in progress (empty when the pins fit as they are).
pub struct Migration {
    root: PathBuf,
    /// Maps whose new generation is staged under `migrate/`, and why.
    staged: Vec<(&'static MapDecl, String)>,
    /// Maps replaced when an interrupted migration was finished at start:
    /// links not swapped yet may still write to them.
    leftovers: Vec<(&'static str, OwnedFd)>,
    /// This generation's `sl_handover`, while it holds the previous
    /// generation's programs.
    handover: Option<OwnedFd>,
    /// The handover of an interrupted migration (see `Recovered`).
    inherited: Option<(OwnedFd, Vec<(u32, u32)>)>,
    cache: BtfCache,
}

/// What one map copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub entries: usize,
    /// Entries the new map could not take (full, or already present in an
    /// insert-only pass: those are not counted here).
    pub failed: usize,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DatapathError + '_ {
    move |source| DatapathError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Migration {
    /// Recovers from an interrupted migration, then plans this one.
    pub fn begin(root: &Path, sizes: &MapSizes, object: &[u8]) -> Result<Self, DatapathError> {
        let Recovered {
            replaced: leftovers,
            handover: inherited,
        } = recover(root)?;
        let defs = layout::object_maps(object).map_err(DatapathError::Btf)?;
        let mut cache = BtfCache::default();
        let mut staged = Vec::new();
        for decl in &MAPS {
            let pin = root.join(decl.name);
            let fd = match sys::obj_get(&pin) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&pin)(e)),
            };
            let pinned = cache.shape(fd.as_fd()).map_err(io_err(&pin))?;
            let wanted = layout::wanted(decl, sizes, defs.get(decl.name));
            if let Some(why) = pinned.mismatch(&wanted) {
                info!(map = decl.name, change = %why, "pinned map has another layout: migrating it");
                staged.push((decl, why));
            }
        }
        if !staged.is_empty() && !staged.iter().any(|(d, _)| d.name == names::PROGS) {
            if let Some(progs) = abi::find(names::PROGS) {
                staged.push((progs, "a new program generation".to_owned()));
            }
        }
        if !staged.is_empty() {
            let dir = root.join(MIGRATE_DIR);
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        Ok(Self {
            root: root.to_owned(),
            staged,
            leftovers,
            handover: None,
            inherited,
            cache,
        })
    }

    /// Whether `finish` has work to do.
    pub fn pending(&self) -> bool {
        !self.staged.is_empty() || !self.leftovers.is_empty() || self.inherited.is_some()
    }

    /// The maps being migrated.
    pub fn staged(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.staged.iter().map(|(d, _)| d.name)
    }

    /// Where this agent's object must pin (or find) map `name`.
    pub fn pin_path(&self, name: &str) -> PathBuf {
        if self.staged.iter().any(|(d, _)| d.name == name) {
            self.root.join(MIGRATE_DIR).join(name)
        } else {
            self.root.join(name)
        }
    }

    /// Steps 2 and 3: copies every staged map's entries, then commits.
    pub fn copy(&mut self) -> Result<(), DatapathError> {
        if self.staged.is_empty() {
            return Ok(());
        }
        for (decl, _) in self.staged.clone() {
            if decl.carry == Carry::Fresh {
                continue;
            }
            let from = self.root.join(decl.name);
            let to = self.pin_path(decl.name);
            let src = sys::obj_get(&from).map_err(io_err(&from))?;
            let dst = sys::obj_get(&to).map_err(io_err(&to))?;
            let copied = copy_entries(&mut self.cache, decl, src.as_fd(), dst.as_fd(), sys::ANY)
                .map_err(io_err(&to))?;
            if decl.name == names::CONFIG {
                stamp_abi(dst.as_fd()).map_err(io_err(&to))?;
            }
            info!(
                map = decl.name,
                entries = copied.entries,
                failed = copied.failed,
                "copied into the new layout"
            );
        }
        failpoint("migrate-copied");
        let marker = self.root.join(MIGRATE_DIR).join(COMMITTED);
        fs::create_dir_all(&marker).map_err(io_err(&marker))?;
        failpoint("migrate-committed");
        Ok(())
    }

    /// Before the swap, when conntrack moves to a new map: puts the
    /// previous generation's TC programs (found through the pinned device
    /// links) into this generation's `sl_handover`, so that while both run
    /// and until the late entries are copied, a packet whose flow only the
    /// old conntrack knows is handed to the old program instead of being
    /// taken for a new flow.
    pub fn hand_over(&mut self, handover: BorrowedFd<'_>) -> Result<(), DatapathError> {
        let links = self.root.join(super::LINKS_DIR);
        let mut old: Vec<(u32, OwnedFd)> = Vec::new();
        let conntrack = [names::CONNTRACK_V4, names::CONNTRACK_V6];
        let inherited = self
            .inherited
            .as_ref()
            .is_some_and(|(_, progs)| !progs.is_empty());
        let moves_now = self.staged.iter().any(|(d, _)| conntrack.contains(&d.name));
        let left_over = self.leftovers.iter().any(|(n, _)| conntrack.contains(n));
        if moves_now || (left_over && !inherited) {
            // Conntrack moves now, or an interrupted migration moved it
            // before any handover: the flows the new map lacks belong to
            // the programs in the links.
            let pins: Vec<PathBuf> = fs::read_dir(&links)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            for (suffix, index) in [
                ("_ingress", names::HANDOVER_INGRESS),
                ("_egress", names::HANDOVER_EGRESS),
            ] {
                // A pod device's `sl_egress_pod` may pass replies untouched
                // (`CFG_F_PODS_ON_SOCKETS`): the handover takes a program
                // that never does.
                let prog = pins.iter().find_map(|pin| {
                    let name = pin.file_name()?.to_str()?;
                    if !name.ends_with(suffix) {
                        return None;
                    }
                    let link = super::bpf::obj_get(pin).ok()?;
                    let info = super::bpf::link_info(link.as_fd()).ok()?;
                    let prog = super::bpf::prog_info(info.prog_id).ok()?;
                    if prog.name == super::links::EGRESS_POD_PROGRAM {
                        return None;
                    }
                    sys::prog_by_id(info.prog_id).ok()
                });
                if let Some(prog) = prog {
                    old.push((index, prog));
                }
            }
        } else if let Some((_, progs)) = &self.inherited {
            // Finishing an interrupted migration: the flows only the old
            // conntrack knows belong to the generation its handover held.
            for (index, id) in progs {
                if let Ok(fd) = sys::prog_by_id(*id) {
                    old.push((*index, fd));
                }
            }
        }
        if old.is_empty() {
            return Ok(());
        }
        for (index, prog) in &old {
            let fd = prog.as_raw_fd() as u32;
            sys::map_update(handover, &index.to_ne_bytes(), &fd.to_ne_bytes(), sys::ANY)
                .map_err(io_err(&links))?;
        }
        // Pinned with the staging, so that it outlives a crash of this
        // agent: the kernel empties a program array nobody holds.
        let dir = self.root.join(MIGRATE_DIR);
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let pin = dir.join(names::HANDOVER);
        let _ = fs::remove_file(&pin);
        sys::obj_pin(handover, &pin).map_err(io_err(&pin))?;
        self.handover = Some(handover.try_clone_to_owned().map_err(io_err(&links))?);
        info!(
            programs = old.len(),
            "previous generation standing by for flows only its conntrack knows"
        );
        Ok(())
    }

    /// Step 5, once every link runs this agent's programs.
    pub fn finish(&mut self) -> Result<(), DatapathError> {
        if !self.pending() {
            return Ok(());
        }
        failpoint("migrate-swapped");
        self.copy_late()?;
        if let Some(handover) = self.handover.take() {
            // From now on this generation decides alone; what the old one
            // created meanwhile is copied by a second pass.
            for index in [names::HANDOVER_INGRESS, names::HANDOVER_EGRESS] {
                sys::map_delete(handover.as_fd(), &index.to_ne_bytes())
                    .map_err(io_err(&self.root))?;
            }
            self.copy_late()?;
        }
        self.leftovers.clear();
        self.inherited = None;
        let dir = self.root.join(MIGRATE_DIR);
        for (i, (decl, _)) in self.staged.iter().enumerate() {
            let staged = dir.join(decl.name);
            let pin = self.root.join(decl.name);
            fs::rename(&staged, &pin).map_err(io_err(&staged))?;
            if i == 0 {
                failpoint("migrate-promoted-one");
            }
        }
        remove_migrate_dir(&dir)?;
        info!(maps = ?self.staged().collect::<Vec<_>>(), abi = ABI_VERSION, "migration finished");
        self.staged.clear();
        Ok(())
    }

    /// Copies the entries the previous generation created since the bulk
    /// copy (insert-only: never over what this generation wrote).
    fn copy_late(&mut self) -> Result<(), DatapathError> {
        for (decl, _) in self.staged.clone() {
            if decl.carry == Carry::Fresh || !insertable(decl) {
                continue;
            }
            let from = self.root.join(decl.name);
            let to = self.pin_path(decl.name);
            let src = sys::obj_get(&from).map_err(io_err(&from))?;
            let dst = sys::obj_get(&to).map_err(io_err(&to))?;
            let late = copy_entries(
                &mut self.cache,
                decl,
                src.as_fd(),
                dst.as_fd(),
                sys::NOEXIST,
            )
            .map_err(io_err(&to))?;
            if late.entries > 0 {
                info!(
                    map = decl.name,
                    entries = late.entries,
                    "copied entries created during the swap"
                );
            }
        }
        for (name, old) in std::mem::take(&mut self.leftovers) {
            let Some(decl) = abi::find(name) else {
                continue;
            };
            if decl.carry == Carry::Fresh || !insertable(decl) {
                continue;
            }
            let to = self.pin_path(name);
            let dst = sys::obj_get(&to).map_err(io_err(&to))?;
            let late = copy_entries(
                &mut self.cache,
                decl,
                old.as_fd(),
                dst.as_fd(),
                sys::NOEXIST,
            )
            .map_err(io_err(&to))?;
            info!(
                map = name,
                entries = late.entries,
                "copied entries of an interrupted migration's old generation"
            );
            self.leftovers.push((name, old));
        }
        Ok(())
    }
}

/// Whether an insert-only copy makes sense (arrays always have every key).
fn insertable(decl: &MapDecl) -> bool {
    !matches!(
        decl.kind,
        MapKind::Array | MapKind::PerCpuArray | MapKind::ProgArray | MapKind::RingBuf
    )
}

fn remove_migrate_dir(dir: &Path) -> Result<(), DatapathError> {
    let marker = dir.join(COMMITTED);
    match fs::remove_dir(&marker) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&marker)(e)),
        _ => {}
    }
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(dir)(e)),
        _ => Ok(()),
    }
}

/// Finishes or undoes a migration a previous agent left. Returns the maps
/// it replaced, still open.
/// What an interrupted migration leaves to finish.
#[derive(Default)]
struct Recovered {
    /// Maps its staged maps replaced, still open.
    replaced: Vec<(&'static str, OwnedFd)>,
    /// Its handover array, kept open so that the programs it holds stay
    /// reachable, and the ids of those programs (the generation whose
    /// conntrack is in `replaced`).
    handover: Option<(OwnedFd, Vec<(u32, u32)>)>,
}

fn recover(root: &Path) -> Result<Recovered, DatapathError> {
    let dir = root.join(MIGRATE_DIR);
    if !dir.exists() {
        return Ok(Recovered::default());
    }
    if !dir.join(COMMITTED).exists() {
        warn!(dir = %dir.display(), "discarding a migration interrupted before its commit point (no link used it)");
        fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
        return Ok(Recovered::default());
    }
    warn!(dir = %dir.display(), "finishing a migration interrupted after its commit point");
    let mut recovered = Recovered::default();
    let handover = dir.join(names::HANDOVER);
    if let Ok(fd) = sys::obj_get(&handover) {
        let mut progs = Vec::new();
        for index in [names::HANDOVER_INGRESS, names::HANDOVER_EGRESS] {
            let mut id = [0u8; 4];
            if sys::map_lookup(fd.as_fd(), &index.to_ne_bytes(), &mut id).unwrap_or(false) {
                progs.push((index, u32::from_ne_bytes(id)));
            }
        }
        recovered.handover = Some((fd, progs));
    }
    let mut replaced = Vec::new();
    for decl in &MAPS {
        let staged = dir.join(decl.name);
        if !staged.exists() {
            continue;
        }
        let pin = root.join(decl.name);
        if let Ok(old) = sys::obj_get(&pin) {
            replaced.push((decl.name, old));
        }
        fs::rename(&staged, &pin).map_err(io_err(&staged))?;
    }
    remove_migrate_dir(&dir)?;
    recovered.replaced = replaced;
    Ok(recovered)
}

/// Sets `abi_version` in a converted `sl_config` value.
fn stamp_abi(config: BorrowedFd<'_>) -> io::Result<()> {
    let key = 0u32.to_ne_bytes();
    let mut value = vec![0u8; std::mem::size_of::<Config>()];
    if sys::map_lookup(config, &key, &mut value)? {
        let at = std::mem::offset_of!(Config, abi_version);
        value[at..at + 4].copy_from_slice(&ABI_VERSION.to_ne_bytes());
        sys::map_update(config, &key, &value, sys::ANY)?;
    }
    Ok(())
}

fn plans(src: &Shape, dst: &Shape) -> (Plan, Plan) {
    let plan = |a: &Option<_>, b: &Option<_>, sa: u32, sb: u32| match (a, b) {
        (Some(a), Some(b)) => Plan::new(a, b),
        _ if sa == sb => Plan::bytes(sa as usize),
        // Sizes differ and neither side says why: nothing can be copied.
        _ => Plan::default(),
    };
    (
        plan(&src.key, &dst.key, src.key_size, dst.key_size),
        plan(&src.value, &dst.value, src.value_size, dst.value_size),
    )
}

fn per_cpu(kind: u32) -> bool {
    kind == MapKind::PerCpuArray as u32 || kind == 5 /* PERCPU_HASH */ || kind == 10
    /* LRU_PERCPU_HASH */
}

/// Copies every entry of `src` into `dst`, converting keys and values by
/// field name; `flags` is `ANY` for the bulk copy, `NOEXIST` for late
/// entries.
pub fn copy_entries(
    cache: &mut BtfCache,
    decl: &MapDecl,
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    flags: u64,
) -> io::Result<Copied> {
    let (from, to) = (cache.shape(src)?, cache.shape(dst)?);
    let (key_plan, value_plan) = plans(&from, &to);
    if key_plan.dst_size == 0 || (value_plan.dst_size == 0 && to.value_size != 0) {
        warn!(
            map = decl.name,
            "layouts cannot be related: starting it empty"
        );
        return Ok(Copied::default());
    }
    if !key_plan.dropped.is_empty() || !value_plan.dropped.is_empty() {
        warn!(map = decl.name, key = ?key_plan.dropped, value = ?value_plan.dropped, "fields the new layout does not have are dropped");
    }
    let cpus = if per_cpu(from.map_type) {
        sys::possible_cpus()?
    } else {
        1
    };
    let stride = |size: u32| {
        if per_cpu(from.map_type) {
            (size as usize).div_ceil(8) * 8
        } else {
            size as usize
        }
    };
    let (src_stride, dst_stride) = (stride(from.value_size), stride(to.value_size));
    let mut key = vec![0u8; from.key_size as usize];
    let mut next = vec![0u8; from.key_size as usize];
    let mut value = vec![0u8; src_stride * cpus];
    let mut new_key = vec![0u8; to.key_size as usize];
    let mut new_value = vec![0u8; dst_stride * cpus];
    let mut copied = Copied::default();
    let mut first = true;
    // A hash map restarts its walk when the current key vanishes under
    // us; bound the walk so that churn cannot keep it going forever.
    let limit = 2 * from.max_entries as usize + 16;
    for _ in 0..limit {
        let more = sys::map_next_key(src, (!first).then_some(&key[..]), &mut next)?;
        if !more {
            break;
        }
        first = false;
        std::mem::swap(&mut key, &mut next);
        if !sys::map_lookup(src, &key, &mut value)? {
            continue;
        }
        key_plan.apply(&key, &mut new_key);
        for cpu in 0..cpus {
            let s = &value[cpu * src_stride..cpu * src_stride + from.value_size as usize];
            let d = &mut new_value[cpu * dst_stride..cpu * dst_stride + to.value_size as usize];
            value_plan.apply(s, d);
        }
        match sys::map_update(dst, &new_key, &new_value, flags) {
            Ok(()) => copied.entries += 1,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::E2BIG)
                    || e.raw_os_error() == Some(libc::ENOMEM) =>
            {
                copied.failed += 1
            }
            Err(e) => return Err(e),
        }
    }
    Ok(copied)
}
