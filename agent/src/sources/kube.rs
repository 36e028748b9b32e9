//! The Kubernetes source: kube-rs watchers on Services (with kube-proxy's
//! label selector), EndpointSlices, this node's Node and the ServiceCIDRs,
//! with the default backoff. Services and EndpointSlices decode into the
//! slim types of `slim.rs` (only what the translation reads). Lists and
//! relists stream through in pages (`Change::ListStart`, `ListPage`,
//! `ListEnd`): the stores apply each page as it comes (an unchanged object
//! changes nothing) and drop what the list did not hold at its end, so
//! deletes missed while disconnected are not lost and a relist never holds
//! a second copy of every object. Every watch event passes the
//! resourceVersion guard: a stale event restarts the watcher with a fresh
//! list instead of letting it resume from the past (incident 4).

use std::{fmt::Debug, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use kube::{
    runtime::{
        watcher::{self, Event},
        WatchStreamExt,
    },
    Api, Client, Resource, ResourceExt,
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use super::{
    guard::{RvGuard, Verdict},
    slim::{SlimService, SlimSlice},
    Change, Converted, Envelope, Kind, Update,
};
use crate::{health::Health, metrics::Metrics, translate::ObjectKey};

/// kube-proxy's selector: services owned by another proxy, and headless
/// services, are not ours.
pub const SERVICE_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// One kind of request the agent makes: `verbs` on `resource` of API
/// `group` (`""` is the core group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

/// What the agent asks the API server for, and so exactly what its
/// ClusterRole must grant (`tests/tests/deploy_manifests.rs` holds
/// `deploy/` to it): the three watchers list and watch, and the probe
/// lists its own Node's metadata. Keep it in step with `run` and `probe`.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: <Service as k8s_openapi::Resource>::GROUP,
        resource: <Service as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: <EndpointSlice as k8s_openapi::Resource>::GROUP,
        resource: <EndpointSlice as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: <Node as k8s_openapi::Resource>::GROUP,
        resource: <Node as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: <ServiceCIDR as k8s_openapi::Resource>::GROUP,
        resource: <ServiceCIDR as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        verbs: &["list", "watch"],
    },
];

/// Runs the four watchers until the receiver goes away.
pub async fn run(
    client: Client,
    node_name: String,
    tx: mpsc::Sender<Envelope>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) {
    // The two big kinds relist one at a time (see `Watch::relists`).
    let big_relists = Arc::new(Semaphore::new(1));
    let services = Watch {
        kind: Kind::Service,
        api: Api::<SlimService>::all(client.clone()),
        config: watcher::Config::default().labels(SERVICE_SELECTOR),
        convert: |s| super::service(&s.0),
        wrap: Update::Services,
        relists: Some(big_relists.clone()),
    };
    let slices = Watch {
        kind: Kind::EndpointSlice,
        api: Api::<SlimSlice>::all(client.clone()),
        config: watcher::Config::default(),
        convert: |s| super::slice(&s.0),
        wrap: Update::Slices,
        relists: Some(big_relists),
    };
    let nodes = Watch {
        kind: Kind::Node,
        api: Api::<Node>::all(client.clone()),
        config: watcher::Config::default().fields(&format!("metadata.name={node_name}")),
        convert: super::node,
        wrap: Update::Node,
        relists: None,
    };
    // kube-proxy (1.33+) learns the service CIDRs from these objects. An
    // API server without the v1 resource (before 1.33, or the feature
    // off) answers 404: that counts as an empty set, so the agent still
    // syncs, and the watcher keeps retrying with backoff.
    let service_cidrs = Watch {
        kind: Kind::ServiceCidr,
        api: Api::<ServiceCIDR>::all(client.clone()),
        config: watcher::Config::default(),
        convert: super::service_cidr,
        wrap: Update::ServiceCidrs,
        relists: None,
    };
    let probe_api = Api::<Node>::all(client);
    // The two big lists decode on tasks of their own, side by side (on one
    // task, 100,000 services and their slices decode one after the
    // other); their relists take turns (`Watch::relists`). Dropping the
    // set (this future aborted) aborts them.
    let mut big = tokio::task::JoinSet::new();
    {
        let (tx, health, metrics) = (tx.clone(), health.clone(), metrics.clone());
        big.spawn(async move { services.run(&tx, &health, &metrics).await });
    }
    {
        let (tx, health, metrics) = (tx.clone(), health.clone(), metrics.clone());
        big.spawn(async move { slices.run(&tx, &health, &metrics).await });
    }
    tokio::join!(
        async { while big.join_next().await.is_some() {} },
        nodes.run(&tx, &health, &metrics),
        service_cidrs.run(&tx, &health, &metrics),
        probe(probe_api, &node_name, &health),
    );
}

/// While a watch is failing, checks every second whether the API answers
/// again (a one-item list of this node): a watch that resumed quietly
/// yields no event to say so.
async fn probe(api: Api<Node>, node_name: &str, health: &Health) {
    let params = kube::api::ListParams::default()
        .fields(&format!("metadata.name={node_name}"))
        .limit(1);
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if health.api_healthy() {
            continue;
        }
        if api.list_metadata(&params).await.is_ok() {
            health.api_ok_all();
        }
    }
}

/// Whether a watch failed because the API server does not serve the
/// resource at all.
fn not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(r))
        | watcher::Error::WatchStartFailed(kube::Error::Api(r)) => r.code == 404,
        _ => false,
    }
}

/// Objects per list page (asked of the API server, and per
/// `Change::ListPage` sent to the sync task) of the first list: few round
/// trips to be ready soon.
const LIST_PAGE: u32 = 500;

/// Objects per page of a relist (410 Gone, a reconnect, a guard relist),
/// while the stores hold every object already: the pages in flight are
/// what a relist adds to the agent's memory (at 100,000 services, pages
/// of 500 raised its high-water mark by 9 MB; pages of 100 by 0.2 MB, for
/// 2.5 s more listing, until the first sync's own peak came down to 2 MiB
/// above where the agent settles; pages of 50, the two kinds one at a
/// time, add 1.1 MiB for a relist of 5.8 s: docs/performance.md).
const RELIST_PAGE: u32 = 50;

/// The longest a relist waits for the other kind's to end (see
/// `Watch::relists`); then it goes ahead beside it.
const RELIST_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the guard makes of a watch event.
enum Step {
    Use,
    Skip,
    Relist,
}

struct Watch<K: Resource, T> {
    kind: Kind,
    api: Api<K>,
    config: watcher::Config,
    convert: fn(&K) -> Option<Converted<T>>,
    wrap: fn(Change<T>) -> Update,
    /// Shared by the kinds that relist one at a time: a relist holds its
    /// permit from its start to its end. A page in flight (its body, the
    /// body's copy, its decoded objects) is what a relist adds to the
    /// agent's memory, and two kinds relisting side by side (the history
    /// compacted past both watches: a 410 Gone for each) doubled it. The
    /// first list is not held back: it makes the agent ready. A kind
    /// waiting for its turn sees none of its own changes until it gets it
    /// (at 100,000 objects a relist takes about 3 s), and waits at most
    /// `RELIST_TURN_WAIT`: a relist stalled on a dead connection does not
    /// stop the other kind for good.
    relists: Option<Arc<Semaphore>>,
}

impl<K, T> Watch<K, T>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    async fn send(&self, tx: &mpsc::Sender<Envelope>, health: &Health, change: Change<T>) -> bool {
        health.update_sent();
        tx.send((std::time::Instant::now(), (self.wrap)(change)))
            .await
            .is_ok()
    }

    /// One list+watch after another; returns when the receiver is gone.
    async fn run(&self, tx: &mpsc::Sender<Envelope>, health: &Health, metrics: &Metrics) {
        let kind = self.kind;
        // The resource is not served (see `run`): reported once.
        let mut absent = false;
        // Whether a list completed: every later list is a relist.
        let mut listed_once = false;
        loop {
            let page_len = if listed_once { RELIST_PAGE } else { LIST_PAGE };
            let config = self.config.clone().page_size(page_len);
            let page_len = page_len as usize;
            let mut stream = watcher::watcher(self.api.clone(), config)
                .default_backoff()
                .boxed();
            let mut guard = RvGuard::new();
            let mut page: Vec<Converted<T>> = Vec::new();
            let mut listed = 0usize;
            // A relist's turn (see `relists`), from its start to its end.
            let mut relisting: Option<OwnedSemaphorePermit> = None;
            // Whether this stream completed a list: a later `Init` is then
            // a relist (410 Gone); before, the watcher's retry of a failed
            // list, which keeps its backoff in this stream.
            let mut completed = false;
            loop {
                let event = match stream.next().await {
                    Some(Ok(event)) => {
                        health.api_ok(kind);
                        event
                    }
                    Some(Err(e)) if kind == Kind::ServiceCidr && not_found(&e) => {
                        if !absent {
                            absent = true;
                            info!(%kind, "not served by the API server: no service CIDRs");
                            if !self.send(tx, health, Change::Reset(Vec::new())).await {
                                return;
                            }
                        }
                        continue;
                    }
                    Some(Err(e)) => {
                        // The list starts over after the backoff: the
                        // other kind need not wait out the failure.
                        relisting = None;
                        health.api_error(kind);
                        metrics.api_errors(kind);
                        warn!(%kind, error = %e, "watch failed, retrying with backoff");
                        continue;
                    }
                    None => break,
                };
                let (obj, deleted) = match event {
                    Event::Init => {
                        if completed && page_len != RELIST_PAGE as usize {
                            // The watcher relists (410 Gone): anew, with
                            // a relist's pages (nothing was fetched yet).
                            break;
                        }
                        if listed_once && relisting.is_none() {
                            if let Some(turns) = &self.relists {
                                let turn = turns.clone().acquire_owned();
                                match tokio::time::timeout(RELIST_TURN_WAIT, turn).await {
                                    // Err only if closed; it never is.
                                    Ok(permit) => relisting = permit.ok(),
                                    Err(_) => warn!(
                                        %kind,
                                        waited_s = RELIST_TURN_WAIT.as_secs(),
                                        "the other kind's relist has not ended: relisting beside it"
                                    ),
                                }
                            }
                        }
                        guard = RvGuard::new();
                        page.clear();
                        listed = 0;
                        metrics.relist(kind);
                        debug!(%kind, "listing");
                        if !self.send(tx, health, Change::ListStart).await {
                            return;
                        }
                        continue;
                    }
                    Event::InitApply(obj) => {
                        guard.listed(obj.resource_version().as_deref());
                        page.extend((self.convert)(&obj));
                        listed += 1;
                        if page.len() >= page_len {
                            let full = std::mem::replace(&mut page, Vec::with_capacity(page_len));
                            if !self.send(tx, health, Change::ListPage(full)).await {
                                return;
                            }
                        }
                        continue;
                    }
                    Event::InitDone => {
                        listed_once = true;
                        completed = true;
                        info!(%kind, objects = listed, "listed");
                        if !page.is_empty() {
                            let rest = std::mem::take(&mut page);
                            if !self.send(tx, health, Change::ListPage(rest)).await {
                                return;
                            }
                        }
                        if !self.send(tx, health, Change::ListEnd).await {
                            return;
                        }
                        relisting = None;
                        continue;
                    }
                    Event::Apply(obj) => (obj, false),
                    Event::Delete(obj) => (obj, true),
                };
                match self.check(&mut guard, &obj, metrics) {
                    Step::Relist => break,
                    Step::Skip => continue,
                    Step::Use => {}
                }
                let change = if deleted {
                    ObjectKey::from_meta(obj.meta()).map(Change::Delete)
                } else {
                    (self.convert)(&obj).map(Change::Apply)
                };
                if let Some(change) = change {
                    if !self.send(tx, health, change).await {
                        return;
                    }
                }
            }
            // The stream is dropped here; the next iteration lists afresh.
        }
    }

    /// Runs the guard on a watch event.
    fn check(&self, guard: &mut RvGuard, obj: &K, metrics: &Metrics) -> Step {
        let kind = self.kind;
        match guard.event(obj.resource_version().as_deref()) {
            Verdict::Apply => Step::Use,
            Verdict::Duplicate => {
                metrics.duplicate_event(kind);
                debug!(%kind, name = %obj.name_any(), "duplicate event ignored");
                Step::Skip
            }
            Verdict::Stale { newest, got } => {
                metrics.stale_event(kind);
                warn!(
                    %kind,
                    name = %obj.name_any(),
                    resource_version = got,
                    newest,
                    "event older than state already applied: relisting instead of resuming from the past"
                );
                Step::Relist
            }
        }
    }
}
