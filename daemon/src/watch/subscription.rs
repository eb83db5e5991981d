//! One subscriber's view of a shared watch: its initial items, then live entries, and a fresh snapshot
//! after RESYNC_REQUIRED when it fell behind. Dropping it releases the shared watch.

use std::{collections::VecDeque, sync::atomic::Ordering};

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
}

impl Subscription {
    pub(super) fn new(claim: WatchClaim, mut joined: Joined) -> Self {
        let pending = std::mem::take(&mut joined.initial).into();
        Self { claim, pending, joined }
    }

    /// The watch incarnation, for cursors.
    pub(crate) fn incarnation(&self) -> u64 {
        self.claim.watch().incarnation
    }

    /// The plural of the watched resource.
    pub(crate) fn resource_plural(&self) -> &str {
        &self.claim.watch().key.resource.plural
    }

    /// The next item; `None` when the watch stopped (the daemon is shutting down).
    pub(crate) async fn next(&mut self) -> Option<Item> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            match self.joined.live.recv().await {
                Some(entry) => return Some(Item::Entry(entry)),
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
