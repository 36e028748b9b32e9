//! The datapath ABI cannot change by accident: every pinned map's layout
//! (from the embedded object's BTF) must equal its line in
//! `ebpf/sluice-common/abi.lock` for the current `ABI_VERSION`. A layout
//! change needs an ABI bump (and a migration that the upgrade tests
//! prove); then regenerate the lock with
//! `SLUICE_BLESS_ABI=1 cargo test -p sluice --test abi_lock`.
#![cfg(not(feature = "abi-probe"))]

use std::{collections::BTreeMap, fs, path::PathBuf};

use sluice::datapath::{abi_lines, BPF_OBJECT};
use sluice_common::ABI_VERSION;

fn lock_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ebpf/sluice-common/abi.lock")
}

fn render(lines: &[String]) -> String {
    let mut out = String::from(
        "# The datapath ABI: one line per pinned map (name, kernel map type, flags,\n\
         # default max_entries, key and value layout as field@offset:type).\n\
         # Checked by agent/tests/abi_lock.rs; regenerate after an ABI bump with\n\
         # SLUICE_BLESS_ABI=1 cargo test -p sluice --test abi_lock\n",
    );
    out.push_str(&format!("abi {ABI_VERSION}\n"));
    for l in lines {
        out.push_str(l);
        out.push('\n');
    }
    out
}

#[test]
fn map_layouts_match_the_lock_of_this_abi_version() {
    assert!(
        !BPF_OBJECT.is_empty(),
        "this agent was built without its eBPF object: run `cargo xtask build-ebpf` first"
    );
    let lines = abi_lines(BPF_OBJECT).unwrap_or_else(|e| panic!("{e}"));
    if std::env::var_os("SLUICE_BLESS_ABI").is_some() {
        fs::write(lock_path(), render(&lines)).unwrap();
        return;
    }
    let lock = fs::read_to_string(lock_path()).expect("reading abi.lock");
    let locked_abi: u32 = lock
        .lines()
        .find_map(|l| l.strip_prefix("abi "))
        .and_then(|v| v.trim().parse().ok())
        .expect("abi.lock names its ABI version");
    let locked: BTreeMap<&str, &str> = lock
        .lines()
        .filter(|l| l.starts_with("sl_"))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let current: BTreeMap<&str, &str> = lines.iter().filter_map(|l| l.split_once(' ')).collect();
    let changed: Vec<String> = current
        .iter()
        .filter(|(name, line)| locked.get(*name) != Some(*line))
        .map(|(name, line)| {
            format!(
                "{name}: now `{line}`, locked `{}`",
                locked.get(name).unwrap_or(&"(absent)")
            )
        })
        .chain(
            locked
                .keys()
                .filter(|name| !current.contains_key(*name))
                .map(|name| format!("{name}: removed")),
        )
        .collect();
    if locked_abi == ABI_VERSION {
        assert!(
            changed.is_empty(),
            "the datapath layout changed without an ABI bump: bump sluice_common::ABI_VERSION \
             (and prove the migration with the upgrade tests), then regenerate abi.lock with \
             SLUICE_BLESS_ABI=1 cargo test -p sluice --test abi_lock:\n{}",
            changed.join("\n")
        );
    } else {
        panic!(
            "ABI_VERSION is {ABI_VERSION} but abi.lock is for {locked_abi}: regenerate it with \
             SLUICE_BLESS_ABI=1 cargo test -p sluice --test abi_lock{}",
            if changed.is_empty() {
                " (and check that the bump was needed: no layout changed)"
            } else {
                ""
            }
        );
    }
}

/// docs/maps.md's table lists exactly the declared maps, each with its
/// kind and default capacity.
#[test]
fn the_map_table_in_the_docs_follows_the_declaration() {
    use sluice::datapath::MapSizes;
    use sluice_common::abi::{Capacity, MapKind, MAPS};
    let doc = fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/maps.md"))
        .unwrap();
    let rows: Vec<Vec<String>> = doc
        .lines()
        .filter(|l| l.starts_with("| `sl_"))
        .map(|l| l.split('|').map(|c| c.trim().to_owned()).collect())
        .collect();
    assert_eq!(rows.len(), MAPS.len(), "one row per declared map");
    let sizes = MapSizes::default();
    for decl in &MAPS {
        let row = rows
            .iter()
            .find(|r| r[1] == format!("`{}`", decl.name))
            .unwrap_or_else(|| panic!("{} is not in docs/maps.md", decl.name));
        let kind = match decl.kind {
            MapKind::Hash => "hash",
            MapKind::LruHash => "LRU hash",
            MapKind::Array => "array",
            MapKind::PerCpuArray => "per-CPU array",
            MapKind::LpmTrie => "LPM trie",
            MapKind::ProgArray => "program array",
            MapKind::RingBuf => "ring buffer",
        };
        assert!(row[2].starts_with(kind), "{}: type `{}`", decl.name, row[2]);
        let capacity = match decl.capacity {
            Capacity::Services => sizes.services,
            Capacity::Backends => sizes.backends,
            Capacity::Conntrack => sizes.conntrack,
            Capacity::Affinity => sizes.affinity,
            Capacity::Maglev => sizes.maglev,
            Capacity::Fixed(n) => n,
        };
        let shown: String = row[4]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(|c| *c != ',')
            .collect();
        assert_eq!(shown, capacity.to_string(), "{}: default size", decl.name);
    }
}
