//! The resourceVersion guard against incident 4.
//!
//! kube-rs's watcher (like client-go's reflector in 2018) resumes a watch
//! from the resourceVersion of the last event it received. If an event
//! arrives out of order, carrying a version older than one already applied,
//! the next reconnect resumes from the past and replays history: live
//! objects appear deleted. Within one list+watch, a conforming server only
//! sends versions newer than everything listed or received before, so an
//! event that is not newer is either a duplicate (ignored) or stale (the
//! stream is not trustworthy: relist from scratch instead of resuming).
//!
//! resourceVersions are opaque; this guard only compares them when both
//! parse as integers (as etcd-backed servers produce) and otherwise lets
//! events through.

/// What to do with a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Apply,
    /// The version equals the newest already seen: nothing new.
    Duplicate,
    /// Older than the newest already seen: discard and relist.
    Stale {
        newest: u64,
        got: u64,
    },
}

#[derive(Debug, Default)]
pub struct RvGuard {
    newest: Option<u64>,
}

fn parse(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}

impl RvGuard {
    /// A fresh guard for a new list+watch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An object of the initial list.
    pub fn listed(&mut self, rv: Option<&str>) {
        if let Some(v) = parse(rv) {
            self.newest = Some(self.newest.map_or(v, |n| n.max(v)));
        }
    }

    /// A watch event for an object carrying `rv`.
    pub fn event(&mut self, rv: Option<&str>) -> Verdict {
        let Some(got) = parse(rv) else {
            return Verdict::Apply;
        };
        match self.newest {
            Some(newest) if got < newest => Verdict::Stale { newest, got },
            Some(newest) if got == newest => Verdict::Duplicate,
            _ => {
                self.newest = Some(got);
                Verdict::Apply
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_events_apply_and_advance() {
        let mut g = RvGuard::new();
        g.listed(Some("5"));
        g.listed(Some("7"));
        assert_eq!(g.event(Some("8")), Verdict::Apply);
        assert_eq!(g.event(Some("12")), Verdict::Apply);
    }

    #[test]
    fn replayed_event_is_a_duplicate() {
        let mut g = RvGuard::new();
        g.listed(Some("7"));
        assert_eq!(g.event(Some("9")), Verdict::Apply);
        assert_eq!(g.event(Some("9")), Verdict::Duplicate);
    }

    #[test]
    fn event_older_than_the_list_is_stale() {
        let mut g = RvGuard::new();
        g.listed(Some("7"));
        assert_eq!(g.event(Some("2")), Verdict::Stale { newest: 7, got: 2 });
    }

    #[test]
    fn out_of_order_watch_events_are_stale() {
        let mut g = RvGuard::new();
        assert_eq!(g.event(Some("10")), Verdict::Apply);
        assert_eq!(g.event(Some("9")), Verdict::Stale { newest: 10, got: 9 });
    }

    #[test]
    fn opaque_versions_pass() {
        let mut g = RvGuard::new();
        g.listed(Some("7"));
        assert_eq!(g.event(Some("abc")), Verdict::Apply);
        assert_eq!(g.event(None), Verdict::Apply);
    }
}
