//! The channel leader's record of what every member applied: each member's app reports a version by
//! ACKing the leader's message that carried it, the leader's outbox sees the ACK, and the leader writes
//! what the ACKs told it on its own member Lease, once per version when every live member has it (or
//! [`FLUSH_AFTER`] after the first change not yet written). One write per version for the whole group,
//! where a write per member per version cost the barrier about 2 ms per replica.

use std::{collections::HashSet, sync::Arc};

use consistd_cluster::leadership::{Key, Observation, Role, group::GroupReader};
use consistd_core::lease::AppliedBy;
use tokio::{
    sync::{broadcast, watch},
    time::{Duration, Instant},
};

use super::{Rollout, inbound};
use crate::outbox::{Destination, Outcome, OutcomeKind, destination::split_member};

/// How long a change to the record may wait to be written while some live member has not applied the
/// newest version: what GetRolloutStatus may lag behind the members' ACKs.
const FLUSH_AFTER: Duration = Duration::from_millis(200);

/// The channels whose record this daemon keeps now (one keeper per channel, however many apps subscribe).
pub(super) type Keeping = Arc<std::sync::Mutex<HashSet<Key>>>;

/// Keeps the record of one channel while this daemon leads it.
#[derive(Debug)]
struct Tally {
    rollout: Rollout,
    key: Key,
    states: watch::Receiver<Observation>,
    /// Subscribed before the version that starts the tally goes out (`keep_progress` runs first in
    /// `publish_as_leader` and `resend_latest`), so no ACK of it is missed.
    outcomes: broadcast::Receiver<Outcome>,
}

impl Rollout {
    /// Starts recording `key`'s members' progress, unless that runs already; it runs while this daemon
    /// leads the channel.
    pub(super) fn keep_progress(&self, key: &Key) {
        let mut keeping = self.keeping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if keeping.insert(key.clone()) {
            let tally = Tally {
                rollout: self.clone(),
                key: key.clone(),
                states: self.leadership.observe(key),
                outcomes: self.outbox.outcomes(),
            };
            self.tasks.spawn(tally.run());
        }
    }
}

impl Tally {
    /// Records the members' ACKs until this daemon no longer leads the channel (or stops).
    async fn run(mut self) {
        let (namespace, name) = (self.key.namespace.clone(), self.key.name.clone());
        match self.rollout.barrier.group(&namespace, &name).await {
            Ok(group) => self.record(group).await,
            Err(error) => {
                tracing::warn!(error = %consistd_core::error::chain(&error), channel = %name, "cannot read the channel's members; members' applied versions reach the barrier at their renewals only");
            }
        }
        let mut keeping = self.rollout.keeping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        keeping.remove(&self.key);
    }

    async fn record(&mut self, mut group: GroupReader) {
        let destination = Destination::Election { namespace: self.key.namespace.clone(), name: self.key.name.clone() };
        let resource_id = inbound::resource_id(&self.key.name);
        let leadership = self.rollout.leadership.clone();
        let mut record = leadership.applied_by(&self.key);
        let mut written = record.clone();
        let mut unwritten_since: Option<Instant> = None;
        loop {
            if self.states.borrow().role != Role::Leader {
                return;
            }
            if record != written
                && group.synced()
                && (complete(&group, &record) || unwritten_since.is_some_and(|at| at.elapsed() >= FLUSH_AFTER))
            {
                // Members whose Lease is gone (they left) are left out.
                let members: HashSet<&str> = group.members().map(|m| m.record.identity.as_str()).collect();
                record.0.retain(|identity, _| members.contains(identity.as_str()));
                leadership.record_applied_by(&self.key, record.clone());
                written = record.clone();
                unwritten_since = None;
            }
            // Only once the group is read completely: before that nothing is written, and a flush time
            // already passed would wake this loop at once, again and again.
            let flush_at = unwritten_since.filter(|_| group.synced()).map(|at| at + FLUSH_AFTER);
            tokio::select! {
                outcome = self.outcomes.recv() => match outcome {
                    Ok(o) if o.kind == OutcomeKind::Acked && o.message.destination == destination && o.message.resource_id == resource_id => {
                        // The outbox names a member's peer "identity@address".
                        let (identity, address) = split_member(&o.peer);
                        let member = group
                            .members()
                            .map(|m| &m.record)
                            .find(|r| r.peer == address && identity.is_none_or(|id| id == r.identity));
                        if let (Ok(version), Some(member)) = (o.message.event_id.parse::<u64>(), member) {
                            let entry = record.0.entry(member.identity.clone()).or_default();
                            if entry.1 != member.incarnation || entry.0 < version {
                                *entry = (version, member.incarnation.clone());
                                unwritten_since.get_or_insert_with(Instant::now);
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(channel = %self.key.name, missed, "missed outcomes; the members' renewals carry what they applied");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                more = group.changed() => if !more { return },
                () = async { match flush_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
                changed = self.states.changed() => if changed.is_err() { return },
            }
        }
    }
}

/// Whether every live member applied the newest version in `record`.
fn complete(group: &GroupReader, record: &AppliedBy) -> bool {
    let newest = record.0.values().map(|(version, _)| *version).max().unwrap_or(0);
    let now = Instant::now();
    group.members().filter(|m| group.live_at(m, now)).all(|m| {
        let r = &m.record;
        AppliedBy::newest(r.applied, [record], &r.identity, &r.incarnation) >= newest
    })
}
