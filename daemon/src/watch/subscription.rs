//! One subscriber's view of a shared watch: its initial items, then live entries, and a fresh snapshot
//! after RESYNC_REQUIRED when it fell behind. Dropping it releases the shared watch.

use std::{collections::VecDeque, sync::atomic::Ordering};

use tokio::time::Instant;

use super::{
    hub::WatchClaim,
    shared::{Item, Joined},
};

/// A subscription to a shared watch.
#[derive(Debug)]
pub(crate) struct Subscription {
    claim: WatchClaim,
    pending: VecDeque<Item>,
    joined: Joined,
    /// When the item `next` returned last was received from the apiserver, if it came live (not from a
    /// snapshot or a replay of the history).
    live_received: Option<Instant>,
}

impl Subscription {
    pub(super) fn new(claim: WatchClaim, mut joined: Joined) -> Self {
        let pending = std::mem::take(&mut joined.initial).into();
        Self { claim, pending, joined, live_received: None }
    }

    /// The watch incarnation, for cursors.
    pub(crate) fn incarnation(&self) -> u64 {
        self.claim.watch().incarnation
    }

    /// The shared watch: its cache and high-water mark.
    pub(crate) fn watch(&self) -> &std::sync::Arc<super::shared::SharedWatch> {
        self.claim.watch()
    }

    /// The plural of the watched resource.
    pub(crate) fn resource_plural(&self) -> &str {
        &self.claim.watch().key.resource.plural
    }

    /// When the item `next` returned last was received from the apiserver; None unless it came live.
    pub(crate) fn live_received(&self) -> Option<Instant> {
        self.live_received
    }

    /// The next item; `None` when the watch stopped (the daemon is shutting down).
    pub(crate) async fn next(&mut self) -> Option<Item> {
        self.live_received = None;
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            match self.joined.live.recv().await {
                Some(entry) => {
                    self.live_received = Some(entry.received);
                    return Some(Item::Entry(entry));
                }
                None if self.joined.overflowed.load(Ordering::Acquire) => {
                    tracing::debug!(resource = %self.claim.watch().key.resource.plural, "subscriber fell behind; resyncing");
                    let mut joined = self.claim.watch().join(None);
                    self.pending.push_back(Item::ResyncRequired);
                    self.pending.extend(std::mem::take(&mut joined.initial));
                    self.joined = joined;
                }
                None if self.joined.first_list_done.load(Ordering::Acquire) => {
                    // Joined before the watch's first list completed: replay that list from the history.
                    let mut joined = self.claim.watch().rejoin_after_first_list();
                    self.pending.extend(std::mem::take(&mut joined.initial));
                    self.joined = joined;
                }
                None => return None,
            }
        }
    }
}
