//! A queue's consistency gate: a key is granted only once the queue's watches show every write of the pod
//! to its primary and every write made for its leases to related objects, or the wait for one passed its
//! deadline (then it is granted marked timed out).

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::time::Instant;

use crate::watch::{
    expectations::{Expectations, Locator},
    object::{Obj, ObjKey},
    resolve::ResourceId,
    selector,
    shared::SharedWatch,
};

/// Whether a key may be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Its watches show every write of the pod it waits for.
    Open,
    /// A write was not seen by its deadline: granted, marked TIMED_OUT.
    TimedOut,
    /// Not yet; look again when something changes, or at the deadline.
    Wait(Option<Instant>),
}

/// A write made for a lease: the key's next grant waits until watch `watch` shows it.
#[derive(Debug, Clone)]
pub(super) struct LeaseWrite {
    /// The index of the watch that will show it.
    pub(super) watch: usize,
    uid: String,
    resource_version: String,
    deadline: Instant,
}

/// The gate of one queue.
#[derive(Debug)]
pub(super) struct Gate {
    /// The queue's watches, the primary's first.
    watches: Vec<Arc<SharedWatch>>,
    /// Whether resourceVersions compare as integers (else: exactly the written version must be seen).
    comparable: bool,
    expectations: Expectations,
    /// The primary resource's plural, for own-write locators.
    plural: String,
    /// Writes made for a key's leases that its next grant waits for.
    pub(super) written: HashMap<ObjKey, Vec<LeaseWrite>>,
}

impl Gate {
    /// The gate over `watches` (the primary's first), judging the pod's writes in `expectations`.
    pub(super) fn new(
        watches: Vec<Arc<SharedWatch>>,
        comparable: bool,
        expectations: Expectations,
        plural: String,
    ) -> Self {
        Self { watches, comparable, expectations, plural, written: HashMap::new() }
    }

    /// A new watch of the primary objects (a sharded queue's new share) in place of the one before.
    pub(super) fn replace_primary(&mut self, watch: Arc<SharedWatch>) {
        if let Some(primary) = self.watches.first_mut() {
            *primary = watch;
        }
    }

    /// The pod's writes the gate judges against; a change may open it.
    pub(super) fn expectations(&self) -> &Expectations {
        &self.expectations
    }

    /// Whether some key waits for a write made for its lease.
    pub(super) fn waits_for_lease_writes(&self) -> bool {
        !self.written.is_empty()
    }

    /// The deadline of a write to the primary `key` still in flight, if any.
    fn write_in_flight(&self, key: &ObjKey) -> Option<Instant> {
        self.expectations.in_flight(&Locator::new(&self.plural, &key.namespace, &key.name))
    }

    /// Whether `key` may be granted now: its watch shows every write of the pod to the primary and every
    /// write made for its leases to related objects.
    pub(super) fn check(&mut self, key: &ObjKey, now: Instant) -> Verdict {
        let Some(primary) = self.watches.first() else { return Verdict::Open };
        let Some(current) = primary.get(key) else {
            // The primary's list is not through yet: nothing to read.
            return Verdict::Wait(None);
        };
        let mut timed_out = false;
        let mut wait: Option<Instant> = None;
        let mut pending = |deadline: Instant, timed_out: &mut bool| {
            if now < deadline {
                wait = Some(wait.map_or(deadline, |w: Instant| w.min(deadline)));
            } else {
                *timed_out = true;
            }
        };
        // A write to the primary still in flight: whatever the cache holds predates it.
        if let Some(deadline) = self.write_in_flight(key) {
            pending(deadline, &mut timed_out);
        }
        // The pod's newest write to the primary (deletes are never waited for: a tombstone is final).
        if let Some(obj) = &current
            && let Some(e) = self.expectations.get(obj.uid())
            && !primary.shows(&self.expectations, self.comparable, obj.uid(), &e.resource_version)
        {
            pending(e.deadline, &mut timed_out);
        }
        if let Some(writes) = self.written.get_mut(key) {
            let (watches, expectations, comparable) = (&self.watches, &self.expectations, self.comparable);
            writes.retain(|w| {
                watches
                    .get(w.watch)
                    .is_some_and(|watch| !watch.shows(expectations, comparable, &w.uid, &w.resource_version))
            });
            for w in writes.iter() {
                pending(w.deadline, &mut timed_out);
            }
            writes.retain(|w| now < w.deadline);
            if writes.is_empty() {
                self.written.remove(key);
            }
        }
        if let Some(deadline) = wait {
            return Verdict::Wait(Some(deadline));
        }
        if timed_out { Verdict::TimedOut } else { Verdict::Open }
    }

    /// The earliest deadline one of the `held` keys waits for.
    pub(super) fn deadline(&self, held: &[ObjKey], now: Instant) -> Option<Instant> {
        if held.is_empty() {
            return None;
        }
        let mut earliest: Option<Instant> = None;
        let mut consider = |d: Instant| earliest = Some(earliest.map_or(d, |e| e.min(d)));
        for key in held {
            if let Some(d) = self.write_in_flight(key) {
                consider(d);
            }
            if let Some(primary) = self.watches.first()
                && let Some(Some(obj)) = primary.get(key)
                && let Some(e) = self.expectations.get(obj.uid())
            {
                consider(e.deadline);
            }
            for w in self.written.get(key).into_iter().flatten() {
                consider(w.deadline);
            }
        }
        // Look again soon when nothing has a deadline (a list not through yet).
        Some(earliest.unwrap_or(now + Duration::from_secs(1)).max(now + Duration::from_millis(1)))
    }

    /// A write made for a lease of `key` produced `obj` of `resource`: the key's next grant waits, until
    /// `deadline`, for the queue's watches that select it to show it.
    pub(super) fn wrote(&mut self, key: &ObjKey, resource: &ResourceId, obj: &Obj, deadline: Instant) {
        for (index, watch) in self.watches.iter().enumerate() {
            let k = &watch.key;
            // Only the watches that select the object will show it; one whose selector cannot be judged
            // here is waited for (at worst until the timeout).
            let selected = selector::selects(&k.label_selector, &k.field_selector, obj) != Some(false)
                && k.shard.as_ref().is_none_or(|shard| shard.selects(obj));
            if &k.resource == resource && (k.namespace.is_empty() || k.namespace == obj.namespace()) && selected {
                self.written.entry(key.clone()).or_default().push(LeaseWrite {
                    watch: index,
                    uid: obj.uid().to_owned(),
                    resource_version: obj.resource_version().to_owned(),
                    deadline,
                });
            }
        }
    }
}
