//! Election groups as the outbox and the replica barrier read them: the member Leases of one election
//! through the watch hub, and the one rule for who is live. A member counts for its TTL after its last
//! contact: its own renewal, or the election leader reaching it in its roll call (recorded, with how long
//! before, on the leader's member Lease; a contact outlives that record until it lapses). When a Lease is first seen, its renewal's age comes from its
//! renewTime and this machine's wall clock; after that, from this daemon's monotonic clock at the moment
//! it saw renewTime change, as client-go judges Leases, so clock skew between nodes matters only at first
//! sight.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::SystemTime,
};

use consistd_core::lease::{AppliedBy, MEMBER_OF_LABEL};
use tokio::time::Instant;

use super::member_lease::{MemberRecord, age_of, group_label};
use crate::watch::{Hub, Mirror, Query, ResourceError, object::Obj, sleep_until};

/// One member Lease as this daemon last saw it.
#[derive(Debug, Clone)]
pub struct SeenMember {
    /// What the Lease says.
    pub record: MemberRecord,
    /// When the member last renewed, on this daemon's clock; None when it was already expired at first
    /// sight.
    renewed: Option<Instant>,
}

impl SeenMember {
    /// What a member Lease of `election` says now, given what it said before.
    fn observe(obj: &Obj, election: &str, before: Option<&SeenMember>) -> Option<Self> {
        let record = MemberRecord::parse(obj, election)?;
        let renewed = match before {
            Some(before) if before.record.renew_time == record.renew_time => before.renewed,
            Some(_) => Some(Instant::now()),
            None => {
                let age = record.renewed_at().map(age_of);
                age.filter(|age| *age < record.ttl).and_then(|age| Instant::now().checked_sub(age))
            }
        };
        Some(Self { record, renewed })
    }

    /// When the member's own renewal stops counting; None when it did not count at first sight.
    pub(super) fn renewal_expires_at(&self) -> Option<Instant> {
        self.renewed.map(|at| at + self.record.ttl)
    }
}

/// When some leader's roll call last reached each run of a member, by identity and incarnation.
type ReachedAt = HashMap<String, HashMap<String, Contact>>;

/// One contact of a leader's roll call with a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Contact {
    /// On this daemon's clock: what liveness is judged by.
    at: Instant,
    /// On the leader's clock (its renewTime less the age): what GetRolloutStatus shows as last seen.
    wall: Option<SystemTime>,
}

/// What the roll call records on `members` say, on top of what they said before (`known`): for each
/// entry, the renewal that carried the record (as this daemon saw it) less the age the record gives; the
/// newest where records disagree. A contact outlives the record that carried it until it lapses: a leader
/// that leaves deletes its Lease, and its record with it, before the members it vouched for have renewed
/// for themselves. Only the current runs of members with a Lease are kept.
fn reached_at<'a>(mut reached: ReachedAt, members: impl Iterator<Item = &'a SeenMember> + Clone) -> ReachedAt {
    for m in members.clone() {
        let Some(written) = m.renewed else { continue };
        let written_wall = m.record.renewed_at().map(SystemTime::from);
        for (identity, (incarnation, age)) in &m.record.reached.0 {
            if let Some(at) = written.checked_sub(*age) {
                let contact = Contact { at, wall: written_wall.and_then(|w| w.checked_sub(*age)) };
                let newest = reached.entry(identity.clone()).or_default().entry(incarnation.clone()).or_insert(contact);
                *newest = (*newest).max(contact);
            }
        }
    }
    let runs: HashSet<(&str, &str)> =
        members.map(|m| (m.record.identity.as_str(), m.record.incarnation.as_str())).collect();
    reached.retain(|identity, by_run| {
        by_run.retain(|incarnation, _| runs.contains(&(identity.as_str(), incarnation.as_str())));
        !by_run.is_empty()
    });
    reached
}

/// When `member` stops counting unless it is renewed or reached again; None when it does not count.
fn expires_at(member: &SeenMember, reached: &ReachedAt) -> Option<Instant> {
    let r = &member.record;
    let reached = contact(member, reached).map(|c| c.at + r.ttl);
    member.renewal_expires_at().max(reached)
}

/// The newest roll call contact with `member`'s current run.
fn contact(member: &SeenMember, reached: &ReachedAt) -> Option<Contact> {
    reached.get(&member.record.identity).and_then(|runs| runs.get(&member.record.incarnation)).copied()
}

/// An election group, read through the hub and kept current.
#[derive(Debug)]
pub struct GroupReader {
    election: String,
    mirror: Mirror<SeenMember>,
    /// What the roll call records among the Leases say, and said before a Lease carrying one was
    /// deleted, as of the last change.
    reached: ReachedAt,
}

impl GroupReader {
    /// Starts reading the group of `election` in `namespace`.
    pub async fn open(hub: &Arc<Hub>, namespace: &str, election: &str) -> Result<Self, ResourceError> {
        let query = Query {
            resource: "coordination.k8s.io/v1/leases".to_owned(),
            namespace: namespace.to_owned(),
            label_selector: format!("{MEMBER_OF_LABEL}={}", group_label(election)),
            own: true,
            ..Query::default()
        };
        Ok(Self { election: election.to_owned(), mirror: Mirror::open(hub, query).await?, reached: ReachedAt::new() })
    }

    /// Waits for the next change: a member Lease written or deleted, or (once the group is read
    /// completely) a live member expiring. Returns false once the hub ended the watch.
    pub async fn changed(&mut self) -> bool {
        let expiry = if self.mirror.synced() {
            self.members().filter_map(|m| expires_at(m, &self.reached)).filter(|at| *at > Instant::now()).min()
        } else {
            None
        };
        let election = &self.election;
        tokio::select! {
            more = self.mirror.next(|obj, before| SeenMember::observe(obj, election, before)) => {
                self.reached = reached_at(std::mem::take(&mut self.reached), self.mirror.values().values());
                more
            }
            () = sleep_until(expiry) => true,
        }
    }

    /// Whether `member` counts at `now`: its TTL has not passed since its last renewal, nor since a
    /// leader last reached its current run.
    pub fn live_at(&self, member: &SeenMember, now: Instant) -> bool {
        expires_at(member, &self.reached).is_some_and(|at| now < at)
    }

    /// When `member` was last seen, on the clocks of the daemons that saw it: its own renewTime, or the
    /// leader's renewTime less the age of its contact, whichever is newer.
    pub fn last_seen(&self, member: &SeenMember) -> Option<SystemTime> {
        let own = member.record.renewed_at().map(SystemTime::from);
        own.max(contact(member, &self.reached).and_then(|c| c.wall))
    }

    /// Whether every member Lease has been read.
    pub fn synced(&self) -> bool {
        self.mirror.synced()
    }

    /// Every member with a Lease, live or not.
    pub fn members(&self) -> impl Iterator<Item = &SeenMember> {
        self.mirror.values().values()
    }

    /// The newest version each member applied, by identity: what its own Lease says, or what any channel
    /// leader's record (on that leader's member Lease) says of the member's current run.
    pub fn applied(&self) -> HashMap<&str, u64> {
        let records: Vec<&AppliedBy> =
            self.members().map(|m| &m.record.applied_by).filter(|r| !r.0.is_empty()).collect();
        self.members()
            .map(|m| {
                let r = &m.record;
                (
                    r.identity.as_str(),
                    AppliedBy::newest(r.applied, records.iter().copied(), &r.identity, &r.incarnation),
                )
            })
            .collect()
    }

    /// What the members live now say of themselves.
    pub fn live_members(&self) -> impl Iterator<Item = &MemberRecord> {
        let now = Instant::now();
        self.members().filter(move |m| self.live_at(m, now)).map(|m| &m.record)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lease(renew_time: &str, ttl_seconds: u64) -> Obj {
        member("a", "x1", renew_time, ttl_seconds, None)
    }

    /// Member `identity`'s Lease in run `incarnation`, with a roll call record when given.
    fn member(identity: &str, incarnation: &str, renew_time: &str, ttl_seconds: u64, reached: Option<&str>) -> Obj {
        let mut annotations = serde_json::json!({
            "consistd.io/election": "web",
            "consistd.io/peer-address": "10.0.0.1:7070",
            "consistd.io/member-incarnation": incarnation,
        });
        if let Some(reached) = reached {
            annotations["consistd.io/reached"] = reached.into();
        }
        let json = serde_json::json!({
            "metadata": {"name": format!("web.member.{identity}"), "annotations": annotations},
            "spec": {"holderIdentity": identity, "renewTime": renew_time, "leaseDurationSeconds": ttl_seconds},
        });
        Obj::new("u", "ns", &format!("web.member.{identity}"), "1", serde_json::to_vec(&json).expect("json"))
    }

    /// Whether `member` counts at `now`, judged by its own renewals alone.
    fn renewed_live(member: &SeenMember, now: Instant) -> bool {
        member.renewal_expires_at().is_some_and(|at| now < at)
    }

    fn ago(seconds: i64) -> String {
        let now = k8s_openapi::jiff::Timestamp::now();
        now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(seconds)).expect("in range").to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_first_seen_counts_for_what_is_left_of_its_ttl() {
        let seen = SeenMember::observe(&lease(&ago(6), 10), "web", None).expect("a member");
        let now = Instant::now();
        assert!(renewed_live(&seen, now));
        assert!(renewed_live(&seen, now + Duration::from_secs(3)));
        assert!(!renewed_live(&seen, now + Duration::from_secs(5)), "renewed 6 s ago with a 10 s TTL: gone in 4 s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_already_expired_at_first_sight_never_counts() {
        let seen = SeenMember::observe(&lease(&ago(11), 10), "web", None).expect("a member");
        assert!(!renewed_live(&seen, Instant::now()));
        assert_eq!(seen.renewal_expires_at(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_counts_from_when_this_daemon_saw_it_whatever_its_timestamp_says() {
        let first = SeenMember::observe(&lease(&ago(9), 10), "web", None).expect("a member");
        tokio::time::advance(Duration::from_secs(5)).await;
        // A node whose clock is an hour behind renews: its renewTime looks stale, the change is what counts.
        let stale = ago(3600);
        let renewed = SeenMember::observe(&lease(&stale, 10), "web", Some(&first)).expect("a member");
        let now = Instant::now();
        assert!(!renewed_live(&first, now));
        assert!(renewed_live(&renewed, now + Duration::from_secs(9)));
        assert!(!renewed_live(&renewed, now + Duration::from_secs(10)));
        // The same renewTime again is no renewal.
        tokio::time::advance(Duration::from_secs(6)).await;
        let unchanged = SeenMember::observe(&lease(&stale, 10), "web", Some(&renewed)).expect("a member");
        assert!(renewed_live(&unchanged, Instant::now()));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!renewed_live(&unchanged, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_the_leader_reached_counts_for_its_ttl_after_that_contact_in_that_run_only() {
        // b renewed 25 s ago (10 s TTL: gone by its own renewals); the leader a renewed 1 s ago and
        // reached b's run y1 2 s before that.
        let b = SeenMember::observe(&member("b", "y1", &ago(25), 10, None), "web", None).expect("b");
        let a =
            SeenMember::observe(&member("a", "x1", &ago(1), 10, Some(r#"{"b":"y1@2000ms"}"#)), "web", None).expect("a");
        let reached = reached_at(ReachedAt::new(), [&a, &b].into_iter());
        let now = Instant::now();
        assert!(!renewed_live(&b, now));
        let until = expires_at(&b, &reached).expect("b counts");
        assert!(
            until > now + Duration::from_millis(6900) && until <= now + Duration::from_secs(7),
            "{:?}",
            until - now
        );
        // The same record says nothing of another run of b (restarted since), nor of a member it omits.
        let b2 = SeenMember::observe(&member("b", "y2", &ago(25), 10, None), "web", None).expect("b2");
        assert_eq!(expires_at(&b2, &reached), None);
        let c = SeenMember::observe(&member("c", "z1", &ago(25), 10, None), "web", None).expect("c");
        assert_eq!(expires_at(&c, &reached), None);
        // A later renewal of its own counts where it is newer.
        tokio::time::advance(Duration::from_secs(5)).await;
        let renewed = SeenMember::observe(&member("b", "y1", &ago(0), 10, None), "web", Some(&b)).expect("b");
        assert_eq!(expires_at(&renewed, &reached), renewed.renewal_expires_at());
    }

    #[tokio::test(start_paused = true)]
    async fn a_contact_outlives_the_deleted_lease_that_recorded_it_until_it_lapses() {
        // The leader a reached b's run y1 and c's run z1 a second before its last renewal; b's and c's own
        // renewals are too old to count.
        let b = SeenMember::observe(&member("b", "y1", &ago(25), 10, None), "web", None).expect("b");
        let c = SeenMember::observe(&member("c", "z1", &ago(25), 10, None), "web", None).expect("c");
        let record = Some(r#"{"b":"y1@1000ms","c":"z1@1000ms"}"#);
        let a = SeenMember::observe(&member("a", "x1", &ago(0), 10, record), "web", None).expect("a");
        let reached = reached_at(ReachedAt::new(), [&a, &b, &c].into_iter());
        let until = expires_at(&b, &reached).expect("b counts");
        // a leaves and deletes its Lease; c restarted meanwhile (a new run) and c's old run is forgotten.
        tokio::time::advance(Duration::from_secs(2)).await;
        let c2 = SeenMember::observe(&member("c", "z2", &ago(0), 10, None), "web", Some(&c)).expect("c2");
        let reached = reached_at(reached, [&b, &c2].into_iter());
        assert_eq!(expires_at(&b, &reached), Some(until), "what the deleted record said of b still holds");
        assert!(!reached.contains_key("c"), "c's run z1 is gone: {reached:?}");
        // And lapses a TTL after the contact: 9 s from the start.
        assert!(until > Instant::now() + Duration::from_secs(6) && until <= Instant::now() + Duration::from_secs(7));
        // b's Lease deleted too: nothing is kept for it.
        let reached = reached_at(reached, [&c2].into_iter());
        assert!(!reached.contains_key("b"), "{reached:?}");
    }

    #[test]
    fn a_lease_of_another_election_is_not_a_member() {
        assert!(SeenMember::observe(&lease(&ago(1), 10), "other", None).is_none());
    }
}
