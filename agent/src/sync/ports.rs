//! The service ports each service contributed, found by the service's key
//! without holding the key: every port name already names its service.
//!
//! A `HashMap<ObjectKey, PortNames>` kept a key beside each list of names
//! (then 32 bytes, two `Arc`s the first name holds too: 4.2 MB of its 6.4
//! MB at 100,000 services). One hash table of the lists, hashed and compared by
//! the namespace and name of their first entry, holds the same.

use std::hash::RandomState;

use hashbrown::HashTable;

use super::desired::PortNames;
use crate::translate::ObjectKey;

/// Service -> the service ports it contributed (never an empty list).
#[derive(Default)]
pub(super) struct PortsByService {
    table: HashTable<PortNames>,
    hasher: RandomState,
}

/// The service every name of `names` belongs to.
fn service(names: &PortNames) -> (&str, &str) {
    let first = &names.as_slice()[0];
    (&first.namespace, &first.name)
}

fn hash(hasher: &RandomState, (namespace, name): (&str, &str)) -> u64 {
    std::hash::BuildHasher::hash_one(hasher, (namespace, name))
}

fn of(key: &ObjectKey) -> (&str, &str) {
    (&key.namespace, &key.name)
}

impl PortsByService {
    pub(super) fn get(&self, key: &ObjectKey) -> Option<&PortNames> {
        self.table.find(hash(&self.hasher, of(key)), |names| {
            service(names) == of(key)
        })
    }

    pub(super) fn remove(&mut self, key: &ObjectKey) -> Option<PortNames> {
        let entry = self.table.find_entry(hash(&self.hasher, of(key)), |names| {
            service(names) == of(key)
        });
        entry.ok().map(|e| e.remove().0)
    }

    /// Sets the names of their service (the one their entries name).
    pub(super) fn insert(&mut self, names: PortNames) {
        let hasher = &self.hasher;
        let at = hash(hasher, service(&names));
        match self
            .table
            .find_entry(at, |held| service(held) == service(&names))
        {
            Ok(mut held) => *held.get_mut() = names,
            Err(_) => {
                self.table
                    .insert_unique(at, names, |held| hash(hasher, service(held)));
            }
        }
    }

    /// Each service that contributed, with its names.
    pub(super) fn iter(&self) -> impl Iterator<Item = (ObjectKey, &PortNames)> {
        self.table.iter().map(|names| {
            let first = &names.as_slice()[0];
            let key = ObjectKey {
                namespace: first.namespace.clone(),
                name: first.name.clone(),
            };
            (key, names)
        })
    }

    /// The services that contributed.
    pub(super) fn keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        self.iter().map(|(key, _)| key)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &PortNames> {
        self.table.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        few::Few,
        model::{Proto, ServicePortName},
    };

    fn port(ns: &str, svc: &str, port: &str) -> ServicePortName {
        ServicePortName::new(ns, svc, port, Proto::Tcp)
    }

    #[test]
    fn a_service_finds_its_ports_by_its_key() {
        let mut ports = PortsByService::default();
        let web = ObjectKey::new("default", "web");
        let other = ObjectKey::new("other", "web");
        ports.insert(Few::One(port("default", "web", "http")));
        ports.insert(Few::One(port("other", "web", "http")));
        assert_eq!(
            ports.get(&web).map(Few::as_slice),
            Some(&[port("default", "web", "http")][..])
        );
        // Replaced whole, not added to.
        let both = vec![
            port("default", "web", "http"),
            port("default", "web", "https"),
        ];
        ports.insert(Few::Many(both.clone().into_boxed_slice()));
        assert_eq!(ports.get(&web).map(|n| n.as_slice().to_vec()), Some(both));
        let mut keys: Vec<ObjectKey> = ports.keys().collect();
        keys.sort();
        assert_eq!(keys, vec![web.clone(), other.clone()]);
        assert!(ports.remove(&web).is_some());
        assert!(ports.get(&web).is_none());
        assert!(ports.remove(&web).is_none());
        assert!(
            ports.get(&other).is_some(),
            "another namespace's is its own"
        );
        assert_eq!(ports.values().count(), 1);
    }
}
