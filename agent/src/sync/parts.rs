//! A full reconcile's services, translated a part at a time: on a thread
//! of their own, one part ahead of the reconcile that writes them.
//!
//! Translation is pure (the stores, the node, the configuration), and a
//! full reconcile at 100,000 services spends about a second in it while
//! the map writes keep the sync task's CPU busy; a machine has a second
//! one. Only the sync task writes the maps: the thread hands it
//! translations, in the stores' key order.

use std::{
    ops::Bound::{Excluded, Unbounded},
    sync::mpsc,
};

use tracing::warn;

use crate::{
    stores::Stores,
    translate::{translate_service, NodeContext, ObjectKey, ServiceTranslation, TranslateConfig},
};

/// Services of one part, with their translations.
pub(super) type Part = Vec<(ObjectKey, ServiceTranslation)>;

/// The stores' services in parts of `size`, in key order, translated. An
/// empty store gives one empty part.
struct Parts<'a> {
    stores: &'a Stores,
    node: &'a NodeContext,
    config: &'a TranslateConfig,
    size: usize,
    after: Option<ObjectKey>,
    done: bool,
}

impl Iterator for Parts<'_> {
    type Item = Part;

    fn next(&mut self) -> Option<Part> {
        if self.done {
            return None;
        }
        let from = self.after.as_ref().map_or(Unbounded, Excluded);
        let part: Part = self
            .stores
            .services
            .range::<ObjectKey, _>((from, Unbounded))
            .take(self.size)
            .map(|(key, svc)| {
                let slices = self.stores.slices_of(key);
                let t = translate_service(key, svc, &slices, self.node, self.config);
                (key.clone(), t)
            })
            .collect();
        self.done = part.len() < self.size;
        self.after = part.last().map(|(key, _)| key.clone());
        Some(part)
    }
}

/// Calls `each` with every part of `size` services in key order; the next
/// part is translated on another thread meanwhile (inline if no thread
/// can be started).
pub(super) fn for_each_part(
    stores: &Stores,
    node: &NodeContext,
    config: &TranslateConfig,
    size: usize,
    mut each: impl FnMut(Part),
) {
    let parts = || Parts {
        stores,
        node,
        config,
        size: size.max(1),
        after: None,
        done: false,
    };
    std::thread::scope(|scope| {
        // One part waits while the reconcile works on another: two parts'
        // translations in memory at most, besides the one being made.
        let (tx, rx) = mpsc::sync_channel::<Part>(1);
        let producer = parts();
        let spawned = std::thread::Builder::new()
            .name("sluice-translate".into())
            .spawn_scoped(scope, move || {
                for part in producer {
                    if tx.send(part).is_err() {
                        break;
                    }
                }
            });
        match spawned {
            Ok(_) => rx.into_iter().for_each(&mut each),
            Err(e) => {
                warn!(error = %e, "no thread to translate on; translating inline");
                parts().for_each(&mut each);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tests::{services, web};

    fn stores_of(n: usize) -> Stores {
        let mut stores = Stores::default();
        let list: Vec<_> = (0..n)
            .map(|i| web(&format!("s{i:02}"), &format!("10.96.0.{}", i + 1)))
            .collect();
        stores.apply(services(&list));
        stores
    }

    /// Every service once, translated, in key order, in parts of the size
    /// asked; a last part shorter than the size (empty when the services
    /// fill the parts exactly) ends them.
    #[test]
    fn parts_hold_every_service_once_in_key_order() {
        let node = NodeContext::default();
        let config = TranslateConfig::default();
        for n in [0, 1, 7] {
            let stores = stores_of(n);
            let all: Vec<ObjectKey> = stores.services.keys().cloned().collect();
            assert_eq!(all.len(), n);
            for size in [1, 2, 3, 7, 8] {
                let mut sizes = Vec::new();
                let mut keys = Vec::new();
                for_each_part(&stores, &node, &config, size, |part| {
                    sizes.push(part.len());
                    for (key, t) in part {
                        assert_eq!(t.ports.len(), 1, "{key} translated");
                        keys.push(key);
                    }
                });
                let mut want = vec![size; n / size];
                want.push(n % size);
                assert_eq!(sizes, want, "{n} services in parts of {size}");
                assert_eq!(keys, all, "{n} services in parts of {size}");
            }
        }
    }
}
