//! What consistd's Leases say, read the way the daemon writes them: election Leases (holder, fencing
//! term, renewal) and member Leases (`<election>.member.<identity>`, labelled `consistd.io/member-of`,
//! with the election's name and the applied rollout version in annotations).

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};

pub(crate) use consistd_core::lease::{
    APPLIED_BY_ANNOTATION, APPLIED_VERSION_ANNOTATION, AppliedBy, ELECTION_ANNOTATION, INCARNATION_ANNOTATION,
    MEMBER_OF_LABEL,
};

/// Whether `lease` is a member Lease rather than an election's own.
pub(crate) fn is_member(lease: &Lease) -> bool {
    lease.metadata.labels.as_ref().is_some_and(|l| l.contains_key(MEMBER_OF_LABEL))
}

/// Milliseconds from `then` to `now`, never negative (clock skew reads as just now).
pub(crate) fn ago_ms(then: Timestamp, now: Timestamp) -> u64 {
    u64::try_from(now.as_millisecond().saturating_sub(then.as_millisecond())).unwrap_or(0)
}

/// An election Lease as `kubectl consistd elections` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElectionLease {
    /// The Lease's namespace.
    pub(crate) namespace: String,
    /// The election's (and Lease's) name.
    pub(crate) election: String,
    /// Who holds it; None when nobody does or the holder's Lease expired.
    pub(crate) holder: Option<String>,
    /// The fencing term: leaseTransitions + 1.
    pub(crate) term: u64,
    /// The last renewal.
    pub(crate) renewed: Option<Timestamp>,
}

impl ElectionLease {
    /// Reads an election Lease at `now`.
    pub(crate) fn read(lease: &Lease, now: Timestamp) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        let renewed = spec.renew_time.map(|t| t.0);
        let live = match (renewed, spec.lease_duration_seconds) {
            (Some(at), Some(seconds)) if seconds > 0 => {
                at.as_millisecond().saturating_add(i64::from(seconds) * 1000) > now.as_millisecond()
            }
            // A missing or non-positive duration is malformed: expired, as the daemon reads it.
            _ => false,
        };
        let holder = spec.holder_identity.filter(|h| live && !h.is_empty());
        let transitions = spec.lease_transitions.and_then(|t| u64::try_from(t).ok()).unwrap_or(0);
        Self {
            namespace: lease.metadata.namespace.clone().unwrap_or_default(),
            election: lease.metadata.name.clone().unwrap_or_default(),
            holder,
            term: transitions.saturating_add(1),
            renewed,
        }
    }
}

/// A member Lease of an election group (a replica that campaigns in it, or a rollout channel's member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberLease {
    /// The Lease's namespace.
    pub(crate) namespace: String,
    /// The election (channel) it is a member of: the `consistd.io/election` annotation.
    pub(crate) election: String,
    /// The member's identity (holderIdentity).
    pub(crate) identity: String,
    /// The newest rollout version its app applied, as its own Lease says; 0 for none.
    pub(crate) applied: u64,
    /// This run of the member (see [`INCARNATION_ANNOTATION`]).
    pub(crate) incarnation: String,
    /// On the channel leader's Lease: its record of what every member applied.
    pub(crate) applied_by: AppliedBy,
    /// Its last renewal.
    pub(crate) renewed: Option<Timestamp>,
    /// Whether it still counts: renewed within its leaseDurationSeconds (30 s when unset).
    pub(crate) live: bool,
}

impl MemberLease {
    /// Reads a member Lease at `now`; None for a Lease that is not one, or names no election.
    pub(crate) fn read(lease: &Lease, now: Timestamp) -> Option<Self> {
        if !is_member(lease) {
            return None;
        }
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        let election = annotations.get(ELECTION_ANNOTATION)?.clone();
        let spec = lease.spec.clone().unwrap_or_default();
        let renewed = spec.renew_time.map(|t| t.0);
        let ttl =
            spec.lease_duration_seconds.map_or(i64::from(consistd_core::lease::DEFAULT_MEMBER_TTL_SECONDS), i64::from);
        let live = renewed.is_some_and(|at| at.as_millisecond().saturating_add(ttl * 1000) > now.as_millisecond());
        Some(Self {
            namespace: lease.metadata.namespace.clone().unwrap_or_default(),
            election,
            identity: spec.holder_identity.unwrap_or_default(),
            applied: annotations.get(APPLIED_VERSION_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0),
            incarnation: annotations.get(INCARNATION_ANNOTATION).cloned().unwrap_or_default(),
            applied_by: annotations.get(APPLIED_BY_ANNOTATION).map(|v| AppliedBy::parse(v)).unwrap_or_default(),
            renewed,
            live,
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(json: serde_json::Value) -> Lease {
        serde_json::from_value(json).expect("a Lease")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn an_election_lease_names_its_holder_only_while_it_is_live() {
        let held = lease(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 2}
        }));
        let live = ElectionLease::read(&held, at("2026-01-01T00:00:10Z"));
        assert_eq!((live.holder.as_deref(), live.term), (Some("a"), 3));
        let expired = ElectionLease::read(&held, at("2026-01-01T00:00:15Z"));
        assert_eq!((expired.holder, expired.term), (None, 3));
        let released = lease(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"leaseDurationSeconds": 1, "renewTime": "2026-01-01T00:00:00.000000Z"}
        }));
        let released = ElectionLease::read(&released, at("2026-01-01T00:00:00.5Z"));
        assert_eq!((released.holder, released.term), (None, 1));
    }

    #[test]
    fn member_leases_are_read_with_their_election_and_applied_version() {
        let mut member = lease(serde_json::json!({
            "metadata": {
                "name": "config.member.a",
                "labels": {MEMBER_OF_LABEL: "config"},
                "annotations": {ELECTION_ANNOTATION: "config", APPLIED_VERSION_ANNOTATION: "4"}
            },
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 3}
        }));
        member.spec.as_mut().expect("spec").renew_time = Some(MicroTime(at("2026-01-01T00:00:00Z")));
        let read = MemberLease::read(&member, at("2026-01-01T00:00:02Z")).expect("a member");
        assert_eq!((read.election.as_str(), read.identity.as_str(), read.applied, read.live), ("config", "a", 4, true));
        assert!(!MemberLease::read(&member, at("2026-01-01T00:00:03Z")).expect("a member").live);
        let election = lease(serde_json::json!({"metadata": {"name": "config"}}));
        assert!(MemberLease::read(&election, at("2026-01-01T00:00:00Z")).is_none());
    }
}
