//! Watch streams: the registry of open watches, and the task that writes
//! one watch's newline-delimited JSON events into its chunked response.
//!
//! Every committed change is sent to every open watch (whatever its kind)
//! while the store is locked, so each watch sees changes in resourceVersion
//! order and knows how far it has progressed, which is the resourceVersion
//! its bookmarks carry. Each watch applies its own filter, turning changes
//! into ADDED/MODIFIED/DELETED events the way the apiserver's watch cache
//! does: an object that stops matching is sent as DELETED (its previous
//! state, with the change's resourceVersion), one that starts matching as
//! ADDED.

use std::{collections::BTreeMap, io, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::{
    sync::mpsc::{self, UnboundedSender},
    time::{Instant, Interval},
};

use super::{
    http::{status_value, Body},
    kinds::ResourceKind,
    selector::Filter,
    store::{Change, SnapshotError},
    Shared,
};

/// What the server tells one open watch.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    /// A committed change (of any kind).
    Change(Arc<Change>),
    /// A synthetic ADDED event of the initial state.
    Initial(Value),
    /// The bookmark that ends the initial events of a streaming list.
    InitialEnd,
    /// An injected line, sent as is.
    Raw(String),
    /// End the response cleanly (terminating chunk).
    Close,
    /// Break the response off (no terminating chunk; the connection is
    /// closed).
    Abort,
}

#[derive(Debug)]
struct Entry {
    kind: ResourceKind,
    tx: UnboundedSender<WatchMsg>,
}

/// The open watches.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
}

impl Registry {
    pub fn insert(&mut self, kind: ResourceKind, tx: UnboundedSender<WatchMsg>) -> u64 {
        self.next_id += 1;
        self.entries.insert(self.next_id, Entry { kind, tx });
        self.next_id
    }

    pub fn remove(&mut self, id: u64) {
        self.entries.remove(&id);
    }

    pub fn broadcast(&mut self, change: &Arc<Change>) {
        self.entries
            .retain(|_, e| e.tx.send(WatchMsg::Change(change.clone())).is_ok());
    }

    /// Sends a line to the open watches of `kind`; returns how many. With
    /// `last`, the watches end after it (and are forgotten right away).
    pub fn send_raw(&mut self, kind: ResourceKind, line: &str, last: bool) -> usize {
        let mut n = 0;
        self.entries.retain(|_, e| {
            if e.kind != kind {
                return true;
            }
            let ok = e.tx.send(WatchMsg::Raw(line.to_owned())).is_ok();
            n += usize::from(ok);
            if ok && last {
                let _ = e.tx.send(WatchMsg::Close);
                return false;
            }
            ok
        });
        n
    }

    /// Ends the open watches (of `kind`, or all) and forgets them; returns
    /// how many.
    pub fn close(&mut self, kind: Option<ResourceKind>, abort: bool) -> usize {
        let ids: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| kind.is_none_or(|k| e.kind == k))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(e) = self.entries.remove(id) {
                let _ = e.tx.send(if abort {
                    WatchMsg::Abort
                } else {
                    WatchMsg::Close
                });
            }
        }
        ids.len()
    }

    pub fn count(&self, kind: Option<ResourceKind>) -> usize {
        self.entries
            .values()
            .filter(|e| kind.is_none_or(|k| e.kind == k))
            .count()
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// `resourceVersion` unset or "0": from the current state.
    Current,
    /// `resourceVersion=N`: every change after N.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    pub filter: Filter,
    pub start: Start,
    /// Send the current state as ADDED events first.
    pub send_initial: bool,
    /// After the initial events, send a bookmark annotated
    /// `k8s.io/initial-events-end` (streaming lists).
    pub initial_end_bookmark: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
}

/// One event as sent on the wire: `{"type":...,"object":...}` and a newline.
fn line(event_type: &str, object: &Value) -> Bytes {
    let mut v = br#"{"type":"#.to_vec();
    v.extend(serde_json::to_vec(event_type).unwrap_or_default());
    v.extend(br#","object":"#);
    v.extend(serde_json::to_vec(object).unwrap_or_default());
    v.extend(b"}\n");
    Bytes::from(v)
}

fn bookmark(kind: ResourceKind, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": kind.kind(), "apiVersion": kind.api_version(), "metadata": meta}),
    )
}

/// The line a raw injected event is sent as.
pub(crate) fn raw_event_line(event_type: &str, object: &Value) -> String {
    String::from_utf8_lossy(&line(event_type, object)).into_owned()
}

/// A watch response that is a single ERROR event with a 410 Expired
/// status, as a real apiserver sends for a compacted resourceVersion.
pub(crate) fn expired_body(requested: u64, compacted: u64) -> Body {
    let status = status_value(
        410,
        "Expired",
        &format!("too old resource version: {requested} ({compacted})"),
    );
    Full::new(line("ERROR", &status))
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The event a change becomes for a watch with this filter, if any.
fn event_for(filter: &Filter, c: &Change) -> Option<Bytes> {
    if c.kind != filter.kind {
        return None;
    }
    let was = c.prev.as_ref().is_some_and(|o| filter.matches(o));
    let is = c.cur.as_ref().is_some_and(|o| filter.matches(o));
    match (was, is, &c.cur) {
        (false, true, Some(cur)) => Some(line("ADDED", cur)),
        (true, true, Some(cur)) => Some(line("MODIFIED", cur)),
        (true, false, _) => Some(line("DELETED", &c.deleted_object()?)),
        _ => None,
    }
}

async fn tick(ticker: &mut Option<Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Deregisters a watch when its task ends.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.store().watchers.remove(self.id);
        self.shared.notify();
    }
}

/// Opens a watch: registers it (replaying history or sending the initial
/// state under the same lock, so nothing is missed or doubled) and spawns
/// the task that streams its events. Must run inside the server's runtime.
pub(crate) fn open(shared: &Arc<Shared>, req: WatchRequest) -> Body {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let kind = req.filter.kind;
    let mut progress;
    let id = {
        let mut store = shared.store();
        progress = store.rv();
        if req.send_initial {
            for (_, obj) in store.current(kind) {
                if req.filter.matches(obj) {
                    let _ = tx.send(WatchMsg::Initial(obj.clone()));
                }
            }
            if req.initial_end_bookmark {
                let _ = tx.send(WatchMsg::InitialEnd);
            }
        } else if let Start::After(after) = req.start {
            match store.changes_after(after) {
                Ok(changes) => {
                    progress = after;
                    for c in changes {
                        let _ = tx.send(WatchMsg::Change(c));
                    }
                }
                Err(SnapshotError::Expired { compacted }) => {
                    return expired_body(after, compacted);
                }
                Err(SnapshotError::TooLarge { .. }) => progress = after,
            }
        }
        store.watchers.insert(kind, tx)
    };
    shared.notify();
    let registration = Registration {
        shared: shared.clone(),
        id,
    };
    let interval = if req.bookmarks {
        shared.bookmark_interval()
    } else {
        None
    };

    let (out, mut out_rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(64);
    tokio::spawn(async move {
        let _registration = registration;
        let filter = req.filter;
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        let mut ticker = interval.map(|d| tokio::time::interval_at(Instant::now() + d, d));
        loop {
            let data = tokio::select! {
                biased;
                () = out.closed() => break,
                msg = rx.recv() => match msg {
                    None | Some(WatchMsg::Close) => break,
                    Some(WatchMsg::Abort) => {
                        let _ = out.send(Err(io::Error::other("watch aborted by the test"))).await;
                        break;
                    }
                    Some(WatchMsg::Change(c)) => {
                        if c.rv <= progress {
                            continue;
                        }
                        progress = c.rv;
                        match event_for(&filter, &c) {
                            Some(data) => data,
                            None => continue,
                        }
                    }
                    Some(WatchMsg::Initial(obj)) => line("ADDED", &obj),
                    Some(WatchMsg::InitialEnd) => bookmark(kind, progress, true),
                    Some(WatchMsg::Raw(l)) => Bytes::from(l),
                },
                () = &mut deadline => break,
                () = tick(&mut ticker) => bookmark(kind, progress, false),
            };
            if out.send(Ok(Frame::data(data))).await.is_err() {
                break;
            }
        }
    });
    StreamBody::new(futures::stream::poll_fn(move |cx| out_rx.poll_recv(cx))).boxed_unsync()
}
