//! Everything that touches the kernel's BPF objects: loading the programs,
//! adopting pinned maps, attaching to devices, and the one writer of the
//! maps.

pub(crate) mod bpf;
mod btf;
mod cgroup;
mod convert;
mod error;
mod fill;
mod layout;
mod links;
mod loader;
pub mod log;
mod maps;
pub mod migrate;
mod socktab;
mod sys;
mod writer;
mod xdp;

pub use cgroup::{cgroup2_mount, netns_cookie, socket_lb_mode, PROGRAMS as CGROUP_PROGRAMS};
pub use error::{DatapathError, WriteError};
pub use fill::{fill_ratios, map_fill, migration_state, MapFill, Occupancy};
pub use layout::abi_lines;
pub use links::{
    attached_devices, detach_device, pinned_program, Attached, Facing, Hook, EGRESS_POD_PROGRAM,
    TC_PROGRAMS,
};
pub(crate) use loader::{fs_type, BPF_FS_MAGIC};
pub use loader::{Datapath, MapSizes};
pub use maps::{read_map_state, FilterMaps, Maps, ServiceKey};
pub use socktab::SockTable;
pub use writer::{Entry, EntryKey, Filter, MapReads, MapWriter, MapWrites, PicksEntry};
pub use xdp::{detach_xdp, xdp_devices, XdpMode, PROGRAM as XDP_PROGRAM};

/// The eBPF object built by `cargo xtask build-ebpf`, embedded at build time
/// (empty when the agent was built without it).
pub static BPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sluice.bpf.o"));

/// The same object built with the `prealloc` feature: the maps of
/// `sluice_common::abi::PREALLOCATABLE` preallocated
/// (`--preallocate-maps`).
pub static BPF_OBJECT_PREALLOC: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sluice-prealloc.bpf.o"));

/// Default bpffs directory for one agent instance's pins.
pub const DEFAULT_BPF_ROOT: &str = "/sys/fs/bpf/sluice";

/// Subdirectory of the bpffs root that holds link pins.
pub const LINKS_DIR: &str = "links";
