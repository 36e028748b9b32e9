//! Programming services while the first list still streams in.
//!
//! An agent that starts on empty maps (a new node, maps lost) has nothing
//! a partial list could take away: it programs each service as soon as
//! the list has brought it and one of its slices, so that the first full
//! reconcile at the list's end finds most of the work done and only
//! looks at the services touched since (and sweeps). An agent that
//! adopts programmed maps (a restart, an upgrade) writes nothing before
//! every kind is listed, as before: a service whose slices are not listed
//! yet would lose its backends.

use std::collections::BTreeSet;

use crate::{sources::Kind, stores::Dirty, translate::ObjectKey};

/// What the first list has touched, while it streams in.
#[derive(Debug, Default)]
pub(super) struct FirstList {
    /// Services the list touched that no wake-up has looked at since.
    /// (One looked at and not ready, a service without a slice yet, is
    /// not kept: it is touched again when its slice comes, and the list's
    /// end finds those still without one.)
    batch: BTreeSet<ObjectKey>,
    /// Programming has begun: the node and the service CIDRs were listed,
    /// and their translation context taken.
    started: bool,
    /// A change of the node or the service CIDRs after `started`: every
    /// service must be translated again, so the end of the list is a
    /// whole full reconcile.
    stale: bool,
    /// Services programmed before the list ended.
    pub(super) programmed: usize,
}

impl FirstList {
    /// Takes what an update of `kind` changed in the stores.
    pub(super) fn touched(&mut self, kind: Kind, dirty: &Dirty) {
        match kind {
            Kind::Service | Kind::EndpointSlice => {
                self.batch.extend(dirty.services.iter().cloned())
            }
            Kind::Node | Kind::ServiceCidr => self.stale |= self.started && !dirty.is_empty(),
        }
    }

    /// Whether programming may begin or go on: the translation context
    /// (this node, the service CIDRs) is listed and has not changed since
    /// it was taken. The first call that says yes with `started` false
    /// asks the caller to take the context.
    pub(super) fn may_program(&self, synced: &BTreeSet<Kind>) -> bool {
        !self.stale && synced.contains(&Kind::Node) && synced.contains(&Kind::ServiceCidr)
    }

    pub(super) fn started(&self) -> bool {
        self.started
    }

    pub(super) fn start(&mut self) {
        self.started = true;
    }

    /// Up to `limit` of the services touched and not yet looked at that
    /// `ready` says can be programmed now. Those not ready leave the batch
    /// (see `batch`); those beyond `limit` stay, for the next wake-up (one
    /// part a wake-up: pages keep being taken from the sources meanwhile,
    /// not queued up behind a long reconcile).
    pub(super) fn take_ready(
        &mut self,
        limit: usize,
        ready: impl Fn(&ObjectKey) -> bool,
    ) -> Vec<ObjectKey> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(key) = self.batch.pop_first() else {
                break;
            };
            if ready(&key) {
                out.push(key);
            }
        }
        out
    }

    /// Whether services touched are left to look at.
    pub(super) fn has_batch(&self) -> bool {
        !self.batch.is_empty()
    }

    /// At the list's end: the services the first full reconcile must
    /// translate (those left in the batch, and `unprogrammed`: the
    /// services still without a slice), or `None` when it must translate
    /// every one (the context changed, or nothing was programmed early).
    /// A service programmed and then gone is the full reconcile's to
    /// find (it still contributes).
    pub(super) fn finish(
        self,
        unprogrammed: impl Iterator<Item = ObjectKey>,
    ) -> Option<BTreeSet<ObjectKey>> {
        (self.started && !self.stale).then(|| {
            let mut only = self.batch;
            only.extend(unprogrammed);
            only
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirty(keys: &[&str]) -> Dirty {
        Dirty {
            services: keys.iter().map(|k| ObjectKey::new("default", *k)).collect(),
            ..Dirty::default()
        }
    }

    #[test]
    fn what_is_not_ready_is_left_to_the_lists_end() {
        let mut fl = FirstList::default();
        fl.touched(Kind::Service, &dirty(&["a", "b"]));
        fl.start();
        let ready = fl.take_ready(10, |k| &*k.name == "a");
        assert_eq!(ready, vec![ObjectKey::new("default", "a")]);
        assert!(!fl.has_batch());
        assert!(
            fl.take_ready(10, |_| true).is_empty(),
            "b is not touched again"
        );
        fl.touched(Kind::EndpointSlice, &dirty(&["a"]));
        let b = ObjectKey::new("default", "b");
        assert_eq!(
            fl.finish([b.clone()].into_iter()),
            Some([ObjectKey::new("default", "a"), b].into())
        );
    }

    #[test]
    fn a_wake_up_takes_one_part_and_leaves_the_rest_for_the_next() {
        let mut fl = FirstList::default();
        fl.touched(Kind::Service, &dirty(&["a", "b", "c"]));
        fl.start();
        assert_eq!(fl.take_ready(2, |_| true).len(), 2);
        assert!(fl.has_batch());
        assert_eq!(
            fl.take_ready(2, |_| true),
            vec![ObjectKey::new("default", "c")]
        );
        assert!(!fl.has_batch());
        assert_eq!(fl.finish(std::iter::empty()), Some(BTreeSet::new()));
    }

    #[test]
    fn a_node_change_after_the_start_makes_the_end_a_whole_full_reconcile() {
        let mut fl = FirstList::default();
        let node = Dirty {
            all: true,
            ..Dirty::default()
        };
        fl.touched(Kind::Node, &node);
        assert!(!fl.stale, "the node's own listing is the context");
        fl.start();
        fl.touched(Kind::Node, &node);
        assert!(!fl.may_program(&[Kind::Node, Kind::ServiceCidr].into()));
        assert_eq!(fl.finish(std::iter::empty()), None);
    }

    #[test]
    fn nothing_started_means_a_whole_full_reconcile() {
        let mut fl = FirstList::default();
        fl.touched(Kind::Service, &dirty(&["a"]));
        assert_eq!(fl.finish(std::iter::empty()), None);
    }
}
