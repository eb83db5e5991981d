//! Who may act, and in which term: the one notion of authority the reconcile queue hands work out under;
//! guarded requests are checked against the same elections ([`Leadership::claim`]). Two kinds: the holder
//! of an election in its term, and for a sharded queue the owner of a key's slot in its epoch.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use consistd_core::claim::Claim;
use tokio::{sync::watch, time::Instant};

use crate::{
    leadership::{Key, Leadership, Observation, Role},
    reconcile::{
        ring::ShardBy,
        shards::{Handoff, Ownership, ShardMember},
    },
    watch::{object::ObjKey, sleep_until},
};

/// Whether a key may be granted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum May {
    /// Yes, in this term (or epoch).
    Grant(u64),
    /// Not here: its slot is another member's, or moving away; the key waits for the slot.
    Park(u16),
    /// Nobody here may act now.
    Nothing,
}

/// The authority work is handed out under.
#[derive(Debug)]
pub(crate) enum Authority {
    /// Anyone may act: work goes out in term 0 and carries no claim.
    Anyone,
    /// The holder of an election, in its term.
    Elected {
        /// The election.
        key: Key,
        /// This daemon's view of it; None once it is no longer followed (the daemon is stopping): then
        /// nobody here may act.
        observation: Option<watch::Receiver<Observation>>,
    },
    /// The owner of a key's slot, in the slot's epoch.
    Sharded {
        /// This daemon's membership of the queue's ring.
        member: ShardMember,
        /// What a key's slot is hashed from.
        by: ShardBy,
        /// What it owns now; None once the member's task ended (the daemon is stopping).
        ownership: Option<watch::Receiver<Ownership>>,
        /// What it owned when the driver last took the ownership in: what it grants under.
        seen: Ownership,
    },
}

impl Authority {
    /// Follows the holder of `election`, or anyone without one.
    pub(crate) fn follow(leadership: &Arc<Leadership>, election: Option<&Key>) -> Self {
        match election {
            None => Self::Anyone,
            Some(key) => Self::Elected { key: key.clone(), observation: Some(leadership.observe(key)) },
        }
    }

    /// A sharded queue's authority: the slots `member` owns, a key's slot hashed `by` its key or namespace.
    pub(crate) fn sharded(member: ShardMember, by: ShardBy) -> Self {
        let mut ownership = member.ownership.clone();
        let seen = ownership.borrow_and_update().clone();
        Self::Sharded { member, by, ownership: Some(ownership), seen }
    }

    /// A sharded queue's ownership as the driver last took it in (see [`Self::changed`]), while the hold
    /// it was published under lasts: the member's current hold is that holding, not lapsed. None while
    /// this member may grant nothing.
    fn hold(&self, now: Instant) -> Option<&Ownership> {
        let Self::Sharded { ownership: Some(rx), seen, .. } = self else { return None };
        // One borrow at a time: a second read lock behind a waiting writer (the member publishing)
        // deadlocks both.
        let lasts = {
            let live = rx.borrow();
            live.holding == seen.holding && live.until.is_some_and(|until| now < until)
        };
        (lasts && seen.until.is_some_and(|until| now < until)).then_some(seen)
    }

    /// The term this daemon may act in now: Some(0) for anyone, the term while it leads the election, None
    /// while it does not. A sharded queue has no one term: Some(0) while its hold lasts (see [`Self::may`]).
    pub(crate) fn term(&self) -> Option<u64> {
        match self {
            Self::Anyone => Some(0),
            Self::Elected { observation: None, .. } => None,
            Self::Elected { observation: Some(rx), .. } => {
                let observation = rx.borrow();
                (observation.role == Role::Leader).then_some(observation.term)
            }
            Self::Sharded { .. } => self.hold(Instant::now()).map(|_| 0),
        }
    }

    /// Whether `key` may be granted at `now`, and in which term. A sharded queue's slots are those the
    /// driver took in, so a slot given to this member is granted from only once the driver took it over.
    pub(crate) fn may(&self, key: &ObjKey, now: Instant) -> May {
        match self {
            Self::Sharded { by, .. } => match self.hold(now) {
                None => May::Nothing,
                Some(ownership) => match ownership.of(by.slot(key), now) {
                    Some((_, epoch, false)) => May::Grant(epoch),
                    Some((slot, _, true)) => May::Park(slot),
                    None => May::Park(by.slot(key)),
                },
            },
            _ => self.term().map_or(May::Nothing, May::Grant),
        }
    }

    /// Whether a lease on `key` granted in `term` still stands at `now`: the term still this daemon's, or
    /// the key's slot still owned (moving away or not) in that epoch while the hold lasts.
    pub(crate) fn holds(&self, key: &ObjKey, term: u64, now: Instant) -> bool {
        match self {
            Self::Sharded { by, .. } => {
                self.hold(now).and_then(|o| o.of(by.slot(key), now)).is_some_and(|(_, epoch, _)| epoch == term)
            }
            _ => self.term() == Some(term),
        }
    }

    /// For a sharded queue, the claim a write for a lease on `key` in epoch `term` carries.
    pub(crate) fn claim(&self, key: &ObjKey, term: u64) -> Option<Claim> {
        let Self::Sharded { member, by, .. } = self else { return None };
        Some(member.names.claim(by.slot(key), term))
    }

    /// The slots owned and moving away, with their epochs.
    pub(crate) fn moving(&self) -> BTreeSet<(u16, u64)> {
        let Some(ownership) = self.hold(Instant::now()) else { return BTreeSet::new() };
        ownership.slots.iter().filter(|(_, (_, moving))| *moving).map(|(slot, (epoch, _))| (*slot, *epoch)).collect()
    }

    /// The slots owned (moving away or not), with their epochs; empty for a queue that is not sharded.
    pub(crate) fn owned(&self) -> BTreeMap<u16, u64> {
        let Some(ownership) = self.hold(Instant::now()) else { return BTreeMap::new() };
        ownership.slots.iter().map(|(slot, (epoch, _))| (*slot, *epoch)).collect()
    }

    /// What the last owner of `slot` handed on with it for the epoch it is owned in now.
    pub(crate) fn handoff(&self, slot: u16) -> Option<Arc<Handoff>> {
        self.hold(Instant::now()).and_then(|o| o.handoffs.get(&slot).cloned())
    }

    /// Whether a key that changed now would wait for another member's slot (so the change is noted for a
    /// hand-off of it).
    pub(crate) fn elsewhere(&self, key: &ObjKey, now: Instant) -> bool {
        matches!(self, Self::Sharded { .. }) && !matches!(self.may(key, now), May::Grant(_))
    }

    /// Tells a sharded queue's member that its queue ends with no lease out: it leaves, every slot carrying
    /// its keys' state.
    pub(crate) fn leaving(&self, slots: Vec<Handoff>) {
        if let Self::Sharded { member, .. } = self {
            member.leaving(slots);
        }
    }

    /// Tells a sharded queue's member that slots moving away have no lease out, with their keys' state.
    pub(crate) fn drained(&self, slots: Vec<Handoff>) {
        if let Self::Sharded { member, .. } = self {
            member.drained(slots);
        }
    }

    /// The sharded queue's member, for status.
    pub(crate) fn member(&self) -> Option<&ShardMember> {
        match self {
            Self::Sharded { member, .. } => Some(member),
            _ => None,
        }
    }

    /// Resolves when who may act may have changed (for a sharded queue, also when its hold lapses); never
    /// for anyone.
    pub(crate) async fn changed(&mut self) {
        match self {
            Self::Anyone | Self::Elected { observation: None, .. } | Self::Sharded { ownership: None, .. } => {
                std::future::pending::<()>().await;
            }
            Self::Elected { key, observation } => {
                let Some(rx) = observation else { return };
                if rx.changed().await.is_err() {
                    tracing::debug!(election = %key, "election no longer followed: nobody here may act");
                    *observation = None;
                }
            }
            Self::Sharded { ownership, seen, .. } => {
                let Some(rx) = ownership else { return };
                let until = seen.until.filter(|until| *until > Instant::now());
                tokio::select! {
                    changed = rx.changed() => match changed {
                        Ok(()) => *seen = rx.borrow_and_update().clone(),
                        Err(_) => *ownership = None,
                    },
                    () = sleep_until(until) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_holder_acts_in_its_term_and_nobody_once_the_election_is_no_longer_followed() {
        assert_eq!(Authority::Anyone.term(), Some(0));
        let (tx, rx) = watch::channel(Observation::unknown("me"));
        let key = Key { namespace: "ns".into(), name: "e".into() };
        let mut authority = Authority::Elected { key, observation: Some(rx) };
        assert_eq!(authority.term(), None, "not leading");
        tx.send_replace(Observation { role: Role::Leader, term: 3, ..Observation::unknown("me") });
        authority.changed().await;
        assert_eq!(authority.term(), Some(3));
        drop(tx);
        authority.changed().await;
        assert_eq!(authority.term(), None, "fail closed: never as if there were no election");
    }
}
