//! One subscriber's view of a shared watch: its initial items, then live entries, and a fresh snapshot
//! after RESYNC_REQUIRED when it fell behind (or, wanting every event, when the watch relisted).
//! Dropping it releases the shared watch.

use std::{collections::VecDeque, sync::atomic::Ordering};

use tokio::time::Instant;

use super::{
    hub::WatchClaim,
    shared::{Change, Item, Joined},
};

/// A subscription to a shared watch.
#[derive(Debug)]
pub struct Subscription {
    claim: WatchClaim,
    pending: VecDeque<Item>,
    joined: Joined,
    /// When the item `next` returned last was received from the apiserver, if it came live (not from a
    /// snapshot or a replay of the history).
    live_received: Option<Instant>,
    /// Whether the subscriber wants every event (RAW), not only states: a relist's difference is then a
    /// gap, answered with RESYNC_REQUIRED and a snapshot.
    every_event: bool,
}

impl Subscription {
    pub(super) fn new(claim: WatchClaim, mut joined: Joined) -> Self {
        let pending = std::mem::take(&mut joined.initial).into();
        Self { claim, pending, joined, live_received: None, every_event: false }
    }

    /// Marks the subscriber as wanting every event: after a relist it resyncs instead of taking the
    /// difference (which would skip whatever happened while the watch was away).
    pub fn every_event(mut self) -> Self {
        self.every_event = true;
        self
    }

    /// The watch incarnation, for cursors.
    pub fn incarnation(&self) -> u64 {
        self.claim.watch().incarnation
    }

    /// The shared watch: its cache and high-water mark.
    pub(crate) fn watch(&self) -> &std::sync::Arc<super::shared::SharedWatch> {
        self.claim.watch()
    }

    /// The plural of the watched resource.
    pub fn resource_plural(&self) -> &str {
        &self.claim.watch().key.resource.plural
    }

    /// Why the watch ended, once [`Subscription::next`] returned None: the memory budget it would have
    /// passed; None when the daemon is stopping.
    pub fn ended(&self) -> Option<super::budget::Exhausted> {
        self.claim.watch().ended()
    }

    /// When the item `next` returned last was received from the apiserver; None unless it came live.
    pub fn live_received(&self) -> Option<Instant> {
        self.live_received
    }

    /// The next item; `None` when the watch stopped (the daemon is shutting down, or the memory budget
    /// ended it: [`Subscription::ended`]).
    pub async fn next(&mut self) -> Option<Item> {
        self.live_received = None;
        loop {
            let item = match self.pending.pop_front() {
                Some(item) => item,
                None => match self.joined.live.recv().await {
                    Some(entry) => {
                        self.live_received = Some(entry.received);
                        Item::Entry(entry)
                    }
                    None if self.joined.overflowed.load(Ordering::Acquire) => {
                        tracing::debug!(resource = %self.resource_plural(), "subscriber fell behind; resyncing");
                        self.resync();
                        continue;
                    }
                    None if self.joined.first_list_done.load(Ordering::Acquire) => {
                        // Joined before the watch's first list completed: replay that list from the history.
                        let mut joined = self.claim.watch().rejoin_after_first_list();
                        self.pending.extend(std::mem::take(&mut joined.initial));
                        self.joined = joined;
                        continue;
                    }
                    None => return None,
                },
            };
            match &item {
                Item::Entry(entry) if entry.change == Change::Relisted => {
                    if self.every_event {
                        tracing::debug!(resource = %self.resource_plural(), "the watch relisted; resyncing");
                        self.live_received = None;
                        self.resync();
                    }
                }
                _ => return Some(item),
            }
        }
    }

    /// Starts over from a snapshot of the cache, announced by RESYNC_REQUIRED; what was pending or queued
    /// is dropped (the snapshot holds its outcome).
    fn resync(&mut self) {
        let mut joined = self.claim.watch().join(None);
        self.pending.clear();
        self.pending.push_back(Item::ResyncRequired);
        self.pending.extend(std::mem::take(&mut joined.initial));
        self.joined = joined;
    }
}
