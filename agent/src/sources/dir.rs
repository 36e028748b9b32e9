//! The directory source: a directory of Kubernetes manifests (YAML or
//! JSON, multi-document), re-read whenever a file in it changes. Each read
//! sends the complete set of every kind, exactly as a relist would, through
//! the same path as the Kubernetes source.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{node, service, service_cidr, slice, Change, Envelope, Update};
use crate::{
    health::Health,
    manifests::{is_manifest_file, parse_file, too_large, unusable, Limits, Manifests},
    metrics::{Metrics, ReasonLabel},
    translate::{ObjectKey, Problem, ProblemReason},
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

/// One file as last parsed: its size and modification time, and what it
/// held.
struct Parsed {
    len: u64,
    modified: Option<SystemTime>,
    manifests: Manifests,
}

/// The directory as last read: every file's objects, and which file holds
/// each object that several files define.
#[derive(Default)]
pub(crate) struct DirState {
    files: BTreeMap<PathBuf, Parsed>,
    owners: HashMap<(&'static str, ObjectKey), PathBuf>,
}

/// Reads and parses the files of `fp` that changed since `state` saw
/// them (a file whose size and modification time are the same is not read
/// again); returns the (path, contents-parsed) of the changed ones.
fn parse_changed(
    fp: &Fingerprint,
    known: &BTreeMap<PathBuf, (u64, Option<SystemTime>)>,
    limits: Limits,
) -> Vec<(PathBuf, u64, Option<SystemTime>, Manifests)> {
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
            (path.clone(), *len, *modified, manifests)
        })
        .collect()
}

impl DirState {
    fn known(&self) -> BTreeMap<PathBuf, (u64, Option<SystemTime>)> {
        self.files
            .iter()
            .map(|(p, f)| (p.clone(), (f.len, f.modified)))
            .collect()
    }

    /// Takes in the files of `fp` (`changed` parsed afresh), and returns
    /// the directory's objects: one definition of each, the one its
    /// current owner file gives if it still does, else the first file's
    /// in name order; every other definition is reported as a duplicate.
    pub(crate) fn merge(
        &mut self,
        fp: &Fingerprint,
        changed: Vec<(PathBuf, u64, Option<SystemTime>, Manifests)>,
    ) -> Manifests {
        let present: BTreeSet<&PathBuf> = fp.iter().map(|(p, _, _)| p).collect();
        self.files.retain(|p, _| present.contains(p));
        for (path, len, modified, manifests) in changed {
            self.files.insert(
                path,
                Parsed {
                    len,
                    modified,
                    manifests,
                },
            );
        }
        let mut out = Manifests::default();
        // Every definition of every object, in file order.
        let mut defined: BTreeMap<(&'static str, ObjectKey), Vec<&PathBuf>> = BTreeMap::new();
        for (path, f) in &self.files {
            out.problems.extend(f.manifests.problems.iter().cloned());
            for key in object_keys(&f.manifests) {
                let files = defined.entry(key).or_default();
                if files.last() != Some(&path) {
                    files.push(path);
                }
            }
        }
        let mut owners = HashMap::new();
        for (id, files) in defined {
            let owner = match self.owners.get(&id) {
                Some(p) if files.contains(&p) => p.clone(),
                _ => files[0].clone(),
            };
            for other in files.iter().filter(|p| ***p != owner) {
                out.problems.push(Problem::new(
                    format!("{} {}", id.0, id.1),
                    ProblemReason::Duplicate,
                    format!(
                        "also defined in {}, which is ignored: {} defines it first",
                        other.display(),
                        owner.display()
                    ),
                ));
            }
            owners.insert(id, owner);
        }
        for (path, f) in &self.files {
            let mine = |kind: &'static str, meta: &ObjectMeta| {
                ObjectKey::from_meta(meta)
                    .is_none_or(|k| owners.get(&(kind, k)).is_some_and(|p| p == path))
            };
            let m = &f.manifests;
            out.services.extend(
                m.services
                    .iter()
                    .filter(|o| mine("Service", &o.metadata))
                    .cloned(),
            );
            out.slices.extend(
                m.slices
                    .iter()
                    .filter(|o| mine("EndpointSlice", &o.metadata))
                    .cloned(),
            );
            out.nodes.extend(
                m.nodes
                    .iter()
                    .filter(|o| mine("Node", &o.metadata))
                    .cloned(),
            );
            out.service_cidrs.extend(
                m.service_cidrs
                    .iter()
                    .filter(|o| mine("ServiceCIDR", &o.metadata))
                    .cloned(),
            );
        }
        // A duplicate inside one file: the first definition wins, as the
        // stores would keep only one.
        dedup_by_key(&mut out);
        self.owners = owners;
        out
    }
}

fn object_keys(m: &Manifests) -> Vec<(&'static str, ObjectKey)> {
    let keys = |kind: &'static str, metas: Vec<&ObjectMeta>| {
        metas
            .into_iter()
            .filter_map(move |meta| ObjectKey::from_meta(meta).map(|k| (kind, k)))
            .collect::<Vec<_>>()
    };
    let mut out = keys("Service", m.services.iter().map(|o| &o.metadata).collect());
    out.extend(keys(
        "EndpointSlice",
        m.slices.iter().map(|o| &o.metadata).collect(),
    ));
    out.extend(keys("Node", m.nodes.iter().map(|o| &o.metadata).collect()));
    out.extend(keys(
        "ServiceCIDR",
        m.service_cidrs.iter().map(|o| &o.metadata).collect(),
    ));
    out
}

fn dedup_by_key(m: &mut Manifests) {
    let mut seen = BTreeSet::new();
    m.services
        .retain(|o| ObjectKey::from_meta(&o.metadata).is_none_or(|k| seen.insert(("Service", k))));
    m.slices.retain(|o| {
        ObjectKey::from_meta(&o.metadata).is_none_or(|k| seen.insert(("EndpointSlice", k)))
    });
    m.nodes
        .retain(|o| ObjectKey::from_meta(&o.metadata).is_none_or(|k| seen.insert(("Node", k))));
    m.service_cidrs.retain(|o| {
        ObjectKey::from_meta(&o.metadata).is_none_or(|k| seen.insert(("ServiceCIDR", k)))
    });
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
                let manifests = state.merge(&fp, changed);
                let now: BTreeSet<String> =
                    manifests.problems.iter().map(ToString::to_string).collect();
                for problem in now.difference(&reported) {
                    warn!(%problem, "manifest not used");
                }
                reported = now;
                let mut by_reason: BTreeMap<&'static str, i64> = BTreeMap::new();
                for p in &manifests.problems {
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
                info!(
                    dir = %dir.display(),
                    services = manifests.services.len(),
                    endpointslices = manifests.slices.len(),
                    nodes = manifests.nodes.len(),
                    servicecidrs = manifests.service_cidrs.len(),
                    "read manifests"
                );
                let updates = [
                    Update::Services(Change::Reset(
                        manifests.services.iter().filter_map(service).collect(),
                    )),
                    Update::Slices(Change::Reset(
                        manifests.slices.iter().filter_map(slice).collect(),
                    )),
                    Update::Node(Change::Reset(
                        manifests.nodes.iter().filter_map(node).collect(),
                    )),
                    Update::ServiceCidrs(Change::Reset(
                        manifests
                            .service_cidrs
                            .iter()
                            .filter_map(service_cidr)
                            .collect(),
                    )),
                ];
                for update in updates {
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
    use crate::manifests::parse_manifests;

    fn web(ip: &str) -> String {
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: {ip}\n  ports: [{{port: 80}}]\n")
    }

    fn step(state: &mut DirState, files: &[(&str, String)], changed: &[&str]) -> Manifests {
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
                    parse_manifests(&[(p, text.clone())]),
                )
            })
            .collect();
        state.merge(&fp, changed)
    }

    fn cluster_ips(m: &Manifests) -> Vec<String> {
        m.services
            .iter()
            .filter_map(|s| s.spec.as_ref()?.cluster_ip.clone())
            .collect()
    }

    #[test]
    fn a_second_definition_never_displaces_the_one_in_use() {
        let mut state = DirState::default();
        let m = step(
            &mut state,
            &[("/d/b.yaml", web("10.96.0.1"))],
            &["/d/b.yaml"],
        );
        assert_eq!(cluster_ips(&m), ["10.96.0.1"]);
        // A file that sorts first defines it again: the one in use stays.
        let files = [
            ("/d/a.yaml", web("10.96.0.2")),
            ("/d/b.yaml", web("10.96.0.1")),
        ];
        let m = step(&mut state, &files, &["/d/a.yaml"]);
        assert_eq!(cluster_ips(&m), ["10.96.0.1"]);
        assert_eq!(m.problems.len(), 1);
        assert_eq!(m.problems[0].reason, ProblemReason::Duplicate);
        assert!(m.problems[0].to_string().contains("/d/a.yaml"));
        // Read again unchanged: the same answer (no flapping).
        for _ in 0..3 {
            assert_eq!(cluster_ips(&step(&mut state, &files, &[])), ["10.96.0.1"]);
        }
        // A fresh agent on the same directory picks by file name.
        let mut fresh = DirState::default();
        let m = step(&mut fresh, &files, &["/d/a.yaml", "/d/b.yaml"]);
        assert_eq!(cluster_ips(&m), ["10.96.0.2"]);
        // The owner drops its definition: the other one takes over.
        let files = [
            ("/d/a.yaml", web("10.96.0.2")),
            ("/d/b.yaml", String::from("# nothing\n")),
        ];
        let m = step(&mut state, &files, &["/d/b.yaml"]);
        assert_eq!(cluster_ips(&m), ["10.96.0.2"]);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
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
        let m = state.merge(&fp, changed);
        assert_eq!(m.services.len(), 2);
        fs::remove_dir_all(&dir).unwrap();
    }
}
