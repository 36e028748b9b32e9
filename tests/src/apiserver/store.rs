//! Objects, the global resourceVersion counter, and the history of changes
//! (the server's "etcd" and watch cache in one).
//!
//! Every create, update and delete increments one counter shared by all
//! kinds and appends a [`Change`] to the history. The history keeps every
//! change after the compaction point; watches may start from any
//! resourceVersion at or after it, lists may read any snapshot in that
//! window (`resourceVersionMatch=Exact`, continue tokens).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use serde_json::{Map, Value};

use super::{kinds::ResourceKind, watch::Registry};

/// Identifies an object: kind, namespace (empty for cluster-scoped), name.
pub(crate) type Key = (ResourceKind, String, String);

/// One committed change. `prev` is `None` for a create, `cur` is `None`
/// for a delete.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub kind: ResourceKind,
    pub prev: Option<Value>,
    pub cur: Option<Value>,
}

impl Change {
    /// The object a DELETED event carries: the last state, with the
    /// deletion's resourceVersion.
    pub fn deleted_object(&self) -> Option<Value> {
        let mut obj = self.prev.clone()?;
        set_rv(&mut obj, self.rv);
        Some(obj)
    }
}

/// Why a snapshot cannot be served.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SnapshotError {
    /// Older than the compaction point (HTTP 410 Expired).
    Expired { compacted: u64 },
    /// Newer than the current resourceVersion (HTTP 504 in Kubernetes).
    TooLarge { current: u64 },
}

/// A stored object and its JSON as an item of a list (without `kind` and
/// `apiVersion`, as a real server's list items), serialized once when
/// stored: a list of 100,000 objects copies bytes instead of cloning and
/// serializing 100,000 JSON trees (a real server lists from its watch
/// cache; this one must not be the bottleneck of the agent's start).
struct Stored {
    value: Value,
    item: Bytes,
}

/// The JSON of `obj` as a list item.
pub(crate) fn list_item(obj: &Value) -> Bytes {
    let mut item = obj.clone();
    if let Some(map) = item.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    Bytes::from(serde_json::to_vec(&item).unwrap_or_default())
}

pub(crate) struct Store {
    rv: u64,
    compacted: u64,
    objects: BTreeMap<Key, Stored>,
    history: VecDeque<Arc<Change>>,
    /// When the last change was committed (its watch events sent), until
    /// taken (`take_last_commit`).
    last_commit: Option<std::time::Instant>,
    next_uid: u64,
    pub watchers: Registry,
}

pub(crate) fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// The key of a stored object of `kind`.
pub(crate) fn key_of(kind: ResourceKind, obj: &Value) -> Key {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (kind, s("/metadata/namespace"), s("/metadata/name"))
}

impl Store {
    pub fn new() -> Self {
        Self {
            rv: 0,
            compacted: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            last_commit: None,
            next_uid: 1,
            watchers: Registry::default(),
        }
    }

    /// The current resourceVersion (that of the last change).
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Watches and exact lists need a resourceVersion at or after this.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Drops all history: afterwards only the current resourceVersion is
    /// a valid starting point.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    pub fn get(&self, kind: ResourceKind, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(kind, namespace.to_owned(), name.to_owned()))
            .map(|s| &s.value)
    }

    /// Current objects of `kind`, in key order.
    pub fn current(&self, kind: ResourceKind) -> impl Iterator<Item = (&Key, &Value)> {
        self.objects
            .iter()
            .filter(move |(k, _)| k.0 == kind)
            .map(|(k, s)| (k, &s.value))
    }

    /// The whole list of `kind` as it was at `at` (tests; the server
    /// serves pages, see [`Store::page`]).
    #[cfg(test)]
    pub fn snapshot(
        &self,
        kind: ResourceKind,
        at: u64,
    ) -> Result<BTreeMap<Key, Value>, SnapshotError> {
        let (items, _) = self.page(kind, at, None, None, true, |_| true)?;
        Ok(items
            .into_iter()
            .map(|(k, item)| (k, serde_json::from_slice(&item).unwrap_or_default()))
            .collect())
    }

    /// One page of the list of `kind` as it was at `at`: the objects after
    /// key `after` (in key order) that `keep` accepts, at most `limit` of
    /// them, and how many more such objects follow (with `count_rest`
    /// false, only whether any does: 0 or 1), each as its list item JSON
    /// (see [`Stored`]). Only the page is copied and
    /// the walk starts after `after`, so paginating through N objects costs
    /// O(N) clones and filter checks, not O(N^2 / limit); counting the rest
    /// walks it once more per page, as a real server's
    /// `remainingItemCount` does not (callers ask for it only without
    /// selectors, where it is a cheap walk).
    pub fn page(
        &self,
        kind: ResourceKind,
        at: u64,
        after: Option<&Key>,
        limit: Option<usize>,
        count_rest: bool,
        mut keep: impl FnMut(&Value) -> bool,
    ) -> Result<(Vec<(Key, Bytes)>, usize), SnapshotError> {
        if at < self.compacted {
            return Err(SnapshotError::Expired {
                compacted: self.compacted,
            });
        }
        if at > self.rv {
            return Err(SnapshotError::TooLarge { current: self.rv });
        }
        // The value at `at` of every key changed since (None: absent then);
        // newest first, so the oldest change's `prev` wins.
        let mut overlay: BTreeMap<Key, Option<&Value>> = BTreeMap::new();
        for change in self.history.iter().rev().take_while(|c| c.rv > at) {
            if change.kind != kind {
                continue;
            }
            let Some(any) = change.prev.as_ref().or(change.cur.as_ref()) else {
                continue;
            };
            overlay.insert(key_of(kind, any), change.prev.as_ref());
        }
        let start = match after {
            Some(a) => std::ops::Bound::Excluded(a.clone()),
            None => std::ops::Bound::Included((kind, String::new(), String::new())),
        };
        let beyond = |k: &Key| after.is_none_or(|a| k > a);
        // The range starts after `after` already.
        let mut current = self
            .objects
            .range((start, std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.0 == kind)
            .filter(|(k, _)| overlay.is_empty() || !overlay.contains_key(*k))
            .map(|(k, s)| (k, Item::Stored(s)))
            .peekable();
        let mut past = overlay
            .iter()
            .filter(|(k, _)| beyond(k))
            .filter_map(|(k, v)| v.map(|v| (k, Item::Past(v))))
            .peekable();
        let mut items = Vec::new();
        let mut remaining = 0;
        loop {
            let next = match (current.peek(), past.peek()) {
                (None, None) => break,
                (Some(_), None) => current.next(),
                (None, Some(_)) => past.next(),
                (Some(c), Some(p)) => {
                    if c.0 < p.0 {
                        current.next()
                    } else {
                        past.next()
                    }
                }
            };
            let Some((key, item)) = next else { break };
            if !keep(item.value()) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
                if !count_rest {
                    break;
                }
            } else {
                items.push((key.clone(), item.bytes()));
            }
        }
        Ok((items, remaining))
    }

    /// Changes after resourceVersion `after`, oldest first.
    pub fn changes_after(&self, after: u64) -> Result<Vec<Arc<Change>>, SnapshotError> {
        if after < self.compacted {
            return Err(SnapshotError::Expired {
                compacted: self.compacted,
            });
        }
        Ok(self
            .history
            .iter()
            .filter(|c| c.rv > after)
            .cloned()
            .collect())
    }

    fn commit(&mut self, kind: ResourceKind, prev: Option<Value>, cur: Option<Value>) {
        let change = Arc::new(Change {
            rv: self.rv,
            kind,
            prev,
            cur,
        });
        self.history.push_back(change.clone());
        self.last_commit = Some(std::time::Instant::now());
        self.watchers.broadcast(&change);
    }

    /// When the last change was committed, if one was since the last call.
    pub fn take_last_commit(&mut self) -> Option<std::time::Instant> {
        self.last_commit.take()
    }

    /// Creates or replaces an object (like `kubectl apply` of the whole
    /// object): fills in kind/apiVersion, namespace (`default` when
    /// missing, none for cluster-scoped kinds), uid and creationTimestamp
    /// (kept from the stored object on update, else generated) and the new
    /// resourceVersion. An update that changes nothing is a no-op, as in
    /// Kubernetes. Returns the stored object.
    pub fn apply(&mut self, kind: ResourceKind, mut obj: Value) -> Result<Value> {
        let Some(map) = obj.as_object_mut() else {
            bail!("a {kind} must be a JSON object");
        };
        for (field, want) in [("apiVersion", kind.api_version()), ("kind", kind.kind())] {
            match map.get(field).and_then(Value::as_str) {
                None => {
                    map.insert(field.into(), want.into());
                }
                Some(got) if got == want => {}
                Some(got) => bail!("{field} {got:?} is not {want:?}"),
            }
        }
        let meta = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
            .ok_or_else(|| anyhow!("metadata must be an object"))?;
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| anyhow!("a {kind} needs metadata.name"))?
            .to_owned();
        if kind.namespaced() {
            if meta
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                meta.insert("namespace".into(), "default".into());
            }
        } else {
            meta.remove("namespace");
        }
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let key = (kind, namespace, name);
        let existing = self.objects.get(&key).map(|s| s.value.clone());
        let keep = |field: &str| {
            existing
                .as_ref()
                .and_then(|e| e.pointer(&format!("/metadata/{field}")))
                .cloned()
        };
        let uid = match keep("uid").or_else(|| meta.get("uid").cloned()) {
            Some(uid) => uid,
            None => {
                let n = self.next_uid;
                self.next_uid += 1;
                Value::String(format!("00000000-0000-4000-8000-{n:012x}"))
            }
        };
        meta.insert("uid".into(), uid);
        let created = keep("creationTimestamp")
            .or_else(|| meta.get("creationTimestamp").cloned())
            .filter(|v| !v.is_null())
            .unwrap_or_else(|| Value::String(now_rfc3339()));
        meta.insert("creationTimestamp".into(), created);
        meta.remove("resourceVersion");
        if let Some(prev) = &existing {
            let mut unchanged = prev.clone();
            if let Some(m) = unchanged.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            if unchanged == obj {
                return Ok(prev.clone());
            }
        }
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        let item = list_item(&obj);
        self.objects.insert(
            key,
            Stored {
                value: obj.clone(),
                item,
            },
        );
        self.commit(kind, existing, Some(obj.clone()));
        Ok(obj)
    }

    /// Deletes an object; returns it with the deletion's resourceVersion,
    /// or `None` when it does not exist (nothing changes then).
    pub fn delete(&mut self, kind: ResourceKind, namespace: &str, name: &str) -> Option<Value> {
        let namespace = if kind.namespaced() { namespace } else { "" };
        let prev = self
            .objects
            .remove(&(kind, namespace.to_owned(), name.to_owned()))?
            .value;
        self.rv += 1;
        let mut gone = prev.clone();
        set_rv(&mut gone, self.rv);
        self.commit(kind, Some(prev), None);
        Some(gone)
    }
}

/// An object of a page: stored now, or as it was (from the history).
enum Item<'a> {
    Stored(&'a Stored),
    Past(&'a Value),
}

impl Item<'_> {
    fn value(&self) -> &Value {
        match self {
            Item::Stored(s) => &s.value,
            Item::Past(v) => v,
        }
    }

    fn bytes(&self) -> Bytes {
        match self {
            Item::Stored(s) => s.item.clone(),
            Item::Past(v) => list_item(v),
        }
    }
}

/// Now as RFC 3339 UTC with second precision, like Kubernetes timestamps.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant), valid for all dates after 1970.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn svc(name: &str, app: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {}})
    }

    #[test]
    fn rv_uid_history_and_snapshots() {
        let mut s = Store::new();
        let k = ResourceKind::Service;
        let a1 = s.apply(k, svc("a", "1")).unwrap();
        assert_eq!(a1["metadata"]["resourceVersion"], "1");
        assert_eq!(a1["metadata"]["namespace"], "default");
        assert_eq!(a1["kind"], "Service");
        let a2 = s.apply(k, svc("a", "2")).unwrap();
        assert_eq!(a2["metadata"]["resourceVersion"], "2");
        assert_eq!(a2["metadata"]["uid"], a1["metadata"]["uid"]);
        // No-op update.
        assert_eq!(s.apply(k, svc("a", "2")).unwrap(), a2);
        assert_eq!(s.rv(), 2);
        s.apply(k, svc("b", "1")).unwrap();
        let gone = s.delete(k, "default", "a").unwrap();
        assert_eq!(gone["metadata"]["resourceVersion"], "4");
        assert!(s.delete(k, "default", "a").is_none());

        let at = |rv| {
            s.snapshot(k, rv)
                .unwrap()
                .values()
                .map(|v| {
                    v["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(at(0), Vec::<String>::new());
        assert_eq!(at(1), ["1"]);
        assert_eq!(at(3), ["2", "3"]);
        assert_eq!(at(4), ["3"]);
        assert_eq!(s.changes_after(2).unwrap().len(), 2);
        s.compact();
        assert_eq!(
            s.snapshot(k, 3),
            Err(SnapshotError::Expired { compacted: 4 })
        );
        assert!(s.changes_after(3).is_err());
        assert!(s.changes_after(4).unwrap().is_empty());
        assert_eq!(
            s.snapshot(k, 5),
            Err(SnapshotError::TooLarge { current: 4 })
        );
    }

    #[test]
    fn timestamp_format() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'), "{t}");
    }
}
