//! Own-write expectations: every write this pod makes through ObjectsService records "object `uid` will
//! reach resourceVersion `rv`", with a deadline. CONSISTENT subscriptions hold states that predate it
//! until their watch delivers exactly that version (or the object is deleted, or the deadline passes).
//!
//! Each shared watch records the position at which it delivered the expected version, so a subscriber
//! that is behind its watch still holds older states until it reaches that position itself.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

/// One expected version of one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    /// The version the apiserver returned for the write.
    pub resource_version: String,
    /// When subscribers stop waiting and deliver the latest state marked timed out.
    pub deadline: Instant,
    /// When the write was answered; a list that started later includes it.
    pub written_at: Instant,
    /// Per watch incarnation: the history position where that watch delivered the version.
    pub seen: HashMap<u64, u64>,
    /// "plural/namespace/name" of the object, for read-your-writes by name.
    pub locator: String,
}

/// Every open expectation of this daemon, by object uid (the latest write per object wins: an older
/// write's version is superseded by the newer one's).
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    inner: Arc<Mutex<HashMap<String, Expectation>>>,
}

impl Expectations {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Expectation>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `uid` (at `locator`, "plural/namespace/name") will reach `resource_version`, waited
    /// for at most `timeout`.
    pub fn expect(&self, uid: &str, resource_version: &str, locator: &str, timeout: Duration) {
        let now = Instant::now();
        let mut map = self.lock();
        // Forget expectations long past their deadline so the map stays bounded by recent writes.
        map.retain(|_, e| e.deadline + timeout > now);
        map.insert(
            uid.to_owned(),
            Expectation {
                resource_version: resource_version.to_owned(),
                deadline: now + timeout,
                written_at: now,
                seen: HashMap::new(),
                locator: locator.to_owned(),
            },
        );
    }

    /// The open expectation for `uid`, if any.
    pub fn get(&self, uid: &str) -> Option<Expectation> {
        self.lock().get(uid).cloned()
    }

    /// Whether an open expectation whose locator starts with `prefix` has not been delivered by watch
    /// `incarnation` yet: what a read-your-writes read waits for.
    pub fn any_unseen(&self, prefix: &str, incarnation: u64) -> bool {
        let now = Instant::now();
        self.lock()
            .values()
            .any(|e| e.deadline > now && e.locator.starts_with(prefix) && !e.seen.contains_key(&incarnation))
    }

    /// Watch `incarnation` delivered `resource_version` of `uid` at `seq`: records it when that is the
    /// expected version and no earlier position was recorded.
    pub fn seen(&self, incarnation: u64, uid: &str, resource_version: &str, seq: u64) {
        if let Some(e) = self.lock().get_mut(uid)
            && e.resource_version == resource_version
        {
            e.seen.entry(incarnation).or_insert(seq);
        }
    }

    /// Watch `incarnation` finished a list that started at `list_started` and holds `uid` at `seq`: a
    /// list that started after the write includes it, so the expectation is met there.
    pub fn listed(&self, incarnation: u64, uid: &str, list_started: Instant, seq: u64) {
        if let Some(e) = self.lock().get_mut(uid)
            && e.written_at <= list_started
        {
            e.seen.entry(incarnation).or_insert(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_expected_version_is_recorded_once_per_watch() {
        let e = Expectations::default();
        e.expect("u", "10", "configmaps/ns/a", Duration::from_secs(5));
        e.seen(1, "u", "9", 3);
        assert!(e.get("u").expect("open").seen.is_empty(), "another version is not it");
        e.seen(1, "u", "10", 4);
        e.seen(1, "u", "10", 7);
        e.seen(2, "u", "10", 1);
        assert_eq!(e.get("u").expect("open").seen, HashMap::from([(1, 4), (2, 1)]));
        assert!(!e.any_unseen("configmaps/ns/", 1));
        assert!(e.any_unseen("configmaps/ns/", 3), "watch 3 has not delivered it");
        assert!(!e.any_unseen("secrets/", 3));
        e.expect("u", "11", "configmaps/ns/a", Duration::from_secs(5));
        assert!(e.get("u").expect("open").seen.is_empty(), "a newer write replaces the older expectation");
    }

    #[tokio::test]
    async fn a_list_started_after_the_write_meets_it() {
        let e = Expectations::default();
        let before = Instant::now();
        e.expect("u", "10", "configmaps/ns/a", Duration::from_secs(5));
        e.listed(1, "u", before, 5);
        assert!(e.get("u").expect("open").seen.is_empty(), "a list from before the write does not");
        e.listed(1, "u", Instant::now(), 6);
        assert_eq!(e.get("u").expect("open").seen.get(&1), Some(&6));
    }
}
