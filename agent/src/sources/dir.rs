//! The directory source: a directory of Kubernetes manifests (YAML or
//! JSON, multi-document), watched by polling file sizes and modification
//! times. Only the files that changed are read and parsed, and their
//! objects trimmed at once; the first read sends the complete set of every
//! kind, exactly as a list would, and later reads only the objects whose
//! definition in use changed, through the same path as the Kubernetes
//! source.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{node, service, service_cidr, slice, Change, Converted, Envelope, Kind, Update};
use crate::{
    health::Health,
    manifests::{is_manifest_file, parse_file, too_large, unusable, Limits, Manifests},
    metrics::{Metrics, ReasonLabel},
    translate::{
        NodeInfo, ObjectKey, Problem, ProblemReason, ServiceCidrInfo, ServiceInfo, SliceInfo,
    },
};

/// What identifies the directory's content without reading it.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn fingerprint(dir: &Path) -> std::io::Result<Fingerprint> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if !is_manifest_file(&path) {
            continue;
        }
        // Follows symlinks (a mounted ConfigMap's files are links).
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if meta.is_file() {
            out.push((path, meta.len(), meta.modified().ok()));
        }
    }
    out.sort();
    Ok(out)
}

/// One object as a file defines it, trimmed at once.
#[derive(Clone, Debug)]
enum Object {
    Service(Converted<ServiceInfo>),
    Slice(Converted<SliceInfo>),
    Node(Converted<NodeInfo>),
    ServiceCidr(Converted<ServiceCidrInfo>),
}

impl Object {
    fn key(&self) -> &ObjectKey {
        match self {
            Object::Service(c) => &c.key,
            Object::Slice(c) => &c.key,
            Object::Node(c) => &c.key,
            Object::ServiceCidr(c) => &c.key,
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Object::Service(_) => Kind::Service,
            Object::Slice(_) => Kind::EndpointSlice,
            Object::Node(_) => Kind::Node,
            Object::ServiceCidr(_) => Kind::ServiceCidr,
        }
    }

    fn apply(self) -> Update {
        match self {
            Object::Service(c) => Update::Services(Change::Apply(c)),
            Object::Slice(c) => Update::Slices(Change::Apply(c)),
            Object::Node(c) => Update::Node(Change::Apply(c)),
            Object::ServiceCidr(c) => Update::ServiceCidrs(Change::Apply(c)),
        }
    }
}

fn delete((kind, key): Id) -> Update {
    match kind {
        Kind::Service => Update::Services(Change::Delete(key)),
        Kind::EndpointSlice => Update::Slices(Change::Delete(key)),
        Kind::Node => Update::Node(Change::Delete(key)),
        Kind::ServiceCidr => Update::ServiceCidrs(Change::Delete(key)),
    }
}

/// An object's identity across files.
type Id = (Kind, ObjectKey);

/// What one file holds, trimmed: its objects (the first definition of each
/// in the file; unnamed ones cannot be tracked and are left out) and its
/// problems. No full API object outlives the parse.
#[derive(Debug, Default)]
pub(crate) struct FileObjects {
    objects: HashMap<Id, Object>,
    problems: Vec<Problem>,
}

impl FileObjects {
    /// Trims what `parse_file` read.
    fn from_manifests(m: Manifests) -> Self {
        let mut out = Self {
            objects: HashMap::new(),
            problems: m.problems,
        };
        let objects = m
            .services
            .iter()
            .filter_map(service)
            .map(Object::Service)
            .chain(m.slices.iter().filter_map(slice).map(Object::Slice))
            .chain(m.nodes.iter().filter_map(node).map(Object::Node))
            .chain(
                m.service_cidrs
                    .iter()
                    .filter_map(service_cidr)
                    .map(Object::ServiceCidr),
            );
        for o in objects {
            // A duplicate inside one file: the first definition wins.
            out.objects.entry((o.kind(), o.key().clone())).or_insert(o);
        }
        out
    }
}

/// One file as last parsed: its size and modification time, and what it
/// held.
struct Parsed {
    len: u64,
    modified: Option<SystemTime>,
    objects: FileObjects,
}

/// The directory as last read: every file's trimmed objects, which files
/// define each object, and which of them is its owner (the one in use).
#[derive(Default)]
pub(crate) struct DirState {
    files: BTreeMap<PathBuf, Parsed>,
    /// Files defining each object, in name order.
    defined: HashMap<Id, Vec<PathBuf>>,
    owners: HashMap<Id, PathBuf>,
    /// The duplicate definitions of objects several files define.
    duplicates: HashMap<Id, Vec<Problem>>,
    /// The complete set went out once (later reads send only changes).
    sent: bool,
}

/// A file that changed, parsed and trimmed: (path, size, modification
/// time, objects).
type Changed = (PathBuf, u64, Option<SystemTime>, FileObjects);

/// Reads, parses and trims the files of `fp` that changed since `state`
/// saw them (a file whose size and modification time are the same is not
/// read again).
fn parse_changed(
    fp: &Fingerprint,
    known: &BTreeMap<PathBuf, (u64, Option<SystemTime>)>,
    limits: Limits,
) -> Vec<Changed> {
    fp.iter()
        .filter(|(path, len, modified)| known.get(path) != Some(&(*len, *modified)))
        .map(|(path, len, modified)| {
            let manifests = match too_large(*len, limits) {
                // Refused before it is read.
                Some(why) => unusable(path, &format!("{why}: refused unread")),
                None => match fs::read_to_string(path) {
                    Ok(text) => parse_file(path, &text, limits),
                    Err(e) => unusable(path, &format!("cannot read: {e}")),
                },
            };
            (
                path.clone(),
                *len,
                *modified,
                FileObjects::from_manifests(manifests),
            )
        })
        .collect()
}

/// What a read of the directory hands over.
pub(crate) struct Delta {
    /// For the sync task: the complete set of every kind on the first read,
    /// then only the objects whose definition in use changed.
    pub updates: Vec<Update>,
    /// Every problem of the directory (files and duplicates).
    pub problems: Vec<Problem>,
    /// Objects in use, by kind.
    pub counts: BTreeMap<Kind, usize>,
}

impl DirState {
    fn known(&self) -> BTreeMap<PathBuf, (u64, Option<SystemTime>)> {
        self.files
            .iter()
            .map(|(p, f)| (p.clone(), (f.len, f.modified)))
            .collect()
    }

    /// Takes in the files of `fp` (`changed` parsed afresh; the others
    /// are as last read). Each object is defined by the file that owns it:
    /// its current owner if that still defines it, else the first file in
    /// name order; every other definition is reported as a duplicate. Only
    /// the objects the changed or removed files define are looked at.
    pub(crate) fn merge(&mut self, fp: &Fingerprint, changed: Vec<Changed>) -> Delta {
        let present: BTreeSet<&PathBuf> = fp.iter().map(|(p, _, _)| p).collect();
        let removed: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains(p))
            .cloned()
            .collect();
        // The objects whose definitions may have changed.
        let mut touched: HashSet<Id> = HashSet::new();
        for path in &removed {
            if let Some(old) = self.files.remove(path) {
                self.undefine(path, &old.objects, &mut touched);
            }
        }
        for (path, len, modified, objects) in changed {
            if let Some(old) = self.files.remove(&path) {
                self.undefine(&path, &old.objects, &mut touched);
            }
            for id in objects.objects.keys() {
                let files = self.defined.entry(id.clone()).or_default();
                if let Err(at) = files.binary_search(&path) {
                    files.insert(at, path.clone());
                }
                touched.insert(id.clone());
            }
            self.files.insert(
                path,
                Parsed {
                    len,
                    modified,
                    objects,
                },
            );
        }
        let mut updates = Vec::new();
        for id in touched {
            let Some(files) = self.defined.get(&id).filter(|f| !f.is_empty()) else {
                self.defined.remove(&id);
                self.owners.remove(&id);
                self.duplicates.remove(&id);
                updates.push(delete(id));
                continue;
            };
            let owner = match self.owners.get(&id) {
                Some(p) if files.contains(p) => p.clone(),
                _ => files[0].clone(),
            };
            let dups: Vec<Problem> = files
                .iter()
                .filter(|p| **p != owner)
                .map(|other| {
                    Problem::new(
                        format!("{} {}", id.0, id.1),
                        ProblemReason::Duplicate,
                        format!(
                            "also defined in {}, which is ignored: {} defines it first",
                            other.display(),
                            owner.display()
                        ),
                    )
                })
                .collect();
            if dups.is_empty() {
                self.duplicates.remove(&id);
            } else {
                self.duplicates.insert(id.clone(), dups);
            }
            if let Some(o) = self
                .files
                .get(&owner)
                .and_then(|f| f.objects.objects.get(&id))
            {
                updates.push(o.clone().apply());
            }
            self.owners.insert(id, owner);
        }
        if !self.sent {
            self.sent = true;
            updates = self.complete_set();
        }
        let mut problems: Vec<Problem> = self
            .files
            .values()
            .flat_map(|f| f.objects.problems.iter().cloned())
            .collect();
        problems.extend(self.duplicates.values().flatten().cloned());
        let mut counts = BTreeMap::new();
        for (kind, _) in self.owners.keys() {
            *counts.entry(*kind).or_default() += 1;
        }
        Delta {
            updates,
            problems,
            counts,
        }
    }

    /// `path` no longer defines what `objects` held.
    fn undefine(&mut self, path: &PathBuf, objects: &FileObjects, touched: &mut HashSet<Id>) {
        for id in objects.objects.keys() {
            if let Some(files) = self.defined.get_mut(id) {
                files.retain(|p| p != path);
            }
            touched.insert(id.clone());
        }
    }

    /// Every object in use, as one complete set per kind.
    fn complete_set(&self) -> Vec<Update> {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        let mut nodes = Vec::new();
        let mut cidrs = Vec::new();
        for (id, owner) in &self.owners {
            let Some(o) = self
                .files
                .get(owner)
                .and_then(|f| f.objects.objects.get(id))
            else {
                continue;
            };
            match o.clone() {
                Object::Service(c) => services.push(c),
                Object::Slice(c) => slices.push(c),
                Object::Node(c) => nodes.push(c),
                Object::ServiceCidr(c) => cidrs.push(c),
            }
        }
        vec![
            Update::Services(Change::Reset(services)),
            Update::Slices(Change::Reset(slices)),
            Update::Node(Change::Reset(nodes)),
            Update::ServiceCidrs(Change::Reset(cidrs)),
        ]
    }
}

/// Watches `dir` until `shutdown` turns true.
pub async fn run(
    dir: PathBuf,
    interval: Duration,
    tx: mpsc::Sender<Envelope>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<Fingerprint> = None;
    let mut missing_reported = false;
    let mut state = DirState::default();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    loop {
        match fingerprint(&dir) {
            Ok(fp) if last.as_ref() != Some(&fp) => {
                missing_reported = false;
                // Reading and parsing run off the async workers: a costly
                // file never delays /healthz or /metrics.
                let known = state.known();
                let files = fp.clone();
                let changed = match tokio::task::spawn_blocking(move || {
                    parse_changed(&files, &known, Limits::default())
                })
                .await
                {
                    Ok(changed) => changed,
                    Err(e) => {
                        warn!(error = %e, "parsing the manifest directory failed; keeping the last state");
                        last = Some(fp);
                        continue;
                    }
                };
                let delta = state.merge(&fp, changed);
                let now: BTreeSet<String> =
                    delta.problems.iter().map(ToString::to_string).collect();
                for problem in now.difference(&reported) {
                    warn!(%problem, "manifest not used");
                }
                reported = now;
                let mut by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
                for p in &delta.problems {
                    *by_reason.entry(p.reason.label()).or_default() += 1;
                }
                for reason in ProblemReason::ALL {
                    metrics
                        .manifest_problems
                        .get_or_create(&ReasonLabel {
                            reason: reason.label().to_owned(),
                        })
                        .set(by_reason.get(reason.label()).copied().unwrap_or(0));
                }
                let count = |k: Kind| delta.counts.get(&k).copied().unwrap_or(0);
                info!(
                    dir = %dir.display(),
                    services = count(Kind::Service),
                    endpointslices = count(Kind::EndpointSlice),
                    nodes = count(Kind::Node),
                    servicecidrs = count(Kind::ServiceCidr),
                    changes = delta.updates.len(),
                    "read manifests"
                );
                for update in delta.updates {
                    health.update_sent();
                    if tx.send((std::time::Instant::now(), update)).await.is_err() {
                        return;
                    }
                }
                last = Some(fp);
            }
            Ok(_) => {}
            // Keep the last state: an unreadable directory is an outage,
            // not an instruction to delete every service.
            Err(e) if !missing_reported => {
                warn!(dir = %dir.display(), error = %e, "cannot read the manifest directory; keeping the last state");
                missing_reported = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{manifests::parse_manifests, stores::Stores};

    fn web(ip: &str) -> String {
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: {ip}\n  ports: [{{port: 80}}]\n")
    }

    /// A directory state and the stores its updates feed.
    #[derive(Default)]
    struct Dir {
        state: DirState,
        stores: Stores,
    }

    fn step(d: &mut Dir, files: &[(&str, String)], changed: &[&str]) -> (Vec<Problem>, usize) {
        let fp: Fingerprint = files
            .iter()
            .map(|(p, text)| (PathBuf::from(p), text.len() as u64, None))
            .collect();
        let changed = files
            .iter()
            .filter(|(p, _)| changed.contains(p))
            .map(|(p, text)| {
                (
                    PathBuf::from(p),
                    text.len() as u64,
                    None,
                    FileObjects::from_manifests(parse_manifests(&[(p, text.clone())])),
                )
            })
            .collect();
        let delta = d.state.merge(&fp, changed);
        let n = delta.updates.len();
        for u in delta.updates {
            d.stores.apply(u);
        }
        (delta.problems, n)
    }

    fn cluster_ips(d: &Dir) -> Vec<String> {
        d.stores
            .services
            .values()
            .flat_map(|s| s.cluster_ips.iter().map(ToString::to_string))
            .collect()
    }

    #[test]
    fn a_second_definition_never_displaces_the_one_in_use() {
        let mut d = Dir::default();
        step(&mut d, &[("/d/b.yaml", web("10.96.0.1"))], &["/d/b.yaml"]);
        assert_eq!(cluster_ips(&d), ["10.96.0.1"]);
        // A file that sorts first defines it again: the one in use stays.
        let files = [
            ("/d/a.yaml", web("10.96.0.2")),
            ("/d/b.yaml", web("10.96.0.1")),
        ];
        let (problems, _) = step(&mut d, &files, &["/d/a.yaml"]);
        assert_eq!(cluster_ips(&d), ["10.96.0.1"]);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].reason, ProblemReason::Duplicate);
        assert!(problems[0].to_string().contains("/d/a.yaml"));
        // Read again unchanged: the same answer (no flapping), nothing sent.
        for _ in 0..3 {
            let (problems, sent) = step(&mut d, &files, &[]);
            assert_eq!(cluster_ips(&d), ["10.96.0.1"]);
            assert_eq!((problems.len(), sent), (1, 0));
        }
        // A fresh agent on the same directory picks by file name.
        let mut fresh = Dir::default();
        step(&mut fresh, &files, &["/d/a.yaml", "/d/b.yaml"]);
        assert_eq!(cluster_ips(&fresh), ["10.96.0.2"]);
        // The owner drops its definition: the other one takes over.
        let files = [
            ("/d/a.yaml", web("10.96.0.2")),
            ("/d/b.yaml", String::from("# nothing\n")),
        ];
        let (problems, _) = step(&mut d, &files, &["/d/b.yaml"]);
        assert_eq!(cluster_ips(&d), ["10.96.0.2"]);
        assert!(problems.is_empty(), "{problems:?}");
        // The last definition goes: the service is deleted.
        let (_, sent) = step(&mut d, &files[1..], &[]);
        assert_eq!(sent, 1, "one delete");
        assert!(d.stores.services.is_empty());
    }

    #[test]
    fn a_change_sends_only_the_objects_of_the_changed_file() {
        let svc = |name: &str, ip: &str| web(ip).replace("name: web", &format!("name: {name}"));
        let many: String = (0..50)
            .map(|i| svc(&format!("s{i}"), &format!("10.96.1.{i}")))
            .collect::<Vec<_>>()
            .join("---\n");
        let mut d = Dir::default();
        let files = [
            ("/d/a.yaml", many.clone()),
            ("/d/b.yaml", svc("one", "10.96.0.1")),
        ];
        step(&mut d, &files, &["/d/a.yaml", "/d/b.yaml"]);
        assert_eq!(d.stores.services.len(), 51);
        let files = [("/d/a.yaml", many), ("/d/b.yaml", svc("one", "10.96.0.9"))];
        let (_, sent) = step(&mut d, &files, &["/d/b.yaml"]);
        assert_eq!(sent, 1, "only the changed file's object");
        assert!(cluster_ips(&d).contains(&"10.96.0.9".to_owned()));
    }

    #[test]
    fn unchanged_files_are_not_parsed_again() {
        let dir = std::env::temp_dir().join(format!("sluice-dir-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.yaml");
        let b = dir.join("b.yaml");
        fs::write(&a, web("10.96.0.1")).unwrap();
        fs::write(&b, web("10.96.0.2").replace("name: web", "name: api")).unwrap();
        let mut state = DirState::default();
        let fp = fingerprint(&dir).unwrap();
        let changed = parse_changed(&fp, &state.known(), Limits::default());
        assert_eq!(changed.len(), 2);
        state.merge(&fp, changed);
        fs::write(&b, web("10.96.0.3").replace("name: web", "name: api2")).unwrap();
        let fp = fingerprint(&dir).unwrap();
        let changed = parse_changed(&fp, &state.known(), Limits::default());
        let paths: Vec<&PathBuf> = changed.iter().map(|c| &c.0).collect();
        assert_eq!(paths, [&b]);
        let delta = state.merge(&fp, changed);
        assert_eq!(delta.counts[&Kind::Service], 2);
        // api went, api2 came.
        assert_eq!(delta.updates.len(), 2);
        fs::remove_dir_all(&dir).unwrap();
    }
}
