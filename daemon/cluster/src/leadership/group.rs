//! Election groups as the outbox and the replica barrier read them: the member Leases of one election
//! through the watch hub, and the one rule for who is live. A member counts for its TTL after its last
//! renewal. When a member is first seen, its renewal's age comes from its renewTime and this machine's
//! wall clock; after that, from this daemon's monotonic clock at the moment it saw renewTime change,
//! as client-go judges Leases, so clock skew between nodes matters only at first sight.

use std::{collections::HashMap, sync::Arc, time::Duration};

use consistd_core::lease::{AppliedBy, MEMBER_OF_LABEL};
use tokio::time::Instant;

use super::membership::{MemberRecord, group_label};
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
                let age = record.renewed_at().map(|at| {
                    let age = k8s_openapi::jiff::Timestamp::now().duration_since(at);
                    // A renewal in the future (a fast clock elsewhere) is as fresh as one just now.
                    if age.is_negative() { Duration::ZERO } else { age.unsigned_abs() }
                });
                age.filter(|age| *age < record.ttl).and_then(|age| Instant::now().checked_sub(age))
            }
        };
        Some(Self { record, renewed })
    }

    /// Whether the member counts at `now`.
    pub fn live_at(&self, now: Instant) -> bool {
        self.expires_at().is_some_and(|at| now < at)
    }

    /// When the member stops counting unless it renews; None when it does not count now.
    fn expires_at(&self) -> Option<Instant> {
        self.renewed.map(|at| at + self.record.ttl)
    }
}

/// An election group, read through the hub and kept current.
#[derive(Debug)]
pub struct GroupReader {
    election: String,
    mirror: Mirror<SeenMember>,
}

impl GroupReader {
    /// Starts reading the group of `election` in `namespace`.
    pub async fn open(hub: &Arc<Hub>, namespace: &str, election: &str) -> Result<Self, ResourceError> {
        let query = Query {
            resource: "coordination.k8s.io/v1/leases".to_owned(),
            namespace: namespace.to_owned(),
            label_selector: format!("{MEMBER_OF_LABEL}={}", group_label(election)),
            ..Query::default()
        };
        Ok(Self { election: election.to_owned(), mirror: Mirror::open(hub, query).await? })
    }

    /// Waits for the next change: a member Lease written or deleted, or (once the group is read
    /// completely) a live member expiring. Returns false once the hub ended the watch.
    pub async fn changed(&mut self) -> bool {
        let expiry = if self.mirror.synced() {
            self.mirror.values().values().filter_map(SeenMember::expires_at).filter(|at| *at > Instant::now()).min()
        } else {
            None
        };
        let election = &self.election;
        tokio::select! {
            more = self.mirror.next(|obj, before| SeenMember::observe(obj, election, before)) => more,
            () = sleep_until(expiry) => true,
        }
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
        self.members().filter(move |m| m.live_at(now)).map(|m| &m.record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renew_time: &str, ttl_seconds: u64) -> Obj {
        let json = serde_json::json!({
            "metadata": {
                "name": "web.member.a",
                "annotations": {"consistd.io/election": "web", "consistd.io/peer-address": "10.0.0.1:7070"},
            },
            "spec": {"holderIdentity": "a", "renewTime": renew_time, "leaseDurationSeconds": ttl_seconds},
        });
        Obj {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "web.member.a".into(),
            resource_version: "1".into(),
            json: serde_json::to_vec(&json).expect("json").into(),
        }
    }

    fn ago(seconds: i64) -> String {
        let now = k8s_openapi::jiff::Timestamp::now();
        now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(seconds)).expect("in range").to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_first_seen_counts_for_what_is_left_of_its_ttl() {
        let seen = SeenMember::observe(&lease(&ago(6), 10), "web", None).expect("a member");
        let now = Instant::now();
        assert!(seen.live_at(now));
        assert!(seen.live_at(now + Duration::from_secs(3)));
        assert!(!seen.live_at(now + Duration::from_secs(5)), "renewed 6 s ago with a 10 s TTL: gone in 4 s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_already_expired_at_first_sight_never_counts() {
        let seen = SeenMember::observe(&lease(&ago(11), 10), "web", None).expect("a member");
        assert!(!seen.live_at(Instant::now()));
        assert_eq!(seen.expires_at(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_counts_from_when_this_daemon_saw_it_whatever_its_timestamp_says() {
        let first = SeenMember::observe(&lease(&ago(9), 10), "web", None).expect("a member");
        tokio::time::advance(Duration::from_secs(5)).await;
        // A node whose clock is an hour behind renews: its renewTime looks stale, the change is what counts.
        let stale = ago(3600);
        let renewed = SeenMember::observe(&lease(&stale, 10), "web", Some(&first)).expect("a member");
        let now = Instant::now();
        assert!(!first.live_at(now));
        assert!(renewed.live_at(now + Duration::from_secs(9)));
        assert!(!renewed.live_at(now + Duration::from_secs(10)));
        // The same renewTime again is no renewal.
        tokio::time::advance(Duration::from_secs(6)).await;
        let unchanged = SeenMember::observe(&lease(&stale, 10), "web", Some(&renewed)).expect("a member");
        assert!(unchanged.live_at(Instant::now()));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!unchanged.live_at(Instant::now()));
    }

    #[test]
    fn a_lease_of_another_election_is_not_a_member() {
        assert!(SeenMember::observe(&lease(&ago(1), 10), "other", None).is_none());
    }
}
