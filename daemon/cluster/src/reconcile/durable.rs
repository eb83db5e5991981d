//! What a queue keeps past a restart of the daemon: its keys' REQUEUE times and TERMINAL marks, in a store
//! the binary hands in ([`Timers`]). Without it a restarted daemon hands every key out once more, as a new
//! queue's list does: a key asked for again in an hour would come at once, and a key that failed for good
//! would fail again.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::watch::object::ObjKey;

/// A key's timer as kept, with what tells whether its object changed since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timer {
    /// The primary object's resourceVersion when the pass that set the timer was handed out: a list that
    /// shows another version shows a change.
    pub resource_version: String,
    /// The newest resourceVersion the queue's watches had shown when the timer was set: a related object
    /// listed at a later version changed since.
    pub watermark: u64,
    /// What the timer is.
    pub kind: TimerKind,
}

/// What a kept timer is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimerKind {
    /// A REQUEUE: hand the key out at this wall-clock time (ms since the Unix epoch), sooner on a change.
    Requeue {
        /// When.
        at_ms: u64,
        /// The priority of the pass it queues.
        priority: i32,
    },
    /// A TERMINAL failure: no pass until the object changes.
    Terminal {
        /// The error it ended with, shown again by `consistd status` and the next pass.
        error: String,
    },
}

/// Where queues keep their timers. Writes are not waited for: one lost in a crash costs at worst a pass
/// that comes early, as without a store.
pub trait Timers: Send + Sync + std::fmt::Debug {
    /// Keeps `timer` for `key` of queue `queue`, replacing what was kept; None forgets it.
    fn keep(&self, queue: &str, key: &ObjKey, timer: Option<&Timer>);
    /// Every timer kept for queue `queue`.
    fn load(&self, queue: &str) -> HashMap<ObjKey, Timer>;
}

/// No store: timers last as long as the daemon.
#[derive(Debug, Default)]
pub struct Volatile;

impl Timers for Volatile {
    fn keep(&self, _: &str, _: &ObjKey, _: Option<&Timer>) {}

    fn load(&self, _: &str) -> HashMap<ObjKey, Timer> {
        HashMap::new()
    }
}
