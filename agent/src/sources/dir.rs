//! The directory source: a directory of Kubernetes manifests (YAML or
//! JSON, multi-document), re-read whenever a file in it changes. Each read
//! sends the complete set of every kind, exactly as a relist would, through
//! the same path as the Kubernetes source.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::{node, service, slice, Change, Envelope, Update};
use crate::{
    health::Health,
    manifests::{is_manifest_file, parse_manifests},
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

fn read(files: &Fingerprint) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .filter_map(|(path, _, _)| match fs::read_to_string(path) {
            Ok(text) => Some((path.clone(), text)),
            Err(e) => {
                warn!(file = %path.display(), error = %e, "cannot read manifest");
                None
            }
        })
        .collect()
}

/// Watches `dir` until `shutdown` turns true.
pub async fn run(
    dir: PathBuf,
    interval: Duration,
    tx: mpsc::Sender<Envelope>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<Fingerprint> = None;
    let mut missing_reported = false;
    loop {
        match fingerprint(&dir) {
            Ok(fp) if last.as_ref() != Some(&fp) => {
                missing_reported = false;
                let manifests = parse_manifests(&read(&fp));
                for problem in &manifests.problems {
                    warn!(%problem, "manifest not used");
                }
                info!(
                    dir = %dir.display(),
                    services = manifests.services.len(),
                    endpointslices = manifests.slices.len(),
                    nodes = manifests.nodes.len(),
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
