//! What consistd's Leases say, read the way the daemon writes them: election Leases (holder, fencing
//! term, renewal) and member Leases (`<election>.member.<identity>`, labelled `consistd.io/member-of`,
//! with the election's name and the applied rollout version in annotations). A member counts for its TTL
//! after its last contact: its own renewal, or the election leader's roll call as the leader's member
//! Lease records it.

use std::collections::HashMap;

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};

pub(crate) use consistd_core::lease::{
    APPLIED_BY_ANNOTATION, APPLIED_VERSION_ANNOTATION, AppliedBy, ELECTION_ANNOTATION, INCARNATION_ANNOTATION,
    MEMBER_OF_LABEL, REACHED_ANNOTATION, Reached,
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
    /// On the election leader's Lease: the members its roll call reached, and how long before `renewed`.
    pub(crate) reached: Reached,
    /// Its last renewal.
    pub(crate) renewed: Option<Timestamp>,
    /// Its leaseDurationSeconds (30 s when unset), in milliseconds.
    ttl_ms: i64,
    /// Whether it still counts: renewed, or reached by a leader, within its TTL (see [`MemberLease::group`]).
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
        let ttl_ms = 1000
            * spec
                .lease_duration_seconds
                .map_or(i64::from(consistd_core::lease::DEFAULT_MEMBER_TTL_SECONDS), i64::from);
        let live = renewed.is_some_and(|at| at.as_millisecond().saturating_add(ttl_ms) > now.as_millisecond());
        Some(Self {
            namespace: lease.metadata.namespace.clone().unwrap_or_default(),
            election,
            identity: spec.holder_identity.unwrap_or_default(),
            applied: annotations.get(APPLIED_VERSION_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0),
            incarnation: annotations.get(INCARNATION_ANNOTATION).cloned().unwrap_or_default(),
            applied_by: annotations.get(APPLIED_BY_ANNOTATION).map(|v| AppliedBy::parse(v)).unwrap_or_default(),
            reached: annotations.get(REACHED_ANNOTATION).map(|v| Reached::parse(v)).unwrap_or_default(),
            renewed,
            ttl_ms,
            live,
        })
    }

    /// Every member Lease among `leases` at `now`, live when its own renewal or a roll call record on a
    /// Lease of the same group (the leader's renewTime less the contact's age) is within its TTL.
    pub(crate) fn group(leases: &[Lease], now: Timestamp) -> Vec<Self> {
        let mut members: Vec<Self> = leases.iter().filter_map(|l| Self::read(l, now)).collect();
        // The newest contact (ms) with each run of each member: (namespace, election, identity, incarnation).
        let mut contacts: HashMap<(&str, &str, &str, &str), i64> = HashMap::new();
        for by in &members {
            let Some(renewed) = by.renewed.map(|r| r.as_millisecond()) else { continue };
            for (identity, (incarnation, age)) in &by.reached.0 {
                let at = renewed.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
                let run = (by.namespace.as_str(), by.election.as_str(), identity.as_str(), incarnation.as_str());
                let newest = contacts.entry(run).or_insert(at);
                *newest = (*newest).max(at);
            }
        }
        let live: Vec<bool> = members
            .iter()
            .map(|m| {
                let run = (m.namespace.as_str(), m.election.as_str(), m.identity.as_str(), m.incarnation.as_str());
                m.live || contacts.get(&run).is_some_and(|at| at.saturating_add(m.ttl_ms) > now.as_millisecond())
            })
            .collect();
        for (m, live) in members.iter_mut().zip(live) {
            m.live = live;
        }
        members
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

    #[test]
    fn a_member_the_leader_reached_counts_for_its_ttl_after_that_contact_in_that_run() {
        let member = |identity: &str, incarnation: &str, renewed: &str, reached: Option<&str>| {
            let mut annotations = serde_json::json!({
                "consistd.io/election": "web",
                "consistd.io/member-incarnation": incarnation,
            });
            if let Some(reached) = reached {
                annotations["consistd.io/reached"] = reached.into();
            }
            lease(serde_json::json!({
                "metadata": {"name": format!("web.member.{identity}"), "namespace": "ns",
                             "labels": {"consistd.io/member-of": "web"}, "annotations": annotations},
                "spec": {"holderIdentity": identity, "leaseDurationSeconds": 3, "renewTime": renewed}
            }))
        };
        // The leader a renewed at 0:10 and had reached b's run y1 2 s before; b last renewed at 0:00.
        let leases = [
            member("a", "x1", "2026-01-01T00:00:10.000000Z", Some(r#"{"b":"y1@2000ms","c":"z0@0ms"}"#)),
            member("b", "y1", "2026-01-01T00:00:00.000000Z", None),
            member("c", "z1", "2026-01-01T00:00:00.000000Z", None),
        ];
        let live = |now: &str| -> Vec<String> {
            MemberLease::group(&leases, at(now)).into_iter().filter(|m| m.live).map(|m| m.identity).collect()
        };
        assert_eq!(live("2026-01-01T00:00:10.500Z"), ["a", "b"], "c's current run was never reached");
        assert_eq!(live("2026-01-01T00:00:11.500Z"), ["a"], "b's contact at 0:08 counts until 0:11");
    }
}
