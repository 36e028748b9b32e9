//! A small, protocol-faithful Kubernetes API server for tests.
//!
//! It serves what sluice's agent reads, over plain HTTP/1.1, the way
//! kube-apiserver does, so the real kube-rs client and
//! `kube::runtime::watcher` can be tested against it, failure modes
//! included:
//!
//! - core/v1 Services (`/api/v1/services`,
//!   `/api/v1/namespaces/{ns}/services[/{name}]`), discovery.k8s.io/v1
//!   EndpointSlices (`/apis/discovery.k8s.io/v1/endpointslices`, and
//!   namespaced) and core/v1 Nodes (`/api/v1/nodes[/{name}]`); also
//!   `/version` and `/healthz`. Anything else is a 404 `Status`; methods
//!   other than GET on resources are 405 (objects change only through
//!   [`ApiHandle`]).
//! - list: label selectors (`key`, `!key`, `key=v`, `key==v`, `key!=v`,
//!   `key in (..)`, `key notin (..)`), field selectors (`metadata.name`,
//!   `metadata.namespace`, ...), `limit`/`continue` (consistent pages from
//!   the snapshot of the first page), `resourceVersion` with
//!   `resourceVersionMatch` `NotOlderThan`/`Exact` (410 Expired before the
//!   compaction point).
//! - watch: newline-delimited JSON events in a chunked response, from a
//!   `resourceVersion` (history replayed after it), or from the current
//!   state for unset/`"0"` (synthetic ADDED events), streaming lists
//!   (`sendInitialEvents=true`, ending with a `k8s.io/initial-events-end`
//!   bookmark), periodic BOOKMARKs when `allowWatchBookmarks=true`,
//!   `timeoutSeconds`, and an ERROR event with a 410 Expired `Status` when
//!   the resourceVersion was compacted.
//!
//! One global resourceVersion counter (a decimal string on the wire) is
//! incremented by every change of any kind; objects get
//! `metadata.resourceVersion`, `uid` and `creationTimestamp`, and a
//! DELETED event carries the object with the deletion's resourceVersion.
//!
//! The server runs its own single-threaded tokio runtime on a background
//! thread, so it serves synchronous and async tests alike; dropping the
//! [`ApiServer`] stops it and every connection. [`ApiHandle`] (cloneable,
//! all methods synchronous unless noted) changes objects, injects faults
//! and reads the request log.
//!
//! Fault injection ([`ApiHandle::inject_fault`], [`ApiHandle::set_outage`],
//! [`ApiHandle::close_watches`], [`ApiHandle::abort_watches`],
//! [`ApiHandle::inject_event`]) and the request log
//! ([`ApiHandle::requests`], [`ApiHandle::watch_resource_versions`]) let
//! tests reproduce and observe what clients do when things go wrong; the
//! log entry of a request exists before the request is served, and
//! [`ApiHandle::wait_for`] waits for any such condition without sleeping.
//!
//! Observed kube-rs 5.0 behaviour worth knowing (see the protocol tests):
//! its client retries 429/503/504 answers itself (up to 15 times,
//! exponential from 5 ms), so a short [`Outage::Status`]`(503)` is invisible
//! to callers; the watcher relists only after an in-stream ERROR 410
//! ([`Fault::ExpiredWatch`], compaction) or a failed list, while an HTTP
//! 410 answer to a watch request makes it retry the watch with the same
//! resourceVersion.

mod faults;
mod http;
mod kinds;
mod kubeconfig;
mod selector;
mod store;
mod watch;

use std::{
    net::SocketAddr,
    ops::Deref,
    path::Path,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

pub use faults::{Fault, Outage, RequestRecord, Verb};
pub use kinds::ResourceKind;
pub use kubeconfig::{kubeconfig_yaml, CONTEXT};
pub use selector::{FieldSelector, LabelSelector};

use crate::Netns;
use faults::Faults;
use store::Store;

/// State shared by the handle, the accept loop and the watch tasks.
pub(crate) struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    bookmark_interval: Mutex<Option<Duration>>,
    /// Bumped on every observable change (objects, requests, watches), so
    /// tests can wait for conditions without polling.
    changes: tokio::sync::watch::Sender<u64>,
    addr: SocketAddr,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub(crate) fn faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }

    pub(crate) fn bookmark_interval(&self) -> Option<Duration> {
        *lock(&self.bookmark_interval)
    }

    pub(crate) fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Logs a request as it starts (status 0); returns its sequence number.
    pub(crate) fn begin(&self, mut rec: RequestRecord) -> u64 {
        let seq = {
            let mut faults = self.faults();
            faults.next_seq += 1;
            rec.seq = faults.next_seq;
            faults.log.push(rec);
            faults.next_seq
        };
        self.notify();
        seq
    }

    /// Sets the answered status of a logged request.
    pub(crate) fn finish(&self, seq: u64, status: u16) {
        if let Some(rec) = self.faults().log.iter_mut().rev().find(|r| r.seq == seq) {
            rec.status = status;
        }
        self.notify();
    }
}

/// Configures an [`ApiServer`] before starting it.
#[derive(Clone, Debug)]
pub struct ApiServerBuilder {
    bookmark_interval: Option<Duration>,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        Self {
            bookmark_interval: Some(Duration::from_secs(1)),
        }
    }
}

impl ApiServerBuilder {
    /// How often watches that allow bookmarks get a BOOKMARK event
    /// (default every second; `None`: never, except the one that ends a
    /// streaming list's initial events).
    pub fn bookmark_interval(mut self, every: Option<Duration>) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// Starts on 127.0.0.1 on an ephemeral port, in the current network
    /// namespace.
    pub fn start(self) -> Result<ApiServer> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the test apiserver")?;
        self.start_with(listener)
    }

    /// Starts on 127.0.0.1 on an ephemeral port inside `ns`: only
    /// processes and threads in that namespace can reach it.
    pub fn start_in(self, ns: &Netns) -> Result<ApiServer> {
        let listener = ns
            .run(|| std::net::TcpListener::bind("127.0.0.1:0"))?
            .with_context(|| format!("binding the test apiserver in {}", ns.name()))?;
        self.start_with(listener)
    }

    fn start_with(self, listener: std::net::TcpListener) -> Result<ApiServer> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the test apiserver's runtime")?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new()),
            faults: Mutex::new(Faults::default()),
            bookmark_interval: Mutex::new(self.bookmark_interval),
            changes: tokio::sync::watch::Sender::new(0),
            addr,
        });
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("test-apiserver-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = http::accept_loop(serving, listener) => {}
                        _ = stop => {}
                    }
                });
                // Drops every connection and watch task.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .context("spawning the test apiserver's thread")?;
        Ok(ApiServer {
            handle: ApiHandle { shared },
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

/// A running test API server; stops on drop. Dereferences to its
/// [`ApiHandle`].
pub struct ApiServer {
    handle: ApiHandle,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// [`ApiServerBuilder::start`] with the defaults.
    pub fn start() -> Result<Self> {
        Self::builder().start()
    }

    /// [`ApiServerBuilder::start_in`] with the defaults.
    pub fn start_in(ns: &Netns) -> Result<Self> {
        Self::builder().start_in(ns)
    }

    /// A handle that can be cloned and moved to other threads or tasks;
    /// it stays usable (as an in-memory store) after the server stops.
    pub fn handle(&self) -> ApiHandle {
        self.handle.clone()
    }
}

impl Deref for ApiServer {
    type Target = ApiHandle;

    fn deref(&self) -> &ApiHandle {
        &self.handle
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Controls and observes a test API server.
#[derive(Clone)]
pub struct ApiHandle {
    shared: Arc<Shared>,
}

fn kind_of(obj: &Value) -> Result<ResourceKind> {
    let s = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or_default();
    ResourceKind::from_type(s("apiVersion"), s("kind")).ok_or_else(|| {
        anyhow!(
            "the test apiserver does not serve apiVersion {:?} kind {:?}",
            s("apiVersion"),
            s("kind")
        )
    })
}

fn kind_for<K: k8s_openapi::Resource>() -> Result<ResourceKind> {
    ResourceKind::of::<K>().ok_or_else(|| {
        anyhow!(
            "the test apiserver does not serve {} {}",
            K::API_VERSION,
            K::KIND
        )
    })
}

fn yaml_documents(yaml: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = Value::deserialize(doc).context("parsing YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

impl ApiHandle {
    // ----- address and client configuration -----

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    pub fn port(&self) -> u16 {
        self.shared.addr.port()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// A kubeconfig for this server (see [`kubeconfig_yaml`]).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url())
    }

    /// Writes a kubeconfig for this server (no auth, namespace `default`),
    /// loadable with `KUBECONFIG` or `kube::Config::from_custom_kubeconfig`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        kubeconfig::write_kubeconfig(path.as_ref(), &self.url())
    }

    /// A kube client configuration for this server (namespace `default`).
    pub fn client_config(&self) -> Result<kube::Config> {
        let uri: hyper::Uri = self.url().parse().context("parsing the server URL")?;
        Ok(kube::Config::new(uri))
    }

    /// A kube client for this server. Call it inside the tokio runtime the
    /// client will be used from (it spawns a task there). kube's
    /// `rustls-tls` builds a TLS connector even for `http://`, so rustls
    /// needs a crypto provider (kube's `ring` or `aws-lc-rs` feature),
    /// or this panics.
    pub fn client(&self) -> Result<kube::Client> {
        Ok(kube::Client::try_from(self.client_config()?)?)
    }

    // ----- objects -----

    /// The current resourceVersion (of the last change; 0 before any).
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv()
    }

    fn changed<T>(&self, value: T) -> T {
        self.shared.notify();
        value
    }

    /// Creates or replaces a Service, EndpointSlice or Node (see
    /// [`ApiHandle::apply_json`]); returns the stored object.
    pub fn apply<K>(&self, obj: &K) -> Result<K>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let kind = kind_for::<K>()?;
        let stored = self
            .shared
            .store()
            .apply(kind, serde_json::to_value(obj)?)?;
        self.changed(Ok(serde_json::from_value(stored)?))
    }

    /// Creates or replaces an object given as JSON (its `apiVersion` and
    /// `kind` pick the resource). Namespaced objects without a namespace go
    /// to `default`; `uid` and `creationTimestamp` are generated on create
    /// and kept on update; the resourceVersion is always the server's. An
    /// update that changes nothing is a no-op (no new resourceVersion, no
    /// event), as in Kubernetes.
    pub fn apply_json(&self, obj: Value) -> Result<Value> {
        self.apply_json_timed(obj).map(|(stored, _)| stored)
    }

    /// [`ApiHandle::apply_json`], and the instant the change was committed
    /// and its watch events sent (`None` when it changed nothing): where
    /// a benchmark starts the clock of "a change reaches the datapath",
    /// after the server's own work on the request.
    pub fn apply_json_timed(&self, obj: Value) -> Result<(Value, Option<Instant>)> {
        let kind = kind_of(&obj)?;
        let (stored, at) = {
            let mut store = self.shared.store();
            store.take_last_commit();
            let stored = store.apply(kind, obj)?;
            (stored, store.take_last_commit())
        };
        Ok((self.changed(stored), at))
    }

    /// Applies every object of a (multi-document) YAML string, in order;
    /// returns the stored objects.
    pub fn apply_yaml(&self, yaml: &str) -> Result<Vec<Value>> {
        yaml_documents(yaml)?
            .into_iter()
            .map(|doc| self.apply_json(doc))
            .collect()
    }

    /// Deletes the objects a (multi-document) YAML string names; returns
    /// how many existed.
    pub fn delete_yaml(&self, yaml: &str) -> Result<usize> {
        let mut n = 0;
        for doc in yaml_documents(yaml)? {
            let kind = kind_of(&doc)?;
            let s = |p: &str| doc.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let ns = match s("/metadata/namespace") {
                "" => "default",
                ns => ns,
            };
            n += usize::from(self.delete_kind(kind, ns, s("/metadata/name")).is_some());
        }
        Ok(n)
    }

    /// Deletes an object; `namespace` is ignored for Nodes. Returns it
    /// (with the deletion's resourceVersion), or `None` if it did not
    /// exist.
    pub fn delete<K>(&self, namespace: &str, name: &str) -> Result<Option<K>>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        self.delete_kind(kind_for::<K>()?, namespace, name)
            .map(serde_json::from_value)
            .transpose()
            .map_err(Into::into)
    }

    /// [`ApiHandle::delete`] by [`ResourceKind`], as JSON.
    pub fn delete_kind(&self, kind: ResourceKind, namespace: &str, name: &str) -> Option<Value> {
        let gone = self.shared.store().delete(kind, namespace, name);
        self.changed(gone)
    }

    pub fn delete_service(&self, namespace: &str, name: &str) -> Option<Value> {
        self.delete_kind(ResourceKind::Service, namespace, name)
    }

    pub fn delete_endpoint_slice(&self, namespace: &str, name: &str) -> Option<Value> {
        self.delete_kind(ResourceKind::EndpointSlice, namespace, name)
    }

    pub fn delete_node(&self, name: &str) -> Option<Value> {
        self.delete_kind(ResourceKind::Node, "", name)
    }

    /// The stored object, if any (`namespace` is ignored for Nodes).
    pub fn get<K>(&self, namespace: &str, name: &str) -> Result<Option<K>>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        self.get_kind(kind_for::<K>()?, namespace, name)
            .map(serde_json::from_value)
            .transpose()
            .map_err(Into::into)
    }

    /// [`ApiHandle::get`] by [`ResourceKind`], as JSON.
    pub fn get_kind(&self, kind: ResourceKind, namespace: &str, name: &str) -> Option<Value> {
        let namespace = if kind.namespaced() { namespace } else { "" };
        self.shared.store().get(kind, namespace, name).cloned()
    }

    /// Every stored object of `kind`, ordered by namespace and name.
    pub fn list_kind(&self, kind: ResourceKind) -> Vec<Value> {
        self.shared
            .store()
            .current(kind)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Drops the history up to now: watches and exact lists from an older
    /// resourceVersion get 410 Expired. Returns the compaction point (the
    /// current resourceVersion).
    pub fn compact(&self) -> u64 {
        let mut store = self.shared.store();
        store.compact();
        store.compacted()
    }

    /// The oldest resourceVersion watches may still start from.
    pub fn compacted(&self) -> u64 {
        self.shared.store().compacted()
    }

    // ----- watches -----

    /// How many watches are open (of `kind`, or of all kinds).
    pub fn open_watches(&self, kind: Option<ResourceKind>) -> usize {
        self.shared.store().watchers.count(kind)
    }

    /// Ends every open watch cleanly (terminating chunk, connection kept
    /// alive), like an apiserver restart behind a load balancer or a
    /// watch timeout: clients should resume from their last
    /// resourceVersion. Returns how many were open.
    pub fn close_watches(&self) -> usize {
        let n = self.shared.store().watchers.close(None, false);
        self.changed(n)
    }

    /// Makes clients of `kinds` relist, as after an outage longer than the
    /// history: compacts it, makes the next watch of each kind answer 410
    /// Gone, and ends the open watches so that clients resume into it.
    pub fn expire_watches(&self, kinds: &[ResourceKind]) {
        self.compact();
        for kind in kinds {
            self.inject_fault(Verb::Watch, Some(*kind), 1, Fault::ExpiredWatch);
        }
        self.close_watches();
    }

    /// [`ApiHandle::close_watches`] for one kind.
    pub fn close_watches_of(&self, kind: ResourceKind) -> usize {
        let n = self.shared.store().watchers.close(Some(kind), false);
        self.changed(n)
    }

    /// Breaks every open watch off mid-stream (no terminating chunk, the
    /// connection is closed), like a dropped TCP connection. Returns how
    /// many were open.
    pub fn abort_watches(&self) -> usize {
        let n = self.shared.store().watchers.close(None, true);
        self.changed(n)
    }

    /// Sends `{"type": event_type, "object": object}` as is to every open
    /// watch of `kind`, in order with real events, bypassing selectors and
    /// the server's own bookkeeping: the object's resourceVersion can be
    /// stale, duplicated or out of order. An `ERROR` event ends the watches
    /// after it, as errors do on a real apiserver. Returns how many watches
    /// got it.
    pub fn inject_event(&self, kind: ResourceKind, event_type: &str, object: Value) -> usize {
        let line = watch::raw_event_line(event_type, &object);
        let n = self
            .shared
            .store()
            .watchers
            .send_raw(kind, &line, event_type == "ERROR");
        self.changed(n)
    }

    /// Sends one raw line (a newline is added if missing) to every open
    /// watch of `kind`; returns how many got it.
    pub fn inject_raw(&self, kind: ResourceKind, line: &str) -> usize {
        let mut line = line.to_owned();
        if !line.ends_with('\n') {
            line.push('\n');
        }
        self.shared.store().watchers.send_raw(kind, &line, false)
    }

    /// Changes the bookmark interval of watches opened from now on.
    pub fn set_bookmark_interval(&self, every: Option<Duration>) {
        *lock(&self.shared.bookmark_interval) = every;
    }

    // ----- faults -----

    /// Fails the next `n` requests of `verb` (on `resource`, or on any)
    /// with `fault`. Rules are used oldest first.
    pub fn inject_fault(&self, verb: Verb, resource: Option<ResourceKind>, n: usize, fault: Fault) {
        self.shared.faults().add(verb, resource, n, fault);
    }

    /// Answers the next `n` requests of `verb` with HTTP `status` and a
    /// `Status` body.
    pub fn fail_next(&self, verb: Verb, n: usize, status: u16) {
        self.inject_fault(verb, None, n, Fault::Status(status));
    }

    /// Faults not yet used up.
    pub fn pending_faults(&self) -> usize {
        self.shared.faults().pending()
    }

    pub fn clear_faults(&self) {
        self.shared.faults().clear();
    }

    /// Makes every list request wait `delay` before it is answered (until
    /// set back to zero; `clear_faults` leaves it).
    pub fn set_list_delay(&self, delay: Duration) {
        self.shared.faults().list_delay = delay;
    }

    /// Switches the outage mode. Entering an outage also breaks every open
    /// watch off, as a dying apiserver would.
    pub fn set_outage(&self, outage: Outage) {
        let off = outage == Outage::Off;
        self.shared.faults().outage = outage;
        if !off {
            self.shared.store().watchers.close(None, true);
        }
        self.shared.notify();
    }

    pub fn outage(&self) -> Outage {
        self.shared.faults().outage.clone()
    }

    /// Connections closed right after accept by [`Outage::CloseConnections`].
    pub fn refused_connections(&self) -> u64 {
        self.shared.faults().refused_connections
    }

    // ----- request log -----

    /// Every request received, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.faults().log.clone()
    }

    pub fn clear_requests(&self) {
        self.shared.faults().log.clear();
    }

    /// How many requests of `verb` were received (faulted ones included).
    pub fn request_count(&self, verb: Verb) -> usize {
        self.shared
            .faults()
            .log
            .iter()
            .filter(|r| r.verb == verb)
            .count()
    }

    /// How many requests of `verb` on `kind` were received.
    pub fn request_count_for(&self, kind: ResourceKind, verb: Verb) -> usize {
        self.shared
            .faults()
            .log
            .iter()
            .filter(|r| r.verb == verb && r.resource == Some(kind))
            .count()
    }

    /// The last request of `verb` (on `kind`, or on any).
    pub fn last_request(&self, verb: Verb, kind: Option<ResourceKind>) -> Option<RequestRecord> {
        self.shared
            .faults()
            .log
            .iter()
            .rev()
            .find(|r| r.verb == verb && kind.is_none_or(|k| r.resource == Some(k)))
            .cloned()
    }

    /// The raw query string of the last request of `verb`.
    pub fn last_query(&self, verb: Verb) -> Option<String> {
        self.last_request(verb, None).map(|r| r.query)
    }

    /// The `resourceVersion` parameter of every watch request on `kind`,
    /// oldest first (`None` when unset).
    pub fn watch_resource_versions(&self, kind: ResourceKind) -> Vec<Option<String>> {
        self.shared
            .faults()
            .log
            .iter()
            .filter(|r| r.verb == Verb::Watch && r.resource == Some(kind))
            .map(|r| r.resource_version().map(str::to_owned))
            .collect()
    }

    // ----- waiting -----

    /// Waits until `condition` holds, re-checking it whenever the server
    /// observes something (a request, a watch opening or ending, a
    /// change). Works from any tokio runtime.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        mut condition: impl FnMut(&ApiHandle) -> bool,
    ) -> Result<()> {
        let mut changes = self.shared.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if condition(self) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => bail!("the test apiserver is gone while waiting for {what}"),
                Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// [`ApiHandle::wait_for`] for synchronous code (do not call it on a
    /// thread that must drive the client being waited for).
    pub fn wait_for_blocking(
        &self,
        timeout: Duration,
        what: &str,
        mut condition: impl FnMut(&ApiHandle) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !condition(self) {
            if Instant::now() >= deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpStream,
    };

    use k8s_openapi::api::core::v1::{Node, Service};

    use super::*;

    const YAML: &str = "apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
---
apiVersion: v1
kind: Node
metadata:
  name: n1
  namespace: ignored
";

    /// Sends a raw HTTP/1.1 GET and reads until `done` accepts what came.
    fn raw_get(server: &ApiServer, target: &str, done: impl Fn(&str) -> bool) -> String {
        let mut conn = TcpStream::connect(server.addr()).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(conn, "GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !done(&String::from_utf8_lossy(&got)) {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    #[test]
    fn objects_from_yaml_and_the_wire_format() {
        let server = ApiServer::builder()
            .bookmark_interval(None)
            .start()
            .unwrap();
        let stored = server.apply_yaml(YAML).unwrap();
        assert_eq!(stored.len(), 2);
        let web: Service = server.get("default", "web").unwrap().unwrap();
        assert_eq!(web.metadata.resource_version.as_deref(), Some("1"));
        let n1: Node = server.get("", "n1").unwrap().unwrap();
        assert_eq!(n1.metadata.namespace, None);

        let missing = raw_get(&server, "/api/v1/pods", |s| s.ends_with('}'));
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        assert!(missing.contains(r#""kind":"Status""#), "{missing}");
        assert!(missing.contains(r#""reason":"NotFound""#), "{missing}");

        // A watch is a chunked stream of JSON lines that ends cleanly.
        let watcher = std::thread::spawn({
            let server = server.handle();
            move || {
                server
                    .wait_for_blocking(Duration::from_secs(5), "a watch", |s| {
                        s.open_watches(None) == 1
                    })
                    .unwrap();
                server.delete::<Service>("default", "web").unwrap();
                server.close_watches();
            }
        });
        let stream = raw_get(&server, "/api/v1/services?watch=1", |s| {
            s.ends_with("0\r\n\r\n")
        });
        watcher.join().unwrap();
        assert!(stream.starts_with("HTTP/1.1 200"), "{stream}");
        assert!(
            stream
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{stream}"
        );
        assert!(
            stream.contains(r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service""#),
            "{stream}"
        );
        let added = stream.find(r#""type":"ADDED""#).unwrap();
        let deleted = stream.find(r#""type":"DELETED""#).unwrap();
        assert!(added < deleted, "{stream}");
        assert!(stream.contains(r#""resourceVersion":"3""#), "{stream}");

        assert_eq!(server.delete_yaml(YAML).unwrap(), 1);
        assert_eq!(server.resource_version(), 4);
        assert_eq!(server.request_count(Verb::Watch), 1);
        assert_eq!(server.last_request(Verb::Other, None).unwrap().status, 404);
    }
}
