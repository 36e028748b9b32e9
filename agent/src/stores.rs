//! The sync task's stores of trimmed objects, the problems of objects it
//! could not use, and which services an update touched.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Bound,
};

use crate::{
    fast_hash::HashSet,
    few::Few,
    heap::compact,
    model::Name,
    sources::{Change, Converted, Kind, Update},
    translate::{ListMark, NodeInfo, ObjectKey, Problem, ServiceCidrInfo, ServiceInfo, SliceInfo},
};

/// What an update changed, for incremental translation.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    /// Everything must be retranslated (the node changed, or the first sync).
    pub all: bool,
    /// Services whose translation may have changed.
    pub services: BTreeSet<ObjectKey>,
    /// The problems of stored objects changed: the set of rejected
    /// objects, or a slice's own problems (metrics, logs).
    pub rejected: bool,
    /// The ServiceCIDR objects changed (the service address space).
    pub cidrs: bool,
    /// A service's cluster IPs (or whether it has ports) changed: the
    /// service address space.
    pub cluster_ips: bool,
}

impl Dirty {
    pub fn is_empty(&self) -> bool {
        !self.all && self.services.is_empty() && !self.rejected && !self.cidrs && !self.cluster_ips
    }

    pub fn merge(&mut self, other: Dirty) {
        self.all |= other.all;
        self.rejected |= other.rejected;
        self.cidrs |= other.cidrs;
        self.cluster_ips |= other.cluster_ips;
        if self.all {
            // Everything is retranslated: no list of services (a first
            // list would otherwise collect every key).
            self.services.clear();
        } else {
            self.services.extend(other.services);
        }
    }
}

#[derive(Debug, Default)]
pub struct Stores {
    pub services: BTreeMap<ObjectKey, ServiceInfo>,
    pub slices: BTreeMap<ObjectKey, SliceInfo>,
    /// Node objects by name; translation uses the one named like this node.
    pub nodes: BTreeMap<ObjectKey, NodeInfo>,
    /// ServiceCIDR objects by name.
    pub service_cidrs: BTreeMap<ObjectKey, ServiceCidrInfo>,
    /// The names of the slices whose names do not begin with their
    /// service's name and a dash, by the service's key (a slice is in its
    /// service's namespace), in name order. The others, nearly all, are
    /// found by that prefix in `slices` (see [`Stores::slices_of`]).
    irregular_slices: BTreeMap<ObjectKey, SliceNames>,
    /// Objects that could not be used at all, by kind and key.
    pub rejected: BTreeMap<(Kind, ObjectKey), Problem>,
    /// Kinds whose complete set has arrived at least once.
    pub synced: BTreeSet<Kind>,
    /// Per kind with a list in progress: its mark and the refused keys
    /// its pages held so far.
    listing: BTreeMap<Kind, Listing>,
}

/// A list in progress. At its start every stored object of the kind is
/// unmarked (`ListMark`, in the object's padding); each one its pages
/// hold is marked; at its end, the unmarked ones are gone. No set of
/// listed keys is held (a relist of 100,000 Services and 100,000 slices
/// side by side held 15 MB of keys, then 2.4 MB as hashes). Objects
/// refused by conversion are few and not stored: their keys are kept. A
/// first list (from an empty store) is compacted at its end; a relist
/// leaves the nodes of unchanged objects as they are and needs no second
/// copy of the store for a rebuild.
#[derive(Debug, Default)]
struct Listing {
    rejected: HashSet<ObjectKey>,
    from_empty: bool,
    /// A first list's store size when last compacted (see
    /// `COMPACT_GROWTH`).
    compacted_at: usize,
}

/// A first list fills its store in key order, which leaves every B-tree
/// node about half empty until the list's end compacts it: at 100,000
/// services the services' and slices' nodes held 34 MB at the agent's
/// peak (the list's end, programming under way), about 1.6 times their
/// entries. Compacting whenever the store grew by a quarter since the
/// last time holds that to at most 1.2 times, for about five moves of
/// each entry in all (tens of milliseconds at 100,000).
const COMPACT_GROWTH: (usize, usize) = (5, 4);
/// Below this, a first list's store is compacted at its end only.
const COMPACT_FROM: usize = 4096;

/// Objects the stores keep, with their list mark.
pub trait Listed {
    fn mark(&mut self) -> &mut ListMark;
    fn marked(&self) -> bool;
}

macro_rules! listed {
    ($($t:ty),*) => {
        $(impl Listed for $t {
            fn mark(&mut self) -> &mut ListMark {
                &mut self.listed
            }
            fn marked(&self) -> bool {
                self.listed.0
            }
        })*
    };
}
listed!(ServiceInfo, SliceInfo, NodeInfo, ServiceCidrInfo);

/// The names of one service's slices named otherwise than for it, in
/// order: a service that has any mostly has one, held in place (16 bytes
/// with a thin `Name`; a `Vec` took 24 and an allocation of its own).
pub type SliceNames = Few<Name>;

/// Whether a slice's name begins with its service's name and a dash, as
/// the EndpointSlice controller names them (`generateName`; a service
/// name too long for that is cut short, and other writers may name
/// theirs as they like). Such a slice is found by that prefix; an index
/// of every slice by service held 3.5 MB at 100,000 services
/// (docs/performance.md, issue 17).
fn named_for_its_service(key: &ObjectKey, slice: &SliceInfo) -> bool {
    key.name
        .as_bytes()
        .strip_prefix(slice.service.as_bytes())
        .is_some_and(|rest| rest.first() == Some(&b'-'))
}

/// The service a slice belongs to (its name shared, not copied).
fn owner(key: &ObjectKey, slice: &SliceInfo) -> ObjectKey {
    ObjectKey {
        namespace: key.namespace.clone(),
        name: slice.service.clone(),
    }
}

/// How one store reacts to its objects changing.
trait Store<T> {
    fn map(&mut self) -> &mut BTreeMap<ObjectKey, T>;
    /// Records that `key` went from `old` to what the map now holds.
    fn touched(&mut self, key: &ObjectKey, old: Option<&T>, dirty: &mut Dirty);

    /// Rebuilds the store's maps with full B-tree nodes (see
    /// [`compact`]).
    fn compact(&mut self) {
        compact(self.map());
    }

    /// Makes a new object share the strings the stores hold already.
    fn share(&self, _item: &mut Converted<T>) {}
}

/// A service's name is one string, shared by its key, its slices' and
/// its service ports' records: a slice decoded holds a copy of its own
/// (its service label), 2.5 MB at 100,000 services (docs/performance.md,
/// issue 17). Whichever of the two comes second takes the first one's.
struct Services<'a> {
    map: &'a mut BTreeMap<ObjectKey, ServiceInfo>,
    slices: &'a BTreeMap<ObjectKey, SliceInfo>,
    irregular: &'a BTreeMap<ObjectKey, SliceNames>,
}
struct Slices<'a> {
    map: &'a mut BTreeMap<ObjectKey, SliceInfo>,
    index: &'a mut BTreeMap<ObjectKey, SliceNames>,
    services: &'a BTreeMap<ObjectKey, ServiceInfo>,
}

/// The name a stored slice of `service` holds for it.
fn slice_held_name(
    slices: &BTreeMap<ObjectKey, SliceInfo>,
    irregular: &BTreeMap<ObjectKey, SliceNames>,
    service: &ObjectKey,
) -> Option<Name> {
    named_for(slices, service)
        .chain(named_otherwise(slices, irregular, service))
        .next()
        .map(|(_, slice)| slice.service.clone())
}

/// A service's slices named otherwise than for it (its entry in the
/// index), in name order.
fn named_otherwise<'s, 'i, 'k>(
    slices: &'s BTreeMap<ObjectKey, SliceInfo>,
    irregular: &'i BTreeMap<ObjectKey, SliceNames>,
    service: &'k ObjectKey,
) -> impl Iterator<Item = (&'s ObjectKey, &'s SliceInfo)> + use<'s, 'i, 'k> {
    let names = irregular.get(service).map_or(&[][..], Few::as_slice);
    names.iter().filter_map(move |name| {
        let key = ObjectKey {
            namespace: service.namespace.clone(),
            name: name.clone(),
        };
        slices.get_key_value(&key)
    })
}

/// A service's slices whose names begin with its name and a dash, in
/// name order: from just after the service's own name, the names that go
/// on with a byte up to the dash come first (in a valid name the dash is
/// the least byte that can follow), those of this service among them.
fn named_for<'s, 'k>(
    slices: &'s BTreeMap<ObjectKey, SliceInfo>,
    service: &'k ObjectKey,
) -> impl Iterator<Item = (&'s ObjectKey, &'s SliceInfo)> + use<'s, 'k> {
    let name = service.name.as_bytes();
    let next = move |key: &ObjectKey| {
        key.name
            .as_bytes()
            .strip_prefix(name)
            .and_then(|rest| rest.first().copied())
    };
    slices
        .range((Bound::Excluded(service), Bound::Unbounded))
        .take_while(move |(key, _)| {
            key.namespace == service.namespace && next(key).is_some_and(|c| c <= b'-')
        })
        .filter(move |(key, slice)| next(key) == Some(b'-') && slice.service == service.name)
}
struct Nodes<'a>(&'a mut BTreeMap<ObjectKey, NodeInfo>);
struct ServiceCidrs<'a>(&'a mut BTreeMap<ObjectKey, ServiceCidrInfo>);

impl Store<ServiceCidrInfo> for ServiceCidrs<'_> {
    fn map(&mut self) -> &mut BTreeMap<ObjectKey, ServiceCidrInfo> {
        self.0
    }
    fn touched(&mut self, _: &ObjectKey, _: Option<&ServiceCidrInfo>, dirty: &mut Dirty) {
        dirty.cidrs = true;
    }
}

impl Store<ServiceInfo> for Services<'_> {
    fn map(&mut self) -> &mut BTreeMap<ObjectKey, ServiceInfo> {
        self.map
    }
    fn touched(&mut self, key: &ObjectKey, old: Option<&ServiceInfo>, dirty: &mut Dirty) {
        let ips = |s: Option<&ServiceInfo>| s.map(|s| (s.has_ports, s.cluster_ips.clone()));
        dirty.cluster_ips |= ips(old) != ips(self.map.get(key));
        dirty.services.insert(key.clone());
    }
    fn share(&self, item: &mut Converted<ServiceInfo>) {
        if let Some(name) = slice_held_name(self.slices, self.irregular, &item.key) {
            item.key.name = name;
        }
    }
}

impl Store<SliceInfo> for Slices<'_> {
    fn map(&mut self) -> &mut BTreeMap<ObjectKey, SliceInfo> {
        self.map
    }
    fn compact(&mut self) {
        compact(self.map);
        compact(self.index);
    }

    fn share(&self, item: &mut Converted<SliceInfo>) {
        let Ok(Some(slice)) = &mut item.value else {
            return;
        };
        let service = owner(&item.key, slice);
        if let Some((key, _)) = self.services.get_key_value(&service) {
            slice.service = key.name.clone();
        } else if let Some(name) = slice_held_name(self.map, self.index, &service) {
            slice.service = name;
        }
    }

    fn touched(&mut self, key: &ObjectKey, old: Option<&SliceInfo>, dirty: &mut Dirty) {
        let new = self.map.get(key);
        let has_problems = |s: Option<&SliceInfo>| s.is_some_and(|s| !s.problems.is_empty());
        dirty.rejected |= has_problems(old) || has_problems(new);
        if let Some(old) = old {
            let svc = owner(key, old);
            if !named_for_its_service(key, old)
                && self
                    .index
                    .get_mut(&svc)
                    .is_some_and(|names| names.remove_sorted(&key.name))
            {
                self.index.remove(&svc);
            }
            dirty.services.insert(svc);
        }
        if let Some(new) = new {
            let svc = owner(key, new);
            if !named_for_its_service(key, new) {
                match self.index.get_mut(&svc) {
                    Some(names) => names.insert_sorted(&key.name),
                    None => {
                        self.index.insert(svc.clone(), Few::One(key.name.clone()));
                    }
                }
            }
            dirty.services.insert(svc);
        }
    }
}

impl Store<NodeInfo> for Nodes<'_> {
    fn map(&mut self) -> &mut BTreeMap<ObjectKey, NodeInfo> {
        self.0
    }
    fn touched(&mut self, _: &ObjectKey, _: Option<&NodeInfo>, dirty: &mut Dirty) {
        dirty.all = true;
    }
}

fn set<T: PartialEq>(
    store: &mut impl Store<T>,
    key: &ObjectKey,
    value: Option<T>,
    dirty: &mut Dirty,
) {
    if store.map().get(key) == value.as_ref() {
        return;
    }
    // Moved in, never cloned: the old value comes back out.
    let old = match value {
        Some(v) => store.map().insert(key.clone(), v),
        None => store.map().remove(key),
    };
    store.touched(key, old.as_ref(), dirty);
}

fn set_rejected(
    rejected: &mut BTreeMap<(Kind, ObjectKey), Problem>,
    kind: Kind,
    key: &ObjectKey,
    problem: Option<Problem>,
    dirty: &mut Dirty,
) {
    let k = (kind, key.clone());
    let changed = match problem {
        Some(p) => rejected.insert(k, p.clone()).as_ref() != Some(&p),
        None => rejected.remove(&k).is_some(),
    };
    dirty.rejected |= changed;
}

fn apply_one<T: PartialEq + Clone>(
    kind: Kind,
    store: &mut impl Store<T>,
    rejected: &mut BTreeMap<(Kind, ObjectKey), Problem>,
    mut item: Converted<T>,
    dirty: &mut Dirty,
) {
    store.share(&mut item);
    let Converted { key, value } = item;
    let (value, problem) = match value {
        Ok(v) => (v, None),
        Err(p) => (None, Some(p)),
    };
    set(store, &key, value, dirty);
    set_rejected(rejected, kind, &key, problem, dirty);
}

/// Removes every object of `kind` that `listed` says the list did not
/// hold (by key and stored value), and the rejections of objects whose
/// key `rejected_listed` says it did not hold.
fn remove_unlisted<T: PartialEq + Clone>(
    kind: Kind,
    store: &mut impl Store<T>,
    rejected: &mut BTreeMap<(Kind, ObjectKey), Problem>,
    listed: impl Fn(&ObjectKey, &T) -> bool,
    rejected_listed: impl Fn(&ObjectKey) -> bool,
    dirty: &mut Dirty,
) {
    let gone: Vec<ObjectKey> = store
        .map()
        .iter()
        .filter(|(k, v)| !listed(k, v))
        .map(|(k, _)| k.clone())
        .collect();
    for key in gone {
        set(store, &key, None, dirty);
    }
    let stale: Vec<ObjectKey> = rejected
        .keys()
        .filter(|(k, key)| *k == kind && !rejected_listed(key))
        .map(|(_, key)| key.clone())
        .collect();
    for key in stale {
        set_rejected(rejected, kind, &key, None, dirty);
    }
}

fn apply_change<T: PartialEq + Clone + Listed>(
    kind: Kind,
    store: &mut impl Store<T>,
    rejected: &mut BTreeMap<(Kind, ObjectKey), Problem>,
    listing: &mut BTreeMap<Kind, Listing>,
    change: Change<T>,
    dirty: &mut Dirty,
) {
    match change {
        Change::Apply(item) => apply_one(kind, store, rejected, item, dirty),
        Change::Delete(key) => {
            set(store, &key, None, dirty);
            set_rejected(rejected, kind, &key, None, dirty);
        }
        Change::Reset(items) => {
            // Everything not in the new set is gone.
            let from_empty = store.map().is_empty();
            let listed: HashSet<ObjectKey> = items.iter().map(|c| c.key.clone()).collect();
            remove_unlisted(
                kind,
                store,
                rejected,
                |k, _| listed.contains(k),
                |k| listed.contains(k),
                dirty,
            );
            for item in items {
                apply_one(kind, store, rejected, item, dirty);
            }
            if from_empty {
                store.compact();
            }
        }
        Change::ListStart => {
            let from_empty = store.map().is_empty();
            for v in store.map().values_mut() {
                v.mark().0 = false;
            }
            listing.insert(
                kind,
                Listing {
                    from_empty,
                    ..Listing::default()
                },
            );
        }
        Change::ListPage(items) => {
            let listed = listing.entry(kind).or_default();
            for item in items {
                let key = item.key.clone();
                let refused = item.value.is_err();
                apply_one(kind, store, rejected, item, dirty);
                if let Some(v) = store.map().get_mut(&key) {
                    v.mark().0 = true;
                } else if refused {
                    listed.rejected.insert(key);
                }
            }
            let len = store.map().len();
            let (num, den) = COMPACT_GROWTH;
            if listed.from_empty && len >= COMPACT_FROM && len * den >= listed.compacted_at * num {
                store.compact();
                listed.compacted_at = len;
            }
        }
        Change::ListEnd => {
            let listed = listing.remove(&kind).unwrap_or_default();
            remove_unlisted(
                kind,
                store,
                rejected,
                |_, v| v.marked(),
                |k| listed.rejected.contains(k),
                dirty,
            );
            // (Not again if the last page's compaction left it whole.)
            if listed.from_empty && listed.compacted_at != store.map().len() {
                store.compact();
            }
        }
    }
}

impl Stores {
    /// Applies one update and says what it changed; a replayed or
    /// duplicated event changes nothing.
    pub fn apply(&mut self, update: Update) -> Dirty {
        let kind = update.kind();
        let mut dirty = Dirty::default();
        if update.is_reset() && self.synced.insert(kind) {
            dirty.all = true;
        }
        match update {
            Update::Services(c) => apply_change(
                kind,
                &mut Services {
                    map: &mut self.services,
                    slices: &self.slices,
                    irregular: &self.irregular_slices,
                },
                &mut self.rejected,
                &mut self.listing,
                c,
                &mut dirty,
            ),
            Update::Slices(c) => apply_change(
                kind,
                &mut Slices {
                    map: &mut self.slices,
                    index: &mut self.irregular_slices,
                    services: &self.services,
                },
                &mut self.rejected,
                &mut self.listing,
                c,
                &mut dirty,
            ),
            Update::Node(c) => apply_change(
                kind,
                &mut Nodes(&mut self.nodes),
                &mut self.rejected,
                &mut self.listing,
                c,
                &mut dirty,
            ),
            Update::ServiceCidrs(c) => apply_change(
                kind,
                &mut ServiceCidrs(&mut self.service_cidrs),
                &mut self.rejected,
                &mut self.listing,
                c,
                &mut dirty,
            ),
        }
        dirty
    }

    /// Every kind has delivered its complete set once.
    pub fn all_synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.synced.contains(k))
    }

    /// The service CIDRs the ServiceCIDR objects declare, sorted.
    pub fn service_cidrs(&self) -> std::collections::BTreeSet<crate::translate::IpNet> {
        self.service_cidrs
            .values()
            .flat_map(|c| c.cidrs.iter().copied())
            .collect()
    }

    /// This node's Node object, if known.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.values().find(|n| n.name == name)
    }

    /// A service's slices, in slice-name order.
    pub fn slices_of(&self, service: &ObjectKey) -> Vec<(&ObjectKey, &SliceInfo)> {
        let mut slices: Vec<_> = named_for(&self.slices, service).collect();
        let prefixed = slices.len();
        slices.extend(named_otherwise(
            &self.slices,
            &self.irregular_slices,
            service,
        ));
        if slices.len() > prefixed {
            slices.sort_unstable_by(|a, b| a.0.name.cmp(&b.0.name));
        }
        slices
    }

    /// Whether a service has a slice.
    pub fn has_slices(&self, service: &ObjectKey) -> bool {
        named_for(&self.slices, service).next().is_some()
            || self.irregular_slices.contains_key(service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::Converted;

    fn slice(service: &str) -> SliceInfo {
        SliceInfo {
            service: service.into(),
            family: crate::translate::AddressFamily::V4,
            ports: Default::default(),
            endpoints: Default::default(),
            problems: Default::default(),
            listed: Default::default(),
        }
    }

    fn apply_slice(key: &str, s: SliceInfo) -> Update {
        Update::Slices(Change::Apply(Converted {
            key: ObjectKey::new("default", key),
            value: Ok(Some(s)),
        }))
    }

    #[test]
    fn one_slice_name_is_held_in_place() {
        assert_eq!(std::mem::size_of::<SliceNames>(), 16);
        let (a, b): (Name, Name) = ("a".into(), "b".into());
        let mut names = Few::One(b.clone());
        names.insert_sorted(&a);
        names.insert_sorted(&a);
        assert_eq!(names.as_slice(), &[a.clone(), b.clone()]);
        assert!(!names.remove_sorted(&a));
        assert_eq!(names, Few::One(b.clone()));
        assert!(!names.remove_sorted(&a), "absent: nothing removed");
        assert!(names.remove_sorted(&b), "the last name goes");
    }

    #[test]
    fn a_services_slices_are_found_by_their_names_prefix_and_the_rest_by_the_index() {
        let mut st = Stores::default();
        let slices = [
            ("web-abcde", "web"),
            ("web-api-12345", "web-api"),
            ("web-zzzzz", "web"),
            ("web-api-x", "web"),
            ("web", "web"),
            ("custom", "web"),
            ("web.x", "web"),
            ("webapp-1", "webapp"),
        ];
        for (name, svc) in slices {
            st.apply(apply_slice(name, slice(svc)));
        }
        // The same name in another namespace is another service's.
        st.apply(Update::Slices(Change::Apply(Converted {
            key: ObjectKey::new("other", "web-abcde"),
            value: Ok(Some(slice("web"))),
        })));
        let names = |st: &Stores, svc: &str| -> Vec<String> {
            st.slices_of(&ObjectKey::new("default", svc))
                .iter()
                .map(|(k, _)| k.name.to_string())
                .collect()
        };
        assert_eq!(
            names(&st, "web"),
            [
                "custom",
                "web",
                "web-abcde",
                "web-api-x",
                "web-zzzzz",
                "web.x"
            ]
        );
        assert_eq!(names(&st, "web-api"), ["web-api-12345"]);
        assert_eq!(names(&st, "webapp"), ["webapp-1"]);
        assert_eq!(names(&st, "api"), Vec::<String>::new());
        assert_eq!(st.slices_of(&ObjectKey::new("other", "web")).len(), 1);
        // Only the slices not named for their service are indexed.
        let indexed: Vec<_> = st
            .irregular_slices
            .iter()
            .map(|(svc, names)| (svc.name.to_string(), names.as_slice().len()))
            .collect();
        assert_eq!(indexed, [("web".to_string(), 3)]);
        for svc in ["web", "web-api", "webapp"] {
            assert!(st.has_slices(&ObjectKey::new("default", svc)));
        }
        assert!(!st.has_slices(&ObjectKey::new("default", "we")));
        for (name, _) in slices {
            st.apply(Update::Slices(Change::Delete(ObjectKey::new(
                "default", name,
            ))));
        }
        assert!(st.irregular_slices.is_empty(), "nothing left behind");
        assert!(!st.has_slices(&ObjectKey::new("default", "web")));
        assert!(st.has_slices(&ObjectKey::new("other", "web")));
    }

    #[test]
    fn a_services_name_is_one_string_whichever_comes_first() {
        let apply_service = |name: &str| {
            Update::Services(Change::Apply(Converted {
                key: ObjectKey::new("default", name),
                value: Ok(Some(ServiceInfo::default())),
            }))
        };
        let key_name = |st: &Stores, name: &str| {
            st.services
                .get_key_value(&ObjectKey::new("default", name))
                .map(|(k, _)| k.name.clone())
                .unwrap()
        };
        let held =
            |st: &Stores, slice: &str| st.slices[&ObjectKey::new("default", slice)].service.clone();
        let mut st = Stores::default();
        // The Service first: its slices take its key's name.
        st.apply(apply_service("web"));
        st.apply(apply_slice("web-1", slice("web")));
        st.apply(apply_slice("named-otherwise", slice("web")));
        let web = key_name(&st, "web");
        assert!(Name::ptr_eq(&held(&st, "web-1"), &web));
        assert!(Name::ptr_eq(&held(&st, "named-otherwise"), &web));
        // Slices first: the second takes the first one's, and so does
        // the Service's key.
        st.apply(apply_slice("api-1", slice("api")));
        st.apply(apply_slice("api-2", slice("api")));
        assert!(Name::ptr_eq(&held(&st, "api-1"), &held(&st, "api-2")));
        st.apply(apply_service("api"));
        assert!(Name::ptr_eq(&key_name(&st, "api"), &held(&st, "api-1")));
        st.apply(apply_slice("other-name", slice("db")));
        st.apply(apply_service("db"));
        assert!(Name::ptr_eq(&key_name(&st, "db"), &held(&st, "other-name")));
    }

    #[test]
    fn replayed_event_dirties_nothing() {
        let mut st = Stores::default();
        let d = st.apply(apply_slice("web-1", slice("web")));
        assert_eq!(
            d.services,
            BTreeSet::from([ObjectKey::new("default", "web")])
        );
        assert!(st.apply(apply_slice("web-1", slice("web"))).is_empty());
    }

    #[test]
    fn slice_moving_to_another_service_dirties_both() {
        let mut st = Stores::default();
        st.apply(apply_slice("s-1", slice("a")));
        let d = st.apply(apply_slice("s-1", slice("b")));
        assert_eq!(
            d.services,
            BTreeSet::from([
                ObjectKey::new("default", "a"),
                ObjectKey::new("default", "b")
            ])
        );
        assert!(st.slices_of(&ObjectKey::new("default", "a")).is_empty());
        assert_eq!(st.slices_of(&ObjectKey::new("default", "b")).len(), 1);
    }

    #[test]
    fn reset_removes_what_it_does_not_list() {
        let mut st = Stores::default();
        st.apply(apply_slice("s-1", slice("a")));
        st.apply(apply_slice("s-2", slice("b")));
        let d = st.apply(Update::Slices(Change::Reset(vec![Converted {
            key: ObjectKey::new("default", "s-2"),
            value: Ok(Some(slice("b"))),
        }])));
        assert!(d.all, "a first complete set retranslates everything");
        assert_eq!(st.slices.len(), 1);
        assert!(d.services.contains(&ObjectKey::new("default", "a")));
        let again = st.apply(Update::Slices(Change::Reset(vec![Converted {
            key: ObjectKey::new("default", "s-2"),
            value: Ok(Some(slice("b"))),
        }])));
        assert!(again.is_empty(), "an identical relist changes nothing");
    }

    fn list(keys: &[(&str, &str)]) -> Vec<Update> {
        let page = |items: &[(&str, &str)]| {
            Update::Slices(Change::ListPage(
                items
                    .iter()
                    .map(|(k, svc)| Converted {
                        key: ObjectKey::new("default", *k),
                        value: Ok(Some(slice(svc))),
                    })
                    .collect(),
            ))
        };
        let (a, b) = keys.split_at(keys.len() / 2);
        vec![
            Update::Slices(Change::ListStart),
            page(a),
            page(b),
            Update::Slices(Change::ListEnd),
        ]
    }

    #[test]
    fn a_paged_relist_changes_only_what_differs_and_drops_the_unlisted_at_its_end() {
        let mut st = Stores::default();
        let mut first = Dirty::default();
        for u in list(&[("s-1", "a"), ("s-2", "b"), ("s-3", "c")]) {
            assert!(!st.all_synced());
            first.merge(st.apply(u));
        }
        assert!(
            first.all,
            "the end of the first list retranslates everything"
        );
        assert!(st.synced.contains(&Kind::EndpointSlice));
        // The same objects again: nothing to do.
        for u in list(&[("s-1", "a"), ("s-2", "b"), ("s-3", "c")]) {
            assert!(st.apply(u).is_empty());
        }
        // s-2 was deleted meanwhile: it stays until the list ends.
        let mut updates = list(&[("s-1", "a"), ("s-3", "c")]);
        let end = updates.pop().unwrap();
        for u in updates {
            assert!(st.apply(u).is_empty());
        }
        assert_eq!(st.slices.len(), 3);
        let d = st.apply(end);
        assert_eq!(d.services, BTreeSet::from([ObjectKey::new("default", "b")]));
        assert_eq!(st.slices.len(), 2);
        assert!(st.listing.is_empty(), "nothing kept once the list ends");
        // Named otherwise than for their services, they are indexed: the
        // unlisted one's entry went with it.
        let indexed: Vec<String> = st
            .irregular_slices
            .keys()
            .map(|k| k.name.to_string())
            .collect();
        assert_eq!(indexed, ["a", "c"]);
    }

    #[test]
    fn a_slice_whose_label_changes_is_found_under_its_new_service_only() {
        let mut st = Stores::default();
        let of = |st: &Stores, svc: &str| st.slices_of(&ObjectKey::new("default", svc)).len();
        // Named for `web`, labelled for `api`: indexed under `api`.
        st.apply(apply_slice("web-1", slice("api")));
        assert_eq!((of(&st, "web"), of(&st, "api")), (0, 1));
        assert_eq!(st.irregular_slices.len(), 1);
        // Relabelled for `web`: found by its prefix, the index empty.
        st.apply(apply_slice("web-1", slice("web")));
        assert_eq!((of(&st, "web"), of(&st, "api")), (1, 0));
        assert!(st.irregular_slices.is_empty());
        // And back.
        st.apply(apply_slice("web-1", slice("api")));
        assert_eq!((of(&st, "web"), of(&st, "api")), (0, 1));
        assert!(!st.has_slices(&ObjectKey::new("default", "web")));
        // A name going on with a byte below the dash sorts before the
        // service's slices and does not hide them.
        st.apply(apply_slice("web+1", slice("web")));
        st.apply(apply_slice("web-2", slice("web")));
        let names: Vec<String> = st
            .slices_of(&ObjectKey::new("default", "web"))
            .iter()
            .map(|(k, _)| k.name.to_string())
            .collect();
        assert_eq!(names, ["web+1", "web-2"]);
        st.apply(Update::Slices(Change::Reset(Vec::new())));
        assert!(st.slices.is_empty() && st.irregular_slices.is_empty());
    }

    #[test]
    fn a_relist_drops_what_events_added_and_it_did_not_hold_and_stale_refusals() {
        let mut st = Stores::default();
        for u in list(&[("s-1", "a"), ("s-2", "b")]) {
            st.apply(u);
        }
        // After the first list: s-3 by an event; s-4 refused by its
        // conversion.
        st.apply(apply_slice("s-3", slice("c")));
        st.apply(Update::Slices(Change::Apply(Converted {
            key: ObjectKey::new("default", "s-4"),
            value: Err(Problem::new(
                "EndpointSlice default/s-4",
                crate::translate::ProblemReason::MissingField,
                "x",
            )),
        })));
        assert_eq!(st.rejected.len(), 1);
        // A relist holds s-1 and s-3 only: s-2 and the refusal go; the
        // listed ones stay unchanged, each relist alike.
        for round in 0..3 {
            let mut d = Dirty::default();
            for u in list(&[("s-1", "a"), ("s-3", "c")]) {
                d.merge(st.apply(u));
            }
            assert_eq!(
                st.slices.keys().map(|k| &*k.name).collect::<Vec<_>>(),
                ["s-1", "s-3"]
            );
            assert!(st.rejected.is_empty());
            if round > 0 {
                assert!(d.is_empty(), "an unchanged relist changes nothing");
            }
            st.apply(apply_slice("s-5", slice("e")));
            st.apply(Update::Slices(Change::Delete(ObjectKey::new(
                "default", "s-5",
            ))));
        }
        // An event's object between two lists goes at the next one if it
        // does not hold it.
        st.apply(apply_slice("s-6", slice("f")));
        let mut d = Dirty::default();
        for u in list(&[("s-1", "a"), ("s-3", "c")]) {
            d.merge(st.apply(u));
        }
        assert_eq!(d.services, BTreeSet::from([ObjectKey::new("default", "f")]));
        assert_eq!(st.slices.len(), 2);
    }
}
