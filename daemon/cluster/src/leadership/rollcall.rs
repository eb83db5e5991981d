//! The election leader's roll call: while this daemon leads an election whose group it is in, it reaches
//! every other member over the peer transport every sixth of the membership TTL, and its member Lease's
//! renewals record whom it reached and how long before (`consistd.io/reached`). Readers count a member
//! for its TTL after its last contact, so a member the leader reaches need not renew its own Lease: an
//! idle group costs the apiserver the leader's renewals, not every member's. Each reached member is told
//! how old the contact in the leader's written record is, and renews its own Lease only when that record
//! would lapse within a quarter of the TTL (the leader gone, or unable to write). It is also told the
//! applied version the leader's record holds for it, so a version it noted for its next renewal is
//! written by the member only when no leader recorded it. A daemon that becomes leader calls the roll at
//! once; a member that joins (or comes back as another run) is called a moment later, written into the
//! record at once, and called again, so it hears of the record before its own first renewal is due.

use std::{collections::HashSet, sync::Arc, time::Duration};

use consistd_core::lease::AppliedBy;
use futures::{StreamExt, future::BoxFuture, stream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Key, Leadership, Role, group::GroupReader, member_lease::Contacts};

/// How many members are reached at once.
const IN_FLIGHT: usize = 32;
/// A member the roll call has not reached, or reached but its written record lacks, is called after this
/// fraction of the TTL (1 s at the default 30 s), not a sixth: a member that joins is counted by the
/// leader's written record, and told so, well before its own first renewal (a third of the TTL after it
/// joined).
const FOLLOW_UP: u32 = 30;
/// How long reaching one member may take.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(2);

/// One roll call: what the leader asks of a member.
#[derive(Debug, Clone)]
pub struct Call {
    /// The election.
    pub key: Key,
    /// The member the leader means to reach.
    pub identity: String,
    /// The run of the member its Lease names.
    pub incarnation: String,
    /// How long ago the contact the leader's written record holds for that run was made; None when it
    /// holds none.
    pub recorded_age: Option<Duration>,
    /// The applied version the leader's written record of what every member applied holds for that run.
    pub recorded_applied: u64,
}

/// How a leader reaches the members of its group.
pub trait Reacher: std::fmt::Debug + Send + Sync {
    /// Makes `call` to the member at `peer` ("host:port"): the incarnation that answered, or why none did.
    fn reach(&self, peer: &str, call: Call) -> BoxFuture<'static, Result<String, String>>;
}

/// Calls the roll of `key`'s group whenever this daemon leads it, until `stop` (its seat's end).
pub(super) async fn run(leadership: Arc<Leadership>, key: Key, stop: CancellationToken) {
    let Some(reacher) = leadership.membership.reacher() else { return };
    // What this daemon's Lease holds already, so a leader elected again keeps counting its contacts.
    let mut reached = leadership.membership.written_records(&key).0;
    let mut group: Option<GroupReader> = None;
    let mut election = leadership.observe(&key);
    loop {
        let Some(ttl) = leadership.membership.ttl() else { return };
        let leading = election.borrow_and_update().role == Role::Leader;
        if !leading {
            group = None;
        } else if group.is_none() {
            match GroupReader::open(&leadership.hub, &key.namespace, &key.name).await {
                Ok(g) => group = Some(g),
                Err(error) => tracing::warn!(
                    error = %consistd_core::error::chain(&error), election = %key,
                    "cannot read the election group; its members renew their own Leases"
                ),
            }
        }
        let mut unrecorded = false;
        if let Some(g) = group.as_ref().filter(|g| g.synced()) {
            let written = leadership.membership.written_records(&key);
            call_roll(reacher.as_ref(), &key, &leadership.identity, g, &written, &mut reached, ttl).await;
            unrecorded = leadership.membership.record_reached(&key, reached.clone());
        }
        // Until the next round, keeping the group current meanwhile. A member not reached yet (one that
        // joined, or its next run) is called soon, and one reached that the written record did not hold is
        // written at once and told so soon: until it hears of that record it renews its own Lease.
        let mut next = Instant::now() + if unrecorded { ttl / FOLLOW_UP } else { ttl / 6 };
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => break,
                () = stop.cancelled() => return,
                // Became leader, or no longer is: at once (a leader's renewals change its observation too).
                changed = election.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if (election.borrow_and_update().role == Role::Leader) != leading {
                        break;
                    }
                }
                more = async { match group.as_mut() { Some(g) => g.changed().await, None => std::future::pending().await } } => {
                    if !more {
                        group = None;
                    } else if group.as_ref().is_some_and(|g| g.synced() && unreached(g, &leadership.identity, &reached)) {
                        next = next.min(Instant::now() + ttl / FOLLOW_UP);
                    }
                }
            }
        }
    }
}

/// Whether `group` has a member but `me` that the roll call has not reached (in its current run).
fn unreached(group: &GroupReader, me: &str, reached: &Contacts) -> bool {
    group
        .members()
        .map(|m| &m.record)
        .filter(|r| r.identity != me)
        .any(|r| reached.get(&r.identity).is_none_or(|(incarnation, _)| *incarnation != r.incarnation))
}

/// Reaches every member of `group` but `me`, and notes in `reached` each one that answered.
async fn call_roll(
    reacher: &dyn Reacher,
    key: &Key,
    me: &str,
    group: &GroupReader,
    (written, applied_by): &(Contacts, AppliedBy),
    reached: &mut Contacts,
    ttl: Duration,
) {
    let calls: Vec<(String, Call)> = group
        .members()
        .map(|m| &m.record)
        .filter(|r| r.identity != me)
        .map(|r| {
            let recorded = written.get(&r.identity).filter(|(incarnation, _)| *incarnation == r.incarnation);
            let call = Call {
                key: key.clone(),
                identity: r.identity.clone(),
                incarnation: r.incarnation.clone(),
                recorded_age: recorded.map(|(_, contact)| contact.elapsed()),
                recorded_applied: applied_by.applied(&r.identity, &r.incarnation),
            };
            (r.peer.clone(), call)
        })
        .collect();
    let answers: Vec<_> = stream::iter(calls)
        .map(|(peer, call)| {
            let (identity, sent) = (call.identity.clone(), Instant::now());
            let reach = reacher.reach(&peer, call);
            async move { (identity, peer, sent, tokio::time::timeout(REACH_TIMEOUT, reach).await) }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for (identity, peer, sent, answer) in answers {
        match answer {
            Ok(Ok(incarnation)) => {
                reached.insert(identity, (incarnation, sent));
            }
            Ok(Err(error)) => tracing::debug!(election = %key, member = identity, peer, error, "member not reached"),
            Err(_) => tracing::debug!(election = %key, member = identity, peer, "member not reached in time"),
        }
    }
    // Members whose Lease is gone left the group; a contact a TTL old keeps nobody counted.
    let members: HashSet<&str> = group.members().map(|m| m.record.identity.as_str()).collect();
    reached.retain(|identity, (_, contact)| members.contains(identity.as_str()) && contact.elapsed() < ttl);
}
