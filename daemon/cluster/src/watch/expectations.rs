//! Own-write expectations: every write this pod makes through ObjectsService records "object `uid` will
//! reach resourceVersion `rv`", with a deadline that runs from the write's answer (the version is not
//! known before it, however slow the link). CONSISTENT subscriptions hold states that predate it until
//! their watch delivers exactly that version (or the object is deleted, or the deadline passes); while the
//! write is in flight, they hold its object's states until it is answered.
//!
//! Each shared watch records the position at which it delivered the expected version, so a subscriber
//! that is behind its watch still holds older states until it reaches that position itself.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

/// Where a written object lives, as own-write tracking knows it (shown as "plural/namespace/name").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Locator {
    /// The resource's lowercase plural, e.g. "configmaps".
    pub plural: String,
    /// The object's namespace; empty for a cluster-scoped object.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl Locator {
    /// The object `name` of `plural` in `namespace`.
    pub fn new(plural: &str, namespace: &str, name: &str) -> Self {
        Self { plural: plural.to_owned(), namespace: namespace.to_owned(), name: name.to_owned() }
    }

    /// Whether a read of `scope` covers this object.
    pub fn within(&self, scope: &Scope<'_>) -> bool {
        match scope {
            Scope::Object(object) => self == *object,
            Scope::Namespace { plural, namespace } => {
                self.plural == *plural && (namespace.is_empty() || self.namespace == *namespace)
            }
        }
    }
}

impl fmt::Display for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.plural, self.namespace, self.name)
    }
}

/// What a read-your-writes read covers.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// One object.
    Object(&'a Locator),
    /// Every object of `plural` in `namespace`; an empty namespace is every namespace (a list across
    /// namespaces, or of a cluster-scoped resource).
    Namespace {
        /// The resource's lowercase plural.
        plural: &'a str,
        /// The namespace listed; empty for all.
        namespace: &'a str,
    },
}

/// One expected version of one object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expectation {
    /// The version the apiserver returned for the write.
    pub resource_version: String,
    /// When subscribers stop waiting and deliver the latest state marked timed out.
    pub deadline: Instant,
    /// When the write was answered; a list that started later includes it.
    pub written_at: Instant,
    /// Per watch incarnation: the history position where that watch delivered the version.
    pub seen: HashMap<u64, u64>,
    /// Where the object lives, for read-your-writes and writes in flight.
    pub locator: Locator,
}

/// Every open expectation of this daemon, by object uid (the latest write per object wins: an older
/// write's version is superseded by the newer one's), and the writes still in flight, by locator.
#[derive(Debug, Clone)]
pub struct Expectations {
    inner: Arc<Mutex<ExpectationTable>>,
    /// Bumped on every change, so subscribers holding states look again.
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug, Default)]
struct ExpectationTable {
    by_uid: HashMap<String, Expectation>,
    /// locator -> (writes in flight, deadline of the oldest).
    in_flight: HashMap<Locator, (usize, Instant)>,
}

/// A write sent to the apiserver and not answered yet: states of its object that arrive meanwhile
/// predate it (watch order) and are held. Dropping it ends the flight.
#[derive(Debug)]
pub(crate) struct InFlight {
    expectations: Expectations,
    locator: Locator,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut inner = self.expectations.lock();
            if let Some((count, _)) = inner.in_flight.get_mut(&self.locator) {
                *count -= 1;
                if *count == 0 {
                    inner.in_flight.remove(&self.locator);
                }
            }
        }
        self.expectations.notify();
    }
}

impl Default for Expectations {
    fn default() -> Self {
        Self { inner: Arc::default(), changed: Arc::new(tokio::sync::watch::channel(0).0) }
    }
}

impl Expectations {
    fn lock(&self) -> MutexGuard<'_, ExpectationTable> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes whoever waits on [`Expectations::subscribe`]: an expectation, or a watch's position, changed.
    pub(crate) fn notify(&self) {
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// A receiver that sees every change.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A write to the object at `locator` is about to be sent; its object's states are held until it is
    /// answered, at most `limit`.
    pub(crate) fn begin(&self, locator: Locator, limit: Duration) -> InFlight {
        {
            let mut inner = self.lock();
            let entry = inner.in_flight.entry(locator.clone()).or_insert((0, Instant::now() + limit));
            entry.0 += 1;
        }
        self.notify();
        InFlight { expectations: self.clone(), locator }
    }

    /// The deadline of a write to `locator` still in flight, if any.
    pub(crate) fn in_flight(&self, locator: &Locator) -> Option<Instant> {
        self.lock().in_flight.get(locator).map(|(_, deadline)| *deadline)
    }

    /// Records that `uid` (at `locator`) will reach `resource_version`, waited for at most `timeout`.
    pub(crate) fn expect(&self, uid: &str, resource_version: &str, locator: Locator, timeout: Duration) {
        let now = Instant::now();
        {
            let map = &mut self.lock().by_uid;
            // Forget expectations long past their deadline so the map stays bounded by recent writes.
            map.retain(|_, e| e.deadline + timeout > now);
            map.insert(
                uid.to_owned(),
                Expectation {
                    resource_version: resource_version.to_owned(),
                    deadline: now + timeout,
                    written_at: now,
                    seen: HashMap::new(),
                    locator,
                },
            );
        }
        self.notify();
    }

    /// The open expectation for `uid`, if any.
    pub(crate) fn get(&self, uid: &str) -> Option<Expectation> {
        self.lock().by_uid.get(uid).cloned()
    }

    /// Whether an open expectation within `scope` has not been delivered by watch `incarnation` yet: what a
    /// read-your-writes read waits for.
    pub(crate) fn any_unseen(&self, scope: &Scope<'_>, incarnation: u64) -> bool {
        let now = Instant::now();
        self.lock()
            .by_uid
            .values()
            .any(|e| e.deadline > now && e.locator.within(scope) && !e.seen.contains_key(&incarnation))
    }

    /// Watch `incarnation` delivered `resource_version` of `uid` at `seq`: records it when that is the
    /// expected version and no earlier position was recorded.
    pub(crate) fn seen(&self, incarnation: u64, uid: &str, resource_version: &str, seq: u64) {
        let recorded = match self.lock().by_uid.get_mut(uid) {
            Some(e) if e.resource_version == resource_version && !e.seen.contains_key(&incarnation) => {
                e.seen.insert(incarnation, seq);
                true
            }
            _ => false,
        };
        if recorded {
            self.notify();
        }
    }

    /// Watch `incarnation` finished a list that started at `list_started` and holds `uid` at `seq`: a
    /// list that started after the write includes it, so the expectation is met there.
    pub(crate) fn listed(&self, incarnation: u64, uid: &str, list_started: Instant, seq: u64) {
        let recorded = match self.lock().by_uid.get_mut(uid) {
            Some(e) if e.written_at <= list_started && !e.seen.contains_key(&incarnation) => {
                e.seen.insert(incarnation, seq);
                true
            }
            _ => false,
        };
        if recorded {
            self.notify();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ConfigMap `name` in namespace "ns".
    fn at(name: &str) -> Locator {
        Locator::new("configmaps", "ns", name)
    }

    #[tokio::test]
    async fn only_the_expected_version_is_recorded_once_per_watch() {
        let e = Expectations::default();
        e.expect("u", "10", at("a"), Duration::from_secs(5));
        e.seen(1, "u", "9", 3);
        assert!(e.get("u").expect("open").seen.is_empty(), "another version is not it");
        e.seen(1, "u", "10", 4);
        e.seen(1, "u", "10", 7);
        e.seen(2, "u", "10", 1);
        assert_eq!(e.get("u").expect("open").seen, HashMap::from([(1, 4), (2, 1)]));
        let namespace = Scope::Namespace { plural: "configmaps", namespace: "ns" };
        assert!(!e.any_unseen(&namespace, 1));
        assert!(e.any_unseen(&namespace, 3), "watch 3 has not delivered it");
        assert!(e.any_unseen(&Scope::Object(&at("a")), 3));
        assert!(e.any_unseen(&Scope::Namespace { plural: "configmaps", namespace: "" }, 3), "a list of all namespaces");
        assert!(!e.any_unseen(&Scope::Object(&at("ab")), 3), "another object whose name starts alike");
        assert!(!e.any_unseen(&Scope::Namespace { plural: "configmaps", namespace: "other" }, 3));
        assert!(!e.any_unseen(&Scope::Namespace { plural: "secrets", namespace: "" }, 3));
        e.expect("u", "11", at("a"), Duration::from_secs(5));
        assert!(e.get("u").expect("open").seen.is_empty(), "a newer write replaces the older expectation");
    }

    #[tokio::test]
    async fn writes_in_flight_are_counted_per_object_and_notify() {
        let e = Expectations::default();
        let mut changes = e.subscribe();
        let first = e.begin(at("a"), Duration::from_secs(5));
        let second = e.begin(at("a"), Duration::from_secs(5));
        assert!(changes.has_changed().expect("sender alive"));
        changes.mark_unchanged();
        drop(first);
        assert!(e.in_flight(&at("a")).is_some(), "one still in flight");
        drop(second);
        assert!(e.in_flight(&at("a")).is_none());
        assert!(changes.has_changed().expect("sender alive"));
    }

    #[tokio::test]
    async fn a_list_started_after_the_write_meets_it() {
        let e = Expectations::default();
        let before = Instant::now();
        e.expect("u", "10", at("a"), Duration::from_secs(5));
        e.listed(1, "u", before, 5);
        assert!(e.get("u").expect("open").seen.is_empty(), "a list from before the write does not");
        e.listed(1, "u", Instant::now(), 6);
        assert_eq!(e.get("u").expect("open").seen.get(&1), Some(&6));
    }
}
