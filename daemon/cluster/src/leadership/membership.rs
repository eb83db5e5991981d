//! Election groups: while a daemon campaigns in an election it announces itself as a member with a
//! Lease of its own (`<election>.member.<identity>`, labelled `consistd.io/member-of=<election>`,
//! annotated with its peer address), deleted when it stops campaigning. A member counts until its TTL
//! has passed since it was last seen: renewing its Lease, or reached by the election's leader, whose
//! roll call (`rollcall`) records every member it reached on the leader's own member Lease. So a member
//! renews every third of the TTL only while no leader's record keeps it counted; with one, it renews
//! only when that record would otherwise lapse within a quarter of the TTL. The Lease also carries the newest
//! rollout version the member's app applied (written at once, or at the next renewal when the channel's
//! leader hears of it through its ACKs), its incarnation, and on the channel leader's Lease the leader's
//! record of what every member applied. Outbox election destinations and replica barriers read the group
//! from these Leases.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use consistd_core::{
    config::Live,
    lease::{
        APPLIED_BY_ANNOTATION, APPLIED_VERSION_ANNOTATION, AppliedBy, ELECTION_ANNOTATION, INCARNATION_ANNOTATION,
        MANAGED_BY, MANAGED_BY_LABEL, MEMBER_OF_LABEL, PEER_ADDRESS_ANNOTATION, REACHED_ANNOTATION, Reached,
    },
    tasks::Tasks,
};
use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    Key, LeadershipError,
    group::GroupReader,
    member_lease::{Contacts, group_label, lease_name},
    rollcall::Reacher,
};
use crate::watch::Hub;

/// How this daemon announces itself.
#[derive(Debug, Clone)]
pub struct Announce {
    /// The address peers reach this daemon at.
    pub address: String,
    /// How long a member counts after its last contact (`membership.ttl`, as reloads change it: the next
    /// renewal writes the new one).
    pub ttl: Live<Duration>,
    /// How this daemon, leading an election, reaches the members of its group (None: it does not, and
    /// members renew their own Leases).
    pub reacher: Option<Arc<dyn Reacher>>,
}

/// What an election leader's written records say of this member's run, as the leader's roll call told it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Vouch {
    /// Until when its roll call record keeps this member counted.
    until: Option<Instant>,
    /// The applied version its record of what every member applied holds for this member.
    applied: u64,
}

/// The member Leases this daemon keeps, one per election it campaigns in.
pub(super) struct Membership {
    client: kube::Client,
    /// Where a leaving member reads its group (see [`Keeper::hand_back`]).
    hub: Arc<Hub>,
    identity: String,
    announce: Option<Announce>,
    held: Mutex<HashMap<Key, Seat>>,
    /// Runs the keepers; its stop signal ends every seat, and shutdown waits for the keepers through it.
    tasks: Tasks,
}

#[derive(Debug)]
struct Seat {
    uses: usize,
    stop: CancellationToken,
    /// This run's id on the Lease (see [`INCARNATION_ANNOTATION`]).
    incarnation: String,
    /// What the leader's written records say of this member, as the leader told it when it last reached it.
    vouched: watch::Sender<Vouch>,
    /// What the member Lease is to say.
    announced: watch::Sender<Announced>,
    /// What the keeper's writes of the member Lease came to.
    written: watch::Receiver<Written>,
}

/// What a member Lease is to say beyond who and where the member is.
#[derive(Debug, Clone, Default)]
struct Announced {
    /// The newest version of the channel the member's app applied.
    applied: u64,
    /// While this daemon leads the channel: its record of what every member applied.
    applied_by: Option<AppliedBy>,
    /// While this daemon leads the election: the members its roll call reached (the next renewal writes
    /// them, with their ages then).
    reached: Contacts,
    /// Bumped by each change to write at once; other changes wait for the next renewal.
    urgent: u64,
}

/// What the writes of a member Lease came to, as ReportApplied waits on them.
#[derive(Debug, Clone, Default)]
pub(super) struct Written {
    /// The applied version the member Lease holds (written and confirmed by the apiserver).
    pub recorded: u64,
    /// Writes attempted so far, so that a report is answered only by writes attempted after it.
    pub attempts: u64,
    /// While writes fail: the applied version the last one carried, and the apiserver's answer (a 403
    /// when RBAC grants no patch on leases).
    pub failed: Option<(u64, Arc<kube::Error>)>,
    /// The roll call contacts the Lease holds (written and confirmed by the apiserver).
    pub reached: Contacts,
    /// The record of what every member applied the Lease holds (written and confirmed).
    pub applied_by: AppliedBy,
}

/// Keeps this daemon in an election group while held.
#[derive(Debug)]
pub(super) struct SeatGuard {
    membership: std::sync::Arc<Membership>,
    key: Key,
}

impl Drop for SeatGuard {
    fn drop(&mut self) {
        let mut held = self.membership.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get_mut(&self.key) {
            h.uses -= 1;
            if h.uses == 0 {
                // The task deletes the Lease on its way out.
                h.stop.cancel();
                held.remove(&self.key);
            }
        }
    }
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership").field("announce", &self.announce).finish_non_exhaustive()
    }
}

impl Membership {
    pub(super) fn new(
        client: kube::Client,
        hub: Arc<Hub>,
        identity: String,
        announce: Option<Announce>,
        tasks: Tasks,
    ) -> Self {
        Self { client, hub, identity, announce, held: Mutex::new(HashMap::new()), tasks }
    }

    /// Joins `key`'s group until the returned guard drops; None when this daemon has no peer address.
    /// With the guard, the new seat's stop signal when this join made the seat (the roll call, run while
    /// this member leads, ends with it).
    pub(super) fn join(self: &std::sync::Arc<Self>, key: &Key) -> Option<(SeatGuard, Option<CancellationToken>)> {
        let announce = self.announce.clone()?;
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let made = match held.get_mut(key) {
            Some(h) => {
                h.uses += 1;
                None
            }
            None => {
                let stop = self.tasks.signal().child_token();
                let (announced, to_announce) = watch::channel(Announced::default());
                let (confirm, written) = watch::channel(Written::default());
                let (vouched, vouched_until) = watch::channel(Vouch::default());
                let incarnation = format!("{:08x}", rand::random::<u32>());
                let keeper = Keeper {
                    api: Api::namespaced(self.client.clone(), &key.namespace),
                    hub: self.hub.clone(),
                    key: key.clone(),
                    election: key.name.clone(),
                    identity: self.identity.clone(),
                    incarnation: incarnation.clone(),
                    announce,
                    announced: to_announce,
                    vouched: vouched_until,
                    written: confirm,
                };
                self.tasks.spawn(keeper.run(stop.clone()));
                held.insert(
                    key.clone(),
                    Seat { uses: 1, stop: stop.clone(), incarnation, vouched, announced, written },
                );
                Some(stop)
            }
        };
        Some((SeatGuard { membership: self.clone(), key: key.clone() }, made))
    }

    /// How long a member counts after its last contact.
    pub(super) fn ttl(&self) -> Option<Duration> {
        self.announce.as_ref().map(|a| a.ttl.get())
    }

    /// How this daemon reaches members when it leads (None: it does not).
    pub(super) fn reacher(&self) -> Option<Arc<dyn Reacher>> {
        self.announce.as_ref().and_then(|a| a.reacher.clone())
    }

    /// Answers a leader's roll call: checks that this daemon is `identity` in `key`'s group, notes what
    /// the leader's written records say of this run (`recorded_age`: how long ago the contact it holds
    /// for `incarnation` was made; `recorded_applied`: the applied version it holds for it), and returns
    /// this run's incarnation.
    pub(super) fn reached(
        &self,
        key: &Key,
        identity: &str,
        incarnation: &str,
        (recorded_age, recorded_applied): (Option<Duration>, u64),
    ) -> Result<String, LeadershipError> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let (Some(h), Some(ttl)) = (held.get(key), self.ttl()) else {
            return Err(LeadershipError::NotMember { election: key.to_string() });
        };
        if identity != self.identity {
            return Err(LeadershipError::NotThisMember {
                election: key.to_string(),
                identity: self.identity.clone(),
                asked: identity.to_owned(),
            });
        }
        if incarnation == h.incarnation {
            let until = recorded_age.and_then(|age| Instant::now().checked_sub(age)).map(|contact| contact + ttl);
            h.vouched.send_if_modified(|v| {
                let news = Vouch { until: v.until.max(until), applied: v.applied.max(recorded_applied) };
                let changed = news != *v;
                *v = news;
                changed
            });
        }
        Ok(h.incarnation.clone())
    }

    /// `key`'s holder or term changed: what the former leader's record said of this member no longer
    /// counts here (a leader that leaves deletes its Lease, and its record with it), so the member
    /// renews on its own cadence, at once when its own renewal is a third of the TTL old, until the new
    /// leader's roll call vouches for it again.
    pub(super) fn leader_changed(&self, key: &Key) {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get(key) {
            h.vouched.send_if_modified(|v| std::mem::take(v) != Vouch::default());
        }
    }

    /// Sets the members this daemon's roll call reached as `key`'s leader, for its member Lease's next
    /// renewal. A daemon that calls the roll renews on its own cadence: nobody else's record is to keep
    /// its Lease, which carries the record, from being written. Returns whether some of them are not in the
    /// record this Lease holds yet: they are written at once (until a member hears of that record it renews
    /// its own Lease), and the caller calls them again soon to tell them.
    pub(super) fn record_reached(&self, key: &Key, reached: Contacts) -> bool {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(h) = held.get(key) else { return false };
        h.vouched.send_if_modified(|v| v.until.take().is_some());
        let unrecorded = unrecorded(&reached, &h.written.borrow().reached);
        h.announced.send_if_modified(|a| {
            let changed = a.reached != reached;
            a.reached = reached;
            if unrecorded {
                a.urgent += 1;
            }
            changed || unrecorded
        });
        unrecorded
    }

    /// The roll call contacts and the record of what every member applied that this daemon's member
    /// Lease of `key` holds now.
    pub(super) fn written_records(&self, key: &Key) -> (Contacts, AppliedBy) {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(key).map(|h| h.written.borrow()).map(|w| (w.reached.clone(), w.applied_by.clone())).unwrap_or_default()
    }

    /// Announces that this member's app applied `version` of `key`'s channel: written at once when
    /// `now`, else at the next renewal. The returned receiver sees what the writes of the member Lease
    /// came to, with the number of writes attempted before this report. None when this daemon is not a
    /// member of that group.
    pub(super) fn report_applied(&self, key: &Key, version: u64, now: bool) -> Option<(watch::Receiver<Written>, u64)> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let h = held.get(key)?;
        // Counted before the keeper is woken, so no write carrying this version is missed. A version
        // noted for the next renewal and then reported to be written now is written now.
        let (attempts, unwritten) = {
            let w = h.written.borrow();
            (w.attempts, version > w.recorded)
        };
        h.announced.send_if_modified(|a| {
            let newer = version > a.applied;
            if newer {
                a.applied = version;
            }
            let write_now = now && unwritten;
            if write_now {
                a.urgent += 1;
            }
            newer || write_now
        });
        Some((h.written.clone(), attempts))
    }

    /// Writes `record` (the channel leader's record of what every member applied) on this daemon's member
    /// Lease of `key` at once; nothing when this daemon is not a member of that group.
    pub(super) fn record_applied_by(&self, key: &Key, record: AppliedBy) {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(h) = held.get(key) else { return };
        h.announced.send_if_modified(|a| {
            let changed = a.applied_by.as_ref() != Some(&record);
            if changed {
                a.applied_by = Some(record);
                a.urgent += 1;
            }
            changed
        });
    }

    /// The record of what every member applied this daemon last wrote as `key`'s channel leader.
    pub(super) fn applied_by(&self, key: &Key) -> AppliedBy {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(key).and_then(|h| h.announced.borrow().applied_by.clone()).unwrap_or_default()
    }

    /// Whether this daemon is a member of `key`'s group.
    pub(super) fn holds(&self, key: &Key) -> bool {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).contains_key(key)
    }

    /// Whether this daemon announces itself (has a peer address).
    pub(super) fn announces(&self) -> bool {
        self.announce.is_some()
    }

    /// The applied version announced for `key` (0 when none, or not a member).
    pub(super) fn applied(&self, key: &Key) -> u64 {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(key).map_or(0, |h| h.announced.borrow().applied)
    }
}

/// The task that keeps one member Lease.
struct Keeper {
    api: Api<Lease>,
    hub: Arc<Hub>,
    key: Key,
    election: String,
    identity: String,
    /// This run's id on the Lease (see [`INCARNATION_ANNOTATION`]).
    incarnation: String,
    announce: Announce,
    /// What the Lease is to say.
    announced: watch::Receiver<Announced>,
    /// What a leader's written records say of this member.
    vouched: watch::Receiver<Vouch>,
    /// Every write's outcome: the applied version once the Lease holds it, or why it does not.
    written: watch::Sender<Written>,
}

impl Keeper {
    /// Creates and renews the member Lease (at once after an urgent change of what it announces; else
    /// every third of the TTL, or, while a leader's record keeps this member counted, a quarter of the
    /// TTL before that record lapses, or a third of the TTL after noting a version the leader's record
    /// does not hold) until `stop`, then deletes it.
    async fn run(mut self, stop: CancellationToken) {
        let (election, identity) = (self.election.clone(), self.identity.clone());
        let name = lease_name(&election, &identity);
        // The resourceVersion of this keeper's last write: the Lease is deleted only as it left it.
        let mut last_written: Option<String> = None;
        loop {
            let ttl = self.announce.ttl.get();
            let renew_every = ttl / 3;
            let ttl_seconds = i32::try_from(ttl.as_secs().max(1)).unwrap_or(i32::MAX);
            let announced = self.announced.borrow_and_update().clone();
            let applied = announced.applied;
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            let mut annotations = serde_json::json!({
                PEER_ADDRESS_ANNOTATION: self.announce.address,
                ELECTION_ANNOTATION: election,
                INCARNATION_ANNOTATION: self.incarnation,
            });
            if applied > 0 {
                annotations[APPLIED_VERSION_ANNOTATION] = applied.to_string().into();
            }
            if let Some(record) = &announced.applied_by {
                annotations[APPLIED_BY_ANNOTATION] = record.encode().into();
            }
            // Contacts a TTL old keep nobody counted; the others stay after this daemon stops leading, as
            // members were told they would.
            let at = Instant::now();
            let reached: Contacts =
                announced.reached.into_iter().filter(|(_, (_, contact))| at.duration_since(*contact) < ttl).collect();
            if !reached.is_empty() {
                let ages = reached.iter().map(|(identity, (incarnation, contact))| {
                    (identity.clone(), (incarnation.clone(), at.duration_since(*contact)))
                });
                annotations[REACHED_ANNOTATION] = Reached(ages.collect()).encode().into();
            }
            let lease = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "labels": { MEMBER_OF_LABEL: group_label(&election), MANAGED_BY_LABEL: MANAGED_BY },
                    "annotations": annotations,
                },
                "spec": { "holderIdentity": identity, "leaseDurationSeconds": ttl_seconds, "renewTime": now },
            });
            let params = PatchParams::apply("consistd-membership").force();
            match self.api.patch(&name, &params, &Patch::Apply(&lease)).await {
                Ok(written) => {
                    last_written = written.metadata.resource_version;
                    self.written.send_modify(|w| {
                        w.attempts += 1;
                        w.recorded = applied;
                        w.failed = None;
                        w.reached = reached;
                        w.applied_by = announced.applied_by.unwrap_or_default();
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, election, lease = name, "could not renew group membership; retrying");
                    self.written.send_modify(|w| {
                        w.attempts += 1;
                        w.failed = Some((applied, Arc::new(error)));
                    });
                }
            }
            // Until the next renewal, or an urgent change; other changes ride with the renewal.
            let renew_at = Instant::now() + renew_every;
            let urgent = announced.urgent;
            // Since when a version noted for the next renewal has been waiting.
            let mut noted_at: Option<Instant> = None;
            let wait = async {
                loop {
                    let vouch = *self.vouched.borrow_and_update();
                    let noted = self.announced.borrow().applied;
                    if noted > applied && noted > vouch.applied {
                        noted_at.get_or_insert_with(Instant::now);
                    }
                    let due = next_renewal(renew_at, ttl, vouch, (noted, applied, noted_at));
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => return true,
                        changed = self.announced.changed() => {
                            if changed.is_err() || self.announced.borrow().urgent != urgent {
                                return changed.is_ok();
                            }
                        }
                        Ok(()) = self.vouched.changed() => {}
                    }
                }
            };
            tokio::select! {
                more = wait => if !more { break },
                () = stop.cancelled() => break,
            }
        }
        self.hand_back().await;
        // Not a Lease a later run of this member (the app back at once) has written since.
        let params = DeleteParams {
            preconditions: Some(Preconditions { resource_version: last_written, uid: None }),
            ..DeleteParams::default()
        };
        match tokio::time::timeout(Duration::from_secs(2), self.api.delete(&name, &params)).await {
            Ok(Ok(_)) => tracing::info!(election, lease = name, "left the election group"),
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                tracing::info!(election, lease = name, "left the election group; a later run keeps its Lease")
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, election, lease = name, "could not delete member Lease; it expires")
            }
            Err(_) => tracing::warn!(election, lease = name, "deleting member Lease timed out; it expires"),
        }
    }

    /// Before the Lease goes, and with it the roll call record it carries: waits, at most [`HAND_BACK`],
    /// until every member that record alone keeps counted renews its own Lease, or the record's contact
    /// with it lapses. They renew once they see this daemon's release (or any change of leader), which
    /// shutdown sends at the same time; readers that open the group after the Lease is gone know only
    /// the members' own renewals.
    async fn hand_back(&self) {
        let ttl = self.announce.ttl.get();
        let started = Instant::now();
        let vouched: HashMap<String, (String, Instant)> = self
            .written
            .borrow()
            .reached
            .iter()
            .filter(|(_, (_, contact))| *contact + ttl > started)
            .map(|(identity, (incarnation, contact))| (identity.clone(), (incarnation.clone(), *contact + ttl)))
            .collect();
        if vouched.is_empty() {
            return;
        }
        let deadline = started + HAND_BACK;
        let Ok(Ok(mut group)) =
            tokio::time::timeout(HAND_BACK, GroupReader::open(&self.hub, &self.key.namespace, &self.key.name)).await
        else {
            return;
        };
        loop {
            let now = Instant::now();
            let waiting = group.synced().then(|| {
                group
                    .members()
                    .filter(|m| {
                        vouched.get(&m.record.identity).is_some_and(|(incarnation, lapses)| {
                            *incarnation == m.record.incarnation
                                && *lapses > now
                                && m.renewal_expires_at().is_none_or(|at| at < now + ttl / 2)
                        })
                    })
                    .count()
            });
            if waiting == Some(0) {
                tracing::debug!(election = %self.key, waited = ?started.elapsed(), "members renewed for themselves");
                return;
            }
            tokio::select! {
                more = group.changed() => if !more { return },
                () = tokio::time::sleep_until(deadline) => {
                    let members = waiting.unwrap_or(vouched.len());
                    tracing::info!(election = %self.key, members, "leaving before every member this daemon's record keeps counted renewed for itself");
                    return;
                }
            }
        }
    }
}

/// Whether a member in `reached` is missing from the `written` record, or in it as another run.
fn unrecorded(reached: &Contacts, written: &Contacts) -> bool {
    reached.iter().any(|(identity, (incarnation, _))| written.get(identity).is_none_or(|(was, _)| was != incarnation))
}

/// How long a leaving member waits for the members its roll call record keeps counted to renew their
/// own Leases (they do within milliseconds unless they cannot write): within the default 5 s shutdown
/// grace period with the 2 s the delete may take.
const HAND_BACK: Duration = Duration::from_secs(2);

/// When a member Lease last written at `renew_at - ttl/3` with applied version `written` is renewed:
/// at `renew_at`; while a leader's record keeps the member counted (`vouch`), only a quarter of the TTL
/// before that record lapses; but a version `noted` (since `noted_at`) for the next renewal that no
/// leader's record holds is written a third of the TTL after it was noted (its ACK may have gone to a
/// leader since gone).
fn next_renewal(
    renew_at: Instant,
    ttl: Duration,
    vouch: Vouch,
    (noted, written, noted_at): (u64, u64, Option<Instant>),
) -> Instant {
    let due = match vouch.until {
        Some(until) => renew_at.max(until.checked_sub(ttl / 4).unwrap_or(renew_at)),
        None => renew_at,
    };
    match noted_at {
        Some(at) if noted > written && noted > vouch.applied => due.min(at + ttl / 3),
        _ => due,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_member_the_leader_vouches_for_renews_only_before_the_record_lapses_or_to_write_what_it_lacks() {
        let ttl = Duration::from_secs(30);
        let now = Instant::now();
        let renew_at = now + ttl / 3;
        let nothing = (0, 0, None);
        assert_eq!(next_renewal(renew_at, ttl, Vouch::default(), nothing), renew_at, "nobody vouches");
        let until = now + Duration::from_secs(28);
        let vouched = Vouch { until: Some(until), applied: 4 };
        assert_eq!(next_renewal(renew_at, ttl, vouched, nothing), until - ttl / 4, "a quarter TTL before it lapses");
        let lapsing = Vouch { until: Some(now + Duration::from_secs(5)), applied: 4 };
        assert_eq!(next_renewal(renew_at, ttl, lapsing, nothing), renew_at, "never sooner than its own cadence");
        // A version noted for the next renewal: the leader's record holds it, or it is written 10 s on.
        let noted_at = now + Duration::from_secs(1);
        assert_eq!(next_renewal(renew_at, ttl, vouched, (4, 3, Some(noted_at))), until - ttl / 4, "recorded");
        assert_eq!(next_renewal(renew_at, ttl, vouched, (5, 3, Some(noted_at))), noted_at + ttl / 3, "not recorded");
        assert_eq!(next_renewal(renew_at, ttl, vouched, (5, 5, Some(noted_at))), until - ttl / 4, "written already");
    }

    #[test]
    fn a_member_reached_but_not_in_the_written_record_or_as_another_run_is_unrecorded() {
        let at = Instant::now();
        let contacts = |entries: &[(&str, &str)]| -> Contacts {
            entries.iter().map(|(id, run)| ((*id).to_owned(), ((*run).to_owned(), at))).collect()
        };
        let written = contacts(&[("a", "1"), ("b", "1")]);
        assert!(!unrecorded(&contacts(&[("a", "1")]), &written), "all written");
        assert!(!unrecorded(&contacts(&[]), &written));
        assert!(unrecorded(&contacts(&[("a", "1"), ("c", "1")]), &written), "a new member");
        assert!(unrecorded(&contacts(&[("b", "2")]), &written), "a member's next run");
    }

    #[test]
    fn names_are_readable_when_valid_and_hashed_otherwise() {
        assert_eq!(lease_name("web", "web-0"), "web.member.web-0");
        let hashed = lease_name("web", "Web_0");
        assert!(hashed.starts_with("consistd-member-") && consistd_core::names::is_dns_subdomain(&hashed), "{hashed}");
        assert_ne!(lease_name("web", "Web_0"), lease_name("web", "Web_1"));
        assert_eq!(group_label("web"), "web");
        let long = "a".repeat(100);
        assert!(group_label(&long).len() <= 63);
    }
}
