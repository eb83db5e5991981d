//! The own-write rule where the app takes an event: per object uid, the largest resourceVersion a write
//! through this client returned, and the check of a watched state against it
//! (`proto/consistd/v1/watch.proto`, `DELIVERY_MODE_CONSISTENT`).
//!
//! The daemon judges a CONSISTENT state when it sends it, so a state it sent just before the app's own
//! write reached it can still wait, unread, in this process (tonic's and hyper's buffers) when that write
//! returns. A watch asks this record when the app takes each event and drops (CONSISTENT) or marks (RAW)
//! a state older than what the app itself already wrote.

use std::{
    collections::HashMap,
    mem,
    sync::{Mutex, PoisonError},
};

use crate::proto::KubeObject;

/// How many objects one generation of the record holds. The record keeps two, so it remembers the
/// 10,000 to 20,000 objects this client wrote most recently (a few MB at most).
pub(crate) const GENERATION: usize = 10_000;

/// Per object uid, the largest resourceVersion a write through one [`crate::Client`] (and its clones)
/// returned. Shared by the client's objects API and all its watches; safe for concurrent use.
///
/// An entry only matters while a state older than its write can still be buffered, and buffered states
/// are taken in order, so old entries may be forgotten: without a bound, a controller writing many
/// objects over days would keep every uid it ever wrote. The least recently written objects are
/// forgotten first, by generations: when the current map is full it becomes the previous one and the
/// one before is dropped; an object written again moves to the current map. That needs no clock and no
/// per-entry bookkeeping. What is given up: an app that writes more than [`GENERATION`] other objects
/// while a watch sits unread can be handed a state of one of its earliest objects older than its write,
/// as it would be without the rule.
#[derive(Debug, Default)]
pub(crate) struct OwnWrites {
    generations: Mutex<Generations>,
}

#[derive(Debug, Default)]
struct Generations {
    current: HashMap<String, u64>,
    previous: HashMap<String, u64>,
}

/// A resourceVersion as the integer it is (Kubernetes 1.35+, KEP-5504), or `None` when it is not a
/// decimal integer (an older apiserver, an aggregated API): such a version is never recorded or compared.
/// Only ASCII digits count (`u64::from_str` alone would also take a leading `+`).
pub(crate) fn integer_version(resource_version: &str) -> Option<u64> {
    if resource_version.is_empty() || !resource_version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    resource_version.parse().ok()
}

impl OwnWrites {
    /// Remembers the object a write returned: its uid's version becomes the larger of the one kept and
    /// this one. An object without a uid or an integer resourceVersion is ignored.
    pub(crate) fn record(&self, object: &KubeObject) {
        let Some(version) = integer_version(&object.resource_version) else { return };
        if object.uid.is_empty() {
            return;
        }
        let mut g = self.generations.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = g.current.get_mut(&object.uid) {
            *kept = (*kept).max(version);
            return;
        }
        let version = g.previous.remove(&object.uid).map_or(version, |kept| kept.max(version));
        if g.current.len() >= GENERATION {
            g.previous = mem::take(&mut g.current);
        }
        g.current.insert(object.uid.clone(), version);
    }

    /// Whether `object` is the state the largest write through this client to its object returned: its
    /// uid is kept with exactly its resourceVersion. False when the version is not an integer.
    pub(crate) fn wrote(&self, object: &KubeObject) -> bool {
        self.lookup(object).is_some_and(|(written, version)| written == version)
    }

    /// Whether a write through this client returned a larger resourceVersion of `object`'s object than
    /// `object` has. False when either version is not an integer or the uid is not (or no longer) kept.
    pub(crate) fn predates(&self, object: &KubeObject) -> bool {
        self.lookup(object).is_some_and(|(written, version)| written > version)
    }

    /// The largest resourceVersion a write through this client returned for `object`'s object, and
    /// `object`'s own, both as integers; `None` for an object without a uid, a version that is not an integer
    /// and an object the record does not (or no longer) keep.
    fn lookup(&self, object: &KubeObject) -> Option<(u64, u64)> {
        let version = integer_version(&object.resource_version)?;
        if object.uid.is_empty() {
            return None;
        }
        let g = self.generations.lock().unwrap_or_else(PoisonError::into_inner);
        g.current.get(&object.uid).or_else(|| g.previous.get(&object.uid)).map(|&written| (written, version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(uid: &str, rv: &str) -> KubeObject {
        KubeObject { uid: uid.into(), resource_version: rv.into(), ..Default::default() }
    }

    #[test]
    fn only_decimal_integers_are_versions() {
        assert_eq!(integer_version("12345"), Some(12345));
        assert_eq!(integer_version("007"), Some(7));
        for opaque in ["", "+1", "-1", "1_000", "0x10", " 1", "1 ", "١٢", "abc", "99999999999999999999999"] {
            assert_eq!(integer_version(opaque), None, "{opaque:?}");
        }
    }

    #[test]
    fn the_largest_version_written_is_kept_and_older_states_predate_it() {
        let w = OwnWrites::default();
        w.record(&object("u", "10"));
        w.record(&object("u", "7")); // an answer that arrived late never lowers it
        assert!(w.predates(&object("u", "9")));
        assert!(!w.predates(&object("u", "10")), "the write's own state");
        assert!(!w.predates(&object("u", "11")), "a later state");
        assert!(!w.predates(&object("other", "1")), "another object");
        w.record(&object("u", "12"));
        assert!(w.predates(&object("u", "11")));
    }

    #[test]
    fn versions_that_are_not_integers_are_never_recorded_or_compared() {
        let w = OwnWrites::default();
        w.record(&object("u", "abc"));
        assert!(!w.predates(&object("u", "1")), "nothing was recorded");
        w.record(&object("u", "10"));
        assert!(!w.predates(&object("u", "5a")), "an opaque state is never older");
        w.record(&object("", "10"));
        assert!(!w.predates(&object("", "5")), "no uid");
    }

    #[test]
    fn at_least_the_most_recently_written_objects_are_kept_and_the_least_recent_forgotten_first() {
        let w = OwnWrites::default();
        let mut written = vec!["old".to_owned(), "again".to_owned()];
        written.extend((0..GENERATION).map(|i| format!("a{i}")));
        for uid in &written {
            w.record(&object(uid, "100"));
        }
        // Written again after others: among the most recently written now.
        w.record(&object("again", "101"));
        written.push("again".to_owned());
        written.extend((0..GENERATION - 2).map(|i| format!("b{i}")));
        for uid in &written[written.len() - (GENERATION - 2)..] {
            w.record(&object(uid, "100"));
        }
        // Each of the last GENERATION distinct objects written is still known ...
        let mut recent = std::collections::HashSet::new();
        for uid in written.iter().rev() {
            if recent.len() == GENERATION {
                break;
            }
            recent.insert(uid);
        }
        for uid in recent {
            assert!(w.predates(&object(uid, "99")), "{uid} was forgotten");
        }
        // ... and the one written least recently is the first to go, while one written again stays.
        assert!(!w.predates(&object("old", "99")), "old is still kept");
        assert!(w.predates(&object("again", "100")), "again was forgotten");
        let g = w.generations.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(g.current.len() + g.previous.len() <= 2 * GENERATION, "bounded");
    }
}
