//! What a map looks like: the shape this agent's object declares for it
//! (from the embedded object's BTF and the `--*-map-size` flags) and the
//! shape of a pinned map (from the kernel's BTF of that map). A migration
//! compares the two.

use std::{collections::HashMap, io, os::fd::BorrowedFd};

use object::{Object, ObjectSection};
use sluice_common::abi::{Capacity, MapDecl, NO_PREALLOC_FLAG, PREALLOCATABLE};

use super::{
    btf::{Btf, BtfError, Layout, MapDef},
    loader::MapSizes,
    sys,
};

/// Everything about a map that must match for a program to use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    /// `None` when the map carries no BTF (then only sizes are compared).
    pub key: Option<Layout>,
    pub value: Option<Layout>,
}

impl Shape {
    /// Why `self` (pinned) cannot serve as `wanted`, if it cannot.
    pub fn mismatch(&self, wanted: &Shape) -> Option<String> {
        let numbers = [
            ("map type", self.map_type, wanted.map_type),
            ("key size", self.key_size, wanted.key_size),
            ("value size", self.value_size, wanted.value_size),
            ("max_entries", self.max_entries, wanted.max_entries),
            ("flags", self.flags, wanted.flags),
        ];
        for (what, pinned, want) in numbers {
            if pinned != want {
                return Some(format!("{what} {pinned} -> {want}"));
            }
        }
        for (what, pinned, want) in [
            ("key", &self.key, &wanted.key),
            ("value", &self.value, &wanted.value),
        ] {
            if let (Some(p), Some(w)) = (pinned, want) {
                if p != w {
                    return Some(format!("{what} layout {} -> {}", p.render(), w.render()));
                }
            }
        }
        None
    }
}

/// The capacity `decl` gets with these flags.
pub fn capacity(decl: &MapDecl, sizes: &MapSizes) -> u32 {
    match decl.capacity {
        Capacity::Services => sizes.services,
        Capacity::Backends => sizes.backends,
        Capacity::Conntrack => sizes.conntrack,
        Capacity::Affinity => sizes.affinity,
        Capacity::Maglev => sizes.maglev,
        Capacity::Fixed(n) => n,
    }
}

/// The maps the object declares, from its `.BTF` section.
pub fn object_maps(object: &[u8]) -> Result<HashMap<String, MapDef>, BtfError> {
    let file = object::File::parse(object).map_err(|_| BtfError::Truncated(0))?;
    let section = file.section_by_name(".BTF").ok_or(BtfError::Truncated(0))?;
    let data = section.data().map_err(|_| BtfError::Truncated(0))?;
    Btf::parse(data)?.object_maps()
}

/// The shape this agent wants for `decl`.
pub fn wanted(decl: &MapDecl, sizes: &MapSizes, def: Option<&MapDef>) -> Shape {
    Shape {
        map_type: decl.kind as u32,
        key_size: decl.key_size as u32,
        value_size: decl.value_size as u32,
        max_entries: capacity(decl, sizes),
        flags: decl.flags
            | if decl.no_prealloc && !(sizes.preallocate && PREALLOCATABLE.contains(&decl.name)) {
                NO_PREALLOC_FLAG
            } else {
                0
            },
        key: def.map(|d| d.key.clone()),
        value: def.map(|d| d.value.clone()),
    }
}

/// Reads the kernel's BTF once per BTF object.
#[derive(Default)]
pub struct BtfCache {
    by_id: HashMap<u32, Option<Btf>>,
}

impl BtfCache {
    fn get(&mut self, id: u32) -> Option<&Btf> {
        if id == 0 {
            return None;
        }
        self.by_id
            .entry(id)
            .or_insert_with(|| sys::btf_by_id(id).ok().and_then(|b| Btf::parse(&b).ok()))
            .as_ref()
    }

    /// The shape of the map behind `fd`.
    pub fn shape(&mut self, fd: BorrowedFd<'_>) -> io::Result<Shape> {
        let info = sys::map_info(fd)?;
        let (key, value) = match self.get(info.btf_id) {
            Some(btf) => (
                (info.btf_key_type_id != 0)
                    .then(|| btf.layout(info.btf_key_type_id).ok())
                    .flatten(),
                (info.btf_value_type_id != 0)
                    .then(|| btf.layout(info.btf_value_type_id).ok())
                    .flatten(),
            ),
            None => (None, None),
        };
        Ok(Shape {
            map_type: info.map_type,
            key_size: info.key_size,
            value_size: info.value_size,
            max_entries: info.max_entries,
            flags: info.map_flags,
            key,
            value,
        })
    }
}

/// One line per declared map, from the embedded object: kind, flags,
/// default capacity and the key and value layouts. `abi.lock` holds these
/// lines for the current ABI. Fails when the kernel side disagrees with
/// the declaration table (`sluice_common::abi::MAPS`).
pub fn abi_lines(object: &[u8]) -> Result<Vec<String>, String> {
    let defs = object_maps(object).map_err(|e| format!("reading the object's BTF: {e}"))?;
    let sizes = MapSizes::default();
    let mut lines = Vec::new();
    for decl in &sluice_common::abi::MAPS {
        let def = defs
            .get(decl.name)
            .ok_or_else(|| format!("{} is declared but the object has no such map", decl.name))?;
        let want = wanted(decl, &sizes, Some(def));
        let checks = [
            ("map type", def.map_type, want.map_type),
            ("max_entries", def.max_entries, want.max_entries),
            ("flags", def.map_flags, want.flags),
            ("key size", def.key.size(), want.key_size),
            ("value size", def.value.size(), want.value_size),
        ];
        // A ring buffer's key and value sizes are 0 to the kernel; its
        // `value` names the record type (`Event`), whose layout the lock
        // line holds.
        let ring = decl.kind == sluice_common::abi::MapKind::RingBuf;
        for (what, object, declared) in checks {
            if object != declared && !(ring && what.ends_with(" size")) {
                return Err(format!(
                    "{}: the kernel side has {what} {object}, the declaration {declared}",
                    decl.name
                ));
            }
        }
        lines.push(format!(
            "{} type={} flags={} max={} key={} value={}",
            decl.name,
            want.map_type,
            want.flags,
            want.max_entries,
            def.key.render(),
            def.value.render()
        ));
    }
    Ok(lines)
}
