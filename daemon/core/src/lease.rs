//! The labels and annotations on consistd's Leases: the daemon writes them, `kubectl consistd` lists and
//! reads Leases by them.

/// The label on every Lease consistd writes, election and member Leases alike, and its value: what
/// `kubectl consistd` lists them by (the Kubernetes recommended label; a Lease already labelled as
/// managed by something else keeps that label).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on consistd's Leases.
pub const MANAGED_BY: &str = "consistd";

/// Label every member Lease of an election carries: its value is the election's group label.
pub const MEMBER_OF_LABEL: &str = "consistd.io/member-of";
/// Annotation on an election's Lease: the run of the daemon that holds it, random each time a daemon
/// starts (as client-go's identities carry a uuid). A holding is this run's only when both the holder
/// identity and the run are its own, so another run with the same identity (a replacement pod with the
/// same name, a restarted sidecar, two daemons configured with one identity) waits for the Lease to expire
/// and takes it in a new term, instead of sharing the term of a holding that may still write.
pub const HOLDER_RUN_ANNOTATION: &str = "consistd.io/holder-run";
/// Annotation on an election's Lease asking for a handover to the candidate it names, as
/// `spec.preferredHolder` does (coordinated leader election) on apiservers that keep that field (it needs
/// the CoordinatedLeaderElection feature gate, off by default; others drop it on write): the holder steps
/// down for that candidate, and whoever takes the Lease next removes the request. `kubectl consistd
/// handover` writes it.
pub const PREFERRED_HOLDER_ANNOTATION: &str = "consistd.io/preferred-holder";
/// Annotation with the member's peer address ("host:port").
pub const PEER_ADDRESS_ANNOTATION: &str = "consistd.io/peer-address";
/// Annotation with the election's full name (labels are limited to 63 characters).
pub const ELECTION_ANNOTATION: &str = "consistd.io/election";
/// Annotation with the newest version of the election's rollout channel this member's app applied.
pub const APPLIED_VERSION_ANNOTATION: &str = "consistd.io/applied-version";
/// Annotation with the member's incarnation: a random id each time the daemon joins the group, so a
/// leader's record of what a member applied counts only for the run of the member that applied it.
pub const INCARNATION_ANNOTATION: &str = "consistd.io/member-incarnation";
/// Annotation on the channel leader's member Lease: what every member applied, as the members' ACKs of
/// the leader's version messages told it (JSON, identity to `version@incarnation`; see [`AppliedBy`]).
pub const APPLIED_BY_ANNOTATION: &str = "consistd.io/applied-by";
/// Annotation on the election leader's member Lease: the members it reached in its roll call (JSON,
/// identity to `incarnation@age`; see [`Reached`]). A member counts for its TTL after its last contact,
/// whether that was its own renewal or the leader reaching it, so an idle member need not write.
pub const REACHED_ANNOTATION: &str = "consistd.io/reached";
/// Annotation on a sharded queue's Leases (its ring Lease and each member's shard Lease): the ring's name,
/// `<election>.ring.<queue>`.
pub const RING_ANNOTATION: &str = "consistd.io/ring";
/// Annotation on a ring Lease: every slot's epoch, owner and next owner (JSON; see the reconcile ring).
pub const RING_SLOTS_ANNOTATION: &str = "consistd.io/ring-slots";
/// Annotation on a slot's hand-off Lease: the state of the slot's keys its last owner handed on with it (JSON;
/// see the reconcile shards).
pub const RING_HANDOFF_ANNOTATION: &str = "consistd.io/ring-handoff";
/// Annotation on a member's shard Lease: its holding, a random id each time its hold on its slots starts,
/// so a ring entry naming an earlier holding is never taken for its own again.
pub const HOLDING_ANNOTATION: &str = "consistd.io/holding";
/// Annotation on a member's shard Lease: the queue's spec as the member runs it (JSON, field to value), so a
/// member whose spec differs is refused naming the field.
pub const QUEUE_SPEC_ANNOTATION: &str = "consistd.io/queue-spec";
/// How long a member counts after a renewal when its Lease has no leaseDurationSeconds.
pub const DEFAULT_MEMBER_TTL_SECONDS: u32 = 30;

/// An election leader's record of the members it reached: identity to (incarnation, how long before the
/// Lease's renewTime the leader last reached that run). Ages, not times: both ends of each age are read
/// on the leader's clock, so a reader adds them to when it saw the Lease renewed, as it judges renewals,
/// and clock skew between nodes does not enter. Like [`AppliedBy`], each entry is a fact about one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reached(pub std::collections::BTreeMap<String, (String, std::time::Duration)>);

impl Reached {
    /// Reads a [`REACHED_ANNOTATION`] value; entries it cannot read are left out.
    pub fn parse(value: &str) -> Self {
        let raw: std::collections::BTreeMap<String, String> = serde_json::from_str(value).unwrap_or_default();
        Self(
            raw.into_iter()
                .filter_map(|(identity, entry)| {
                    let (incarnation, age) = entry.rsplit_once('@')?;
                    let age = std::time::Duration::from_millis(age.strip_suffix("ms")?.parse().ok()?);
                    Some((identity, (incarnation.to_owned(), age)))
                })
                .collect(),
        )
    }

    /// The annotation's value (ages in whole milliseconds).
    pub fn encode(&self) -> String {
        let raw: std::collections::BTreeMap<&String, String> = self
            .0
            .iter()
            .map(|(identity, (incarnation, age))| (identity, format!("{incarnation}@{}ms", age.as_millis())))
            .collect();
        serde_json::to_string(&raw).unwrap_or_default()
    }

    /// How long before the record was written the leader last reached `identity` in `incarnation`.
    pub fn age(&self, identity: &str, incarnation: &str) -> Option<std::time::Duration> {
        self.0.get(identity).filter(|(i, _)| i == incarnation).map(|(_, age)| *age)
    }
}

/// A channel leader's record of what its members applied: identity to (version, incarnation). Readers
/// take, for each member, the newest of its own Lease's applied version and every record's entry for its
/// current incarnation: each entry is a fact ("this run of the member applied at least this version"), so
/// records of former leaders can only be behind, never wrong.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedBy(pub std::collections::BTreeMap<String, (u64, String)>);

impl AppliedBy {
    /// Reads an [`APPLIED_BY_ANNOTATION`] value; entries it cannot read are left out.
    pub fn parse(value: &str) -> Self {
        let raw: std::collections::BTreeMap<String, String> = serde_json::from_str(value).unwrap_or_default();
        Self(
            raw.into_iter()
                .filter_map(|(identity, entry)| {
                    let (version, incarnation) = entry.split_once('@')?;
                    Some((identity, (version.parse().ok()?, incarnation.to_owned())))
                })
                .collect(),
        )
    }

    /// The annotation's value.
    pub fn encode(&self) -> String {
        let raw: std::collections::BTreeMap<&String, String> = self
            .0
            .iter()
            .map(|(identity, (version, incarnation))| (identity, format!("{version}@{incarnation}")))
            .collect();
        serde_json::to_string(&raw).unwrap_or_default()
    }

    /// What this record says `identity` applied in `incarnation` (0: nothing).
    pub fn applied(&self, identity: &str, incarnation: &str) -> u64 {
        self.0.get(identity).filter(|(_, i)| i == incarnation).map_or(0, |(v, _)| *v)
    }

    /// The rule every reader applies: what member `identity` applied in `incarnation` is the newest of
    /// what its own Lease says (`own`) and what each of `records` says of that run.
    pub fn newest<'a>(
        own: u64,
        records: impl IntoIterator<Item = &'a AppliedBy>,
        identity: &str,
        incarnation: &str,
    ) -> u64 {
        records.into_iter().map(|r| r.applied(identity, incarnation)).fold(own, u64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_only_for_the_incarnation_that_applied_and_survives_its_own_encoding() {
        let mut record = AppliedBy::default();
        record.0.insert("a".to_owned(), (5, "x1".to_owned()));
        record.0.insert("b".to_owned(), (3, "y1".to_owned()));
        let read = AppliedBy::parse(&record.encode());
        assert_eq!(read, record);
        assert_eq!(read.applied("a", "x1"), 5);
        assert_eq!(read.applied("a", "x2"), 0, "a restarted member applied nothing yet");
        assert_eq!(read.applied("c", "z"), 0);
        assert_eq!(AppliedBy::newest(3, [&read, &AppliedBy::default()], "a", "x1"), 5, "the record is newer");
        assert_eq!(AppliedBy::newest(7, [&read], "a", "x1"), 7, "the member's own Lease is newer");
        assert_eq!(AppliedBy::newest(0, [&read], "a", "x2"), 0, "another run");
        assert_eq!(AppliedBy::parse("not json"), AppliedBy::default());
        assert_eq!(AppliedBy::parse(r#"{"a":"5@x","b":"nope","c":"x@y"}"#).0.len(), 1);
    }

    #[test]
    fn a_roll_call_counts_only_for_the_run_it_reached_and_survives_its_own_encoding() {
        use std::time::Duration;
        let mut reached = Reached::default();
        reached.0.insert("a".to_owned(), ("x1".to_owned(), Duration::from_millis(1500)));
        reached.0.insert("b".to_owned(), ("y1".to_owned(), Duration::ZERO));
        let read = Reached::parse(&reached.encode());
        assert_eq!(read, reached);
        assert_eq!(read.age("a", "x1"), Some(Duration::from_millis(1500)));
        assert_eq!(read.age("a", "x2"), None, "a restarted member was not reached yet");
        assert_eq!(read.age("c", "z"), None);
        assert_eq!(Reached::parse(r#"{"a":"x@5ms","b":"y@5","c":"5ms","d":"z@-1ms"}"#).0.len(), 1);
    }
}
